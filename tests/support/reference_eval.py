"""A reference evaluator for the plan IR: the plan computed from scratch over multisets.

The incremental engine in ``services/compute`` must produce, at every time, what this module
computes from the inputs at that time. To be a useful check it shares no evaluation code with
the engine: every node and function is implemented here from plan.proto's comments, as plainly
as possible (nested loops, exact arithmetic with ``fractions.Fraction``), trading speed for
being obviously right. From ``tidemark.plan`` it uses type derivation only (to know decimal
scales and numeric promotion), never value code.

A multiset is a ``dict`` from row tuple to a non-zero multiplicity. Values are Python values
as in ``tidemark.columnar.rows``. Floats are normalised as the contract says: -0.0 becomes
0.0 and every NaN becomes the one object :data:`NAN`, so rows holding NaN compare and hash
equal (use :func:`canonical` on an engine's output before comparing it with ours).
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cmp_to_key
from typing import Any, TypeAlias

from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import aggregate_type, derive_schema, scalar_type
from tidemark.plan.derive import window_aggregate, window_function_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

Row: TypeAlias = tuple[Any, ...]
Multiset: TypeAlias = dict[Row, int]

NAN = float("nan")
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_DIGITS = 38
EPOCH_DATE = datetime.date(1970, 1, 1)
EPOCH = datetime.datetime(1970, 1, 1)

T = ColumnType


class UndefinedResult(Exception):
    """The contract leaves this result undefined (Reduce, TopK or an outer join over negative
    multiplicities); a random plan must never get here."""


# Values -----------------------------------------------------------------------------------


def canonical_value(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return NAN
        if value == 0.0:
            return 0.0
    return value


def canonical(multiset: Mapping[Row, int]) -> Multiset:
    """``multiset`` with floats normalised and zero multiplicities dropped (rows that become
    equal are merged)."""
    result: Multiset = {}
    for row, count in multiset.items():
        key = tuple(canonical_value(v) for v in row)
        result[key] = result.get(key, 0) + count
    return {row: count for row, count in result.items() if count != 0}


def _decimal(scaled: int, scale: int) -> Decimal:
    """The decimal ``scaled * 10**-scale``, built exactly (no context rounding)."""
    digits = tuple(int(d) for d in str(abs(scaled)))
    return Decimal((1 if scaled < 0 else 0, digits, -scale))


def _to_decimal(value: Fraction, precision: int, scale: int) -> Decimal | None:
    """``value`` rounded half to even to ``scale`` digits; None if it needs more than
    ``precision`` digits."""
    scaled = round(value * 10**scale)  # Fraction rounding is half to even
    if abs(scaled) >= 10**precision:
        return None
    return _decimal(scaled, scale)


def _exact(value: Any) -> Fraction:
    """An int or Decimal as an exact fraction."""
    return Fraction(value)


def _to_float(value: Any, kind: ColumnType) -> float:
    if kind is T.FLOAT64:
        return float(value)
    return float(Fraction(value))  # correctly rounded


def _in_int64(value: int) -> int | None:
    return value if INT64_MIN <= value <= INT64_MAX else None


def _compare_floats(a: float, b: float) -> int:
    """NaN equals NaN and is above everything else."""
    if math.isnan(a) or math.isnan(b):
        return (math.isnan(a) > math.isnan(b)) - (math.isnan(a) < math.isnan(b))
    return (a > b) - (a < b)


def compare(a: Any, b: Any, ta: ScalarType, tb: ScalarType) -> int:
    """-1, 0 or 1 for two non-NULL values of comparable types."""
    if ta.is_numeric and tb.is_numeric:
        if T.FLOAT64 in (ta.kind, tb.kind):
            return _compare_floats(_to_float(a, ta.kind), _to_float(b, tb.kind))
        fa, fb = _exact(a), _exact(b)
        return (fa > fb) - (fa < fb)
    if ta.kind is not tb.kind:
        raise AssertionError(f"compare {ta} with {tb}")
    return int(a > b) - int(a < b)


def _convert(value: Any, source: ScalarType, target: ScalarType) -> Any:
    """A value moved to a unified type (coalesce, case): numeric promotion; a decimal that
    does not fit becomes NULL."""
    if value is None or not target.is_numeric:
        return value
    if target.kind is T.FLOAT64:
        return canonical_value(_to_float(value, source.kind))
    if target.kind is T.DECIMAL:
        return _to_decimal(_exact(value), target.precision, target.scale)
    return value


# Functions --------------------------------------------------------------------------------


def _comparison(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    a, b = args
    if a is None or b is None:
        return None
    c = compare(a, b, types[0], types[1])
    return {"eq": c == 0, "ne": c != 0, "lt": c < 0, "le": c <= 0, "gt": c > 0, "ge": c >= 0}[name]


def _and(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    if any(a is False for a in args):
        return False
    if any(a is None for a in args):
        return None
    return True


def _or(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    if any(a is True for a in args):
        return True
    if any(a is None for a in args):
        return None
    return False


def _not(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    return None if args[0] is None else not args[0]


def _int_arithmetic(name: str, a: int, b: int) -> int | None:
    if name == "add":
        return _in_int64(a + b)
    if name == "sub":
        return _in_int64(a - b)
    if name == "mul":
        return _in_int64(a * b)
    if b == 0:
        return None
    quotient = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        quotient = -quotient
    if name == "div":
        return _in_int64(quotient)
    return a - b * quotient  # mod: the sign of the dividend


def _decimal_arithmetic(name: str, a: Fraction, b: Fraction, out: ScalarType) -> Any:
    if name == "add":
        exact = a + b
    elif name == "sub":
        exact = a - b
    elif name == "mul":
        exact = a * b
    elif b == 0:
        return None
    elif name == "div":
        exact = a / b
    else:
        quotient = math.trunc(a / b)
        exact = a - b * quotient
    return _to_decimal(exact, MAX_DIGITS, out.scale)


def _float_arithmetic(name: str, a: float, b: float) -> float | None:
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if b == 0:
        return None
    if name == "div":
        return a / b
    if math.isinf(a) or math.isnan(a) or math.isnan(b):
        return NAN
    return math.fmod(a, b)


def _arithmetic(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    a, b = args
    if a is None or b is None:
        return None
    if out.kind is T.INT64:
        return _int_arithmetic(name, a, b)
    if out.kind is T.DECIMAL:
        return _decimal_arithmetic(name, _exact(a), _exact(b), out)
    return canonical_value(
        _float_arithmetic(name, _to_float(a, types[0].kind), _to_float(b, types[1].kind))
    )


def _sign(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    (a,) = args
    if a is None:
        return None
    if out.kind is T.INT64:
        return _in_int64(-a if name == "neg" else abs(a))
    if out.kind is T.DECIMAL:
        exact = _exact(a)
        return _to_decimal(-exact if name == "neg" else abs(exact), out.precision, out.scale)
    return canonical_value(-a if name == "neg" else abs(a))


def _strict(function: Callable[..., Any]) -> Callable[..., Any]:
    """A function of non-NULL arguments made to return NULL for any NULL argument."""

    def wrapped(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
        if any(a is None for a in args):
            return None
        return function(*args)

    return wrapped


def _substr(text: str, start: int, length: int | None = None) -> str | None:
    first = max(start, 1)
    if length is None:
        end = len(text) + 1
    elif length < 0:
        return None
    else:
        end = start + length  # exclusive, in 1-based positions
    if end <= first:
        return ""
    return text[first - 1 : end - 1]


def _like(text: str, pattern: str) -> bool:
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, text, flags=re.DOTALL) is not None


def _coalesce(name: str, args: list[Any], types: list[ScalarType], out: ScalarType) -> Any:
    for value, kind in zip(args, types, strict=True):
        if value is not None:
            return _convert(value, kind, out)
    return None


FUNCTIONS: dict[str, Callable[[str, list[Any], list[ScalarType], ScalarType], Any]] = {
    **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge"), _comparison),
    "and": _and,
    "or": _or,
    "not": _not,
    "is_null": lambda name, args, types, out: args[0] is None,
    "is_not_null": lambda name, args, types, out: args[0] is not None,
    **dict.fromkeys(("add", "sub", "mul", "div", "mod"), _arithmetic),
    "neg": _sign,
    "abs": _sign,
    "lower": _strict(str.lower),
    "upper": _strict(str.upper),
    "trim": _strict(lambda s: s.strip(" ")),
    "length": _strict(len),
    "substr": _strict(_substr),
    "concat": _strict(lambda *parts: "".join(parts)),
    "like": _strict(_like),
    "coalesce": _coalesce,
    "extract_year": _strict(lambda d: d.year),
    "extract_month": _strict(lambda d: d.month),
    "extract_day": _strict(lambda d: d.day),
    "date_trunc_day": _strict(lambda ts: datetime.datetime(ts.year, ts.month, ts.day)),
    "add_days": _strict(lambda d, n: _date_from_ordinal(d.toordinal() + n)),
    "days_between": _strict(lambda a, b: a.toordinal() - b.toordinal()),
    "add_months": _strict(lambda ts, n: _add_months(ts, n)),
    "add_microseconds": _strict(lambda ts, n: _timestamp_from_micros(_micros_of(ts) + n)),
}


# Dates as day ordinals and timestamps as microseconds since 0001-01-01, so the shifts are
# integer arithmetic checked against the contract's years 1..9999.
_LAST_ORDINAL = datetime.date(9999, 12, 31).toordinal()
_DAY_MICROS = 86_400_000_000


def _date_from_ordinal(ordinal: int) -> datetime.date | None:
    return datetime.date.fromordinal(ordinal) if 1 <= ordinal <= _LAST_ORDINAL else None


def _micros_of(ts: datetime.datetime) -> int:
    time_of_day = ((ts.hour * 60 + ts.minute) * 60 + ts.second) * 1_000_000 + ts.microsecond
    return (ts.toordinal() - 1) * _DAY_MICROS + time_of_day


def _timestamp_from_micros(micros: int) -> datetime.datetime | None:
    days, rest = divmod(micros, _DAY_MICROS)
    date = _date_from_ordinal(days + 1)
    if date is None:
        return None
    seconds, micro = divmod(rest, 1_000_000)
    return datetime.datetime(date.year, date.month, date.day) + datetime.timedelta(
        seconds=seconds, microseconds=micro
    )


def _add_months(ts: datetime.datetime, months: int) -> datetime.datetime | None:
    total = ts.month - 1 + months
    year = ts.year + total // 12
    month = total % 12 + 1
    if not 1 <= year <= 9999:
        return None
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    lengths = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    day = min(ts.day, lengths[month - 1])
    return datetime.datetime(year, month, day, ts.hour, ts.minute, ts.second, ts.microsecond)


# Casts ------------------------------------------------------------------------------------

_NUMBER_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_DATE_TEXT = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP_TEXT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,6})?"
)
_BYTES_TEXT = re.compile(r"\\x((?:[0-9a-fA-F]{2})*)")


def _text_of(value: Any, source: ScalarType) -> str:
    kind = source.kind
    if kind is T.BOOL:
        return "true" if value else "false"
    if kind is T.INT64:
        return str(value)
    if kind is T.FLOAT64:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if kind is T.DECIMAL:
        scaled = int(_exact(value) * 10**source.scale)
        digits = str(abs(scaled)).rjust(source.scale + 1, "0")
        if source.scale:
            digits = digits[: -source.scale] + "." + digits[-source.scale :]
        return ("-" if scaled < 0 else "") + digits
    if kind is T.BYTES:
        return "\\x" + bytes(value).hex()
    if kind is T.DATE:
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    if kind is T.TIMESTAMP:
        text = (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
            f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
        )
        return text + (f".{value.microsecond:06d}" if value.microsecond else "")
    assert isinstance(value, str)
    return value  # TEXT, JSON


def _is_json(text: str) -> bool:
    def reject(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=reject)
    except ValueError:
        return False
    return True


def _parse_float(text: str) -> float | None:
    lowered = text.lower()
    if lowered == "nan":
        return NAN
    if lowered in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if lowered in ("-inf", "-infinity"):
        return -math.inf
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    value = float(text)
    return None if math.isinf(value) else canonical_value(value)


def _parse_decimal(text: str, target: ScalarType) -> Decimal | None:
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    exact = Decimal(text)  # the constructor is exact
    if exact == 0:
        return _decimal(0, target.scale)
    if exact.adjusted() >= MAX_DIGITS:
        return None  # more integer digits than any decimal holds
    if exact.adjusted() < -MAX_DIGITS - 2:
        return _decimal(0, target.scale)  # rounds to zero at any scale
    return _to_decimal(Fraction(exact), target.precision, target.scale)


def _parse(text: str, target: ScalarType) -> Any:
    kind = target.kind
    if kind is T.JSON:
        return text if _is_json(text) else None
    text = text.strip(" ")
    if kind is T.BOOL:
        return {"true": True, "false": False}.get(text.lower())
    if kind is T.INT64:
        return _in_int64(int(text)) if _INT_TEXT.fullmatch(text) else None
    if kind is T.FLOAT64:
        return _parse_float(text)
    if kind is T.DECIMAL:
        return _parse_decimal(text, target)
    try:
        if kind is T.DATE:
            match = _DATE_TEXT.fullmatch(text)
            return None if match is None else datetime.date(*map(int, match.groups()))
        if kind is T.TIMESTAMP:
            match = _TIMESTAMP_TEXT.fullmatch(text)
            if match is None:
                return None
            year, month, day, hour, minute, second = map(int, match.groups()[:6])
            micros = int((match.group(7) or ".")[1:].ljust(6, "0"))
            return datetime.datetime(year, month, day, hour, minute, second, micros)
    except ValueError:
        return None  # no such date or time
    if kind is T.BYTES:
        match = _BYTES_TEXT.fullmatch(text)
        return None if match is None else bytes.fromhex(match.group(1))
    raise AssertionError(f"cast text to {kind}")


def cast_value(value: Any, source: ScalarType, target: ScalarType) -> Any:
    """``value`` of ``source`` cast to ``target`` per plan.proto's Cast table."""
    if value is None:
        return None
    kind = target.kind
    if kind is T.TEXT:
        return _text_of(value, source)
    if source.kind is T.TEXT:
        return _parse(value, target)
    if kind is T.DECIMAL:
        if source.kind is T.FLOAT64:
            if math.isnan(value) or math.isinf(value):
                return None
            return _to_decimal(Fraction(Decimal(repr(value))), target.precision, target.scale)
        return _to_decimal(_exact(value), target.precision, target.scale)
    if kind is T.FLOAT64:
        return canonical_value(_to_float(value, source.kind))
    if kind is T.INT64:
        if source.kind is T.FLOAT64:
            if math.isnan(value) or math.isinf(value):
                return None
            return _in_int64(round(value))  # half to even
        return _in_int64(round(_exact(value)))
    if kind is T.TIMESTAMP and source.kind is T.DATE:
        return datetime.datetime(value.year, value.month, value.day)
    if kind is T.DATE and source.kind is T.TIMESTAMP:
        return value.date()
    if kind is source.kind:
        return value
    raise AssertionError(f"cast {source} to {target}")


