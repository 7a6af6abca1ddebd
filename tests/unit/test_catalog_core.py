"""The catalog's core (appends, snapshots, subscriptions, history, restarts) on the in-memory
log and a fake oracle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.catalog.catalog import Catalog, CatalogSettings, Snapshot
from services.catalog.log import MemoryCatalogLog
from tests.support.catalog_items import Draft
from tidemark.cdc import CdcReader, Message
from tidemark.clients.catalog import CatalogUpperMismatch
from tidemark.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    Indeterminate,
    InvalidArgument,
    Unavailable,
)
from tidemark.frontier import Antichain
from tidemark.lattice import U64
from tidemark.v1 import catalog_pb2

TIMELINE = "catalog"


class FakeOracle:
    """The oracle's laws for one timeline, in memory; ``down`` makes ApplyWrite fail."""

    def __init__(self) -> None:
        self.read = 0
        self.write = 1000
        self.down = False

    async def read_ts(self, timeline: str) -> int:
        return self.read

    async def write_ts(self, timeline: str) -> int:
        self.write += 1
        return self.write

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        if self.down:
            raise Unavailable("oracle is down")
        self.read = max(self.read, timestamp)
        self.write = max(self.write, timestamp)


def settings(**overrides: Any) -> CatalogSettings:
    base: dict[str, Any] = {
        "maintenance_seconds": 3600.0,
        "max_wait_seconds": 2.0,
        "catch_up_seconds": 5.0,
    }
    base.update(overrides)
    return CatalogSettings(**base)


@pytest.fixture
def oracle() -> FakeOracle:
    return FakeOracle()


@pytest.fixture
def memory_log() -> MemoryCatalogLog:
    return MemoryCatalogLog()


@pytest.fixture
async def catalog(memory_log: MemoryCatalogLog, oracle: FakeOracle) -> AsyncIterator[Catalog]:
    made = Catalog(memory_log, oracle, settings())
    await made.start()
    yield made
    await made.close()


def names(snapshot: Snapshot) -> set[str]:
    return {row.item.name.item for row in snapshot.rows if row.item.name.item}


async def create_table(catalog: Catalog, oracle: FakeOracle, name: str) -> tuple[int, str]:
    """DDL the adapter's way; returns the append's time and the table's id."""
    snapshot = await catalog.snapshot_at(await oracle.read_ts(TIMELINE))
    ts = await oracle.write_ts(TIMELINE)
    draft = Draft((row.item for row in snapshot.rows), ts)
    table = draft.table(name)
    await catalog.compare_and_append(snapshot.upper, ts + 1, draft.updates())
    return ts, table.id


