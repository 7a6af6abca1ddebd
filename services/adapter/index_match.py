"""Answering a query from indexes: finding the parts of its plan that indexes already hold.

An index holds the contents of one relation: its dataflow's plan is the relation's plan (a
table, source or materialized view read from its collection; a view's stored plan). Views are
inlined into queries, so a subtree of a query's plan that equals an indexed relation's plan
can be read from the index instead. If every collection a plan reads is covered that way by
indexes of one cluster, the query is an index peek whose ``finishing`` plan reads the indexes
(``Get(collection_id = index id)``): no dataflow has to be built.

Plans are compared with Get schemas left out (a Get names its collection; the schema is the
collection's either way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidemark.errors import InvalidArgument
from tidemark.plan.catalog_relations import relation_plan
from tidemark.plan.walk import collections_read, inputs, relations
from tidemark.v1 import catalog_pb2, common_pb2, plan_pb2


@dataclass(frozen=True)
class IndexedRelation:
    index_id: str
    cluster_id: str
    root: plan_pb2.Relation
    schema: common_pb2.RelationSchema


@dataclass(frozen=True)
class IndexPeek:
    """Read ``dataflow_id`` (through ``finishing`` unless it is ``None``)."""

    dataflow_id: str
    finishing: plan_pb2.Plan | None
    index_ids: tuple[str, ...]


def comparison_key(relation: plan_pb2.Relation) -> bytes:
    """The relation's bytes with every Get's schema left out."""
    copy = plan_pb2.Relation()
    copy.CopyFrom(relation)
    for node in relations(copy):
        if node.WhichOneof("kind") == "get":
            node.get.ClearField("schema")
    return copy.SerializeToString(deterministic=True)


def indexed_relations(
    items: Iterable[catalog_pb2.CatalogItem], cluster_id: str
) -> list[IndexedRelation]:
    """The indexes of ``cluster_id`` with the plans of the relations they hold."""
    by_id = {item.id: item for item in items if item.id}
    found = []
    for item in by_id.values():
        if item.WhichOneof("body") != "index" or item.index.cluster_id != cluster_id:
            continue
        relation = by_id.get(item.index.on_id)
        if relation is None:
            continue
        try:
            plan = relation_plan(relation)
        except InvalidArgument:
            continue
        schema = plan.output_schema
        found.append(IndexedRelation(item.id, cluster_id, plan.root, schema))
    return sorted(found, key=lambda indexed: indexed.index_id)


def match_indexes(plan: plan_pb2.Plan, indexes: Iterable[IndexedRelation]) -> IndexPeek | None:
    """An index peek answering ``plan`` from ``indexes`` (all of one cluster), if they cover
    every collection it reads."""
    by_key: dict[bytes, IndexedRelation] = {}
    for indexed in indexes:
        by_key.setdefault(comparison_key(indexed.root), indexed)
    if not by_key:
        return None
    rewritten = plan_pb2.Plan()
    rewritten.CopyFrom(plan)
    used: list[str] = []
    _replace(rewritten.root, by_key, used)
    if not used:
        return None
    if collections_read(rewritten) - set(used):
        return None  # something is still read from storage
    first = used[0]
    root = rewritten.root
    if root.WhichOneof("kind") == "get" and root.get.collection_id == first:
        return IndexPeek(first, None, tuple(dict.fromkeys(used)))
    return IndexPeek(first, rewritten, tuple(dict.fromkeys(used)))


def _replace(
    relation: plan_pb2.Relation, by_key: Mapping[bytes, IndexedRelation], used: list[str]
) -> None:
    """Replace, top down, each subtree an index holds by a Get of that index."""
    stack = [relation]
    while stack:
        node = stack.pop()
        indexed = by_key.get(comparison_key(node))
        if indexed is not None:
            node.Clear()
            node.get.collection_id = indexed.index_id
            node.get.schema.CopyFrom(indexed.schema)
            used.append(indexed.index_id)
            continue
        stack.extend(inputs(node))