# Scalars ----------------------------------------------------------------------------------


def decode_datum(datum: plan_pb2.Datum) -> Any:
    """A literal's Python value (written here again rather than shared with tidemark.plan)."""
    field = datum.WhichOneof("value")
    if field is None:
        return None
    value = getattr(datum, field)
    if field == "decimal_value":
        return Decimal(value)
    if field == "date_value":
        return EPOCH_DATE + datetime.timedelta(days=value)
    if field == "timestamp_value":
        return EPOCH + datetime.timedelta(microseconds=value)
    return canonical_value(value)


@dataclass(frozen=True)
class Expr:
    """A scalar expression with every part's type worked out once, to evaluate per row."""

    kind: str
    type: ScalarType
    column: int = 0
    value: Any = None
    function: str = ""
    args: tuple[Expr, ...] = ()

    def evaluate(self, row: Row) -> Any:
        if self.kind == "column":
            return row[self.column]
        if self.kind == "literal":
            return self.value
        values = [arg.evaluate(row) for arg in self.args]
        if self.kind == "call":
            types = [arg.type for arg in self.args]
            return FUNCTIONS[self.function](self.function, values, types, self.type)
        if self.kind == "case":
            _, then, otherwise = self.args
            chosen, source = (values[1], then) if values[0] is True else (values[2], otherwise)
            return _convert(chosen, source.type, self.type)
        if self.kind == "cast":
            target = self.type
            return cast_value(values[0], self.args[0].type, target)
        raise AssertionError(self.kind)


