"""Compiles a plan ``Scalar`` into a Python callable over one row tuple.

Compilation type-checks the expression (rejecting unknown and nondeterministic functions and
ill-typed calls with ``InvalidArgument``), resolves numeric promotion once, and folds
sub-expressions without column references into constants. Evaluation never raises: overflow,
division by zero and failed casts give NULL (None), as the contract says.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from services.compute.dataflow.datum import datum_value
from services.compute.dataflow.functions import casts, numeric, temporal, text
from services.compute.dataflow.functions.compare import COMPARISONS, comparison
from services.compute.dataflow.ordering import canonical_float
from services.compute.dataflow.types import from_column
from tidemark.columnar.schema import ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.scalar_types import ScalarType, comparable, unify, widest_numeric_kind
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]
Evaluator = Callable[[Row], Any]

BOOL_NOT_NULL = ScalarType(ColumnType.BOOL, False)

NONDETERMINISTIC = frozenset(
    {
        "now",
        "random",
        "rand",
        "setseed",
        "current_timestamp",
        "current_date",
        "current_time",
        "localtime",
        "localtimestamp",
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "gen_random_uuid",
        "uuid_generate_v4",
        "mz_now",
    }
)


@dataclass(frozen=True, slots=True)
class CompiledScalar:
    """An expression ready to run: ``evaluate(row)`` gives its value (None is NULL)."""

    evaluate: Evaluator
    type: ScalarType
    constant: bool = False


def compile_scalar(
    expr: plan_pb2.Scalar, input_types: Sequence[ScalarType], where: str = "expression"
) -> CompiledScalar:
    """Compiles ``expr`` over rows whose columns have ``input_types``. ``where`` names the plan
    node in error messages."""
    return _Compiler(input_types, where).compile(expr)


def constant(value: Any, type_: ScalarType) -> CompiledScalar:
    def evaluate(row: Row) -> Any:
        return value

    return CompiledScalar(evaluate, type_, True)


def _folded(result: CompiledScalar, args: Sequence[CompiledScalar]) -> CompiledScalar:
    """``result`` evaluated once when none of its arguments reads the row."""
    if args and all(arg.constant for arg in args):
        return constant(result.evaluate(()), result.type)
    return result


# -- null handling wrappers ------------------------------------------------------------------


def strict1(f: Callable[[Any], Any], a: Evaluator) -> Evaluator:
    def evaluate(row: Row) -> Any:
        x = a(row)
        return None if x is None else f(x)

    return evaluate


def strict2(f: Callable[[Any, Any], Any], a: Evaluator, b: Evaluator) -> Evaluator:
    def evaluate(row: Row) -> Any:
        x = a(row)
        if x is None:
            return None
        y = b(row)
        if y is None:
            return None
        return f(x, y)

    return evaluate


def strict_n(f: Callable[..., Any], args: Sequence[Evaluator]) -> Evaluator:
    def evaluate(row: Row) -> Any:
        values = []
        for arg in args:
            value = arg(row)
            if value is None:
                return None
            values.append(value)
        return f(*values)

    return evaluate


# -- conversions between types ---------------------------------------------------------------


def promoted(arg: CompiledScalar, kind: ColumnType) -> Evaluator:
    """``arg``'s values converted to the numeric ``kind`` (value only; decimals keep their own
    digits, which is exact)."""
    source = arg.type.kind
    if source is kind:
        return arg.evaluate
    if kind is ColumnType.FLOAT64:
        # A decimal -0 would otherwise become the float -0.0, which the contract normalises.
        return strict1(_to_float, arg.evaluate)
    return strict1(Decimal, arg.evaluate)


def _to_float(value: Any) -> float:
    return canonical_float(float(value))


def _conversion(source: ScalarType, target: ScalarType) -> Callable[[Any], Any] | None:
    """How a non-NULL value of ``source`` becomes one of the unified type ``target`` (None when
    it is already one)."""
    if not target.is_numeric or source.same_type(target):
        return None
    if target.kind is ColumnType.FLOAT64:
        return None if source.kind is ColumnType.FLOAT64 else _to_float
    return casts.to_decimal(source.kind, target.precision, target.scale)


def converted(arg: CompiledScalar, target: ScalarType) -> CompiledScalar:
    """``arg`` as a value of the unified type ``target``: numbers are promoted, and a decimal
    that does not fit ``target``'s precision becomes NULL."""
    convert = _conversion(arg.type, target)
    if convert is None:
        return CompiledScalar(arg.evaluate, target, arg.constant)
    return CompiledScalar(strict1(convert, arg.evaluate), target, arg.constant)


