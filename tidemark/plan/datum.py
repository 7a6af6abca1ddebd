"""``Datum`` messages to and from Python values, and their validation.

Python values by column type: BOOL ``bool``, INT64 ``int``, FLOAT64 ``float``, DECIMAL
``decimal.Decimal``, TEXT and JSON ``str``, BYTES ``bytes``, DATE ``datetime.date``, TIMESTAMP
``datetime.datetime`` (naive UTC); ``None`` is NULL (the same forms as
:mod:`tidemark.columnar.rows`).
"""

from __future__ import annotations

import datetime
import json
import re
from decimal import Decimal
from typing import Any

from tidemark.columnar import Column, ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType, decimal_literal_type
from tidemark.v1 import plan_pb2

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
EPOCH_DATE = datetime.date(1970, 1, 1)
EPOCH = datetime.datetime(1970, 1, 1)
ONE_MICROSECOND = datetime.timedelta(microseconds=1)
MIN_DAYS = (datetime.date.min - EPOCH_DATE).days
MAX_DAYS = (datetime.date.max - EPOCH_DATE).days
MIN_MICROS = (datetime.datetime.min - EPOCH) // ONE_MICROSECOND
MAX_MICROS = (datetime.datetime.max - EPOCH) // ONE_MICROSECOND

_PLAIN_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")

# The oneof field that holds a value of each type.
VALUE_FIELDS: dict[ColumnType, str] = {
    ColumnType.BOOL: "bool_value",
    ColumnType.INT64: "int64_value",
    ColumnType.FLOAT64: "float64_value",
    ColumnType.DECIMAL: "decimal_value",
    ColumnType.TEXT: "text_value",
    ColumnType.BYTES: "bytes_value",
    ColumnType.DATE: "date_value",
    ColumnType.TIMESTAMP: "timestamp_value",
    ColumnType.JSON: "json_value",
}


def days_from_date(value: datetime.date) -> int:
    return (value - EPOCH_DATE).days


def date_from_days(days: int) -> datetime.date:
    if not MIN_DAYS <= days <= MAX_DAYS:
        raise InvalidArgument(f"date {days} days from 1970-01-01 is outside years 1..9999")
    return EPOCH_DATE + datetime.timedelta(days=days)


def micros_from_timestamp(value: datetime.datetime) -> int:
    return (value - EPOCH) // ONE_MICROSECOND


def timestamp_from_micros(micros: int) -> datetime.datetime:
    if not MIN_MICROS <= micros <= MAX_MICROS:
        raise InvalidArgument(f"timestamp {micros} us from the epoch is outside years 1..9999")
    return EPOCH + datetime.timedelta(microseconds=micros)


def is_json_text(text: str) -> bool:
    """Whether ``text`` is one JSON value per RFC 8259 (no NaN or Infinity)."""

    def reject(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=reject)
    except (ValueError, RecursionError):
        return False
    return True


def decimal_fits(value: Decimal, precision: int, scale: int) -> bool:
    """Whether ``value`` has at most ``scale`` fractional and ``precision`` digits in all
    (trailing fractional zeros do not count)."""
    if not value.is_finite():
        return False
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)))
    if coefficient == 0:
        return True
    while coefficient % 10 == 0:
        coefficient //= 10
        exponent += 1
    fractional = max(0, -exponent)
    integer = max(0, len(str(coefficient)) + exponent)
    return fractional <= scale and integer <= precision - scale


def _kind_of(kind: ColumnType | Column | ScalarType) -> ColumnType:
    if isinstance(kind, Column):
        return kind.type
    if isinstance(kind, ScalarType):
        return kind.kind
    return kind