def compile_scalar(expr: plan_pb2.Scalar, columns: Sequence[ScalarType]) -> Expr:
    kind = expr.WhichOneof("kind")
    assert kind is not None
    own_type = scalar_type(expr, columns)
    if kind == "column":
        return Expr(kind, own_type, column=expr.column)
    if kind == "literal":
        return Expr(kind, own_type, value=decode_datum(expr.literal))
    if kind == "call":
        args = tuple(compile_scalar(a, columns) for a in expr.call.args)
        return Expr(kind, own_type, function=expr.call.function, args=args)
    if kind == "case":
        parts = (expr.case.cond, expr.case.then, expr.case.otherwise)
        return Expr(kind, own_type, args=tuple(compile_scalar(p, columns) for p in parts))
    return Expr(kind, own_type, args=(compile_scalar(expr.cast.input, columns),))


# Aggregates -------------------------------------------------------------------------------


def _float_sum(values: list[tuple[float, int]]) -> float:
    """The exact sum of ``value * count`` correctly rounded, with the contract's NaN and
    infinity rules."""
    floats = [v for v, _ in values]
    if any(math.isnan(v) for v in floats) or (math.inf in floats and -math.inf in floats):
        return NAN
    if math.inf in floats:
        return math.inf
    if -math.inf in floats:
        return -math.inf
    exact = sum((Fraction(v) * n for v, n in values), Fraction(0))
    try:
        return float(canonical_value(float(exact)))
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def _aggregate(
    aggregate: plan_pb2.Aggregate,
    rows: list[tuple[Row, int]],
    columns: Sequence[ScalarType],
) -> Any:
    out = aggregate_type(aggregate, columns)
    if not aggregate.HasField("expression"):
        return sum(count for _, count in rows)  # COUNT(*)
    expr = compile_scalar(aggregate.expression, columns)
    values = [(expr.evaluate(row), count) for row, count in rows]
    values = [(v, n) for v, n in values if v is not None]
    if aggregate.distinct:
        unique: list[Any] = []
        for v, _ in values:
            if not any(compare(v, u, expr.type, expr.type) == 0 for u in unique):
                unique.append(v)
        values = [(v, 1) for v in unique]
    func = aggregate.func
    if func == plan_pb2.Aggregate.FUNC_COUNT:
        return sum(n for _, n in values)
    if not values:
        return None
    if func in (plan_pb2.Aggregate.FUNC_MIN, plan_pb2.Aggregate.FUNC_MAX):
        best = values[0][0]
        for v, _ in values[1:]:
            c = compare(v, best, expr.type, expr.type)
            if (c < 0) if func == plan_pb2.Aggregate.FUNC_MIN else (c > 0):
                best = v
        return best
    count = sum(n for _, n in values)
    if expr.type.kind is T.FLOAT64:
        total = _float_sum(values)
        if func == plan_pb2.Aggregate.FUNC_SUM:
            return total
        return canonical_value(total / count)
    exact = sum((_exact(v) * n for v, n in values), Fraction(0))
    if func == plan_pb2.Aggregate.FUNC_SUM:
        return _to_decimal(exact, MAX_DIGITS, out.scale)
    if out.kind is T.FLOAT64:  # AVG(INT64): int / int, correctly rounded
        assert exact.denominator == 1
        return canonical_value(exact.numerator / count)
    return _to_decimal(exact / count, MAX_DIGITS, out.scale)