class _Compiler:
    def __init__(self, input_types: Sequence[ScalarType], where: str) -> None:
        self.input_types = list(input_types)
        self.where = where

    def fail(self, message: str) -> InvalidArgument:
        return InvalidArgument(f"{self.where}: {message}")

    def compile(self, expr: plan_pb2.Scalar) -> CompiledScalar:
        kind = expr.WhichOneof("kind")
        if kind == "column":
            return self.column(expr.column)
        if kind == "literal":
            value, type_ = datum_value(expr.literal, self.where)
            return constant(value, type_)
        if kind == "call":
            return self.call(expr.call)
        if kind == "case":
            return self.case(expr.case)
        if kind == "cast":
            return self.cast(expr.cast)
        raise self.fail("empty scalar expression")

    def column(self, index: int) -> CompiledScalar:
        if index >= len(self.input_types):
            raise self.fail(
                f"column {index} is out of range (the input has {len(self.input_types)} columns)"
            )
        return CompiledScalar(operator.itemgetter(index), self.input_types[index])

    def case(self, case: plan_pb2.Case) -> CompiledScalar:
        cond = self.compile(case.cond)
        if cond.type.kind is not ColumnType.BOOL:
            raise self.fail(f"case: the condition is {cond.type.describe()}, not BOOL")
        then, otherwise = self.compile(case.then), self.compile(case.otherwise)
        unified = unify([then.type, otherwise.type], f"{self.where}: case")
        result_type = unified.type.with_nullable(unified.type.nullable or unified.lossy)
        then_eval = converted(then, result_type).evaluate
        else_eval = converted(otherwise, result_type).evaluate
        test = cond.evaluate

        def evaluate(row: Row) -> Any:
            return then_eval(row) if test(row) is True else else_eval(row)

        return _folded(CompiledScalar(evaluate, result_type), [cond, then, otherwise])

    def cast(self, cast: plan_pb2.Cast) -> CompiledScalar:
        arg = self.compile(cast.input)
        target = from_column(cast.to, self.where)
        convert, can_fail = casts.cast_converter(arg.type, target)
        result_type = target.with_nullable(arg.type.nullable or can_fail)
        return _folded(CompiledScalar(strict1(convert, arg.evaluate), result_type), [arg])

    def call(self, call: plan_pb2.Call) -> CompiledScalar:
        name = call.function
        if name in NONDETERMINISTIC:
            raise self.fail(f"function {name!r} is nondeterministic and cannot be maintained")
        build = _FUNCTIONS.get(name)
        if build is None:
            raise self.fail(f"unknown function {name!r}")
        args = [self.compile(arg) for arg in call.args]
        return _folded(build(self, name, args), args)

    def arity(self, name: str, args: Sequence[CompiledScalar], low: int, high: int) -> None:
        if not low <= len(args) <= high:
            wanted = str(low) if low == high else f"{low} to {high}" if high < 99 else f"{low}+"
            raise self.fail(f"function {name!r} takes {wanted} arguments, got {len(args)}")

    def expect(self, name: str, arg: CompiledScalar, *kinds: ColumnType) -> None:
        if arg.type.kind not in kinds:
            allowed = " or ".join(kind.name for kind in kinds)
            raise self.fail(f"function {name!r} takes {allowed}, got {arg.type.describe()}")


# -- function builders -----------------------------------------------------------------------

Builder = Callable[[_Compiler, str, list[CompiledScalar]], CompiledScalar]


def _nullable(args: Sequence[CompiledScalar]) -> bool:
    return any(arg.type.nullable for arg in args)


