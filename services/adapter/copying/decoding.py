"""COPY FROM's input read into an update batch of the table.

Text and CSV are split into fields by Arrow's multithreaded CSV reader, every field read as a
string; each column is then converted to its type with one Arrow cast where Arrow's reading
of the text is PostgreSQL's, and value by value with the planner's own input rules
(:func:`~services.adapter.sql.literals.parse_text`) where it is not, or where the cast fails,
so that the error names the first bad value. Errors name the line and the column, as
PostgreSQL's ``CONTEXT: COPY t, line 3, column a`` does.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from services.adapter.copying.options import CopyFormat
from services.adapter.sql.errors import NOT_NULL_VIOLATION, SqlError
from services.adapter.sql.literals import parse_text
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.columnar.schema import DIFF_TYPE, TIME_TYPE
from tidemark.plan.scalar_types import ScalarType

BAD_COPY_FILE_FORMAT = "22P04"
UNDEFINED_COLUMN = "42703"
# Arrow reads this much of the input per block (and thread).
BLOCK_BYTES = 4 << 20
# Types whose text Arrow's cast reads as PostgreSQL does (whenever the cast succeeds).
_ARROW_CASTS = {
    ColumnType.INT64,
    ColumnType.FLOAT64,
    ColumnType.DECIMAL,
    ColumnType.DATE,
    ColumnType.TIMESTAMP,
    ColumnType.BOOL,
}
_END_OF_DATA = re.compile(rb"(^|\r?\n)\\\.(\r?\n)?$")
_TEXT_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


class CopyInput:
    """Where a COPY writes: the table's label and columns, and which of them the input fills."""

    def __init__(self, label: str, schema: RelationSchema, targets: Sequence[int]) -> None:
        self.label = label
        self.schema = schema
        self.targets = list(targets)

    def error(
        self, code: str, message: str, line: int | None, column: str | None = None
    ) -> SqlError:
        where = f"COPY {self.label}"
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column}"
        return SqlError(code, f"{message} ({where})")


def decode_delimited(data: bytes, fmt: CopyFormat, into: CopyInput) -> pa.Table:
    """Text or CSV ``data`` as the table's update batch: every row once (diff 1, time 0)."""
    if fmt.kind == "text":
        data = _END_OF_DATA.sub(rb"\1", data, count=1)
    names = [into.schema.columns[i].name for i in into.targets]
    if not data.strip(b"\r\n"):
        return updates(into, {}, 0)
    first_line = 2 if fmt.header else 1
    bad_rows: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad_rows.append(row)
        return "error"

    csv = fmt.kind == "csv"
    parse_options = pacsv.ParseOptions(
        delimiter=fmt.delimiter,
        quote_char=fmt.quote if csv else False,
        double_quote=csv and fmt.escape == fmt.quote,
        escape_char=fmt.escape if csv and fmt.escape != fmt.quote else False,
        newlines_in_values=csv,
        invalid_row_handler=on_invalid,
    )
    read_options = pacsv.ReadOptions(
        column_names=[f"f{i}" for i in range(len(names))],
        skip_rows=1 if fmt.header else 0,
        block_size=BLOCK_BYTES,
    )
    convert_options = pacsv.ConvertOptions(
        column_types={f"f{i}": pa.string() for i in range(len(names))},
        null_values=[fmt.null],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    try:
        fields = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=read_options,
            parse_options=parse_options,
            convert_options=convert_options,
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        if bad_rows and bad_rows[0].number is None:
            # Threads read blocks without knowing their line numbers: read again, in order,
            # to name the line (only ever on the way to an error).
            bad_rows.clear()
            read_options.use_threads = False
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError):
                pacsv.read_csv(
                    pa.py_buffer(data),
                    read_options=read_options,
                    parse_options=parse_options,
                    convert_options=convert_options,
                )
        raise _shape_error(exc, bad_rows, into, len(names)) from None
    columns: dict[int, pa.Array] = {}
    for index, target in enumerate(into.targets):
        strings = fields.column(index).combine_chunks()
        if not csv:
            strings = _unescape_text(strings)
        columns[target] = convert_strings(strings, into, target, first_line)
    return updates(into, columns, fields.num_rows, first_line)


def _shape_error(exc: Exception, bad_rows: Sequence[Any], into: CopyInput, width: int) -> SqlError:
    if bad_rows:
        row = bad_rows[0]
        message = (
            "extra data after last expected column"
            if row.actual_columns > width
            else f"missing data for column "
            f'"{into.schema.columns[into.targets[row.actual_columns]].name}"'
        )
        return into.error(BAD_COPY_FILE_FORMAT, message, row.number)
    text = str(exc).split("\n", 1)[0]
    return into.error(BAD_COPY_FILE_FORMAT, f"the input is not valid: {text}", None)


