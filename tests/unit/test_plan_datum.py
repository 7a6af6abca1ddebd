"""Datum messages to and from Python values, for every column type, and their validation."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.columnar import Column, ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan import datum_type, from_datum, to_datum
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType

ROUND_TRIPS: list[tuple[Any, ColumnType]] = [
    (True, T.BOOL),
    (False, T.BOOL),
    (0, T.INT64),
    (2**63 - 1, T.INT64),
    (-(2**63), T.INT64),
    (0.1, T.FLOAT64),
    (math.inf, T.FLOAT64),
    (-1e-320, T.FLOAT64),
    (Decimal("-12.50"), T.DECIMAL),
    (Decimal("9" * 38), T.DECIMAL),
    (Decimal("0.000"), T.DECIMAL),
    ("", T.TEXT),
    ("héllo \x00 wörld", T.TEXT),
    (b"", T.BYTES),
    (b"\x00\xff", T.BYTES),
    (datetime.date(1, 1, 1), T.DATE),
    (datetime.date(9999, 12, 31), T.DATE),
    (datetime.date(1969, 12, 31), T.DATE),
    (datetime.datetime(1, 1, 1), T.TIMESTAMP),
    (datetime.datetime(9999, 12, 31, 23, 59, 59, 999999), T.TIMESTAMP),
    (datetime.datetime(1969, 12, 31, 23, 59, 59, 1), T.TIMESTAMP),
    ('{"a": [1, null]}', T.JSON),
]


@pytest.mark.parametrize(("value", "kind"), ROUND_TRIPS)
def test_round_trip(value: Any, kind: ColumnType) -> None:
    datum = to_datum(value, kind)
    assert datum.type == kind.value
    back = from_datum(plan_pb2.Datum.FromString(datum.SerializeToString()))
    assert type(back) is type(value)
    assert back == value
    if isinstance(value, Decimal):
        assert str(back) == str(value)  # trailing zeros kept


def test_nan_round_trips() -> None:
    assert math.isnan(from_datum(to_datum(float("nan"), T.FLOAT64)))


@pytest.mark.parametrize("kind", list(ColumnType))
def test_null_of_every_type(kind: ColumnType) -> None:
    datum = to_datum(None, kind)
    assert datum.WhichOneof("value") is None
    assert from_datum(datum) is None
    assert datum_type(datum).nullable


def test_wire_forms() -> None:
    assert to_datum(datetime.date(1970, 1, 2), T.DATE).date_value == 1
    assert to_datum(datetime.datetime(1970, 1, 1, 0, 0, 1), T.TIMESTAMP).timestamp_value == 10**6
    assert to_datum(Decimal("1E+2"), T.DECIMAL).decimal_value == "100"
    assert to_datum(7, T.DECIMAL).decimal_value == "7"
    assert to_datum(3, T.FLOAT64).float64_value == 3.0
    aware = datetime.datetime(2020, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert from_datum(to_datum(aware, T.TIMESTAMP)) == datetime.datetime(2020, 1, 1)


def test_decimal_with_a_column_type_is_written_at_its_scale() -> None:
    column = Column("d", T.DECIMAL, True, 10, 2)
    assert to_datum(Decimal("1.5"), column).decimal_value == "1.50"
    assert to_datum(Decimal("-3"), column).decimal_value == "-3.00"
    assert to_datum(Decimal("1.500"), column).decimal_value == "1.50"
    with pytest.raises(InvalidArgument, match="does not fit"):
        to_datum(Decimal("1.555"), column)
    with pytest.raises(InvalidArgument, match="does not fit"):
        to_datum(Decimal("123456789"), column)


BAD_VALUES: list[tuple[Any, ColumnType]] = [
    (1, T.BOOL),
    (True, T.INT64),
    (1.0, T.INT64),
    (2**63, T.INT64),
    ("1", T.FLOAT64),
    (1.5, T.DECIMAL),
    (Decimal("NaN"), T.DECIMAL),
    (Decimal("1" * 39), T.DECIMAL),
    (b"x", T.TEXT),
    ("x", T.BYTES),
    (datetime.datetime(2020, 1, 1), T.DATE),
    (datetime.date(2020, 1, 1), T.TIMESTAMP),
    ("{not json", T.JSON),
    ("NaN", T.JSON),
]


@pytest.mark.parametrize(("value", "kind"), BAD_VALUES)
def test_rejects_bad_values(value: Any, kind: ColumnType) -> None:
    with pytest.raises(InvalidArgument):
        to_datum(value, kind)


BAD_DATUMS = [
    plan_pb2.Datum(int64_value=1),  # no type
    plan_pb2.Datum(type=T.INT64.value, text_value="1"),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.DECIMAL.value, decimal_value="1e5"),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.DECIMAL.value, decimal_value="+1"),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.DECIMAL.value, decimal_value="1."),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.DATE.value, date_value=3_000_000),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.TIMESTAMP.value, timestamp_value=-(2**62)),  # type: ignore[arg-type]
    plan_pb2.Datum(type=T.JSON.value, json_value="[1,"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("datum", BAD_DATUMS)
def test_rejects_bad_datums(datum: plan_pb2.Datum) -> None:
    with pytest.raises(InvalidArgument):
        from_datum(datum)


LITERAL_TYPES = [
    ("-12.50", ScalarType.decimal(4, 2, nullable=False)),
    ("0.05", ScalarType.decimal(2, 2, nullable=False)),
    ("0", ScalarType.decimal(1, 0, nullable=False)),
    ("007", ScalarType.decimal(1, 0, nullable=False)),
    ("123", ScalarType.decimal(3, 0, nullable=False)),
]


@pytest.mark.parametrize(("text", "expected"), LITERAL_TYPES)
def test_decimal_literal_types(text: str, expected: ScalarType) -> None:
    datum = plan_pb2.Datum(type=T.DECIMAL.value, decimal_value=text)  # type: ignore[arg-type]
    assert datum_type(datum) == expected


def test_literal_types() -> None:
    assert datum_type(to_datum(None, T.DECIMAL)) == ScalarType.decimal(38, 0)
    assert datum_type(to_datum(1, T.INT64)) == ScalarType(T.INT64, nullable=False)
    assert datum_type(to_datum(None, T.TEXT)) == ScalarType(T.TEXT, nullable=True)


@given(
    st.decimals(allow_nan=False, allow_infinity=False, places=4).filter(
        lambda d: abs(d) < Decimal(10) ** 30
    )
)
def test_random_decimals_round_trip(value: Decimal) -> None:
    back = from_datum(to_datum(value, T.DECIMAL))
    assert back == value
    assert datum_type(to_datum(value, T.DECIMAL)).scale == max(0, -value.as_tuple().exponent)  # type: ignore[operator]


@given(st.datetimes())
def test_random_timestamps_round_trip(value: datetime.datetime) -> None:
    assert from_datum(to_datum(value, T.TIMESTAMP)) == value