# Relations --------------------------------------------------------------------------------


def _add(result: Multiset, row: Row, count: int) -> None:
    total = result.get(row, 0) + count
    if total:
        result[row] = total
    else:
        result.pop(row, None)


def _schema_types(schema: RelationSchema) -> list[ScalarType]:
    return [ScalarType.of_column(c) for c in schema.columns]


def _order_compare(
    a: Row, b: Row, keys: Sequence[plan_pb2.SortKey], types: Sequence[ScalarType]
) -> int:
    """TopK's order: the sort keys, then the whole row ascending with NULLs last."""
    full = [
        *((k.column, k.descending, k.descending != k.nulls_flipped) for k in keys),
        *((i, False, False) for i in range(len(types))),
    ]
    for column, descending, nulls_first in full:
        x, y = a[column], b[column]
        if x is None and y is None:
            continue
        if x is None or y is None:
            x_first = (x is None) == nulls_first
            return -1 if x_first else 1
        c = compare(x, y, types[column], types[column])
        if c:
            return -c if descending else c
    return 0


def _peers(a: Row, b: Row, keys: Sequence[plan_pb2.SortKey], types: Sequence[ScalarType]) -> bool:
    """Whether two rows are equal on every order column (NULL equal to NULL)."""
    for key in keys:
        x, y = a[key.column], b[key.column]
        if (x is None) != (y is None):
            return False
        if x is not None and compare(x, y, types[key.column], types[key.column]) != 0:
            return False
    return True