def _unescape_text(strings: pa.Array) -> pa.Array:
    """PostgreSQL's text format escapes (``\\t``, ``\\n``, ``\\\\``, octal, ``\\x``) undone; the
    fast path is a column with no backslash at all."""
    if strings.null_count == len(strings) or not pc.any(pc.match_substring(strings, "\\")).as_py():
        return strings
    values = [
        None if value is None else _TEXT_ESCAPE.sub(_unescape_one, value)
        for value in strings.to_pylist()
    ]
    return pa.array(values, pa.string())


def _unescape_one(match: re.Match[str]) -> str:
    octal, hexa, other = match.groups()
    if octal is not None:
        return chr(int(octal, 8) & 0xFF)
    if hexa is not None:
        return chr(int(hexa, 16))
    return _SIMPLE_ESCAPES.get(other, other)


def convert_strings(strings: pa.Array, into: CopyInput, target: int, first_line: int) -> pa.Array:
    """A column of text read as the column's type."""
    column = into.schema.columns[target]
    arrow_type = column.arrow_type
    if column.type is ColumnType.TEXT:
        return strings
    if column.type in _ARROW_CASTS:
        try:
            cast = pc.cast(strings, arrow_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            cast = None  # some value Arrow does not read: PostgreSQL's rules decide, one by one
        if cast is not None and _reads_as_postgres(strings, cast, column.type):
            return cast
    scalar = _scalar_type(column)
    values: list[Any] = []
    for offset, text in enumerate(strings.to_pylist()):
        if text is None:
            values.append(None)
            continue
        try:
            values.append(parse_text(text, scalar))
        except SqlError as exc:
            raise into.error(
                exc.code, exc.message, first_line + offset, f"{column.name}: {text[:60]!r}"
            ) from None
    return pa.array(values, arrow_type)


def _reads_as_postgres(strings: pa.Array, cast: pa.Array, kind: ColumnType) -> bool:
    """Whether a successful cast read the text as PostgreSQL would: Arrow also takes
    hexadecimal integers, and reads a double beyond range as infinity where PostgreSQL
    rejects it."""
    if kind is ColumnType.INT64:
        return not pc.any(pc.match_substring_regex(strings, "[xX]")).as_py()
    if kind is ColumnType.FLOAT64:
        return not pc.any(pc.is_inf(cast)).as_py()
    return True


def _scalar_type(column: Column) -> ScalarType:
    kind = column.type
    return ScalarType(
        kind, True, column.precision if kind is ColumnType.DECIMAL else 0, column.scale
    )


def updates(
    into: CopyInput, columns: dict[int, pa.Array], rows: int, first_line: int = 1
) -> pa.Table:
    """The update batch: the given columns, NULL for the others, every row at time 0 with
    diff 1. 23502 for a NULL in a NOT NULL column."""
    arrays = []
    for index, column in enumerate(into.schema.columns):
        values = columns.get(index)
        if values is None:
            values = pa.nulls(rows, column.arrow_type)
        if not column.nullable and values.null_count:
            first = pc.index(pc.is_null(values), True).as_py()
            raise into.error(
                NOT_NULL_VIOLATION,
                f'null value in column "{column.name}" of relation "{into.label}" violates '
                "not-null constraint",
                first_line + first,
            )
        arrays.append(values)
    arrays.append(pa.repeat(pa.scalar(0, TIME_TYPE), rows))
    arrays.append(pa.repeat(pa.scalar(1, DIFF_TYPE), rows))
    return pa.Table.from_arrays(arrays, schema=into.schema.update_schema())


def decode_arrow(table: pa.Table, into: CopyInput, what: str) -> pa.Table:
    """An Arrow table (read from Parquet) matched to the target columns by name and cast to
    their types."""
    available = {name.lower(): name for name in table.column_names}
    columns: dict[int, pa.Array] = {}
    for target in into.targets:
        column = into.schema.columns[target]
        name = column.name if column.name in table.column_names else available.get(column.name)
        if name is None:
            raise into.error(UNDEFINED_COLUMN, f'{what} has no column "{column.name}"', None)
        source = table.column(name).combine_chunks()
        try:
            columns[target] = pc.cast(source, column.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if pa.types.is_string(source.type) or pa.types.is_large_string(source.type):
                columns[target] = convert_strings(pc.cast(source, pa.string()), into, target, 1)
                continue
            raise into.error(
                "42804",
                f"{what} column {name} of type {source.type} does not convert to "
                f"{column.arrow_type}: {str(exc).splitlines()[0]}",
                None,
                column.name,
            ) from None
    return updates(into, columns, table.num_rows)
