"""The function registry: each scalar function's name, arity and result-type rule.

Only signatures live here (plan.proto's Call comment is the contract). The compute engine and
the test suite's reference evaluator each implement the functions themselves, so that one
checks the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemark.columnar import ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.scalar_types import (
    MAX_PRECISION,
    ScalarType,
    comparable,
    unify,
    widest_numeric_kind,
)

ResultRule = Callable[[str, Sequence[ScalarType]], ScalarType]


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    min_args: int
    # None: any number from min_args on.
    max_args: int | None
    result: ResultRule
    # NULL in any argument gives NULL. Lets validation see which columns a predicate needs.
    strict: bool = True
    # False for functions whose value depends on when or where they run: SQL has them, a
    # maintained view cannot use them, and validation rejects them by name.
    deterministic: bool = True


def _any_nullable(args: Sequence[ScalarType]) -> bool:
    return any(arg.nullable for arg in args)


def _type_error(name: str, args: Sequence[ScalarType], wanted: str) -> InvalidArgument:
    got = ", ".join(arg.describe() for arg in args)
    return InvalidArgument(f"function {name!r} takes {wanted}, not ({got})")


def _expect(name: str, args: Sequence[ScalarType], kinds: Sequence[set[ColumnType]]) -> None:
    """Each argument's kind is one of its position's kinds (the last set repeats)."""
    for index, arg in enumerate(args):
        allowed = kinds[min(index, len(kinds) - 1)]
        if arg.kind not in allowed:
            wanted = ", ".join("|".join(sorted(k.name.lower() for k in ks)) for ks in kinds)
            raise _type_error(name, args, f"({wanted}{', ...' if len(args) > len(kinds) else ''})")


def _comparison(name: str, args: Sequence[ScalarType]) -> ScalarType:
    if not comparable(args[0], args[1]):
        raise _type_error(name, args, "two comparable arguments (numbers, or one type)")
    return ScalarType(ColumnType.BOOL, _any_nullable(args))


def _logic(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.BOOL}])
    return ScalarType(ColumnType.BOOL, _any_nullable(args))


def _null_test(name: str, args: Sequence[ScalarType]) -> ScalarType:
    return ScalarType(ColumnType.BOOL, nullable=False)


def _arithmetic(name: str, args: Sequence[ScalarType]) -> ScalarType:
    if not all(arg.is_numeric for arg in args):
        raise _type_error(name, args, "numeric arguments")
    kind = widest_numeric_kind(args)
    if kind is ColumnType.INT64:
        return ScalarType(kind, nullable=True)
    if kind is ColumnType.FLOAT64:
        return ScalarType(kind, _any_nullable(args) or name in ("div", "mod"))
    scales = [arg.scale for arg in args]
    if name == "mul":
        scale = min(MAX_PRECISION, sum(scales))
    elif name == "div":
        scale = max(*scales, 6)
    else:
        scale = max(scales)
    return ScalarType.decimal(MAX_PRECISION, scale)


def _sign(name: str, args: Sequence[ScalarType]) -> ScalarType:
    (arg,) = args
    if not arg.is_numeric:
        raise _type_error(name, args, "a numeric argument")
    # -INT64_MIN overflows; decimals and floats cannot.
    return arg.with_nullable(True) if arg.kind is ColumnType.INT64 else arg


def _text_to_text(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.TEXT}])
    return ScalarType(ColumnType.TEXT, _any_nullable(args))


def _length(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.TEXT}])
    return ScalarType(ColumnType.INT64, _any_nullable(args))


def _substr(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.TEXT}, {ColumnType.INT64}])
    # A negative length gives NULL.
    return ScalarType(ColumnType.TEXT, _any_nullable(args) or len(args) == 3)


def _like(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.TEXT}])
    return ScalarType(ColumnType.BOOL, _any_nullable(args))


def _coalesce(name: str, args: Sequence[ScalarType]) -> ScalarType:
    unified = unify(args, f"function {name!r}")
    nullable = all(arg.nullable for arg in args) or unified.lossy
    return unified.type.with_nullable(nullable)


def _extract(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.DATE, ColumnType.TIMESTAMP}])
    return ScalarType(ColumnType.INT64, _any_nullable(args))


def _date_trunc_day(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.TIMESTAMP}])
    return ScalarType(ColumnType.TIMESTAMP, _any_nullable(args))


def _shift(base: ColumnType) -> ResultRule:
    """``base`` moved by an INT64 amount; NULL when the result leaves years 1..9999."""

    def rule(name: str, args: Sequence[ScalarType]) -> ScalarType:
        _expect(name, args, [{base}, {ColumnType.INT64}])
        return ScalarType(base, nullable=True)

    return rule


def _days_between(name: str, args: Sequence[ScalarType]) -> ScalarType:
    _expect(name, args, [{ColumnType.DATE}])
    return ScalarType(ColumnType.INT64, _any_nullable(args))


def _fixed(kind: ColumnType) -> ResultRule:
    def rule(name: str, args: Sequence[ScalarType]) -> ScalarType:
        return ScalarType(kind, nullable=False)

    return rule


# Functions SQL has that depend on the clock, randomness or session: typed, so the adapter can
# name them, but never accepted in a plan.
_NONDETERMINISTIC_RESULTS = {
    "now": ColumnType.TIMESTAMP,
    "current_timestamp": ColumnType.TIMESTAMP,
    "localtimestamp": ColumnType.TIMESTAMP,
    "clock_timestamp": ColumnType.TIMESTAMP,
    "statement_timestamp": ColumnType.TIMESTAMP,
    "transaction_timestamp": ColumnType.TIMESTAMP,
    "current_date": ColumnType.DATE,
    "current_time": ColumnType.TEXT,
    "localtime": ColumnType.TEXT,
    "timeofday": ColumnType.TEXT,
    "random": ColumnType.FLOAT64,
    "gen_random_uuid": ColumnType.TEXT,
    "uuid_generate_v4": ColumnType.TEXT,
    "current_user": ColumnType.TEXT,
    "session_user": ColumnType.TEXT,
    "pg_backend_pid": ColumnType.INT64,
}


def _specs() -> dict[str, FunctionSpec]:
    specs = [
        *(FunctionSpec(n, 2, 2, _comparison) for n in ("eq", "ne", "lt", "le", "gt", "ge")),
        FunctionSpec("and", 2, None, _logic, strict=False),
        FunctionSpec("or", 2, None, _logic, strict=False),
        FunctionSpec("not", 1, 1, _logic),
        FunctionSpec("is_null", 1, 1, _null_test, strict=False),
        FunctionSpec("is_not_null", 1, 1, _null_test, strict=False),
        *(FunctionSpec(n, 2, 2, _arithmetic) for n in ("add", "sub", "mul", "div", "mod")),
        FunctionSpec("neg", 1, 1, _sign),
        FunctionSpec("abs", 1, 1, _sign),
        *(FunctionSpec(n, 1, 1, _text_to_text) for n in ("lower", "upper", "trim")),
        FunctionSpec("length", 1, 1, _length),
        FunctionSpec("substr", 2, 3, _substr),
        FunctionSpec("concat", 1, None, _text_to_text),
        FunctionSpec("like", 2, 2, _like),
        FunctionSpec("coalesce", 1, None, _coalesce, strict=False),
        *(
            FunctionSpec(n, 1, 1, _extract)
            for n in ("extract_year", "extract_month", "extract_day")
        ),
        FunctionSpec("date_trunc_day", 1, 1, _date_trunc_day),
        FunctionSpec("add_days", 2, 2, _shift(ColumnType.DATE)),
        FunctionSpec("days_between", 2, 2, _days_between),
        FunctionSpec("add_months", 2, 2, _shift(ColumnType.TIMESTAMP)),
        FunctionSpec("add_microseconds", 2, 2, _shift(ColumnType.TIMESTAMP)),
        *(
            FunctionSpec(n, 0, 0, _fixed(kind), deterministic=False)
            for n, kind in _NONDETERMINISTIC_RESULTS.items()
        ),
    ]
    return {spec.name: spec for spec in specs}


FUNCTIONS: dict[str, FunctionSpec] = _specs()
"""Every known function by name, nondeterministic ones included (check ``deterministic``)."""
DETERMINISTIC = frozenset(name for name, spec in FUNCTIONS.items() if spec.deterministic)
"""The functions a plan may use, which the engine and the reference evaluator implement."""
NONDETERMINISTIC = frozenset(FUNCTIONS) - DETERMINISTIC


def lookup(name: str) -> FunctionSpec:
    """The spec of a function a plan may use; ``InvalidArgument`` for any other name."""
    spec = FUNCTIONS.get(name) or FUNCTIONS.get(name.lower())
    if spec is not None and not spec.deterministic:
        raise InvalidArgument(
            f"function {name!r} is nondeterministic; a maintained view cannot use it"
        )
    if spec is None or spec.name != name:
        known = ", ".join(sorted(DETERMINISTIC))
        raise InvalidArgument(f"unknown function {name!r}; known: {known}")
    return spec


def result_type(name: str, args: Sequence[ScalarType]) -> ScalarType:
    """The type ``name`` returns for arguments of ``args``' types, after checking the arity
    and argument types; ``InvalidArgument`` naming the function otherwise."""
    spec = lookup(name)
    count = len(args)
    if count < spec.min_args or (spec.max_args is not None and count > spec.max_args):
        if spec.max_args is None:
            wanted = f"at least {spec.min_args}"
        elif spec.min_args == spec.max_args:
            wanted = str(spec.min_args)
        else:
            wanted = f"{spec.min_args} to {spec.max_args}"
        raise InvalidArgument(f"function {name!r} takes {wanted} arguments, got {count}")
    return spec.result(name, args)


# Casts ------------------------------------------------------------------------------------

_TEXT_PARSES_TO = {
    ColumnType.BOOL,
    ColumnType.INT64,
    ColumnType.FLOAT64,
    ColumnType.DECIMAL,
    ColumnType.DATE,
    ColumnType.TIMESTAMP,
    ColumnType.BYTES,
    ColumnType.JSON,
}


def cast_allowed(source: ScalarType, target: ScalarType) -> bool:
    if source.kind is target.kind or target.kind is ColumnType.TEXT:
        return True
    if source.is_numeric and target.is_numeric:
        return True
    if source.kind is ColumnType.TEXT:
        return target.kind in _TEXT_PARSES_TO
    return {source.kind, target.kind} == {ColumnType.DATE, ColumnType.TIMESTAMP}


def cast_can_fail(source: ScalarType, target: ScalarType) -> bool:
    """Whether some non-NULL value of ``source`` casts to NULL (so the result is nullable)."""
    if target.kind is ColumnType.DECIMAL:
        if source.kind is ColumnType.INT64:
            return target.integer_digits < source.integer_digits
        if source.kind is ColumnType.DECIMAL:
            # Rounding away fractional digits can carry into one more integer digit.
            carry = 1 if target.scale < source.scale else 0
            return target.integer_digits < source.integer_digits + carry
        return True
    if target.kind is ColumnType.INT64:
        if source.kind is ColumnType.DECIMAL:
            # Up to 18 integer digits, even rounded up, stay below 2**63.
            return source.integer_digits > 18
        return source.kind is not ColumnType.INT64
    if source.kind is ColumnType.TEXT:
        return target.kind is not ColumnType.TEXT
    return False


def cast_type(source: ScalarType, target: ScalarType) -> ScalarType:
    """The type of casting a ``source`` value to ``target``'s kind (its nullability ignored)."""
    if not cast_allowed(source, target):
        raise InvalidArgument(
            f"cannot cast {source.with_nullable(True).describe()} to "
            f"{target.with_nullable(True).describe()}"
        )
    return target.with_nullable(source.nullable or cast_can_fail(source, target))
