"""PostgreSQL column types as Tidemark columns, and their text format as Python values.

Values cross in PostgreSQL's text format both in the initial snapshot (``col::text``) and in
``pgoutput`` (which sends text unless asked for binary), so one decoder serves both and the
snapshot and the stream can never disagree on a value.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import Any

from tidemark.columnar import Column, ColumnType

# pg_type OIDs (stable across PostgreSQL versions: they are fixed in pg_type.dat).
BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIMESTAMP, NUMERIC, UUID, JSONB = (
    114,
    700,
    701,
    1042,
    1043,
    1082,
    1114,
    1700,
    2950,
    3802,
)

_FAMILIES: dict[int, ColumnType] = {
    BOOL: ColumnType.BOOL,
    INT2: ColumnType.INT64,
    INT4: ColumnType.INT64,
    INT8: ColumnType.INT64,
    OID: ColumnType.INT64,
    FLOAT4: ColumnType.FLOAT64,
    FLOAT8: ColumnType.FLOAT64,
    TEXT: ColumnType.TEXT,
    VARCHAR: ColumnType.TEXT,
    BPCHAR: ColumnType.TEXT,
    NAME: ColumnType.TEXT,
    UUID: ColumnType.TEXT,
    BYTEA: ColumnType.BYTES,
    DATE: ColumnType.DATE,
    TIMESTAMP: ColumnType.TIMESTAMP,
    JSON: ColumnType.JSON,
    JSONB: ColumnType.JSON,
}

# An unconstrained ``numeric`` becomes what Tidemark's SQL makes of one: 38 digits, 10 after
# the point.
UNCONSTRAINED_NUMERIC = (38, 10)


class UnsupportedType(ValueError):
    def __init__(self, column: str, type_name: str) -> None:
        super().__init__(f"column {column!r} has type {type_name}, which Tidemark does not have")
        self.column = column
        self.type_name = type_name


def tidemark_column(name: str, type_oid: int, type_modifier: int, type_name: str) -> Column:
    """The Tidemark column for an upstream column; UnsupportedType for the types Tidemark has
    no counterpart of (e.g. timestamptz, arrays, ranges, geometric types)."""
    if type_oid == NUMERIC:
        if type_modifier < 4:
            precision, scale = UNCONSTRAINED_NUMERIC
        else:
            precision, scale = ((type_modifier - 4) >> 16) & 0xFFFF, (type_modifier - 4) & 0xFFFF
        if not 1 <= precision <= 38:
            raise UnsupportedType(name, f"{type_name} (precision above 38)")
        return Column(name, ColumnType.DECIMAL, True, precision, scale)
    family = _FAMILIES.get(type_oid)
    if family is None:
        raise UnsupportedType(name, type_name)
    return Column(name, family)


def _bool(text: str) -> bool:
    # boolout writes "t"/"f" (pgoutput); a ``::text`` cast writes "true"/"false" (snapshot).
    return text in ("t", "true")


def _bytea(text: str) -> bytes:
    # bytea_output = hex (the default since PostgreSQL 9.0): "\x0a0b".
    if not text.startswith("\\x"):
        raise ValueError(f"bytea not in hex format: {text[:20]!r}")
    return bytes.fromhex(text[2:])


def _date(text: str) -> datetime.date:
    return datetime.date.fromisoformat(text)


def _timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _numeric(scale: int) -> Callable[[str], decimal.Decimal]:
    quantum = decimal.Decimal(1).scaleb(-scale)

    def parse(text: str) -> decimal.Decimal:
        value = decimal.Decimal(text)
        if not value.is_finite():
            raise ValueError(f"numeric value {text} has no Tidemark counterpart")
        return value.quantize(quantum, rounding=decimal.ROUND_HALF_EVEN)

    return parse


_PARSERS: dict[ColumnType, Callable[[str], Any]] = {
    ColumnType.BOOL: _bool,
    ColumnType.INT64: int,
    ColumnType.FLOAT64: float,
    ColumnType.TEXT: str,
    ColumnType.JSON: str,
    ColumnType.BYTES: _bytea,
    ColumnType.DATE: _date,
    ColumnType.TIMESTAMP: _timestamp,
}


def text_parser(column: Column) -> Callable[[str], Any]:
    """Text format to the Python value a Tidemark row holds for ``column``."""
    if column.type is ColumnType.DECIMAL:
        return _numeric(column.scale)
    return _PARSERS[column.type]