_W = plan_pb2.WindowFunction
_B = plan_pb2.WindowFrameBound


def _frame_positions(
    frame: plan_pb2.WindowFrame | None, index: int, peer_group: list[int]
) -> range:
    """The 0-based positions of ``index``'s frame; ``peer_group[i]`` numbers i's peer group."""
    n = len(peer_group)
    if frame is None:
        frame = plan_pb2.WindowFrame(
            mode=plan_pb2.WindowFrame.MODE_RANGE,
            start=_B(kind=_B.KIND_UNBOUNDED_PRECEDING),
            end=_B(kind=_B.KIND_CURRENT_ROW),
        )
    peers = [j for j in range(n) if peer_group[j] == peer_group[index]]

    def bound(b: plan_pb2.WindowFrameBound, is_start: bool) -> int:
        if b.kind == _B.KIND_UNBOUNDED_PRECEDING:
            return 0
        if b.kind == _B.KIND_UNBOUNDED_FOLLOWING:
            return n - 1
        if b.kind == _B.KIND_PRECEDING:
            return index - b.offset
        if b.kind == _B.KIND_FOLLOWING:
            return index + b.offset
        if frame.mode == plan_pb2.WindowFrame.MODE_ROWS:
            return index
        return peers[0] if is_start else peers[-1]

    start, end = bound(frame.start, True), bound(frame.end, False)
    return range(max(start, 0), min(end, n - 1) + 1)


