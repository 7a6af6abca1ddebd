"""Update batches as Python values: ``(row, time, diff)`` triples whose rows are tuples.

The form :mod:`tidemark.updates`, :mod:`tidemark.ptvc` and the CDCv2 reader work with, and
the convenient one for tests and small tools. Rows hold ``bool``, ``int``, ``float``,
``decimal.Decimal``, ``str`` (text and JSON), ``bytes``, ``datetime.date``,
``datetime.datetime`` (naive, microseconds) or ``None``. Hot paths stay in Arrow; these
conversions cost Python work per value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import pyarrow as pa

from tidemark.columnar.schema import DIFF_COLUMN, TIME_COLUMN, RelationSchema
from tidemark.columnar.updates import data_columns
from tidemark.errors import InvalidArgument

Row: TypeAlias = tuple[Any, ...]
RowUpdate: TypeAlias = tuple[Row, int, int]
"""``(row, time, diff)``."""


def table_from_updates(schema: RelationSchema, updates: Iterable[RowUpdate]) -> pa.Table:
    """An update batch of ``schema`` holding ``updates`` (not consolidated)."""
    held = list(updates)
    width = len(schema.columns)
    for row, _, _ in held:
        if not isinstance(row, tuple) or len(row) != width:
            raise InvalidArgument(f"row {row!r} is not a tuple of {width} values")
    target = schema.update_schema()
    values: list[list[Any]] = [[] for _ in range(width + 2)]
    if held:
        rows, times, diffs = zip(*held, strict=True)
        values = [list(column) for column in zip(*rows, strict=True)]
        values.append(list(times))
        values.append(list(diffs))
    arrays = []
    for field, column in zip(target, values, strict=True):
        try:
            arrays.append(pa.array(column, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise InvalidArgument(f"column {field.name!r} ({field.type}): {exc}") from None
    try:
        return pa.Table.from_arrays(arrays, schema=target)
    except (pa.ArrowInvalid, ValueError) as exc:
        raise InvalidArgument(str(exc)) from None


def updates_from_table(table: pa.Table) -> list[RowUpdate]:
    """The ``(row, time, diff)`` triples of an update batch, in table order."""
    names = data_columns(table)
    columns = [table.column(name).to_pylist() for name in names]
    times = table.column(TIME_COLUMN).to_pylist()
    diffs = table.column(DIFF_COLUMN).to_pylist()
    rows = zip(*columns, strict=True) if columns else ((),) * table.num_rows
    return list(zip(rows, times, diffs, strict=True))


def rows_from_table(table: pa.Table) -> list[Row]:
    """The data rows of a table (any ``time``/``diff`` columns left out)."""
    columns = [table.column(name).to_pylist() for name in data_columns(table)]
    return list(zip(*columns, strict=True))


def version_from_table(table: pa.Table) -> dict[Row, int]:
    """An update batch read as one collection version: ``{row: summed diff}``, no zeros
    (times are ignored; select them first)."""
    version: dict[Row, int] = {}
    for row, _, diff in updates_from_table(table):
        version[row] = version.get(row, 0) + diff
    return {row: n for row, n in version.items() if n != 0}
