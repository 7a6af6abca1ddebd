"""Casts between types. A cast that fails gives NULL; a pair of types the contract does not
list is rejected when the plan is compiled."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from services.compute.dataflow.functions import decimals, temporal
from services.compute.dataflow.functions.numeric import INT64_MAX, INT64_MIN
from services.compute.dataflow.ordering import canonical_float
from tidemark.columnar.schema import ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.datum import is_json_text
from tidemark.plan.scalar_types import ScalarType

Converter = Callable[[Any], Any]

_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_FLOAT_WORD = re.compile(r"nan|[+-]?(infinity|inf)", re.IGNORECASE)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?"
)
_BYTES = re.compile(r"\\x((?:[0-9a-fA-F]{2})*)")


# -- to text ---------------------------------------------------------------------------------


def bool_to_text(value: bool) -> str:
    return "true" if value else "false"


def float_to_text(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def decimal_to_text(scale: int) -> Converter:
    def convert(value: Decimal) -> str:
        fixed = decimals.EXACT.quantize(value, Decimal(1).scaleb(-scale))
        if fixed.is_zero():
            fixed = abs(fixed)
        return format(fixed, "f")

    return convert


def bytes_to_text(value: bytes) -> str:
    return "\\x" + value.hex()


def date_to_text(value: datetime.date) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"


def timestamp_to_text(value: datetime.datetime) -> str:
    text = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    )
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text


# -- from text -------------------------------------------------------------------------------


def text_to_bool(text: str) -> bool | None:
    word = text.strip(" ").lower()
    if word == "true":
        return True
    if word == "false":
        return False
    return None


def text_to_int(text: str) -> int | None:
    word = text.strip(" ")
    if not _INTEGER.fullmatch(word):
        return None
    value = int(word)
    return value if INT64_MIN <= value <= INT64_MAX else None


def text_to_float(text: str) -> float | None:
    word = text.strip(" ")
    if _NUMBER.fullmatch(word):
        value = float(word)
        return None if math.isinf(value) else canonical_float(value)
    if _FLOAT_WORD.fullmatch(word):
        return canonical_float(float(word))
    return None


def text_to_decimal(precision: int, scale: int) -> Converter:
    def convert(text: str) -> Decimal | None:
        word = text.strip(" ")
        if not _NUMBER.fullmatch(word):
            return None
        return decimals.at_scale(Decimal(word), scale, precision)

    return convert


def text_to_date(text: str) -> datetime.date | None:
    match = _DATE.fullmatch(text.strip(" "))
    if match is None:
        return None
    try:
        return datetime.date(*(int(part) for part in match.groups()))
    except ValueError:
        return None


def text_to_timestamp(text: str) -> datetime.datetime | None:
    match = _TIMESTAMP.fullmatch(text.strip(" "))
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction = match.groups()
    micros = int(fraction.ljust(6, "0")) if fraction else 0
    try:
        return datetime.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micros
        )
    except ValueError:
        return None


def text_to_bytes(text: str) -> bytes | None:
    match = _BYTES.fullmatch(text.strip(" "))
    if match is None:
        return None
    return bytes.fromhex(match.group(1))


def text_to_json(text: str) -> str | None:
    return text if is_json_text(text) else None


# -- numeric ---------------------------------------------------------------------------------


def float_to_int(value: float) -> int | None:
    if math.isnan(value) or math.isinf(value):
        return None
    rounded = round(value)
    return rounded if INT64_MIN <= rounded <= INT64_MAX else None


def decimal_to_int(value: Decimal) -> int | None:
    rounded = int(value.to_integral_value(rounding=ROUND_HALF_EVEN, context=decimals.EXACT))
    return rounded if INT64_MIN <= rounded <= INT64_MAX else None


def to_decimal(source: ColumnType, precision: int, scale: int) -> Converter:
    def from_int(value: int) -> Decimal | None:
        return decimals.at_scale(Decimal(value), scale, precision)

    def from_decimal(value: Decimal) -> Decimal | None:
        return decimals.at_scale(value, scale, precision)

    def from_float(value: float) -> Decimal | None:
        if math.isnan(value) or math.isinf(value):
            return None
        return decimals.at_scale(Decimal(repr(value)), scale, precision)

    if source is ColumnType.INT64:
        return from_int
    return from_decimal if source is ColumnType.DECIMAL else from_float


def _to_float(value: Any) -> float:
    return canonical_float(float(value))


def _identity(value: Any) -> Any:
    return value


_TO_TEXT: dict[ColumnType, Converter] = {
    ColumnType.BOOL: bool_to_text,
    ColumnType.INT64: str,
    ColumnType.FLOAT64: float_to_text,
    ColumnType.TEXT: _identity,
    ColumnType.BYTES: bytes_to_text,
    ColumnType.DATE: date_to_text,
    ColumnType.TIMESTAMP: timestamp_to_text,
    ColumnType.JSON: _identity,
}

_FROM_TEXT: dict[ColumnType, Converter] = {
    ColumnType.BOOL: text_to_bool,
    ColumnType.INT64: text_to_int,
    ColumnType.FLOAT64: text_to_float,
    ColumnType.DATE: text_to_date,
    ColumnType.TIMESTAMP: text_to_timestamp,
    ColumnType.BYTES: text_to_bytes,
    ColumnType.JSON: text_to_json,
}

_NUMERIC = (ColumnType.INT64, ColumnType.DECIMAL, ColumnType.FLOAT64)


def cast_converter(source: ScalarType, target: ScalarType) -> tuple[Converter, bool]:
    """The conversion of a non-NULL ``source`` value to ``target``, and whether it can fail
    (give NULL for a non-NULL input). Raises ``InvalidArgument`` for a pair with no cast."""
    s, t = source.kind, target.kind
    if t is ColumnType.DECIMAL and s in _NUMERIC:
        if s is ColumnType.DECIMAL and target.scale >= source.scale:
            safe = target.precision - target.scale >= source.precision - source.scale
        elif s is ColumnType.INT64:
            safe = target.precision - target.scale >= 19
        else:
            safe = False
        return to_decimal(s, target.precision, target.scale), not safe
    if s is t:
        return _identity, False
    if t is ColumnType.TEXT:
        if s is ColumnType.DECIMAL:
            return decimal_to_text(source.scale), False
        return _TO_TEXT[s], False
    if s is ColumnType.TEXT and t is ColumnType.DECIMAL:
        return text_to_decimal(target.precision, target.scale), True
    if s is ColumnType.TEXT and t in _FROM_TEXT:
        return _FROM_TEXT[t], True
    if t is ColumnType.FLOAT64 and s in _NUMERIC:
        return _to_float, False
    if t is ColumnType.INT64 and s is ColumnType.FLOAT64:
        return float_to_int, True
    if t is ColumnType.INT64 and s is ColumnType.DECIMAL:
        return decimal_to_int, source.precision - source.scale > 18
    if s is ColumnType.DATE and t is ColumnType.TIMESTAMP:
        return temporal.date_to_timestamp, False
    if s is ColumnType.TIMESTAMP and t is ColumnType.DATE:
        return temporal.timestamp_to_date, False
    raise InvalidArgument(f"cast: no cast from {source.describe()} to {target.describe()}")
