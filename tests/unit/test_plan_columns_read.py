"""Which columns of each collection a plan reads: what a one-shot query fetches."""

from __future__ import annotations

from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan.walk import columns_read

SCHEMA = RelationSchema.of(("a", ColumnType.INT64), ("b", ColumnType.TEXT), ("c", ColumnType.INT64))


def test_gets_under_projects_read_their_columns_only() -> None:
    left = pb.project(pb.get("u1", SCHEMA), 2, 0)
    right = pb.project(pb.get("u1", SCHEMA), 1)
    other = pb.get("u2", SCHEMA)
    plan = pb.union(pb.project(pb.join(left, right), 0, 1), pb.project(other, 0, 1, 2))
    assert columns_read(plan) == {"u1": {0, 1, 2}, "u2": {0, 1, 2}}
    assert columns_read(pb.project(pb.get("u1", SCHEMA), 1)) == {"u1": {1}}


def test_a_get_read_whole_anywhere_is_read_whole() -> None:
    narrowed = pb.project(pb.get("u1", SCHEMA), 0)
    whole = pb.filter(pb.get("u1", SCHEMA))
    assert columns_read(pb.union(narrowed, pb.project(whole, 0))) == {"u1": None}
    assert columns_read(pb.get("u1", SCHEMA)) == {"u1": None}