def _comparison(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 2, 2)
    a, b = args
    if not comparable(a.type, b.type):
        raise c.fail(
            f"function {name!r} cannot compare {a.type.describe()} with {b.type.describe()}"
        )
    kind = a.type.kind
    if a.type.is_numeric:
        kind = widest_numeric_kind([a.type, b.type])
    compare = comparison(name, kind)
    evaluate = strict2(compare, promoted(a, kind), promoted(b, kind))
    return CompiledScalar(evaluate, ScalarType(ColumnType.BOOL, _nullable(args)))


def _and(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 2, 999)
    for arg in args:
        c.expect(name, arg, ColumnType.BOOL)
    parts = [arg.evaluate for arg in args]
    absorbing = name == "or"  # the value that decides the result on its own

    def evaluate(row: Row) -> Any:
        unknown = False
        for part in parts:
            value = part(row)
            if value is None:
                unknown = True
            elif value is absorbing:
                return absorbing
        return None if unknown else not absorbing

    return CompiledScalar(evaluate, ScalarType(ColumnType.BOOL, _nullable(args)))


def _not(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 1, 1)
    c.expect(name, args[0], ColumnType.BOOL)
    return CompiledScalar(strict1(operator.not_, args[0].evaluate), args[0].type)


def _is_null(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 1, 1)
    inner = args[0].evaluate
    if name == "is_null":

        def evaluate(row: Row) -> Any:
            return inner(row) is None
    else:

        def evaluate(row: Row) -> Any:
            return inner(row) is not None

    return CompiledScalar(evaluate, BOOL_NOT_NULL)


_NUMERIC_KINDS = (ColumnType.INT64, ColumnType.DECIMAL, ColumnType.FLOAT64)


def _arithmetic(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 2, 2)
    a, b = args
    c.expect(name, a, *_NUMERIC_KINDS)
    c.expect(name, b, *_NUMERIC_KINDS)
    kind = widest_numeric_kind([a.type, b.type])
    result = numeric.result_type(name, a.type, b.type, kind)
    op = numeric.binary_op(name, kind, result.scale)
    return CompiledScalar(strict2(op, promoted(a, kind), promoted(b, kind)), result)


def _unary_arithmetic(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 1, 1)
    (a,) = args
    c.expect(name, a, *_NUMERIC_KINDS)
    result = a.type.with_nullable(True) if a.type.kind is ColumnType.INT64 else a.type
    return CompiledScalar(strict1(numeric.unary_op(name, a.type.kind), a.evaluate), result)


