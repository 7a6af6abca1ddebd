"""What a catalog item says about the relation it describes, as plans see it: its schema, the
storage collection holding its contents, the plan that reads it, and positions of its columns.

A table or source is read from its collection, a materialized view from its output collection
and a view by its stored plan. This is how the compute controller builds an index's dataflow
and how the adapter recognises the relation an index holds, so the two agree by construction.

Every problem with an item raises ``InvalidArgument`` naming it (as
:func:`tidemark.catalog_items.describe` does); callers that report errors their own way
(SQLSTATEs) catch it, or ``UnknownColumn``, and translate.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from tidemark.catalog_items import describe
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.v1 import catalog_pb2, common_pb2, plan_pb2

RELATION_KINDS = ("table", "source", "view", "materialized_view")
# Where the kinds kept in storage name their collection.
_COLLECTION_FIELDS = {
    "table": "collection_id",
    "source": "collection_id",
    "materialized_view": "output_collection_id",
}


class UnknownColumn(InvalidArgument):
    """A column name the relation lacks (``column``)."""

    def __init__(self, message: str, column: str) -> None:
        super().__init__(message)
        self.column = column


def relation_schema(item: catalog_pb2.CatalogItem) -> common_pb2.RelationSchema:
    """The schema of a table, source, view or materialized view."""
    kind = item.WhichOneof("body")
    if kind not in RELATION_KINDS:
        raise InvalidArgument(f"{describe(item)} is not a relation")
    schema: common_pb2.RelationSchema = getattr(item, kind).schema
    return schema


def collection_of(item: catalog_pb2.CatalogItem) -> str | None:
    """The storage collection a table, source or materialized view names for its contents
    (``""`` when it names none); ``None`` for the other kinds."""
    kind = item.WhichOneof("body") or ""
    field = _COLLECTION_FIELDS.get(kind)
    if field is None:
        return None
    collection_id: str = getattr(getattr(item, kind), field)
    return collection_id


def stored_plan(data: bytes, item: catalog_pb2.CatalogItem) -> plan_pb2.Plan:
    """The plan a view or materialized view stores (``data``), parsed."""
    try:
        plan = plan_pb2.Plan.FromString(data)
    except DecodeError as exc:
        raise InvalidArgument(f"{describe(item)}: its stored plan does not parse: {exc}") from exc
    if plan.root.WhichOneof("kind") is None:
        raise InvalidArgument(f"{describe(item)}: its stored plan is empty")
    return plan


def relation_plan(item: catalog_pb2.CatalogItem) -> plan_pb2.Plan:
    """The plan whose output is the relation ``item``: its collection read as is, or for a
    view its stored plan."""
    if item.WhichOneof("body") == "view":
        return stored_plan(item.view.plan, item)
    schema = relation_schema(item)
    collection_id = collection_of(item)
    if not collection_id:
        raise InvalidArgument(f"{describe(item)} names no storage collection")
    return pb.plan(pb.get(collection_id, schema), schema)


def key_positions(relation: catalog_pb2.CatalogItem, names: Sequence[str]) -> tuple[int, ...]:
    """The positions of the columns ``names`` in the relation's schema; ``UnknownColumn`` for
    the first name it lacks."""
    columns = [column.name for column in relation_schema(relation).columns]
    positions = []
    for name in names:
        if name not in columns:
            raise UnknownColumn(
                f"{describe(relation)} has no column {name!r} (its columns: {', '.join(columns)})",
                name,
            )
        positions.append(columns.index(name))
    return tuple(positions)
