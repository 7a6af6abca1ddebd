"""The dataflows a cluster runs for its catalog items, as ``DataflowSpec``s.

A materialized view runs its stored plan into its output collection. An index runs the plan of
the relation it indexes (a table or source is read from its collection, a materialized view
from its output collection, a view by its stored plan) and keeps the result keyed by the
index's columns. Both name collections only: the host acquires the capabilities. What an item
says about its relation is ``tidemark.plan.catalog_relations`` (the adapter reads it too).

Every problem with an item (an unknown relation, a column name the relation lacks, plan bytes
that do not parse) raises ``InvalidArgument`` naming the item, so the controller can report it
and carry on with the other items.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.compute.spec import DataflowInputSpec, DataflowSpec
from tidemark.catalog_items import describe
from tidemark.errors import InvalidArgument
from tidemark.plan.catalog_relations import key_positions, relation_plan, stored_plan
from tidemark.plan.optimize import optimize
from tidemark.plan.walk import collections_read
from tidemark.v1 import catalog_pb2, plan_pb2


def _inputs(plan: plan_pb2.Plan) -> tuple[DataflowInputSpec, ...]:
    return tuple(DataflowInputSpec(cid) for cid in sorted(collections_read(plan)))


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
    # A view stores its plan as planned (queries inline it so); the dataflow runs it optimized.
    plan = optimize(relation_plan(relation)).plan
    try:
        keys = key_positions(relation, index.key_columns)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{describe(item)}: {exc.message}") from exc
    return DataflowSpec(
        dataflow_id=item.id,
        plan=plan,
        inputs=_inputs(plan),
        index_key_columns=keys,
        from_catalog=True,
    )


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
