"""Plan literals (``Datum``) as Python values with their types.

The engine reads Datums itself (rather than through a shared helper) so that a mistake in one
reading cannot hide in both the engine and the evaluator it is tested against.
"""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from typing import Any

from services.compute.dataflow.functions.casts import is_json
from services.compute.dataflow.ordering import canonical_float
from tidemark.columnar.schema import MAX_DECIMAL_PRECISION, ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_PLAIN_DECIMAL = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?")

_FIELD_OF: dict[ColumnType, str] = {
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


def decimal_type_of_text(integer_part: str, fraction: str) -> tuple[int, int]:
    """(precision, scale) of a decimal literal: scale is its fractional digits and precision
    those plus the integer digits without leading zeros (at least 1)."""
    scale = len(fraction)
    return max(1, scale + len(integer_part.lstrip("0"))), scale


def datum_value(datum: plan_pb2.Datum, where: str) -> tuple[Any, ScalarType]:
    """The value a Datum holds (None for NULL) and its type. Raises ``InvalidArgument`` when
    the value does not match the type."""
    try:
        kind = ColumnType(datum.type)
    except ValueError:
        raise InvalidArgument(f"{where}: literal has no type") from None
    field = datum.WhichOneof("value")
    if field is None:
        if kind is ColumnType.DECIMAL:
            return None, ScalarType.decimal(MAX_DECIMAL_PRECISION, 0, True)
        return None, ScalarType(kind, True)
    if field != _FIELD_OF[kind]:
        raise InvalidArgument(f"{where}: a {kind.name} literal cannot hold {field}")
    raw = getattr(datum, field)
    if kind is ColumnType.FLOAT64:
        return canonical_float(raw), ScalarType(kind, False)
    if kind is ColumnType.DECIMAL:
        return _decimal(raw, where)
    if kind is ColumnType.DATE:
        try:
            return _EPOCH_DATE + datetime.timedelta(days=raw), ScalarType(kind, False)
        except OverflowError:
            raise InvalidArgument(f"{where}: date {raw} days is outside years 1..9999") from None
    if kind is ColumnType.TIMESTAMP:
        try:
            return _EPOCH + datetime.timedelta(microseconds=raw), ScalarType(kind, False)
        except OverflowError:
            raise InvalidArgument(f"{where}: timestamp {raw} is outside years 1..9999") from None
    if kind is ColumnType.JSON and not is_json(raw):
        raise InvalidArgument(f"{where}: {raw!r} is not a JSON document")
    return raw, ScalarType(kind, False)


def _decimal(text: str, where: str) -> tuple[Decimal, ScalarType]:
    match = _PLAIN_DECIMAL.fullmatch(text)
    if match is None:
        raise InvalidArgument(f"{where}: {text!r} is not a plain decimal")
    precision, scale = decimal_type_of_text(match.group(1), match.group(2) or "")
    if precision > MAX_DECIMAL_PRECISION:
        raise InvalidArgument(f"{where}: decimal {text!r} has more than 38 digits")
    return Decimal(text), ScalarType.decimal(precision, scale, False)
