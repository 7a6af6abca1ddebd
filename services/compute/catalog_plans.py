"""The dataflows a cluster runs for its catalog items, as ``DataflowSpec``s.

A materialized view runs its stored plan into its output collection. An index runs the plan of
the relation it indexes (a table or source is read from its collection, a materialized view
from its output collection, a view by its stored plan) and keeps the result keyed by the
index's columns. Both name collections only: the host acquires the capabilities.

Every problem with an item (an unknown relation, a column name the relation lacks, plan bytes
that do not parse) raises ``InvalidArgument`` naming the item, so the controller can report it
and carry on with the other items.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from google.protobuf.message import DecodeError

from services.compute.spec import DataflowInputSpec, DataflowSpec
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.v1 import catalog_pb2, common_pb2, plan_pb2

_RELATION = plan_pb2.Relation.DESCRIPTOR.full_name


def collections_read(plan: plan_pb2.Plan) -> list[str]:
    """The ids of the collections the plan's Get nodes read, sorted, each once."""
    found: set[str] = set()
    pending: list[plan_pb2.Relation] = [plan.root]
    while pending:
        relation = pending.pop()
        kind = relation.WhichOneof("kind")
        if kind is None:
            continue
        if kind == "get":
            found.add(relation.get.collection_id)
            continue
        # Every other node holds its inputs as Relation fields (single or repeated); walking
        # them by descriptor keeps this correct when node kinds are added.
        node = getattr(relation, kind)
        for field, value in node.ListFields():
            if field.message_type is None or field.message_type.full_name != _RELATION:
                continue
            if isinstance(value, plan_pb2.Relation):
                pending.append(value)
            else:
                pending.extend(value)
    return sorted(found)


def describe(item: catalog_pb2.CatalogItem) -> str:
    """``index tidemark.public.i (u7)``: how log lines and errors name an item."""
    kind = (item.WhichOneof("body") or "item").replace("_", " ")
    parts = [part for part in (item.name.database, item.name.schema, item.name.item) if part]
    return f"{kind} {'.'.join(parts) or '(unnamed)'} ({item.id or 'no id'})"


def stored_plan(data: bytes, item: catalog_pb2.CatalogItem) -> plan_pb2.Plan:
    """The plan a view or materialized view stores, parsed."""
    try:
        plan = plan_pb2.Plan.FromString(data)
    except DecodeError as exc:
        raise InvalidArgument(f"{describe(item)}: its stored plan does not parse: {exc}") from exc
    if plan.root.WhichOneof("kind") is None:
        raise InvalidArgument(f"{describe(item)}: its stored plan is empty")
    return plan


def relation_schema(item: catalog_pb2.CatalogItem) -> common_pb2.RelationSchema:
    """The schema of a table, source, view or materialized view."""
    kind = item.WhichOneof("body")
    if kind == "table":
        return item.table.schema
    if kind == "source":
        return item.source.schema
    if kind == "view":
        return item.view.schema
    if kind == "materialized_view":
        return item.materialized_view.schema
    raise InvalidArgument(f"{describe(item)} is not a relation")


def _collection_of(item: catalog_pb2.CatalogItem) -> str:
    kind = item.WhichOneof("body")
    if kind == "table":
        collection_id = item.table.collection_id
    elif kind == "source":
        collection_id = item.source.collection_id
    else:
        collection_id = item.materialized_view.output_collection_id
    if not collection_id:
        raise InvalidArgument(f"{describe(item)} names no storage collection")
    return collection_id


def relation_plan(item: catalog_pb2.CatalogItem) -> plan_pb2.Plan:
    """The plan whose output is the relation ``item``: its collection read as is, or for a
    view its stored plan."""
    kind = item.WhichOneof("body")
    if kind == "view":
        return stored_plan(item.view.plan, item)
    schema = relation_schema(item)
    return pb.plan(pb.get(_collection_of(item), schema), schema)


def key_positions(
    schema: common_pb2.RelationSchema, names: Sequence[str], relation: catalog_pb2.CatalogItem
) -> tuple[int, ...]:
    """The positions of the columns ``names`` in ``schema`` (the relation's)."""
    columns = [column.name for column in schema.columns]
    positions = []
    for name in names:
        if name not in columns:
            raise InvalidArgument(
                f"{describe(relation)} has no column {name!r} (its columns: {', '.join(columns)})"
            )
        positions.append(columns.index(name))
    return tuple(positions)


def _inputs(plan: plan_pb2.Plan) -> tuple[DataflowInputSpec, ...]:
    return tuple(DataflowInputSpec(collection_id) for collection_id in collections_read(plan))


def materialized_view_spec(item: catalog_pb2.CatalogItem) -> DataflowSpec:
    view = item.materialized_view
    plan = stored_plan(view.plan, item)
    if not view.output_collection_id:
        raise InvalidArgument(f"{describe(item)} names no output collection")
    return DataflowSpec(
        dataflow_id=item.id,
        plan=plan,
        inputs=_inputs(plan),
        output_collection_id=view.output_collection_id,
        from_catalog=True,
    )


def index_spec(
    item: catalog_pb2.CatalogItem, items_by_id: Mapping[str, catalog_pb2.CatalogItem]
) -> DataflowSpec:
    index = item.index
    relation = items_by_id.get(index.on_id)
    if relation is None:
        raise InvalidArgument(f"{describe(item)}: the indexed relation {index.on_id} is unknown")
    plan = relation_plan(relation)
    try:
        keys = key_positions(relation_schema(relation), index.key_columns, relation)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{describe(item)}: {exc.message}") from exc
    return DataflowSpec(
        dataflow_id=item.id,
        plan=plan,
        inputs=_inputs(plan),
        index_key_columns=keys,
        from_catalog=True,
    )


def cluster_named(items: Iterable[catalog_pb2.CatalogItem], name: str) -> str | None:
    """The GlobalId of the cluster called ``name``, if ``items`` hold one."""
    for item in items:
        if item.WhichOneof("body") == "cluster" and item.name.item == name:
            return item.id
    return None


def cluster_of(item: catalog_pb2.CatalogItem) -> str | None:
    """The cluster a materialized view or index is assigned to; ``None`` for other items."""
    kind = item.WhichOneof("body")
    if kind == "materialized_view":
        return item.materialized_view.cluster_id
    if kind == "index":
        return item.index.cluster_id
    return None


def cluster_dataflows(
    items: Iterable[catalog_pb2.CatalogItem], cluster_id: str | None
) -> tuple[dict[str, DataflowSpec], dict[str, str]]:
    """The specs of every materialized view and index of ``cluster_id`` (none when the cluster
    is unknown), by dataflow id, and the errors of the items that have none, by item id."""
    items_by_id = {item.id: item for item in items if item.id}
    specs: dict[str, DataflowSpec] = {}
    errors: dict[str, str] = {}
    if cluster_id is None:
        return specs, errors
    for item_id, item in items_by_id.items():
        if cluster_of(item) != cluster_id:
            continue
        try:
            if item.WhichOneof("body") == "index":
                specs[item_id] = index_spec(item, items_by_id)
            else:
                specs[item_id] = materialized_view_spec(item)
        except InvalidArgument as exc:
            errors[item_id] = exc.message
    return specs, errors