def to_datum(value: Any, kind: ColumnType | Column | ScalarType) -> plan_pb2.Datum:
    """``value`` as a Datum of type ``kind`` (``None`` gives NULL). Decimals given a Column or
    ScalarType must fit its precision and scale. Raises ``InvalidArgument`` for a value of the
    wrong Python type or out of range."""
    column_type = _kind_of(kind)
    datum = plan_pb2.Datum(type=column_type.value)  # type: ignore[arg-type]
    if value is None:
        return datum
    wrong = InvalidArgument(f"{value!r} is not a {column_type.name} value")
    if column_type is ColumnType.BOOL:
        if not isinstance(value, bool):
            raise wrong
        datum.bool_value = value
    elif column_type is ColumnType.INT64:
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidArgument(f"{value} is outside the INT64 range")
        datum.int64_value = value
    elif column_type is ColumnType.FLOAT64:
        if not isinstance(value, float | int) or isinstance(value, bool):
            raise wrong
        datum.float64_value = float(value)
    elif column_type is ColumnType.DECIMAL:
        datum.decimal_value = _decimal_text(value, kind)
    elif column_type in (ColumnType.TEXT, ColumnType.JSON):
        if not isinstance(value, str):
            raise wrong
        if column_type is ColumnType.JSON:
            if not is_json_text(value):
                raise InvalidArgument(f"{value!r} is not a JSON document")
            datum.json_value = value
        else:
            datum.text_value = value
    elif column_type is ColumnType.BYTES:
        if not isinstance(value, bytes | bytearray):
            raise wrong
        datum.bytes_value = bytes(value)
    elif column_type is ColumnType.DATE:
        if not isinstance(value, datetime.date) or isinstance(value, datetime.datetime):
            raise wrong
        datum.date_value = days_from_date(value)
    elif column_type is ColumnType.TIMESTAMP:
        if not isinstance(value, datetime.datetime):
            raise wrong
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        datum.timestamp_value = micros_from_timestamp(value)
    return datum


def _decimal_text(value: Any, kind: ColumnType | Column | ScalarType) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = Decimal(value)
    if not isinstance(value, Decimal) or not value.is_finite():
        raise InvalidArgument(f"{value!r} is not a finite decimal.Decimal")
    text = format(value, "f")
    if isinstance(kind, Column | ScalarType):
        if not decimal_fits(value, kind.precision, kind.scale):
            raise InvalidArgument(f"{value} does not fit DECIMAL({kind.precision}, {kind.scale})")
        # Written with the column's scale so the literal's own type has it too.
        whole, _, fraction = text.partition(".")
        fraction = fraction.rstrip("0").ljust(kind.scale, "0")
        text = f"{whole}.{fraction}" if fraction else whole
    _check_decimal_text(text)
    return text


def _check_decimal_text(text: str) -> None:
    if not _PLAIN_DECIMAL.fullmatch(text):
        raise InvalidArgument(f"decimal datum {text!r} is not a plain decimal like -12.50")
    if sum(c.isdigit() for c in text.lstrip("-").lstrip("0")) > MAX_PRECISION:
        raise InvalidArgument(f"decimal datum {text!r} has more than {MAX_PRECISION} digits")


def datum_kind(datum: plan_pb2.Datum) -> ColumnType:
    try:
        return ColumnType(datum.type)
    except ValueError:
        raise InvalidArgument(f"datum has no type (got {datum.type})") from None


def from_datum(datum: plan_pb2.Datum) -> Any:
    """The Python value a Datum holds (``None`` for NULL). Raises ``InvalidArgument`` when the
    set field does not match the type or the value is malformed."""
    kind = datum_kind(datum)
    field = datum.WhichOneof("value")
    if field is None:
        return None
    if field != VALUE_FIELDS[kind]:
        raise InvalidArgument(f"a {kind.name} datum cannot hold {field}")
    if kind is ColumnType.DECIMAL:
        _check_decimal_text(datum.decimal_value)
        return Decimal(datum.decimal_value)
    if kind is ColumnType.FLOAT64:
        return datum.float64_value
    if kind is ColumnType.DATE:
        return date_from_days(datum.date_value)
    if kind is ColumnType.TIMESTAMP:
        return timestamp_from_micros(datum.timestamp_value)
    if kind is ColumnType.JSON and not is_json_text(datum.json_value):
        raise InvalidArgument(f"JSON datum {datum.json_value!r} is not a JSON document")
    return getattr(datum, field)


def datum_type(datum: plan_pb2.Datum) -> ScalarType:
    """A literal's type (validating it): its kind, nullable only when NULL; a decimal's
    precision and scale come from its text, DECIMAL(38, 0) for NULL."""
    value = from_datum(datum)
    kind = datum_kind(datum)
    if kind is ColumnType.DECIMAL:
        if value is None:
            return ScalarType.decimal(MAX_PRECISION, 0)
        return decimal_literal_type(datum.decimal_value, nullable=False)
    return ScalarType(kind, nullable=value is None)


def check_value_fits(value: Any, column: Column) -> None:
    """Raises ``InvalidArgument`` unless a decoded value may sit in ``column``."""
    if value is None:
        if not column.nullable:
            raise InvalidArgument(f"NULL in NOT NULL column {column.name!r}")
        return
    if column.type is ColumnType.DECIMAL and not decimal_fits(
        value, column.precision, column.scale
    ):
        raise InvalidArgument(
            f"{value} does not fit column {column.name!r} "
            f"DECIMAL({column.precision}, {column.scale})"
        )
