"""What DDL statements need from planning: relation schemas from column definitions, the
plan an index or subscription reads a relation with, and index keys checked against it."""

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
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2


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


def read_plan(relation: BoundRelation) -> plan_pb2.Plan:
    """The plan reading a relation's contents: a view's stored plan, else its collection."""
    if relation.plan is not None:
        return relation.plan
    assert relation.collection_id is not None
    return pb.plan(pb.get(relation.collection_id, relation.schema), relation.schema)


def key_positions(relation: BoundRelation, names: Sequence[str], position: int = 0) -> list[int]:
    """The positions of an index's key columns (42703 for a column the relation lacks)."""
    known = relation.schema.names
    positions = []
    for name in names:
        if name not in known:
            raise SqlError(
                UNDEFINED_COLUMN,
                f'column "{name}" does not exist in "{dotted(relation.name)}"',
                position,
            )
        positions.append(known.index(name))
    return positions
