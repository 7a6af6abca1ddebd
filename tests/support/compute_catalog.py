"""For testing the compute controller: the catalog items a cluster runs (clusters, views,
materialized views, indexes), added to a :class:`tests.support.catalog_items.Draft` the way the
adapter would create them, a host that records what it is asked to run, and the specs to
expect."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from services.compute.spec import DataflowInputSpec, DataflowSpec
from tests.support.catalog_items import DATABASE, SCHEMA, Draft, int_columns
from tidemark.errors import AlreadyExists, Unavailable
from tidemark.plan import builders as pb
from tidemark.v1 import catalog_pb2, common_pb2, plan_pb2

# The columns of a test table (Draft.table).
AB = int_columns("a", "b")


def _name(item: str) -> catalog_pb2.QualifiedName:
    return catalog_pb2.QualifiedName(database=DATABASE, schema=SCHEMA, item=item)


def cluster(draft: Draft, name: str) -> catalog_pb2.CatalogItem:
    return draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=catalog_pb2.QualifiedName(item=name),
            owner="test",
            cluster=catalog_pb2.Cluster(size="local", replication_factor=1),
        )
    )


def view(
    draft: Draft,
    name: str,
    plan: plan_pb2.Plan,
    schema: common_pb2.RelationSchema,
    depends_on: Sequence[str] = (),
) -> catalog_pb2.CatalogItem:
    return draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=_name(name),
            depends_on=list(depends_on),
            owner="test",
            view=catalog_pb2.View(
                sql=f"SELECT ... -- {name}", schema=schema, plan=plan.SerializeToString()
            ),
        )
    )


def materialized_view(
    draft: Draft,
    name: str,
    plan: plan_pb2.Plan | bytes,
    schema: common_pb2.RelationSchema,
    cluster_id: str,
    depends_on: Sequence[str] = (),
) -> catalog_pb2.CatalogItem:
    """``plan`` as bytes is stored as given (to store a broken plan)."""
    global_id = draft.allocate()
    data = plan if isinstance(plan, bytes) else plan.SerializeToString()
    return draft.create(
        catalog_pb2.CatalogItem(
            id=global_id,
            name=_name(name),
            depends_on=[cluster_id, *depends_on],
            owner="test",
            materialized_view=catalog_pb2.MaterializedView(
                sql=f"SELECT ... -- {name}",
                schema=schema,
                plan=data,
                cluster_id=cluster_id,
                output_collection_id=global_id,
            ),
        )
    )


def index(
    draft: Draft,
    name: str,
    on: catalog_pb2.CatalogItem,
    key_columns: Sequence[str],
    cluster_id: str,
) -> catalog_pb2.CatalogItem:
    return draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=_name(name),
            depends_on=[on.id, cluster_id],
            owner="test",
            index=catalog_pb2.Index(
                on_id=on.id, key_columns=list(key_columns), cluster_id=cluster_id
            ),
        )
    )


def copy_of(item: catalog_pb2.CatalogItem) -> catalog_pb2.CatalogItem:
    """A copy to change and put in the item's place (``Draft.replace``)."""
    copy = catalog_pb2.CatalogItem()
    copy.CopyFrom(item)
    return copy


class RecordingHost:
    """A ``DataflowHost`` that runs nothing: it records installs and drops, and fails the
    installs of the ids in ``failing`` and the drops of those in ``failing_drops``."""

    def __init__(self) -> None:
        self.dataflows: dict[str, DataflowSpec] = {}
        self.events: list[tuple[str, str]] = []
        self.attempts: Counter[str] = Counter()
        self.attempts_to_drop: Counter[str] = Counter()
        self.failing: set[str] = set()
        self.failing_drops: set[str] = set()

    async def install(self, spec: DataflowSpec) -> None:
        self.attempts[spec.dataflow_id] += 1
        if spec.dataflow_id in self.failing:
            raise Unavailable(f"storage is down for {spec.dataflow_id}")
        if spec.dataflow_id in self.dataflows:
            raise AlreadyExists(f"dataflow {spec.dataflow_id} already exists")
        self.dataflows[spec.dataflow_id] = spec
        self.events.append(("install", spec.dataflow_id))

    async def drop(self, dataflow_id: str) -> None:
        self.attempts_to_drop[dataflow_id] += 1
        if dataflow_id in self.failing_drops:
            raise Unavailable(f"cannot release the holds of {dataflow_id}")
        self.dataflows.pop(dataflow_id, None)
        self.events.append(("drop", dataflow_id))

    def dataflow_ids(self) -> set[str]:
        return set(self.dataflows)


def table_plan(collection_id: str) -> plan_pb2.Plan:
    """The plan reading a test table's collection as is."""
    return pb.plan(pb.get(collection_id, AB), AB)


def inputs(*collection_ids: str) -> tuple[DataflowInputSpec, ...]:
    """Spec inputs naming these collections, in the controller's order."""
    return tuple(DataflowInputSpec(c) for c in sorted(collection_ids))
