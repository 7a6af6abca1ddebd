"""Typed scalar expressions: plan Scalars with their types, and SQL's type coercions.

A :class:`Typed` is a ``plan_pb2.Scalar`` together with its type. Types are worked out as
each node is built, by the same rules compute validates plans with (``tidemark.plan``), so a
planned query always type-checks.

PostgreSQL leaves a quoted literal (and a bare NULL) untyped until its context decides:
``d = '2024-01-01'`` reads the string as a date. Such a Typed is *unknown*; :func:`coerce`
gives it a type by folding the text into a literal of that type (so bad text is an error when
the statement is planned), and anything left unknown at the end becomes text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from services.adapter.sql.errors import (
    DATATYPE_MISMATCH,
    NUMERIC_VALUE_OUT_OF_RANGE,
    UNDEFINED_FUNCTION,
    SqlError,
    not_supported,
)
from services.adapter.sql.literals import parse_text, round_decimal
from services.adapter.sql.types import type_name
from tidemark.columnar import ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.plan.datum import INT64_MAX, INT64_MIN, datum_type, from_datum, to_datum
from tidemark.plan.functions import cast_type, result_type
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType, unify
from tidemark.v1 import plan_pb2

BOOL = ScalarType(ColumnType.BOOL)
INT64 = ScalarType(ColumnType.INT64)
FLOAT64 = ScalarType(ColumnType.FLOAT64)
TEXT = ScalarType(ColumnType.TEXT)
TIMESTAMP = ScalarType(ColumnType.TIMESTAMP)


@dataclass(frozen=True)
class Typed:
    """A scalar and its type. ``unknown_text`` holds an untyped quoted literal's text, and
    ``unknown_null`` marks a bare NULL; both are typed text until coerced."""

    scalar: plan_pb2.Scalar
    type: ScalarType
    unknown_text: str | None = None
    unknown_null: bool = False
    position: int = 0
    # A literal's value, kept so folding need not decode the Datum again.
    value: Any = field(default=None, compare=False)

    @property
    def is_unknown(self) -> bool:
        return self.unknown_text is not None or self.unknown_null

    def at(self, position: int) -> Typed:
        if not position or position == self.position:
            return self
        return replace(self, position=position)


class _NotLiteral:
    pass


_NOT_LITERAL: Any = _NotLiteral()


def literal_value(typed: Typed) -> Any:
    """The value of a literal Typed, or the module's not-a-literal marker."""
    if typed.value is not None and not typed.is_unknown:
        return typed.value
    scalar = typed.scalar
    if scalar.WhichOneof("kind") == "cast" and scalar.cast.input.WhichOneof("kind") == "literal":
        if typed.type.kind is ColumnType.DECIMAL:
            return from_datum(scalar.cast.input.literal)
        return _NOT_LITERAL
    if scalar.WhichOneof("kind") != "literal":
        return _NOT_LITERAL
    return from_datum(scalar.literal)


def is_literal(typed: Typed) -> bool:
    return literal_value(typed) is not _NOT_LITERAL


# Constructors -----------------------------------------------------------------------------


def column(position: int, column_type: ScalarType) -> Typed:
    return Typed(pb.column(position), column_type)


def literal(value: Any, target: ScalarType, position: int = 0) -> Typed:
    """A literal of exactly ``target``'s type (a decimal is cast to its precision and scale)."""
    if value is None:
        return null(target, position)
    try:
        if target.kind is ColumnType.DECIMAL:
            scalar = pb.literal(value, target.with_nullable(False))
        else:
            scalar = plan_pb2.Scalar(literal=to_datum(value, target.kind))
    except InvalidArgument as exc:
        raise SqlError(NUMERIC_VALUE_OUT_OF_RANGE, exc.message, position) from None
    if scalar.WhichOneof("kind") == "literal":
        own = datum_type(scalar.literal)
        if own.kind is ColumnType.DECIMAL and (own.precision, own.scale) != (
            target.precision,
            target.scale,
        ):
            scalar = pb.cast(scalar, target)
    return Typed(scalar, target.with_nullable(False), position=position, value=value)


def null(target: ScalarType, position: int = 0) -> Typed:
    scalar = plan_pb2.Scalar(literal=to_datum(None, target.kind))
    if target.kind is ColumnType.DECIMAL and (target.precision, target.scale) != (
        MAX_PRECISION,
        0,
    ):
        scalar = pb.cast(scalar, target)
    return Typed(scalar, target.with_nullable(True), position=position)