def _window_values(
    function: plan_pb2.WindowFunction,
    copies: list[Row],
    order: Sequence[plan_pb2.SortKey],
    types: Sequence[ScalarType],
) -> list[Any]:
    """One window function's value at every position of a sorted partition, by definition."""
    n = len(copies)
    peer_group: list[int] = []
    for index, row in enumerate(copies):
        same = index > 0 and _peers(copies[index - 1], row, order, types)
        peer_group.append(peer_group[-1] if same else (peer_group[-1] + 1 if index else 0))
    argument = compile_scalar(function.argument, types) if function.HasField("argument") else None
    default = compile_scalar(function.default, types) if function.HasField("default") else None
    frame = function.frame if function.HasField("frame") else None
    kind = function.kind
    values: list[Any] = []
    for index in range(n):
        if kind == _W.KIND_ROW_NUMBER:
            values.append(index + 1)
        elif kind == _W.KIND_RANK:
            values.append(1 + sum(1 for j in range(n) if peer_group[j] < peer_group[index]))
        elif kind == _W.KIND_DENSE_RANK:
            values.append(1 + peer_group[index])
        elif kind in (_W.KIND_LAG, _W.KIND_LEAD):
            assert argument is not None
            step = function.offset if function.HasField("offset") else 1
            target = index - step if kind == _W.KIND_LAG else index + step
            if 0 <= target < n:
                values.append(argument.evaluate(copies[target]))
            else:
                values.append(None if default is None else default.evaluate(copies[index]))
        else:
            positions = _frame_positions(frame, index, peer_group)
            if kind in (_W.KIND_FIRST_VALUE, _W.KIND_LAST_VALUE):
                assert argument is not None
                if not positions:
                    values.append(None)
                else:
                    chosen = positions[0] if kind == _W.KIND_FIRST_VALUE else positions[-1]
                    values.append(argument.evaluate(copies[chosen]))
            else:
                rows = [(copies[j], 1) for j in positions]
                values.append(_aggregate(window_aggregate(function), rows, types))
    return values


