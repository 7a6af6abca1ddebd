"""Values written in SQL text: numeric literals and quoted strings read as a given type.

PostgreSQL gives a quoted literal a type from its context (``d = '2024-01-01'`` reads the
string as a date) and rejects text that is not a valid value when the statement is planned.
The planner folds such literals here, so a bad literal is an error (22P02, 22007, 22003), not
the NULL a failed cast gives at run time.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from services.adapter.sql.errors import (
    INVALID_TEXT_REPRESENTATION,
    NUMERIC_VALUE_OUT_OF_RANGE,
    SqlError,
)
from services.adapter.sql.types import type_name
from tidemark.columnar import ColumnType
from tidemark.plan.datum import INT64_MAX, INT64_MIN, decimal_fits
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType, decimal_literal_type

INVALID_DATETIME_FORMAT = "22007"

_INT = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_DATE = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})"
    r"(?:[ T]([0-9]{1,2}):([0-9]{2})(?::([0-9]{2})(\.[0-9]+)?)?)?"
)
_BOOL_WORDS = {
    "t": True,
    "true": True,
    "y": True,
    "yes": True,
    "on": True,
    "1": True,
    "f": False,
    "false": False,
    "n": False,
    "no": False,
    "off": False,
    "0": False,
}


def _invalid(kind: str, text: str, position: int) -> SqlError:
    return SqlError(
        INVALID_TEXT_REPRESENTATION, f"invalid input syntax for type {kind}: {text!r}", position
    )


def number_literal(text: str) -> tuple[Any, ScalarType]:
    """An unquoted numeric literal: a bigint when it is an integer in range, else numeric."""
    if _INT.fullmatch(text):
        value = int(text)
        if INT64_MIN <= value <= INT64_MAX:
            return value, ScalarType(ColumnType.INT64, nullable=False)
    exact = Decimal(text)
    plain = format(exact, "f")
    if exact == 0:
        plain = plain.lstrip("-")
    digits = sum(c.isdigit() for c in plain.lstrip("-").lstrip("0"))
    if digits > MAX_PRECISION:
        raise SqlError(
            NUMERIC_VALUE_OUT_OF_RANGE, f"numeric literal {text} has more than 38 digits"
        )
    return Decimal(plain), decimal_literal_type(plain, nullable=False)


def round_decimal(value: Decimal, target: ScalarType, position: int) -> Decimal:
    """``value`` in ``numeric(p, s)``: rounded half away from zero to s digits (as PostgreSQL),
    22003 when it needs more than p digits."""
    quantum = Decimal(1).scaleb(-target.scale)
    try:
        rounded = value.quantize(quantum, rounding=ROUND_HALF_UP)
    except InvalidOperation:
        rounded = None
    if rounded is None or not decimal_fits(rounded, target.precision, target.scale):
        raise SqlError(
            NUMERIC_VALUE_OUT_OF_RANGE,
            f"numeric value {value} does not fit {type_name(target)}",
            position,
        )
    return rounded


def parse_text(text: str, target: ScalarType, position: int = 0) -> Any:
    """The value ``text`` denotes as a ``target`` (PostgreSQL's input rules, as far as
    Tidemark's types go). Raises 22P02/22007/22003 for text that is no such value."""
    kind = target.kind
    if kind is ColumnType.TEXT:
        return text
    if kind is ColumnType.JSON:
        return normalize_json(text, position)
    stripped = text.strip()
    if kind is ColumnType.BOOL:
        value = _BOOL_WORDS.get(stripped.lower())
        if value is None:
            raise _invalid("boolean", text, position)
        return value
    if kind is ColumnType.INT64:
        if not _INT.fullmatch(stripped):
            raise _invalid("bigint", text, position)
        number = int(stripped)
        if not INT64_MIN <= number <= INT64_MAX:
            raise SqlError(
                NUMERIC_VALUE_OUT_OF_RANGE, f"value {text} is out of range for bigint", position
            )
        return number
    if kind is ColumnType.FLOAT64:
        return _parse_float(stripped, text, position)
    if kind is ColumnType.DECIMAL:
        if not _NUMBER.fullmatch(stripped):
            raise _invalid("numeric", text, position)
        return round_decimal(Decimal(stripped), target, position)
    if kind is ColumnType.DATE:
        return _parse_date(stripped, text, position)
    if kind is ColumnType.TIMESTAMP:
        return _parse_timestamp(stripped, text, position)
    if kind is ColumnType.BYTES:
        return _parse_bytes(text, position)
    raise AssertionError(kind)


def _parse_float(stripped: str, text: str, position: int) -> float:
    lowered = stripped.lower()
    specials = {
        "nan": math.nan,
        "infinity": math.inf,
        "+infinity": math.inf,
        "inf": math.inf,
        "+inf": math.inf,
        "-infinity": -math.inf,
        "-inf": -math.inf,
    }
    if lowered in specials:
        return specials[lowered]
    if not _NUMBER.fullmatch(stripped):
        raise _invalid("double precision", text, position)
    value = float(stripped)
    if math.isinf(value):
        raise SqlError(
            NUMERIC_VALUE_OUT_OF_RANGE,
            f"{text!r} is out of range for type double precision",
            position,
        )
    return value


def _parse_date(stripped: str, text: str, position: int) -> datetime.date:
    match = _DATE.fullmatch(stripped)
    try:
        if match is None:
            raise ValueError
        year, month, day = map(int, match.groups())
        return datetime.date(year, month, day)
    except ValueError:
        raise SqlError(
            INVALID_DATETIME_FORMAT, f"invalid input syntax for type date: {text!r}", position
        ) from None


def _parse_timestamp(stripped: str, text: str, position: int) -> datetime.datetime:
    match = _TIMESTAMP.fullmatch(stripped)
    try:
        if match is None:
            raise ValueError
        year, month, day, hour, minute, second = (int(g or 0) for g in match.groups()[:6])
        fraction = match.group(7) or "."
        micros = Decimal("0" + fraction) if len(fraction) > 1 else Decimal(0)
        # More than six fractional digits round to the microsecond, as PostgreSQL does.
        whole = int((micros * 1_000_000).quantize(Decimal(1), rounding=ROUND_HALF_UP))
        base = datetime.datetime(year, month, day, hour, minute, second)
        return base + datetime.timedelta(microseconds=whole)
    except (ValueError, OverflowError):
        raise SqlError(
            INVALID_DATETIME_FORMAT,
            f"invalid input syntax for type timestamp: {text!r}",
            position,
        ) from None


def _parse_bytes(text: str, position: int) -> bytes:
    if text.startswith("\\x"):
        digits = text[2:].replace(" ", "")
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise _invalid("bytea", text, position) from None
    # The escape format: backslash-backslash and backslash with three octal digits.
    out = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\":
            out += char.encode()
            index += 1
        elif text[index + 1 : index + 2] == "\\":
            out.append(0x5C)
            index += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[index + 1 : index + 4]):
            out.append(int(text[index + 1 : index + 4], 8))
            index += 4
        else:
            raise _invalid("bytea", text, position)
    return bytes(out)


def normalize_json(text: str, position: int = 0) -> str:
    """A JSON document in jsonb's text form: object keys deduplicated (the last wins) and
    ordered shorter first, then bytewise; ``", "`` and ``": "`` separators; numbers kept as
    written."""

    def reject(constant: str) -> Any:
        raise ValueError(constant)

    try:
        document = json.loads(text, parse_float=Decimal, parse_int=Decimal, parse_constant=reject)
    except (ValueError, RecursionError):
        raise SqlError(
            INVALID_TEXT_REPRESENTATION, f"invalid input syntax for type json: {text!r}", position
        ) from None
    return _render_json(document)


def _render_json(value: Any) -> str:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        inner = ", ".join(
            f"{json.dumps(k, ensure_ascii=False)}: {_render_json(value[k])}" for k in keys
        )
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render_json(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value) if "E" not in str(value) else format(value, "f")
    return json.dumps(value, ensure_ascii=False)