def unknown_text(text: str, position: int = 0) -> Typed:
    scalar = plan_pb2.Scalar(literal=to_datum(text, ColumnType.TEXT))
    return Typed(scalar, TEXT.with_nullable(False), unknown_text=text, position=position)


def unknown_null(position: int = 0) -> Typed:
    return replace(null(TEXT), unknown_null=True, position=position)


def call(name: str, *args: Typed, position: int = 0) -> Typed:
    """``name(args)`` typed by the function registry; 42883 when the types do not fit."""
    resolved = [resolve(arg) for arg in args]
    try:
        out = result_type(name, [arg.type for arg in resolved])
    except InvalidArgument as exc:
        where = position or _first_position(args)
        raise SqlError(UNDEFINED_FUNCTION, exc.message, where) from None
    return Typed(pb.call(name, *(arg.scalar for arg in resolved)), out, position=position)


def case(cond: Typed, then: Typed, otherwise: Typed, position: int = 0) -> Typed:
    """CASE WHEN cond THEN then ELSE otherwise END, branches already of one type family."""
    try:
        unified = unify([then.type, otherwise.type], "case branches")
    except InvalidArgument as exc:
        raise SqlError(DATATYPE_MISMATCH, exc.message, position) from None
    out = unified.type.with_nullable(unified.type.nullable or unified.lossy)
    return Typed(pb.case(cond.scalar, then.scalar, otherwise.scalar), out, position=position)


def cast(value: Typed, target: ScalarType, position: int = 0) -> Typed:
    """A plan-level Cast (the IR's rules: a failing cast gives NULL)."""
    value = resolve(value)
    try:
        out = cast_type(value.type, target)
    except InvalidArgument as exc:
        raise SqlError(DATATYPE_MISMATCH, exc.message, position or value.position) from None
    return Typed(pb.cast(value.scalar, target), out, position=position or value.position)


def _first_position(args: Sequence[Typed]) -> int:
    return next((arg.position for arg in args if arg.position), 0)


# Coercion ---------------------------------------------------------------------------------


def resolve(value: Typed) -> Typed:
    """An unknown literal as text (what is left when no context typed it)."""
    if not value.is_unknown:
        return value
    return replace(value, unknown_text=None, unknown_null=False)


def coerce(value: Typed, target: ScalarType, position: int = 0) -> Typed:
    """Gives an unknown literal ``target``'s type (folding its text); others unchanged."""
    where = position or value.position
    if value.unknown_null:
        return null(target, where)
    if value.unknown_text is not None:
        if target.kind is ColumnType.DECIMAL and target.precision == 0:
            target = ScalarType.decimal(MAX_PRECISION, 10)
        return literal(parse_text(value.unknown_text, target, where), target, where)
    return value


def common_type(values: Sequence[Typed], context: str, position: int = 0) -> ScalarType:
    """The type SQL gives values that must share one (CASE branches, UNION columns, VALUES
    columns, IN lists, COALESCE arguments): numbers promote, date goes to timestamp, unknown
    literals take the others' type and text when all are unknown. 42804 otherwise."""
    known = [v.type for v in values if not v.is_unknown]
    nullable = any(v.type.nullable for v in values)
    if not known:
        return TEXT.with_nullable(nullable)
    if all(t.is_numeric for t in known):
        unified = unify(known, context).type
        return unified.with_nullable(nullable)
    kinds = {t.kind for t in known}
    if kinds == {ColumnType.DATE, ColumnType.TIMESTAMP}:
        return TIMESTAMP.with_nullable(nullable)
    first = known[0]
    for other in known[1:]:
        if other.kind is not first.kind:
            raise SqlError(
                DATATYPE_MISMATCH,
                f"{context} types {type_name(first)} and {type_name(other)} cannot be matched",
                position or _first_position(values),
            )
    return first.with_nullable(nullable)


def convert(value: Typed, target: ScalarType, position: int = 0) -> Typed:
    """``value`` as exactly ``target``'s type, for values already found compatible by
    :func:`common_type` (numeric promotion, date to timestamp, decimal precision)."""
    value = coerce(value, target, position)
    if value.type.same_type(target):
        return value
    folded = fold(value, target, position)
    if folded is not None:
        return folded
    return cast(value, target, position)


