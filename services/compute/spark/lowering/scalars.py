"""Plan ``Scalar`` expressions as Spark Columns with the contract's semantics.

Native where Spark's own expression is provably the contract's: comparisons (numbers promoted
exactly first), three-valued logic, NULL tests, INT64 arithmetic through Spark's ``try_*``
functions (overflow is NULL, as the contract says, whatever the session's ANSI mode), FLOAT64
arithmetic, DECIMAL add, sub, mul, mod, neg and abs when Spark's result scale is the
contract's (checked on the analysed expression, so no rounding can happen), trim, length,
concat, LIKE with a literal pattern, coalesce and CASE, extracts, days_between,
date_trunc_day, and the casts that are exact in Spark.

substr is native with its bounds clipped first (Spark counts a negative start from the end).
A fallback call whose arguments are all literals is evaluated once while lowering and becomes
a literal. Everything else goes through :mod:`.fallback` (the engine's own implementation in
a Python UDF), listed in :data:`FALLBACK_FUNCTIONS` and ``ScalarLowering._native_cast``:

- lower, upper (Java and Python case mappings differ for some code points), LIKE with a
  computed pattern, add_days, add_months, add_microseconds (the contract's years 1..9999
  range check).
- DECIMAL div (Spark rounds half up, to another scale), and any decimal arithmetic or
  comparison whose Spark result would need more than 38 digits or another scale.
- casts that round (float or decimal to INT64, to a decimal of smaller scale, float to
  decimal), parse text, or print floats, decimals, dates, timestamps and bytes as text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as S

from services.compute.dataflow.scalar import compile_scalar
from services.compute.spark.lowering.fallback import call_over_arguments, scalar_udf
from services.compute.spark.lowering.types import result_type, spark_type
from tidemark.columnar import ColumnType
from tidemark.plan import scalar_type
from tidemark.plan.datum import from_datum
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType, widest_numeric_kind
from tidemark.v1 import plan_pb2

T = ColumnType
INT64_MIN = -(2**63)

FALLBACK_FUNCTIONS = frozenset({"lower", "upper", "add_days", "add_months", "add_microseconds"})


@dataclass(frozen=True)
class Lowered:
    column: Column
    type: ScalarType
    # Set for a literal argument: its value (some native forms need a constant).
    constant: Any = None
    is_constant: bool = False


def literal(value: Any, kind: ScalarType) -> Column:
    """A typed Spark literal holding ``value`` exactly (dates and timestamps as SQL literals,
    so no time zone applies)."""
    target = spark_type(kind)
    if value is None:
        return F.lit(None).cast(target)
    if kind.kind is T.DATE:
        return F.expr(f"DATE '{value.isoformat()}'")
    if kind.kind is T.TIMESTAMP:
        return F.expr(f"TIMESTAMP_NTZ '{value.isoformat(sep=' ')}'")
    if kind.kind is T.BYTES:
        return F.lit(bytearray(value)).cast(target)
    return F.lit(value).cast(target)


def to_float(arg: Lowered) -> Column:
    """A number as a double, correctly rounded: a long casts exactly-rounded in the JVM; a
    decimal goes through its text, which Java parses correctly rounded (Spark's own
    decimal-to-double divides two doubles, which can round twice)."""
    if arg.type.kind is T.FLOAT64:
        return arg.column
    if arg.type.kind is T.INT64:
        return arg.column.cast(S.DoubleType())
    return arg.column.cast(S.StringType()).cast(S.DoubleType())


def to_decimal(arg: Lowered, precision: int, scale: int) -> Column:
    """An INT64 or DECIMAL as DECIMAL(precision, scale) when ``scale`` is at least the
    value's (no rounding): NULL when it does not fit."""
    if arg.type.kind is T.DECIMAL and (arg.type.precision, arg.type.scale) == (precision, scale):
        return arg.column
    return arg.column.try_cast(S.DecimalType(precision, scale))


