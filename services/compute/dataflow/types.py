"""Column types while compiling a plan: the plan library's ``ScalarType`` plus a few helpers.

Scalar semantics depend on types (int64 overflow gives NULL, decimal results are rounded to a
scale, comparisons promote int64 < decimal < float64), so every compiled expression and every
lowered relation carries one ``ScalarType`` per column.
"""

from __future__ import annotations

from tidemark.columnar.schema import MAX_DECIMAL_PRECISION, ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import common_pb2

__all__ = ["ColumnType", "ScalarType", "computed_decimal", "from_column", "from_schema"]


def computed_decimal(scale: int, nullable: bool = True) -> ScalarType:
    """DECIMAL(38, scale): the type of decimal arithmetic and aggregate results."""
    return ScalarType.decimal(MAX_DECIMAL_PRECISION, scale, nullable)


def from_column(column: common_pb2.Column, where: str) -> ScalarType:
    try:
        kind = ColumnType(column.type)
    except ValueError:
        raise InvalidArgument(f"{where}: column {column.name!r} has no type") from None
    if kind is ColumnType.DECIMAL:
        precision = column.precision or MAX_DECIMAL_PRECISION
        if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= column.scale <= precision:
            raise InvalidArgument(
                f"{where}: column {column.name!r}: DECIMAL({column.precision},{column.scale}) "
                "is not a valid decimal type"
            )
        return ScalarType(kind, column.nullable, precision, column.scale)
    if column.precision or column.scale:
        raise InvalidArgument(
            f"{where}: column {column.name!r}: precision and scale apply to decimals only"
        )
    return ScalarType(kind, column.nullable)


def from_schema(schema: common_pb2.RelationSchema, where: str) -> list[ScalarType]:
    if not schema.columns:
        raise InvalidArgument(f"{where}: a relation needs at least one column")
    return [from_column(column, where) for column in schema.columns]