def _text_function(
    f: Callable[..., Any], result_kind: ColumnType, arg_kinds: Sequence[ColumnType]
) -> Builder:
    def build(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
        c.arity(name, args, len(arg_kinds), len(arg_kinds))
        for arg, kind in zip(args, arg_kinds, strict=True):
            c.expect(name, arg, kind)
        evaluators = [arg.evaluate for arg in args]
        if len(evaluators) == 1:
            evaluate = strict1(f, evaluators[0])
        else:
            evaluate = strict_n(f, evaluators)
        return CompiledScalar(evaluate, ScalarType(result_kind, _nullable(args)))

    return build


def _substr(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 2, 3)
    c.expect(name, args[0], ColumnType.TEXT)
    for arg in args[1:]:
        c.expect(name, arg, ColumnType.INT64)
    nullable = _nullable(args) or len(args) == 3
    evaluate = strict_n(text.substr, [arg.evaluate for arg in args])
    return CompiledScalar(evaluate, ScalarType(ColumnType.TEXT, nullable))


def _concat(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 1, 999)
    for arg in args:
        c.expect(name, arg, ColumnType.TEXT)
    evaluate = strict_n(text.concat, [arg.evaluate for arg in args])
    return CompiledScalar(evaluate, ScalarType(ColumnType.TEXT, _nullable(args)))


def _like(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 2, 2)
    for arg in args:
        c.expect(name, arg, ColumnType.TEXT)
    subject, pattern = args
    result_type = ScalarType(ColumnType.BOOL, _nullable(args))
    if pattern.constant:
        fixed = pattern.evaluate(())
        if fixed is None:
            return constant(None, result_type)
        return CompiledScalar(strict1(text.like_matcher(fixed), subject.evaluate), result_type)
    return CompiledScalar(strict2(text.like, subject.evaluate, pattern.evaluate), result_type)


def _coalesce(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
    c.arity(name, args, 1, 999)
    unified = unify([arg.type for arg in args], f"{c.where}: {name}")
    nullable = all(arg.type.nullable for arg in args) or unified.lossy
    result_type = unified.type.with_nullable(nullable)
    # The first non-NULL argument wins, and only then is it converted: one that does not fit
    # the result type makes the result NULL (it does not fall through to the next argument).
    parts = [(arg.evaluate, _conversion(arg.type, result_type)) for arg in args]

    def evaluate(row: Row) -> Any:
        for part, convert in parts:
            value = part(row)
            if value is not None:
                return value if convert is None else convert(value)
        return None

    return CompiledScalar(evaluate, result_type)


def _temporal(f: Callable[[Any], Any], result_kind: ColumnType, *kinds: ColumnType) -> Builder:
    def build(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
        c.arity(name, args, 1, 1)
        c.expect(name, args[0], *kinds)
        return CompiledScalar(
            strict1(f, args[0].evaluate), ScalarType(result_kind, args[0].type.nullable)
        )

    return build


_DATES = (ColumnType.DATE, ColumnType.TIMESTAMP)


def _temporal2(
    f: Callable[[Any, Any], Any], result: ScalarType, first: ColumnType, second: ColumnType
) -> Builder:
    def build(c: _Compiler, name: str, args: list[CompiledScalar]) -> CompiledScalar:
        c.arity(name, args, 2, 2)
        c.expect(name, args[0], first)
        c.expect(name, args[1], second)
        nullable = result.nullable or any(a.type.nullable for a in args)
        evaluate = strict2(f, args[0].evaluate, args[1].evaluate)
        return CompiledScalar(evaluate, ScalarType(result.kind, nullable))

    return build


_FUNCTIONS: dict[str, Builder] = {
    **dict.fromkeys(COMPARISONS, _comparison),
    "and": _and,
    "or": _and,
    "not": _not,
    "is_null": _is_null,
    "is_not_null": _is_null,
    **dict.fromkeys(("add", "sub", "mul", "div", "mod"), _arithmetic),
    "neg": _unary_arithmetic,
    "abs": _unary_arithmetic,
    "lower": _text_function(text.lower, ColumnType.TEXT, [ColumnType.TEXT]),
    "upper": _text_function(text.upper, ColumnType.TEXT, [ColumnType.TEXT]),
    "trim": _text_function(text.trim, ColumnType.TEXT, [ColumnType.TEXT]),
    "length": _text_function(text.length, ColumnType.INT64, [ColumnType.TEXT]),
    "substr": _substr,
    "concat": _concat,
    "like": _like,
    "coalesce": _coalesce,
    "extract_year": _temporal(temporal.extract_year, ColumnType.INT64, *_DATES),
    "extract_month": _temporal(temporal.extract_month, ColumnType.INT64, *_DATES),
    "extract_day": _temporal(temporal.extract_day, ColumnType.INT64, *_DATES),
    "date_trunc_day": _temporal(
        temporal.date_trunc_day, ColumnType.TIMESTAMP, ColumnType.TIMESTAMP
    ),
    "add_days": _temporal2(
        temporal.add_days, ScalarType(ColumnType.DATE, True), ColumnType.DATE, ColumnType.INT64
    ),
    "days_between": _temporal2(
        temporal.days_between, ScalarType(ColumnType.INT64, False), ColumnType.DATE, ColumnType.DATE
    ),
    "add_months": _temporal2(
        temporal.add_months,
        ScalarType(ColumnType.TIMESTAMP, True),
        ColumnType.TIMESTAMP,
        ColumnType.INT64,
    ),
    "add_microseconds": _temporal2(
        temporal.add_microseconds,
        ScalarType(ColumnType.TIMESTAMP, True),
        ColumnType.TIMESTAMP,
        ColumnType.INT64,
    ),
}

KNOWN_FUNCTIONS = frozenset(_FUNCTIONS)
