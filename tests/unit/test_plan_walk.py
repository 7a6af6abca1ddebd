"""Walking a plan's relation tree (``tidemark.plan.walk``)."""

from __future__ import annotations

from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan.walk import collections_read, inputs, relations
from tidemark.v1 import plan_pb2

AB = RelationSchema.of(("a", T.INT64), ("b", T.INT64))


def test_collections_read_finds_every_get_once_in_every_kind_of_node() -> None:
    deep = pb.get("u1", AB)
    for _ in range(40):
        deep = pb.filter(deep)
    root = pb.let(
        1,
        pb.union(pb.get("u3", AB), pb.negate(pb.get("u2", AB))),
        pb.join(
            pb.reduce(pb.local_get(1), [0], [pb.aggregate("count")]),
            pb.top_k(pb.distinct(deep), [0], [1], limit=3),
            [0],
            [0],
        ),
    )
    assert collections_read(pb.plan(root)) == {"u1", "u2", "u3"}
    assert collections_read(root.let.body) == {"u1"}
    assert collections_read(pb.plan(pb.constant(AB, [(1, 2)]))) == set()
    assert collections_read(plan_pb2.Plan()) == set()


def test_inputs_in_field_order_and_relations_depth_first() -> None:
    first, second = pb.get("u1", AB), pb.negate(pb.get("u2", AB))
    root = pb.union(first, second, pb.get("u3", AB))
    assert [node.get.collection_id for node in inputs(root)] == ["u1", "", "u3"]
    assert inputs(pb.get("u1", AB)) == []
    kinds = [node.WhichOneof("kind") for node in relations(root)]
    assert kinds == ["union", "get", "negate", "get", "get"]


def test_relations_yields_the_tree_own_nodes() -> None:
    plan = pb.plan(pb.filter(pb.get("u1", AB)))
    for node in relations(plan.root):
        if node.HasField("get"):
            node.get.collection_id = "u9"
    assert collections_read(plan) == {"u9"}