def fold(value: Typed, target: ScalarType, position: int = 0) -> Typed | None:
    """A literal converted to ``target`` now, with PostgreSQL's rounding and range errors;
    None when ``value`` is not a literal or the conversion is not a plain one."""
    current = literal_value(value)
    if current is _NOT_LITERAL:
        return None
    where = position or value.position
    if current is None:
        return null(target, where)
    converted = convert_value(current, value.type, target, where)
    if converted is _NOT_LITERAL:
        return None
    return literal(converted, target, where)


def convert_value(value: Any, source: ScalarType, target: ScalarType, position: int) -> Any:
    """A non-NULL Python value of ``source`` in ``target`` (numeric conversions and date to
    timestamp, as PostgreSQL rounds); the not-a-literal marker for other pairs."""
    kind = target.kind
    if source.kind is kind and kind is not ColumnType.DECIMAL:
        return value
    if source.is_numeric and target.is_numeric:
        if kind is ColumnType.FLOAT64:
            return float(value)
        if kind is ColumnType.DECIMAL:
            if source.kind is ColumnType.FLOAT64:
                return _NOT_LITERAL
            return round_decimal(Decimal(value), target, position)
        if source.kind is ColumnType.FLOAT64:
            return _NOT_LITERAL
        rounded = round_decimal(Decimal(value), ScalarType.decimal(MAX_PRECISION, 0), position)
        number = int(rounded)
        if not INT64_MIN <= number <= INT64_MAX:
            raise SqlError(NUMERIC_VALUE_OUT_OF_RANGE, "bigint out of range", position)
        return number
    if source.kind is ColumnType.DATE and kind is ColumnType.TIMESTAMP:
        import datetime

        return datetime.datetime(value.year, value.month, value.day)
    return _NOT_LITERAL


def comparable_pair(left: Typed, right: Typed, operator: str, position: int) -> tuple[Typed, Typed]:
    """Two operands made comparable as PostgreSQL compares them: unknown literals take the
    other side's type, a date meets a timestamp as a timestamp. 42883 when there is no such
    comparison."""
    if left.is_unknown and right.is_unknown:
        left, right = resolve(left), resolve(right)
    elif left.is_unknown:
        left = coerce(left, right.type, position)
    elif right.is_unknown:
        right = coerce(right, left.type, position)
    lt, rt = left.type, right.type
    if lt.is_numeric and rt.is_numeric:
        return left, right
    if {lt.kind, rt.kind} == {ColumnType.DATE, ColumnType.TIMESTAMP}:
        return convert(left, TIMESTAMP, position), convert(right, TIMESTAMP, position)
    if lt.kind is not rt.kind:
        raise SqlError(
            UNDEFINED_FUNCTION,
            f"operator does not exist: {type_name(lt)} {operator} {type_name(rt)}",
            position,
            hint="No operator matches the given name and argument types; add an explicit cast.",
        )
    if lt.kind is ColumnType.JSON and operator not in ("=", "<>", "!="):
        raise not_supported(f"ordering comparisons ({operator}) of jsonb values", position)
    return left, right


def require_kind(value: Typed, kinds: set[ColumnType], what: str, position: int) -> Typed:
    """``value`` (unknown literals read as the first of ``kinds``), 42804 unless one of them."""
    if value.is_unknown:
        preferred = ColumnType.TEXT if ColumnType.TEXT in kinds else sorted(kinds, key=str)[0]
        value = coerce(value, ScalarType(preferred), position)
    if value.type.kind not in kinds:
        wanted = " or ".join(sorted(type_name(ScalarType(k)) for k in kinds))
        raise SqlError(
            DATATYPE_MISMATCH,
            f"{what} must be {wanted}, not {type_name(value.type)}",
            position or value.position,
        )
    return value


def boolean(value: Typed, what: str, position: int = 0) -> Typed:
    """A condition: 42804 unless boolean (unknown literals read as boolean)."""
    if value.is_unknown:
        value = coerce(value, BOOL, position)
    if value.type.kind is not ColumnType.BOOL:
        raise SqlError(
            DATATYPE_MISMATCH,
            f"argument of {what} must be type boolean, not type {type_name(value.type)}",
            position or value.position,
        )
    return value


def true_literal() -> Typed:
    return literal(True, BOOL)


def false_literal() -> Typed:
    return literal(False, BOOL)
