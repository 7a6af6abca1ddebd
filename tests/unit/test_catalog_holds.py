"""The catalog's durable read holds (``services/catalog/holds.py``), one pass at a time, against
the storage core's operations (the rules a real storage applies) behind a client-shaped
adapter: holds are taken for objects without one, trail the upper by the history window but
not past a reading view's restart point, and are released for dropped objects at once and
for never-named collections after the grace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.catalog.holds import CatalogHolds, HoldSettings
from services.storage.core import StorageCore, StorageSettings
from services.storage.state import CapabilityRecord
from tidemark.blob import MemoryBlob
from tidemark.catalog_items import CATALOG_HOLDER
from tidemark.clients.storage import Capability, CapabilityInfo, CollectionInfo
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.consensus.memory import MemoryConsensus
from tidemark.frontier import Antichain, u64_frontier
from tidemark.plan import builders as pb
from tidemark.v1 import catalog_pb2

SCHEMA = RelationSchema.of(
    ("k", ColumnType.INT64),
)
HISTORY_MS = 1_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def _capability(collection_id: str, record: CapabilityRecord) -> Capability:
    return Capability(
        collection_id,
        record.id,
        record.kind.label,
        record.frontier,
        record.lease_expires_ms,
        record.holder,
        record.critical,
    )


class CoreClient:
    """The calls ``CatalogHolds`` makes, answered by a ``StorageCore``."""

    def __init__(self, core: StorageCore) -> None:
        self.core = core

    async def list(self) -> list[CollectionInfo]:
        return [
            CollectionInfo(
                v.state.collection_id,
                v.state.schema,
                v.state.since,
                v.state.upper,
                len(v.state.batches),
                0,
                0,
                [
                    CapabilityInfo(
                        c.id[:8], c.kind.label, c.frontier, c.lease_expires_ms, c.holder, c.critical
                    )
                    for c in v.state.capabilities
                ],
                [],
                v.version,
                0,
                v.state.created_ms,
            )
            for v in await self.core.list_collections()
        ]

    async def acquire_critical(self, collection_id: str, holder: str) -> Capability:
        return _capability(collection_id, await self.core.acquire_critical(collection_id, holder))

    async def downgrade(self, capability: Capability, to: int) -> Capability:
        record = await self.core.downgrade(
            capability.collection_id, capability.id, u64_frontier(to)
        )
        return _capability(capability.collection_id, record)

    async def drop(self, capability: Capability) -> None:
        await self.core.drop(capability.collection_id, capability.id)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def core(clock: Clock) -> AsyncIterator[StorageCore]:
    made = StorageCore(
        MemoryConsensus(), MemoryBlob(), StorageSettings(lease_ms=10_000), clock=clock
    )
    yield made
    await made.close()


def table(global_id: str) -> catalog_pb2.CatalogItem:
    item = catalog_pb2.CatalogItem(id=global_id)
    item.table.collection_id = global_id
    return item


def view(global_id: str, reads: str) -> catalog_pb2.CatalogItem:
    item = catalog_pb2.CatalogItem(id=global_id)
    item.materialized_view.output_collection_id = global_id
    item.materialized_view.plan = pb.plan(pb.get(reads, SCHEMA)).SerializeToString()
    return item


def hold_of(core: StorageCore, state_capabilities: tuple[CapabilityRecord, ...]) -> Antichain[int]:
    (hold,) = [c for c in state_capabilities if c.critical and c.holder == CATALOG_HOLDER]
    return hold.frontier


async def advance(core: StorageCore, collection_id: str, write: str, upper: int) -> None:
    await core.append(collection_id, write, None, u64_frontier(upper))


async def test_holds_follow_the_catalog(core: StorageCore, clock: Clock) -> None:
    items: list[catalog_pb2.CatalogItem] = []
    holds = CatalogHolds(
        CoreClient(core),  # type: ignore[arg-type]
        lambda: items,
        HoldSettings(history_ms=HISTORY_MS, orphan_grace_ms=60_000),
        clock_ms=clock,
    )
    # u1 as the adapter creates it (hold in place), u2 from before holds existed.
    _, w1 = await core.create("u1", SCHEMA, critical_holder=CATALOG_HOLDER)
    _, w2 = await core.create("u2", SCHEMA)
    await core.create("u9", SCHEMA, critical_holder=CATALOG_HOLDER)  # not named yet
    await core.create("s1", SCHEMA)  # the catalog's own log: never touched
    items += [table("u1"), view("u2", reads="u1")]
    report = await holds.reconcile()
    assert report.taken == ["u2"] and report.released == [] and report.lost == []
    state = (await core.describe("u2")).state
    assert hold_of(core, state.capabilities) == u64_frontier(0)

    # The holds trail the upper by the history, in steps, but u1's stops at u2's upper - 1.
    await advance(core, "u1", w1.id, 10_000)
    await advance(core, "u2", w2.id, 5_000)
    report = await holds.reconcile()
    assert sorted(report.moved) == ["u1", "u2"]
    assert hold_of(core, (await core.describe("u1")).state.capabilities) == u64_frontier(4_999)
    assert hold_of(core, (await core.describe("u2")).state.capabilities) == u64_frontier(4_000)
    await advance(core, "u2", w2.id, 5_050)
    assert (await holds.reconcile()).moved == []  # less than a step: not worth a write

    # Every lease lapses: the holds keep the since.
    clock.now += 1_000_000
    await core.maintenance.run_once()
    assert (await core.describe("u1")).state.since == u64_frontier(4_999)

    # DROP of u2: released at the next pass. u9, never named, only after the grace.
    items.remove(items[1])
    report = await holds.reconcile()
    assert sorted(report.released) == ["u2", "u9"]  # u9 is old now (the clock moved)
    for gone in ("u2", "u9"):
        state = (await core.describe(gone)).state
        assert not any(c.critical for c in state.capabilities) and state.since.is_empty()
    assert not (await core.describe("s1")).state.since.is_empty()
    await core.create("u10", SCHEMA, critical_holder=CATALOG_HOLDER)
    assert (await holds.reconcile()).released == []  # young: its append may still come


async def test_a_lost_history_is_reported_not_papered_over(core: StorageCore, clock: Clock) -> None:
    holds = CatalogHolds(
        CoreClient(core),  # type: ignore[arg-type]
        lambda: [table("u1")],
        HoldSettings(history_ms=HISTORY_MS),
        clock_ms=clock,
    )
    read, _ = await core.create("u1", SCHEMA, writer="tidemark://compute/db/default")
    await core.drop("u1", read.id)  # the runaway: since {}
    report = await holds.reconcile()
    assert report.lost == ["u1"] and report.taken == []
    await core.reset_history("u1", CATALOG_HOLDER)  # REBUILD
    report = await holds.reconcile()
    assert report.lost == [] and report.taken == []
    assert hold_of(core, (await core.describe("u1")).state.capabilities) == u64_frontier(0)
