"""Text for what the adapter returns, laid out the way ``psql`` does it.

A result with columns becomes an aligned table (header centred, numbers right-aligned, NULL as
the ``null`` marker, empty by default) with a ``(N rows)`` footer; any other result is its
command tag. Errors show the SQLSTATE and point at the failing position with a caret.
Subscription changes are one ``|``-separated line each, printed as they arrive.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.clients.adapter import (
    Change,
    Column,
    SqlPyValue,
    StatementError,
    StatementResult,
)
from tidemark.sql_text import format_value

_NUMERIC_TYPES = frozenset(
    {"smallint", "integer", "int", "bigint", "real", "double precision", "numeric", "decimal"}
)


def is_numeric(type_name: str) -> bool:
    return type_name.split("(", 1)[0].strip().lower() in _NUMERIC_TYPES


def row_count(count: int) -> str:
    return "(1 row)" if count == 1 else f"({count} rows)"


def _centre(text: str, width: int) -> str:
    # psql puts the odd space on the right; str.center does not always.
    pad = max(0, width - len(text))
    return " " * (pad // 2) + text + " " * (pad - pad // 2)


def render_table(
    columns: Sequence[Column], rows: Sequence[Sequence[SqlPyValue]], null: str = ""
) -> str:
    """An aligned table and its row count, e.g.::

     a | name
    ---+------
     1 | x
    (1 row)
    """
    cells = [[format_value(v, null) for v in row] for row in rows]
    widths = [len(c.name) for c in columns]
    for row_cells in cells:
        for i, cell in enumerate(row_cells[: len(widths)]):
            widths[i] = max(widths[i], len(cell))
    right = [is_numeric(c.type) for c in columns]
    lines = [
        "|".join(f" {_centre(c.name, w)} " for c, w in zip(columns, widths, strict=True)).rstrip(),
        "+".join("-" * (w + 2) for w in widths),
    ]
    for row_cells in cells:
        parts = []
        for i, width in enumerate(widths):
            cell = row_cells[i] if i < len(row_cells) else ""
            parts.append(f" {cell.rjust(width) if right[i] else cell.ljust(width)} ")
        lines.append("|".join(parts).rstrip())
    lines.append(row_count(len(rows)))
    return "\n".join(lines)


def render_result(result: StatementResult, null: str = "") -> str:
    """What the shell prints for a successful statement: its rows, or its command tag."""
    if result.columns:
        return render_table(result.columns, result.rows, null) + "\n"
    return result.tag


def render_notices(result: StatementResult) -> list[str]:
    return [f"NOTICE:  {notice}" for notice in result.notices]


def render_error(error: StatementError, sql: str = "") -> str:
    """The error with its SQLSTATE and, when its position falls inside ``sql``, the line it is
    on with a caret under the character::

        ERROR:  unknown table "nope" (SQLSTATE 42P01)
        LINE 1: SELECT * FROM nope
                              ^
    """
    lines = [f"ERROR:  {error.message} (SQLSTATE {error.code})"]
    if 0 < error.position <= len(sql) + 1:
        offset = error.position - 1
        line_start = sql.rfind("\n", 0, offset) + 1
        line_end = sql.find("\n", offset)
        line_text = sql[line_start : len(sql) if line_end < 0 else line_end]
        prefix = f"LINE {sql.count(chr(10), 0, line_start) + 1}: "
        lines.append(prefix + line_text)
        lines.append(" " * (len(prefix) + offset - line_start) + "^")
    if error.hint:
        lines.append(f"HINT:  {error.hint}")
    return "\n".join(lines)


def render_timing(seconds: float) -> str:
    return f"Time: {seconds * 1000:.3f} ms"


def render_change_header(columns: Sequence[Column]) -> str:
    return " | ".join(["timestamp", "diff", *(c.name for c in columns)])


def render_change(change: Change, null: str = "") -> str:
    """``timestamp | diff | col1 | col2 ...`` for one change."""
    values = [format_value(v, null) for v in change.row]
    return " | ".join([str(change.timestamp), f"{change.diff:+d}", *values])
