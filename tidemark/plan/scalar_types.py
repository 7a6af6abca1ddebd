"""The type of a scalar value, and the rules that combine types (plan.proto's contract).

A :class:`ScalarType` is a column type without a name: the kind, nullability and, for
decimals, precision and scale. The rules here decide types only; evaluating values is the
engine's and the reference evaluator's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tidemark.columnar import Column, ColumnType
from tidemark.errors import InvalidArgument

MAX_PRECISION = 38
# INT64 promoted to a decimal: 19 digits hold every int64 (|x| < 9.3e18).
INT64_DECIMAL_DIGITS = 19

NUMERIC_KINDS = (ColumnType.INT64, ColumnType.DECIMAL, ColumnType.FLOAT64)


@dataclass(frozen=True)
class ScalarType:
    """A value's type. ``precision``/``scale`` are for ``DECIMAL`` only (1..38, 0..precision)."""

    kind: ColumnType
    nullable: bool = True
    precision: int = 0
    scale: int = 0

    def __post_init__(self) -> None:
        if self.kind is ColumnType.DECIMAL:
            if not 1 <= self.precision <= MAX_PRECISION or not 0 <= self.scale <= self.precision:
                raise InvalidArgument(f"invalid decimal type ({self.precision}, {self.scale})")
        elif self.precision or self.scale:
            raise InvalidArgument(f"{self.kind.name} takes no precision or scale")

    @classmethod
    def of_column(cls, column: Column) -> ScalarType:
        return cls(column.type, column.nullable, column.precision, column.scale)

    @classmethod
    def decimal(cls, precision: int, scale: int, nullable: bool = True) -> ScalarType:
        return cls(ColumnType.DECIMAL, nullable, precision, scale)

    def column(self, name: str) -> Column:
        return Column(name, self.kind, self.nullable, self.precision, self.scale)

    def with_nullable(self, nullable: bool) -> ScalarType:
        return replace(self, nullable=nullable)

    @property
    def is_numeric(self) -> bool:
        return self.kind in NUMERIC_KINDS

    @property
    def integer_digits(self) -> int:
        """Digits before the point a value of this numeric type can have."""
        if self.kind is ColumnType.INT64:
            return INT64_DECIMAL_DIGITS
        return self.precision - self.scale

    def same_type(self, other: ScalarType) -> bool:
        """Equal kinds (and decimal precision and scale), whatever the nullability."""
        return self.with_nullable(True) == other.with_nullable(True)

    def describe(self) -> str:
        text = self.kind.name.lower()
        if self.kind is ColumnType.DECIMAL:
            text = f"decimal({self.precision},{self.scale})"
        return text if self.nullable else f"{text} not null"


def column_type(kind: ColumnType, nullable: bool = True) -> ScalarType:
    return ScalarType(kind, nullable)


BOOL = ScalarType(ColumnType.BOOL, nullable=False)
INT64 = ScalarType(ColumnType.INT64, nullable=False)
FLOAT64 = ScalarType(ColumnType.FLOAT64, nullable=False)
TEXT = ScalarType(ColumnType.TEXT, nullable=False)


def comparable(a: ScalarType, b: ScalarType) -> bool:
    """Whether eq/lt/... accept the pair: both numeric, or the same kind."""
    if a.is_numeric and b.is_numeric:
        return True
    return a.kind is b.kind


def widest_numeric_kind(types: Sequence[ScalarType]) -> ColumnType:
    """The kind numeric arguments are promoted to (INT64 < DECIMAL < FLOAT64)."""
    return max((t.kind for t in types), key=NUMERIC_KINDS.index)


@dataclass(frozen=True)
class Unified:
    """The common type of several arguments, and whether converting any of them to it can fail
    (a decimal whose digits had to be capped at 38)."""

    type: ScalarType
    lossy: bool


def unify(types: Sequence[ScalarType], what: str) -> Unified:
    """The one type values of ``types`` take together (coalesce, case branches); nullable if
    any is. Raises ``InvalidArgument`` naming ``what`` when they have no common type."""
    nullable = any(t.nullable for t in types)
    if all(t.is_numeric for t in types):
        kind = widest_numeric_kind(types)
        if kind is not ColumnType.DECIMAL:
            return Unified(ScalarType(kind, nullable), lossy=False)
        scale = max(t.scale for t in types)
        wanted = max(t.integer_digits for t in types) + scale
        precision = min(MAX_PRECISION, wanted)
        return Unified(ScalarType.decimal(precision, scale, nullable), wanted > MAX_PRECISION)
    first = types[0]
    for other in types[1:]:
        if not first.same_type(other):
            raise InvalidArgument(
                f"{what}: arguments have different types ({', '.join(t.describe() for t in types)})"
            )
    return Unified(first.with_nullable(nullable), lossy=False)


def decimal_literal_type(text: str, nullable: bool) -> ScalarType:
    """The type of a DECIMAL literal written as ``text`` (plain form, already validated)."""
    digits = text.lstrip("+-")
    whole, _, fraction = digits.partition(".")
    scale = len(fraction)
    integer_digits = len(whole.lstrip("0"))
    return ScalarType.decimal(max(1, scale + integer_digits), scale, nullable)
