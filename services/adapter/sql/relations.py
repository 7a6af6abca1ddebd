"""Relations under construction: a plan node with the types of its columns.

The helpers mirror ``tidemark.plan.builders`` and work each node's column types out as they
go (nullability conservatively: a column may be marked nullable where compute derives NOT
NULL, which a declared output schema allows; the finished plan's exact schema comes from
``check_plan``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from services.adapter.sql import typed as t
from services.adapter.sql.typed import Typed
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan.derive import aggregate_type, true_columns
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

Types = tuple[ScalarType, ...]


@dataclass(frozen=True)
class Rel:
    node: plan_pb2.Relation
    types: Types

    @property
    def arity(self) -> int:
        return len(self.types)


def schema_of(types: Sequence[ScalarType], names: Sequence[str] | None = None) -> RelationSchema:
    """A schema for ``types``; names default to c0, c1, ... and are made unique."""
    chosen = unique_names(names if names is not None else [f"c{i}" for i in range(len(types))])
    return RelationSchema(t.column(n) for t, n in zip(types, chosen, strict=True))


def unique_names(names: Sequence[str]) -> list[str]:
    """``names`` with repeats (and the reserved ``time``/``diff``) renamed ``name_2``, ...;
    empty names become ``?column?``."""
    taken: set[str] = set()
    result = []
    for raw in names:
        name = (raw or "?column?")[:240]
        candidate, suffix = name, 2
        while candidate in taken or candidate in ("time", "diff"):
            candidate = f"{name}_{suffix}"
            suffix += 1
        taken.add(candidate)
        result.append(candidate)
    return result


def get(collection_id: str, schema: RelationSchema) -> Rel:
    return Rel(
        pb.get(collection_id, schema), tuple(ScalarType.of_column(c) for c in schema.columns)
    )


def constant(types: Sequence[ScalarType], rows: Sequence[Sequence[Any]]) -> Rel:
    schema = schema_of(types)
    return Rel(pb.constant(schema, [tuple(r) for r in rows]), tuple(types))


def one_row() -> Rel:
    """A relation of one row and one (unused) column: what FROM-less queries select from."""
    return constant([ScalarType(ColumnType.BOOL, nullable=False)], [(True,)])


def map_(rel: Rel, expressions: Sequence[Typed]) -> Rel:
    if not expressions:
        return rel
    node = pb.map(rel.node, *(e.scalar for e in expressions))
    return Rel(node, (*rel.types, *(e.type for e in expressions)))


def project(rel: Rel, columns: Sequence[int]) -> Rel:
    if list(columns) == list(range(rel.arity)):
        return rel
    return Rel(pb.project(rel.node, *columns), tuple(rel.types[c] for c in columns))


def filter_(rel: Rel, predicates: Sequence[Typed]) -> Rel:
    if not predicates:
        return rel
    nonnull: set[int] = set()
    for predicate in predicates:
        nonnull |= true_columns(predicate.scalar)
    types = tuple(t.with_nullable(False) if i in nonnull else t for i, t in enumerate(rel.types))
    return Rel(pb.filter(rel.node, *(p.scalar for p in predicates)), types)


def union(rels: Sequence[Rel]) -> Rel:
    if len(rels) == 1:
        return rels[0]
    types = tuple(
        rels[0].types[i].with_nullable(any(r.types[i].nullable for r in rels))
        for i in range(rels[0].arity)
    )
    return Rel(pb.union(*(r.node for r in rels)), types)


def negate(rel: Rel) -> Rel:
    return Rel(pb.negate(rel.node), rel.types)


def threshold(rel: Rel) -> Rel:
    return Rel(pb.threshold(rel.node), rel.types)


def distinct(rel: Rel) -> Rel:
    return Rel(pb.distinct(rel.node), rel.types)


def join(
    left: Rel,
    right: Rel,
    left_keys: Sequence[Typed] = (),
    right_keys: Sequence[Typed] = (),
    kind: pb.JoinKind = "inner",
) -> Rel:
    node = pb.join(
        left.node,
        right.node,
        [k.scalar for k in left_keys],
        [k.scalar for k in right_keys],
        kind,
    )
    left_types, right_types = left.types, right.types
    if kind in ("right_outer", "full_outer"):
        left_types = tuple(t.with_nullable(True) for t in left_types)
    if kind in ("left_outer", "full_outer"):
        right_types = tuple(t.with_nullable(True) for t in right_types)
    return Rel(node, (*left_types, *right_types))


def reduce(rel: Rel, group_key: Sequence[int], aggregates: Sequence[plan_pb2.Aggregate]) -> Rel:
    types = [rel.types[k] for k in group_key]
    types += [aggregate_type(a, rel.types) for a in aggregates]
    return Rel(pb.reduce(rel.node, list(group_key), list(aggregates)), tuple(types))


def top_k(
    rel: Rel,
    order: Sequence[plan_pb2.SortKey],
    limit: int | None,
    offset: int,
    group_key: Sequence[int] = (),
) -> Rel:
    return Rel(pb.top_k(rel.node, list(group_key), list(order), limit, offset), rel.types)


def let(binding: int, value: Rel, body: Rel) -> Rel:
    return Rel(pb.let(binding, value.node, body.node), body.types)


def local_get(binding: int, types: Types) -> Rel:
    return Rel(pb.local_get(binding), types)


_FILLER: dict[ColumnType, Any] = {
    ColumnType.BOOL: False,
    ColumnType.INT64: 0,
    ColumnType.FLOAT64: 0.0,
    ColumnType.DECIMAL: Decimal(0),
    ColumnType.TEXT: "",
    ColumnType.BYTES: b"",
    ColumnType.DATE: datetime.date(1970, 1, 1),
    ColumnType.TIMESTAMP: datetime.datetime(1970, 1, 1),
    ColumnType.JSON: "null",
}


def null_safe_keys(
    rel: Rel, positions: Sequence[int], nullable: Sequence[bool] | None = None
) -> list[Typed]:
    """Join keys on ``positions`` of ``rel`` that match NULL with NULL and a value with itself
    only: ``is_null(c)`` and ``coalesce(c, a fixed value)``. A position whose ``nullable`` is
    false is its own key (both sides of a join must pass the same ``nullable``)."""
    keys: list[Typed] = []
    flags = list(nullable) if nullable is not None else [True] * len(positions)
    for position, may_be_null in zip(positions, flags, strict=True):
        value = t.column(position, rel.types[position])
        if not may_be_null:
            keys.append(value)
            continue
        kind = value.type.kind
        filler_type = ScalarType.decimal(1, 0) if kind is ColumnType.DECIMAL else ScalarType(kind)
        filler = t.literal(_FILLER[kind], filler_type)
        keys.append(t.call("is_null", value))
        keys.append(t.call("coalesce", value, filler))
    return keys
