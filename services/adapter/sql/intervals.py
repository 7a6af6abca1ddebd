"""Date and time arithmetic: ``date ± interval``, ``date ± integer`` and ``date - date``.

Tidemark has no interval type, so an ``INTERVAL`` literal is read at planning time into
months, days and microseconds and applied with the plan's shift functions, PostgreSQL's way:
``date|timestamp ± interval`` is a timestamp, moved by the months first (a day past the end
of the month becomes its last day), then by the days and time (a day is 24 hours: there are
no time zones). ``date ± integer`` is a date, ``date - date`` the days between them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from services.adapter.sql import typed as t
from services.adapter.sql.errors import SqlError, not_supported
from services.adapter.sql.typed import Typed
from tidemark.columnar import ColumnType
from tidemark.plan.scalar_types import ScalarType

INVALID_DATETIME_FORMAT = "22007"
_DAY_MICROS = 86_400_000_000
_UNIT_MICROS = {"hour": 3_600_000_000, "minute": 60_000_000, "second": 1_000_000}
_UNITS = {
    "year": "year",
    "years": "year",
    "y": "year",
    "yr": "year",
    "yrs": "year",
    "month": "month",
    "months": "month",
    "mon": "month",
    "mons": "month",
    "week": "week",
    "weeks": "week",
    "w": "week",
    "day": "day",
    "days": "day",
    "d": "day",
    "hour": "hour",
    "hours": "hour",
    "h": "hour",
    "hr": "hour",
    "hrs": "hour",
    "minute": "minute",
    "minutes": "minute",
    "min": "minute",
    "mins": "minute",
    "m": "minute",
    "second": "second",
    "seconds": "second",
    "sec": "second",
    "secs": "second",
    "s": "second",
}
_CLOCK = re.compile(r"([+-]?)(\d+):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,6}))?)?")
_AMOUNT = re.compile(r"[+-]?\d+(\.\d+)?")


@dataclass(frozen=True)
class Interval:
    months: int
    days: int
    microseconds: int

    def negated(self) -> Interval:
        return Interval(-self.months, -self.days, -self.microseconds)


def interval_of(node: exp.Interval, where: int) -> Interval:
    """An INTERVAL literal's value: ``INTERVAL '90' DAY``, ``INTERVAL '3 months'``,
    ``INTERVAL '1 year 2 mons 04:05:06'``. 22007 for text that is not an interval."""
    text_node = node.this
    if not isinstance(text_node, exp.Literal):
        raise not_supported("INTERVAL with a value that is not a constant", where)
    text = str(text_node.this).strip().lower()
    unit = node.args.get("unit")
    if unit is not None:
        unit_name = unit.name if isinstance(unit, exp.Var) else unit.key
        return _amount(text, str(unit_name).lower(), text_node, where)
    return _parse(text, text_node, where)


def _parse(text: str, node: exp.Expr, where: int) -> Interval:
    months = days = micros = 0
    words = text.replace(",", " ").split()
    index = 0
    if not words:
        raise _bad(text, where)
    while index < len(words):
        word = words[index]
        clock = _CLOCK.fullmatch(word)
        if clock is not None:
            micros += _clock_micros(clock)
            index += 1
            continue
        if index + 1 >= len(words):
            raise _bad(text, where)
        part = _amount(word, words[index + 1], node, where)
        months, days, micros = (
            months + part.months,
            days + part.days,
            micros + part.microseconds,
        )
        index += 2
    return Interval(months, days, micros)


def _amount(number: str, unit_text: str, node: exp.Expr, where: int) -> Interval:
    unit = _UNITS.get(unit_text.rstrip("s") if unit_text not in _UNITS else unit_text)
    if unit is None or not _AMOUNT.fullmatch(number):
        raise _bad(f"{number} {unit_text}", where)
    if "." in number:
        if unit not in _UNIT_MICROS:
            raise not_supported(f"fractional {unit}s in an interval", where)
        whole, fraction = number.split(".")
        sign = -1 if whole.startswith("-") else 1
        micros = abs(int(whole)) * _UNIT_MICROS[unit]
        micros += int(fraction.ljust(6, "0")[:6]) * _UNIT_MICROS[unit] // 1_000_000
        return Interval(0, 0, sign * micros)
    value = int(number)
    if unit == "year":
        return Interval(12 * value, 0, 0)
    if unit == "month":
        return Interval(value, 0, 0)
    if unit == "week":
        return Interval(0, 7 * value, 0)
    if unit == "day":
        return Interval(0, value, 0)
    return Interval(0, 0, value * _UNIT_MICROS[unit])


def _clock_micros(match: re.Match[str]) -> int:
    sign, hours, minutes, seconds, fraction = match.groups()
    total = (int(hours) * 60 + int(minutes)) * 60 + int(seconds or 0)
    micros = total * 1_000_000 + int((fraction or "").ljust(6, "0"))
    return -micros if sign == "-" else micros


def _bad(text: str, where: int) -> SqlError:
    return SqlError(
        INVALID_DATETIME_FORMAT, f'invalid input syntax for type interval: "{text}"', where
    )


# Arithmetic ---------------------------------------------------------------------------------

_TEMPORAL = {ColumnType.DATE, ColumnType.TIMESTAMP}
_TIMESTAMP = ScalarType(ColumnType.TIMESTAMP)
_DATE = ScalarType(ColumnType.DATE)


def shifted(value: Typed, interval: Interval, where: int) -> Typed:
    """``value`` (a date, timestamp, or an untyped literal read as a timestamp) moved by
    ``interval``: a timestamp."""
    if value.is_unknown:
        value = t.coerce(value, _TIMESTAMP, where)
    if value.type.kind not in _TEMPORAL:
        raise SqlError(
            "42883",
            f"operator does not exist: {value.type.kind.name.lower()} + interval",
            where,
        )
    result = t.convert(value, _TIMESTAMP.with_nullable(value.type.nullable), where)
    if interval.months:
        result = t.call("add_months", result, _int(interval.months, where), position=where)
    micros = interval.days * _DAY_MICROS + interval.microseconds
    if micros or not interval.months:
        result = t.call("add_microseconds", result, _int(micros, where), position=where)
    return result


def date_arithmetic(operator: str, left: Typed, right: Typed, where: int) -> Typed | None:
    """``date ± integer`` (a date) and ``date - date`` (an integer); None when neither side is
    a date or timestamp (plain arithmetic), 0A000 for the combinations without a type here."""
    left_kind = None if left.is_unknown else left.type.kind
    right_kind = None if right.is_unknown else right.type.kind
    if left_kind not in _TEMPORAL and right_kind not in _TEMPORAL:
        return None
    if left.is_unknown and right_kind is ColumnType.DATE:
        left = t.coerce(left, _DATE, where)
        left_kind = ColumnType.DATE
    if right.is_unknown:
        target = t.INT64 if left_kind is ColumnType.DATE and operator == "+" else _DATE
        right = t.coerce(right, target, where)
        right_kind = right.type.kind
    if left_kind is ColumnType.DATE and right_kind is ColumnType.INT64 and operator in "+-":
        days = right if operator == "+" else t.call("neg", right, position=where)
        return t.call("add_days", left, days, position=where)
    if left_kind is ColumnType.INT64 and right_kind is ColumnType.DATE and operator == "+":
        return t.call("add_days", right, left, position=where)
    if left_kind is ColumnType.DATE and right_kind is ColumnType.DATE and operator == "-":
        return t.call("days_between", left, right, position=where)
    if left_kind in _TEMPORAL and right_kind in _TEMPORAL and operator == "-":
        raise not_supported("subtracting timestamps (interval values)", where)
    raise SqlError(
        "42883",
        f"operator does not exist: {_name(left_kind)} {operator} {_name(right_kind)}",
        where,
    )


def _name(kind: ColumnType | None) -> str:
    return "unknown" if kind is None else kind.name.lower()


def _int(value: int, where: int) -> Typed:
    return t.literal(value, t.INT64, where)
