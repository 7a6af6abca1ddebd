"""COPY TO's output: rows as PostgreSQL's text or CSV format, in chunks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from services.adapter.copying.options import CopyFormat
from tidemark.sql_text import format_value

# Rows per chunk sent to the client.
ROWS_PER_CHUNK = 2048


def encode_rows(
    rows: Iterable[Sequence[Any]], names: Sequence[str], fmt: CopyFormat
) -> Iterator[bytes]:
    """The lines of the output (a header first when asked), a few thousand rows a chunk."""
    field = _csv_field if fmt.kind == "csv" else _text_field
    lines: list[str] = []
    if fmt.header:
        lines.append(fmt.delimiter.join(field(name, fmt) for name in names))
    for row in rows:
        lines.append(
            fmt.delimiter.join(
                fmt.null if value is None else field(format_value(value), fmt) for value in row
            )
        )
        if len(lines) >= ROWS_PER_CHUNK:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _text_field(text: str, fmt: CopyFormat) -> str:
    if not any(c in text for c in ("\\", "\n", "\r", "\t", fmt.delimiter)):
        return text
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if fmt.delimiter != "\t":
        out = out.replace(fmt.delimiter, "\\" + fmt.delimiter)
    return out


def _csv_field(text: str, fmt: CopyFormat) -> str:
    needs_quotes = (
        text == fmt.null
        or any(c in text for c in (fmt.delimiter, fmt.quote, "\n", "\r"))
        or text.startswith("\\.")
    )
    if not needs_quotes:
        return text
    escaped = text.replace(fmt.escape, fmt.escape + fmt.escape) if fmt.escape != fmt.quote else text
    escaped = escaped.replace(fmt.quote, fmt.escape + fmt.quote)
    return fmt.quote + escaped + fmt.quote
