"""PostgreSQL column types as Tidemark columns, and their text format as row values."""

from __future__ import annotations

import datetime
import decimal

import pytest

from tidemark.columnar import Column, ColumnType
from tidemark.sources.postgres import types as pg
from tidemark.sources.postgres.types import UnsupportedType, text_parser, tidemark_column


def numeric_modifier(precision: int, scale: int) -> int:
    # atttypmod of numeric(p, s), as PostgreSQL stores it.
    return ((precision << 16) | scale) + 4


@pytest.mark.parametrize(
    ("oid", "expected"),
    [
        (pg.BOOL, ColumnType.BOOL),
        (pg.INT2, ColumnType.INT64),
        (pg.INT4, ColumnType.INT64),
        (pg.INT8, ColumnType.INT64),
        (pg.FLOAT4, ColumnType.FLOAT64),
        (pg.FLOAT8, ColumnType.FLOAT64),
        (pg.TEXT, ColumnType.TEXT),
        (pg.VARCHAR, ColumnType.TEXT),
        (pg.BPCHAR, ColumnType.TEXT),
        (pg.UUID, ColumnType.TEXT),
        (pg.BYTEA, ColumnType.BYTES),
        (pg.DATE, ColumnType.DATE),
        (pg.TIMESTAMP, ColumnType.TIMESTAMP),
        (pg.JSON, ColumnType.JSON),
        (pg.JSONB, ColumnType.JSON),
    ],
)
def test_type_families(oid: int, expected: ColumnType) -> None:
    assert tidemark_column("c", oid, -1, "t") == Column("c", expected)


def test_numeric_precision_and_scale() -> None:
    assert tidemark_column("n", pg.NUMERIC, numeric_modifier(12, 3), "numeric(12,3)") == Column(
        "n", ColumnType.DECIMAL, True, 12, 3
    )
    assert tidemark_column("n", pg.NUMERIC, -1, "numeric") == Column(
        "n", ColumnType.DECIMAL, True, 38, 10
    )
    with pytest.raises(UnsupportedType):
        tidemark_column("n", pg.NUMERIC, numeric_modifier(50, 2), "numeric(50,2)")


@pytest.mark.parametrize(
    ("oid", "name"),
    [(1184, "timestamp with time zone"), (600, "point"), (1007, "integer[]"), (3904, "int4range")],
)
def test_unsupported_types_name_the_column_and_type(oid: int, name: str) -> None:
    with pytest.raises(UnsupportedType) as error:
        tidemark_column("c", oid, -1, name)
    assert str(error.value) == f"column 'c' has type {name}, which Tidemark does not have"


def test_text_values() -> None:
    assert text_parser(Column("b", ColumnType.BOOL))("t") is True
    assert text_parser(Column("b", ColumnType.BOOL))("true") is True
    assert text_parser(Column("b", ColumnType.BOOL))("f") is False
    assert text_parser(Column("i", ColumnType.INT64))("-42") == -42
    assert text_parser(Column("f", ColumnType.FLOAT64))("NaN") != 0.0
    assert text_parser(Column("f", ColumnType.FLOAT64))("-Infinity") == float("-inf")
    money = text_parser(Column("d", ColumnType.DECIMAL, True, 10, 2))
    assert money("12.5") == decimal.Decimal("12.50")
    with pytest.raises(ValueError, match="no Tidemark counterpart"):
        money("NaN")
    assert text_parser(Column("x", ColumnType.BYTES))("\\x00ff10") == b"\x00\xff\x10"
    assert text_parser(Column("d", ColumnType.DATE))("2024-02-29") == datetime.date(2024, 2, 29)
    assert text_parser(Column("t", ColumnType.TIMESTAMP))(
        "2024-02-29 23:59:59.000001"
    ) == datetime.datetime(2024, 2, 29, 23, 59, 59, 1)
    assert text_parser(Column("j", ColumnType.JSON))('{"a": [1]}') == '{"a": [1]}'
