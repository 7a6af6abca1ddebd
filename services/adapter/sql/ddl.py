"""What DDL statements need from planning: relation schemas from column definitions, and index
keys checked against the relation (``tidemark.plan.catalog_relations`` has the plan an index
reads its relation with)."""

from __future__ import annotations

from collections.abc import Sequence

from services.adapter.sql.catalog_view import BoundRelation
from services.adapter.sql.errors import (
    DUPLICATE_COLUMN,
    RESERVED_NAME,
    UNDEFINED_COLUMN,
    SqlError,
)
from services.adapter.sql.names import dotted
from services.adapter.sql.statements import ColumnDef
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar.schema import RESERVED_COLUMNS
from tidemark.errors import InvalidArgument
from tidemark.plan import catalog_relations
from tidemark.plan.catalog_relations import UnknownColumn


def relation_schema(columns: Sequence[ColumnDef]) -> RelationSchema:
    """The schema CREATE TABLE/SOURCE declares: 42701 for a repeated column name, 42939 for
    the names update batches reserve (time, diff)."""
    seen: set[str] = set()
    built: list[Column] = []
    for column in columns:
        if column.name in seen:
            raise SqlError(
                DUPLICATE_COLUMN,
                f'column "{column.name}" specified more than once',
                column.position,
            )
        if column.name in RESERVED_COLUMNS:
            raise SqlError(
                RESERVED_NAME, f'column name "{column.name}" is reserved', column.position
            )
        seen.add(column.name)
        kind = column.type.type
        try:
            built.append(
                Column(column.name, kind.kind, not column.not_null, kind.precision, kind.scale)
            )
        except InvalidArgument as exc:
            raise SqlError("42602", exc.message, column.position) from None
    return RelationSchema(built)


def key_positions(relation: BoundRelation, names: Sequence[str], position: int = 0) -> list[int]:
    """The positions of an index's key columns (42703 for a column the relation lacks)."""
    try:
        return list(catalog_relations.key_positions(relation.item, names))
    except UnknownColumn as exc:
        raise SqlError(
            UNDEFINED_COLUMN,
            f'column "{exc.column}" does not exist in {dotted(relation.name)}',
            position,
        ) from None
