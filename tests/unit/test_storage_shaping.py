"""Row filters and projections as subscribers and snapshot readers ask for them."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest

from services.storage.shaping import compile_shape
from tidemark.clients.storage import row_filter, where
from tidemark.columnar import (
    Column,
    ColumnType,
    RelationSchema,
    table_from_updates,
    updates_from_table,
)
from tidemark.errors import InvalidArgument
from tidemark.v1 import storage_pb2

SCHEMA = RelationSchema(
    [
        Column("n", ColumnType.INT64),
        Column("name", ColumnType.TEXT),
        Column("amount", ColumnType.DECIMAL, precision=10, scale=2),
        Column("day", ColumnType.DATE),
        Column("at", ColumnType.TIMESTAMP),
        Column("ok", ColumnType.BOOL),
    ]
)
ROWS = [
    (
        1,
        "a",
        decimal.Decimal("1.50"),
        datetime.date(2024, 1, 1),
        datetime.datetime(2024, 1, 1),
        True,
    ),
    (
        2,
        "b",
        decimal.Decimal("2.00"),
        datetime.date(2024, 1, 2),
        datetime.datetime(2024, 1, 2),
        False,
    ),
    (None, None, None, None, None, None),
    (
        3,
        "a",
        decimal.Decimal("9.99"),
        datetime.date(2024, 1, 3),
        datetime.datetime(2024, 1, 3),
        True,
    ),
]
TABLE = table_from_updates(SCHEMA, [(row, 5, 1) for row in ROWS])


def kept(*predicates: storage_pb2.ColumnPredicate) -> list[Any]:
    shape = compile_shape(SCHEMA, (), row_filter(*predicates))
    return [row[0] for row, _, _ in updates_from_table(shape.apply(TABLE))]


@pytest.mark.parametrize(
    ("predicate", "expected"),
    [
        (where("n", "=", 2), [2]),
        (where("n", "!=", 2), [1, 3]),  # NULL compares to nothing
        (where("n", "<", 2), [1]),
        (where("n", "<=", 2), [1, 2]),
        (where("n", ">", 2), [3]),
        (where("n", ">=", 2), [2, 3]),
        (where("n", "is null"), [None]),
        (where("n", "is not null"), [1, 2, 3]),
        (where("name", "in", ["a", "z"]), [1, 3]),
        (where("amount", ">", decimal.Decimal("1.75")), [2, 3]),
        (where("amount", "<", 2), [1]),
        (where("day", ">=", datetime.date(2024, 1, 2)), [2, 3]),
        (where("at", "<", datetime.datetime(2024, 1, 2)), [1]),
        (where("ok", "=", True), [1, 3]),
    ],
)
def test_each_operator(predicate: storage_pb2.ColumnPredicate, expected: list[Any]) -> None:
    assert kept(predicate) == expected


def test_predicates_are_a_conjunction() -> None:
    assert kept(where("name", "=", "a"), where("n", ">", 1)) == [3]
    assert kept() == [1, 2, None, 3]


def test_projection_keeps_order_and_consolidates() -> None:
    shape = compile_shape(SCHEMA, ["ok", "name"], None)
    assert shape.schema.names == ["ok", "name"]
    out = updates_from_table(shape.apply(TABLE))
    assert sorted(out, key=repr) == sorted(
        [((True, "a"), 5, 2), ((False, "b"), 5, 1), ((None, None), 5, 1)], key=repr
    )


@pytest.mark.parametrize(
    ("columns", "predicate", "message"),
    [
        (["nope"], None, "no column named"),
        (["n", "n"], None, "twice"),
        ([], where("nope", "=", 1), "no column named"),
        ([], where("n", "=", "text"), "cannot be compared"),
        ([], where("day", "=", 3), "cannot be compared"),
        ([], storage_pb2.ColumnPredicate(column="n", op=storage_pb2.FILTER_OP_EQ), "no value"),
        ([], storage_pb2.ColumnPredicate(column="n"), "no operator"),
        ([], where("n", "in", []), "at least one value"),
        ([], where("amount", "=", decimal.Decimal("1.234")), "constant for column"),
    ],
)
def test_bad_shapes(
    columns: list[str], predicate: storage_pb2.ColumnPredicate | None, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        compile_shape(SCHEMA, columns, row_filter(predicate) if predicate else None)


def test_unknown_filter_operator_in_the_client() -> None:
    with pytest.raises(InvalidArgument, match="unknown filter operator"):
        where("n", "~", 1)