def _decimal_type(t: ScalarType) -> S.DecimalType:
    """The Spark type of an INT64 or DECIMAL operand of decimal arithmetic (a lowered column
    has its plan type's Spark type; an INT64 is made a DECIMAL(19, 0) first)."""
    return S.DecimalType(19, 0) if t.kind is T.INT64 else S.DecimalType(t.precision, t.scale)


def _decimal_view(t: ScalarType) -> tuple[int, int]:
    """(integer digits, scale) of an INT64 or DECIMAL."""
    if t.kind is T.INT64:
        return 19, 0
    return t.precision - t.scale, t.scale


class ScalarLowering:
    """Lowers expressions over the columns ``columns`` (of plan types ``types``, each held as
    its type's :func:`spark_type`) of ``df``."""

    def __init__(self, df: DataFrame, columns: Sequence[Column], types: Sequence[ScalarType]):
        self.df = df
        self.columns = list(columns)
        self.types = list(types)

    def lower(self, expr: plan_pb2.Scalar) -> Lowered:
        out = scalar_type(expr, self.types)  # validates, and is the contract's type
        kind = expr.WhichOneof("kind")
        if kind == "column":
            return Lowered(self.columns[expr.column], out)
        if kind == "literal":
            value = from_datum(expr.literal)
            return Lowered(literal(value, out), out, value, True)
        if kind == "case":
            return self._case(expr.case, out)
        if kind == "cast":
            return self._cast(expr.cast, out)
        assert kind == "call", kind
        return self._call(expr.call, out)

    # -- helpers -------------------------------------------------------------------------

    def _fallback(
        self, node: plan_pb2.Call | plan_pb2.Cast, args: Sequence[Lowered], out: ScalarType
    ) -> Lowered:
        expr = call_over_arguments(node, len(args))
        types = [a.type for a in args]
        if args and all(a.is_constant for a in args):
            # Literal arguments (a date plus an interval, say): evaluated once, here.
            value = compile_scalar(expr, types, "spark lowering").evaluate(
                tuple(a.constant for a in args)
            )
            return Lowered(literal(value, out), out, value, True)
        column = scalar_udf(expr, types, out, [a.column for a in args])
        return Lowered(column, out)

    def convert(self, arg: Lowered, target: ScalarType) -> Column:
        """``arg`` moved to a unified type (coalesce, case): numeric promotion, and NULL for a
        decimal that does not fit."""
        if not target.is_numeric or arg.type.kind is target.kind is T.INT64:
            return arg.column
        if target.kind is T.FLOAT64:
            return to_float(arg)
        return to_decimal(arg, target.precision, target.scale)

    # -- case and cast ---------------------------------------------------------------------

    def _case(self, case: plan_pb2.Case, out: ScalarType) -> Lowered:
        cond, then, otherwise = (self.lower(p) for p in (case.cond, case.then, case.otherwise))
        column = F.when(cond.column, self.convert(then, out)).otherwise(
            self.convert(otherwise, out)
        )
        return Lowered(column, out)

    def _cast(self, cast: plan_pb2.Cast, out: ScalarType) -> Lowered:
        arg = self.lower(cast.input)
        column = self._native_cast(arg, out)
        if column is None:
            return self._fallback(cast, [arg], out)
        return Lowered(column, out)

    def _native_cast(self, arg: Lowered, out: ScalarType) -> Column | None:
        source, target = arg.type.kind, out.kind
        if source is target and target is not T.DECIMAL:
            return arg.column
        if target is T.FLOAT64 and source in (T.INT64, T.DECIMAL):
            return to_float(arg)
        if target is T.DECIMAL and source in (T.INT64, T.DECIMAL):
            if _decimal_view(arg.type)[1] <= out.scale:
                return to_decimal(arg, out.precision, out.scale)
            return None  # rounding: Spark rounds half up
        if (source, target) == (T.DATE, T.TIMESTAMP):
            return arg.column.cast(S.TimestampNTZType())
        if (source, target) == (T.TIMESTAMP, T.DATE):
            return arg.column.cast(S.DateType())
        if target is T.TEXT and source in (T.INT64, T.BOOL, T.JSON):
            return arg.column.cast(S.StringType())
        return None

    # -- calls -----------------------------------------------------------------------------

    def _call(self, call: plan_pb2.Call, out: ScalarType) -> Lowered:
        args = [self.lower(a) for a in call.args]
        name = call.function
        build = _NATIVE.get(name)
        column = None if build is None else build(self, name, args, out)
        if column is None:
            return self._fallback(call, args, out)
        return Lowered(column, out)

    def comparison(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        a, b = args
        if a.type.is_numeric and b.type.is_numeric and a.type.kind is not b.type.kind:
            if T.FLOAT64 in (a.type.kind, b.type.kind):
                x, y = to_float(a), to_float(b)
            else:  # long against decimal: both exact decimals, compared by value
                if not self._decimal_pair_fits(a.type, b.type):
                    return None
                x = to_decimal(a, 19, 0) if a.type.kind is T.INT64 else a.column
                y = to_decimal(b, 19, 0) if b.type.kind is T.INT64 else b.column
        elif a.type.kind is T.DECIMAL:
            if not self._decimal_pair_fits(a.type, b.type):
                return None
            x, y = a.column, b.column
        else:
            x, y = a.column, b.column
        operators: dict[str, Callable[[Column, Column], Column]] = {
            "eq": lambda p, q: p == q,
            "ne": lambda p, q: p != q,
            "lt": lambda p, q: p < q,
            "le": lambda p, q: p <= q,
            "gt": lambda p, q: p > q,
            "ge": lambda p, q: p >= q,
        }
        return operators[name](x, y)

    @staticmethod
    def _decimal_pair_fits(a: ScalarType, b: ScalarType) -> bool:
        """Whether Spark's common decimal type for ``a`` and ``b`` holds both exactly (it is
        capped at 38 digits, which would fail or round)."""
        (ia, sa), (ib, sb) = _decimal_view(a), _decimal_view(b)
        return max(ia, ib) + max(sa, sb) <= MAX_PRECISION

    def arithmetic(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        a, b = args
        kind = widest_numeric_kind([a.type, b.type])
        if kind is T.FLOAT64:
            x, y = to_float(a), to_float(b)
            if name == "add":
                return x + y
            if name == "sub":
                return x - y
            if name == "mul":
                return x * y
            if name == "div":
                return F.when(y == 0, F.lit(None)).otherwise(x / y)
            return F.when(y == 0, F.lit(None)).otherwise(x % y)
        if kind is T.INT64:
            x, y = a.column, b.column
            if name == "div":
                overflow = (x == F.lit(INT64_MIN)) & (y == -1)
                return F.when((y == 0) | overflow, F.lit(None)).otherwise(
                    F.call_function("div", x, y)
                )
            return _TRY[name](x, y)
        if name == "div":
            return None  # Spark rounds half up, to another scale
        x = to_decimal(a, 19, 0) if a.type.kind is T.INT64 else a.column
        y = to_decimal(b, 19, 0) if b.type.kind is T.INT64 else b.column
        column = _TRY[name](x, y)
        spark = result_type(
            self.df.sparkSession, name, _TRY[name], _decimal_type(a.type), _decimal_type(b.type)
        )
        if not isinstance(spark, S.DecimalType) or spark.scale != out.scale:
            return None
        return column.cast(spark_type(out))

    def sign(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        (a,) = args
        x = a.column
        value = -x if name == "neg" else F.abs(x)
        if a.type.kind is T.INT64:
            return F.when(x == F.lit(INT64_MIN), F.lit(None)).otherwise(value)
        return value

    def like(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        text, pattern = args
        if not pattern.is_constant or pattern.constant is None:
            return None  # a computed pattern: the fallback
        literal_pattern: str = pattern.constant
        regex = "".join(
            ".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in literal_pattern
        )
        # rlike searches; anchors and DOTALL make it a whole match over any code point.
        return text.column.rlike(f"(?s)^{regex}$")

    def substr(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        """Code points start .. start+len-1 counting from 1, clipped to the string (Spark's
        own substr counts a negative start from the end, so the bounds are clipped here and
        kept within int range first)."""
        text, start = args[0].column, args[1].column
        size = F.char_length(text).cast(S.LongType())
        # Spark's greatest and least skip NULLs: a NULL start is handled apart.
        first = F.least(F.greatest(start, F.lit(1)), size + 1)
        null = F.lit(None).cast(S.StringType())
        if len(args) == 2:
            rest = text.substr(first.cast(S.IntegerType()), (size + 1 - first).cast("int"))
            return F.when(start.isNull(), null).otherwise(rest)
        count = args[2].column
        # start + len, the exclusive end; past the long range only when both are huge.
        end = F.coalesce(F.try_add(start, count), F.lit(2**63 - 1))
        # end - first only overflows far below zero, where the piece is empty anyway.
        span = F.coalesce(F.try_subtract(end, first), F.lit(0))
        length = F.least(F.greatest(span, F.lit(0)), size + 1)
        piece = text.substr(first.cast(S.IntegerType()), length.cast(S.IntegerType()))
        return F.when(start.isNull() | count.isNull() | (count < 0), null).otherwise(piece)

    def coalesce(self, name: str, args: list[Lowered], out: ScalarType) -> Column | None:
        # The first non-NULL argument, converted after it is chosen (a value that does not
        # fit the result is NULL; it does not fall through to the next argument).
        column = F.lit(None).cast(spark_type(out))
        for arg in reversed(args):
            column = F.when(arg.column.isNotNull(), self.convert(arg, out)).otherwise(column)
        return column


_TRY: dict[str, Callable[[Column, Column], Column]] = {
    "add": F.try_add,
    "sub": F.try_subtract,
    "mul": F.try_multiply,
    "mod": F.try_mod,
}


def _and(self: ScalarLowering, name: str, args: list[Lowered], out: ScalarType) -> Column:
    column = args[0].column
    for arg in args[1:]:
        column = (column & arg.column) if name == "and" else (column | arg.column)
    return column


def _simple(
    function: Callable[..., Column],
) -> Callable[[ScalarLowering, str, list[Lowered], ScalarType], Column]:
    def build(self: ScalarLowering, name: str, args: list[Lowered], out: ScalarType) -> Column:
        return function(*(a.column for a in args))

    return build


_NATIVE: dict[str, Callable[[ScalarLowering, str, list[Lowered], ScalarType], Column | None]] = {
    **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge"), ScalarLowering.comparison),
    "and": _and,
    "or": _and,
    "not": _simple(lambda a: ~a),
    "is_null": _simple(lambda a: a.isNull()),
    "is_not_null": _simple(lambda a: a.isNotNull()),
    **dict.fromkeys(("add", "sub", "mul", "div", "mod"), ScalarLowering.arithmetic),
    "neg": ScalarLowering.sign,
    "abs": ScalarLowering.sign,
    "trim": _simple(F.trim),  # removes U+0020 only, as the contract says
    "length": _simple(lambda s: F.char_length(s).cast(S.LongType())),  # code points
    "concat": _simple(F.concat),
    "substr": ScalarLowering.substr,
    "like": ScalarLowering.like,
    "coalesce": ScalarLowering.coalesce,
    "extract_year": _simple(lambda d: F.year(d).cast(S.LongType())),
    "extract_month": _simple(lambda d: F.month(d).cast(S.LongType())),
    "extract_day": _simple(lambda d: F.dayofmonth(d).cast(S.LongType())),
    "date_trunc_day": _simple(lambda t: t.cast(S.DateType()).cast(S.TimestampNTZType())),
    "days_between": _simple(lambda a, b: F.datediff(a, b).cast(S.LongType())),
}