async def test_start_bootstraps_once_and_publishes(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    assert memory_log.appends == 1
    read = await oracle.read_ts(TIMELINE)
    assert read == catalog.history.upper - 1
    snapshot = await catalog.snapshot_at(read)
    kinds = sorted(row.kind for row in snapshot.rows)
    assert kinds == ["cluster", "database", "id_allocator", "id_allocator", "schema"]
    # A second process on the same log does not bootstrap again and sees the same items.
    second = Catalog(memory_log, oracle, settings())
    await second.start()
    try:
        assert memory_log.appends == 1
        again = await second.snapshot_at(read)
        assert {r.data for r in again.rows} == {r.data for r in snapshot.rows}
    finally:
        await second.close()


async def test_acknowledged_ddl_is_visible_at_the_next_read_timestamp(
    catalog: Catalog, oracle: FakeOracle
) -> None:
    ts, table_id = await create_table(catalog, oracle, "t")
    read = await oracle.read_ts(TIMELINE)
    assert read >= ts
    snapshot = await catalog.snapshot_at(read)
    assert table_id in {row.key for row in snapshot.rows}
    assert snapshot.upper == ts + 1


async def test_racing_writers_exactly_one_wins_and_the_loser_retries(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    snapshot = await catalog.snapshot_at(await oracle.read_ts(TIMELINE))
    times = [await oracle.write_ts(TIMELINE), await oracle.write_ts(TIMELINE)]
    drafts = [Draft((r.item for r in snapshot.rows), ts) for ts in times]
    for n, draft in enumerate(drafts):
        draft.table(f"t{n}")
    outcomes = await asyncio.gather(
        *(
            catalog.compare_and_append(snapshot.upper, ts + 1, draft.updates())
            for ts, draft in zip(times, drafts, strict=True)
        ),
        return_exceptions=True,
    )
    winners = [o for o in outcomes if isinstance(o, int)]
    losers = [o for o in outcomes if isinstance(o, CatalogUpperMismatch)]
    assert len(winners) == 1 and len(losers) == 1
    loser = losers[0]
    assert loser.current_upper == winners[0]
    assert loser.expected_upper == snapshot.upper
    # The loser re-reads and retries with a fresh timestamp.
    retry_snapshot = await catalog.snapshot_at(loser.current_upper - 1)
    ts = await oracle.write_ts(TIMELINE)
    lost_name = "t1" if winners[0] == times[0] + 1 else "t0"
    draft = Draft((r.item for r in retry_snapshot.rows), ts)
    draft.table(lost_name)
    await catalog.compare_and_append(loser.current_upper, ts + 1, draft.updates())
    final = await catalog.snapshot_at(await oracle.read_ts(TIMELINE))
    assert {"t0", "t1"} <= names(final)
    assert memory_log.appends == 3


async def test_a_repeated_append_is_answered_like_the_original(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    snapshot = await catalog.snapshot_at(catalog.history.upper - 1)
    ts = await oracle.write_ts(TIMELINE)
    draft = Draft((r.item for r in snapshot.rows), ts)
    draft.table("t")
    updates = draft.updates()
    assert await catalog.compare_and_append(snapshot.upper, ts + 1, updates) == ts + 1
    appends = memory_log.appends
    # The client did not hear the reply and sends the same request again.
    assert await catalog.compare_and_append(snapshot.upper, ts + 1, updates[::-1]) == ts + 1
    assert memory_log.appends == appends
    # Same bounds, other content: a genuine mismatch.
    other = Draft((r.item for r in snapshot.rows), ts)
    other.table("u")
    with pytest.raises(CatalogUpperMismatch):
        await catalog.compare_and_append(snapshot.upper, ts + 1, other.updates())


async def test_a_rejected_append_changes_nothing(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    await create_table(catalog, oracle, "t")
    upper, appends = catalog.history.upper, memory_log.appends
    before = await catalog.snapshot_at(upper - 1)
    ts = await oracle.write_ts(TIMELINE)
    draft = Draft((r.item for r in before.rows), ts)
    draft.table("t")  # the name is taken
    with pytest.raises(AlreadyExists, match="already exists"):
        await catalog.compare_and_append(upper, ts + 1, draft.updates())
    early = Draft((r.item for r in before.rows), upper - 1)
    early.table("new")
    with pytest.raises(InvalidArgument, match="lies outside"):
        await catalog.compare_and_append(upper, ts + 1, early.updates())
    assert (catalog.history.upper, memory_log.appends) == (upper, appends)
    after = await catalog.snapshot_at(upper - 1)
    assert {r.data for r in after.rows} == {r.data for r in before.rows}


async def test_snapshots_at_past_times_and_the_bounds(catalog: Catalog, oracle: FakeOracle) -> None:
    start = catalog.history.upper - 1
    t1, _ = await create_table(catalog, oracle, "a")
    t2, _ = await create_table(catalog, oracle, "b")
    assert names(await catalog.snapshot_at(start)) == {"default"}
    assert names(await catalog.snapshot_at(t1 - 1)) == {"default"}
    assert names(await catalog.snapshot_at(t1)) == {"default", "a"}
    assert names(await catalog.snapshot_at(t2 - 1)) == {"default", "a"}
    assert names(await catalog.snapshot_at(t2)) == {"default", "a", "b"}
    with pytest.raises(FailedPrecondition, match="before the catalog's since"):
        await catalog.snapshot_at(catalog.history.since - 1)
    with pytest.raises(DeadlineExceeded, match="not complete"):
        await catalog.snapshot_at(t2 + 1, timeout=0.05)
    # A snapshot at an incomplete time waits for the append that completes it.
    waiting = asyncio.create_task(catalog.snapshot_at(t2 + 1, timeout=5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await create_table(catalog, oracle, "c")
    assert names(await waiting) == {"default", "a", "b", "c"}


async def test_history_window_compacts_memory_and_log(
    memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    catalog = Catalog(memory_log, oracle, settings(history_ms=0))
    await catalog.start()
    try:
        t1, _ = await create_table(catalog, oracle, "a")
        await create_table(catalog, oracle, "b")
        hold = catalog.history.hold(t1)  # a reader part-way through keeps t1 readable
        await catalog.maintain()
        assert catalog.history.since == t1 and memory_log.since == t1
        hold.release()
        await catalog.maintain()
        assert catalog.history.since == catalog.history.upper - 1
        assert memory_log.since == catalog.history.since
        assert catalog.history.step_count == 0
        with pytest.raises(FailedPrecondition):
            await catalog.snapshot_at(t1)
        assert names(await catalog.snapshot_at(catalog.history.since)) == {"default", "a", "b"}
    finally:
        await catalog.close()


async def test_restart_loses_nothing_acknowledged(
    memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    catalog = Catalog(memory_log, oracle, settings())
    await catalog.start()
    created = [await create_table(catalog, oracle, f"t{n}") for n in range(3)]
    await catalog.close()
    await memory_log.downgrade_since(created[1][0])  # the log compacted some history meanwhile
    restarted = Catalog(memory_log, oracle, settings())
    await restarted.start()
    try:
        snapshot = await restarted.snapshot_at(await oracle.read_ts(TIMELINE))
        assert {table_id for _, table_id in created} <= {r.key for r in snapshot.rows}
        assert restarted.history.since == created[1][0]
        assert names(await restarted.snapshot_at(created[1][0])) == {"default", "t0", "t1"}
        await create_table(restarted, oracle, "after")
    finally:
        await restarted.close()


async def test_a_second_catalog_process_follows_and_appends(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    other = Catalog(memory_log, oracle, settings())
    await other.start()
    try:
        ts, table_id = await create_table(catalog, oracle, "t")
        # The other process learns of it by following the log, and can append after it.
        snapshot = await other.snapshot_at(ts, timeout=2.0)
        assert table_id in {r.key for r in snapshot.rows}
        _, second_id = await create_table(other, oracle, "u")
        # A stale expected upper on the first process is refused with the current upper.
        draft = Draft((r.item for r in snapshot.rows), ts + 1)
        draft.table("v")
        with pytest.raises(CatalogUpperMismatch) as lost:
            await catalog.compare_and_append(ts + 1, ts + 2, draft.updates())
        assert lost.value.current_upper == other.history.upper
        final = await catalog.snapshot_at(other.history.upper - 1, timeout=2.0)
        assert {table_id, second_id} <= {r.key for r in final.rows}
    finally:
        await other.close()


async def test_an_append_at_an_upper_this_process_has_not_followed_yet_waits_for_it(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    other = Catalog(memory_log, oracle, settings())
    await other.start()
    try:
        _, first_id = await create_table(catalog, oracle, "first")
        # The other process has not run its follower since: its history ends earlier.
        assert other.history.upper < memory_log.current_upper
        ts = await oracle.write_ts(TIMELINE)
        draft = Draft((r.item for r in (await catalog.snapshot_at(ts - 1)).rows), ts)
        second = draft.table("second")
        await other.compare_and_append(memory_log.current_upper, ts + 1, draft.updates())
        rows = (await other.snapshot_at(ts)).rows
        assert {first_id, second.id} <= {r.key for r in rows}
    finally:
        await other.close()


async def test_an_unreachable_oracle_makes_the_append_indeterminate(
    catalog: Catalog, memory_log: MemoryCatalogLog, oracle: FakeOracle
) -> None:
    oracle.down = True
    with pytest.raises(Indeterminate, match="durable, but the oracle"):
        await create_table(catalog, oracle, "t")
    upper = catalog.history.upper
    assert memory_log.current_upper == upper
    assert oracle.read < upper - 1
    oracle.down = False
    await catalog.maintain()
    assert oracle.read == upper - 1


async def collect_subscription(
    catalog: Catalog, as_of: int, until: int
) -> list[tuple[dict[bytes, int], int]]:
    """Contents after each report of a subscription, until its frontier passes ``until``."""
    reader: CdcReader[bytes, int] = CdcReader(U64, Antichain(U64, [as_of]))
    contents: dict[bytes, int] = {}
    seen: list[tuple[dict[bytes, int], int]] = []
    messages: AsyncIterator[Message[bytes, int]] = catalog.subscribe_at(as_of)
    async for message in messages:
        for updates, frontier in reader.push(message):
            for data, _, diff in updates:
                contents[data] = contents.get(data, 0) + diff
                if contents[data] == 0:
                    del contents[data]
            (time,) = frontier.elements
            seen.append((dict(contents), time))
            if time > until:
                await messages.aclose()  # type: ignore[attr-defined]
                return seen
    raise AssertionError("subscription ended")


async def test_subscription_contents_equal_snapshots_at_every_reported_time(
    catalog: Catalog, oracle: FakeOracle
) -> None:
    as_of = catalog.history.upper - 1
    await create_table(catalog, oracle, "before")  # between as_of and the subscription's start
    ts, _ = await create_table(catalog, oracle, "x")
    subscription = asyncio.create_task(collect_subscription(catalog, as_of, until=ts + 100))
    await asyncio.sleep(0.01)
    for name in ("y", "z"):
        await create_table(catalog, oracle, name)
    draft_snapshot = await catalog.snapshot_at(catalog.history.upper - 1)
    ts = await oracle.write_ts(TIMELINE)
    draft = Draft((r.item for r in draft_snapshot.rows), ts)
    draft.drop(draft.by_name("x", "table"))
    await catalog.compare_and_append(draft_snapshot.upper, ts + 200, draft.updates())
    reports = await asyncio.wait_for(subscription, 5.0)
    assert len(reports) >= 2
    for contents, frontier in reports:
        expected = await catalog.snapshot_at(frontier - 1)
        assert contents == {row.data: 1 for row in expected.rows}
    last_names = {catalog_pb2.CatalogItem.FromString(data).name.item for data in reports[-1][0]} - {
        ""
    }
    assert last_names == {"default", "before", "y", "z"}