def _group_key(row: Row, positions: Sequence[int]) -> Row:
    return tuple(row[p] for p in positions)


def _groups(data: Multiset, positions: Sequence[int]) -> dict[Row, list[tuple[Row, int]]]:
    groups: dict[Row, list[tuple[Row, int]]] = {}
    for row, count in data.items():
        groups.setdefault(_group_key(row, positions), []).append((row, count))
    return groups


@dataclass
class _Evaluator:
    inputs: Mapping[str, Multiset]
    bindings: dict[int, tuple[Multiset, list[ScalarType]]]

    def relation(self, rel: plan_pb2.Relation) -> tuple[Multiset, list[ScalarType]]:
        kind = rel.WhichOneof("kind")
        method: Callable[[Any], tuple[Multiset, list[ScalarType]]] = getattr(self, f"_{kind}")
        return method(getattr(rel, str(kind)))

    def _get(self, node: plan_pb2.Get) -> tuple[Multiset, list[ScalarType]]:
        types = _schema_types(RelationSchema.from_proto(node.schema))
        return canonical(self.inputs[node.collection_id]), types

    def _constant(self, node: plan_pb2.Constant) -> tuple[Multiset, list[ScalarType]]:
        result: Multiset = {}
        for row in node.rows:
            _add(result, tuple(decode_datum(d) for d in row.values), row.diff or 1)
        return result, _schema_types(RelationSchema.from_proto(node.schema))

    def _filter(self, node: plan_pb2.Filter) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        predicates = [compile_scalar(p, types) for p in node.predicates]
        kept = {
            row: count
            for row, count in data.items()
            if all(p.evaluate(row) is True for p in predicates)
        }
        return kept, types

    def _map(self, node: plan_pb2.Map) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        types = list(types)
        exprs = []
        for e in node.expressions:  # each sees the columns appended before it
            exprs.append(compile_scalar(e, types))
            types.append(exprs[-1].type)
        result: Multiset = {}
        for row, count in data.items():
            extended = row
            for expr in exprs:
                extended = (*extended, expr.evaluate(extended))
            _add(result, extended, count)
        return result, types

    def _project(self, node: plan_pb2.Project) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        result: Multiset = {}
        for row, count in data.items():
            _add(result, tuple(row[c] for c in node.columns), count)
        return result, [types[c] for c in node.columns]

    def _union(self, node: plan_pb2.Union) -> tuple[Multiset, list[ScalarType]]:
        result: Multiset = {}
        branches = [self.relation(r) for r in node.inputs]
        for data, _ in branches:
            for row, count in data.items():
                _add(result, row, count)
        return result, branches[0][1]

    def _negate(self, node: plan_pb2.Negate) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        return {row: -count for row, count in data.items()}, types

    def _threshold(self, node: plan_pb2.Threshold) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        return {row: count for row, count in data.items() if count > 0}, types

    def _distinct(self, node: plan_pb2.Distinct) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        return {row: 1 for row, count in data.items() if count > 0}, types

    def _join(self, node: plan_pb2.Join) -> tuple[Multiset, list[ScalarType]]:
        left, left_types = self.relation(node.left)
        right, right_types = self.relation(node.right)
        left_keys = [compile_scalar(k, left_types) for k in node.left_keys]
        right_keys = [compile_scalar(k, right_types) for k in node.right_keys]
        keep_left = node.kind in (plan_pb2.Join.KIND_LEFT_OUTER, plan_pb2.Join.KIND_FULL_OUTER)
        keep_right = node.kind in (plan_pb2.Join.KIND_RIGHT_OUTER, plan_pb2.Join.KIND_FULL_OUTER)
        if (keep_left or keep_right) and any(
            count < 0 for count in [*left.values(), *right.values()]
        ):
            raise UndefinedResult("outer join over negative multiplicities")

        def matches(lrow: Row, rrow: Row) -> bool:
            for lk, rk in zip(left_keys, right_keys, strict=True):
                a, b = lk.evaluate(lrow), rk.evaluate(rrow)
                if a is None or b is None or compare(a, b, lk.type, rk.type) != 0:
                    return False
            return True

        result: Multiset = {}
        matched_right: set[Row] = set()
        for lrow, lcount in left.items():
            matched = False
            for rrow, rcount in right.items():
                if matches(lrow, rrow):
                    matched = True
                    matched_right.add(rrow)
                    _add(result, lrow + rrow, lcount * rcount)
            if keep_left and not matched:
                _add(result, lrow + (None,) * len(right_types), lcount)
        if keep_right:
            for rrow, rcount in right.items():
                if rrow not in matched_right:
                    _add(result, (None,) * len(left_types) + rrow, rcount)
        return result, [*left_types, *right_types]

    def _reduce(self, node: plan_pb2.Reduce) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        result: Multiset = {}
        for key, rows in _groups(data, node.group_key).items():
            if sum(count for _, count in rows) <= 0:
                continue
            if any(count < 0 for _, count in rows):
                raise UndefinedResult(f"reduce over a group with negative rows: {key!r}")
            values = [_aggregate(a, rows, types) for a in node.aggregates]
            _add(result, (*key, *values), 1)
        out_types = [types[p] for p in node.group_key]
        out_types += [aggregate_type(a, types) for a in node.aggregates]
        return result, out_types

    def _top_k(self, node: plan_pb2.TopK) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)
        start = node.offset
        stop = start + node.limit if node.HasField("limit") else math.inf

        def compare_rows(a: Row, b: Row) -> int:
            return _order_compare(a, b, node.order, types)

        order = cmp_to_key(compare_rows)
        result: Multiset = {}
        for key, rows in _groups(data, node.group_key).items():
            if any(count < 0 for _, count in rows):
                raise UndefinedResult(f"top_k over a group with negative rows: {key!r}")
            position = 0  # a row of multiplicity m takes positions [position, position + m)
            for row, count in sorted(rows, key=lambda entry: order(entry[0])):
                kept = min(stop, position + count) - max(start, position)
                if kept > 0:
                    _add(result, row, int(kept))
                position += count
        return result, types

    def _window(self, node: plan_pb2.Window) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.relation(node.input)

        def compare_rows(a: Row, b: Row) -> int:
            return _order_compare(a, b, node.order, types)

        order = cmp_to_key(compare_rows)
        result: Multiset = {}
        for key, rows in _groups(data, node.partition_key).items():
            if any(count < 0 for _, count in rows):
                raise UndefinedResult(f"window over a partition with negative rows: {key!r}")
            # One entry per copy: a row of multiplicity m takes m consecutive positions.
            copies = [
                row
                for row, count in sorted(rows, key=lambda entry: order(entry[0]))
                for _ in range(count)
            ]
            values = [_window_values(f, copies, node.order, types) for f in node.functions]
            for index, row in enumerate(copies):
                _add(result, (*row, *(column[index] for column in values)), 1)
        out_types = [*types, *(window_function_type(f, types) for f in node.functions)]
        return result, out_types

    def _let(self, node: plan_pb2.Let) -> tuple[Multiset, list[ScalarType]]:
        value = self.relation(node.value)
        outer = self.bindings.get(node.id)
        self.bindings[node.id] = value
        try:
            return self.relation(node.body)
        finally:
            if outer is None:
                del self.bindings[node.id]
            else:
                self.bindings[node.id] = outer

    def _local_get(self, node: plan_pb2.LocalGet) -> tuple[Multiset, list[ScalarType]]:
        data, types = self.bindings[node.id]
        return dict(data), types


def evaluate(
    plan: plan_pb2.Plan | plan_pb2.Relation, inputs: Mapping[str, Mapping[Row, int]]
) -> Multiset:
    """The plan's output over ``inputs`` (collection id -> multiset): a dict from row to
    non-zero multiplicity. Raises ``InvalidArgument`` for an invalid plan (as compute would at
    install time) and :class:`UndefinedResult` where the contract defines no result."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    derive_schema(root)
    held = {name: canonical(data) for name, data in inputs.items()}
    data, _ = _Evaluator(held, {}).relation(root)
    return data
