"""The storage service's core on the in-memory backends, with a hand-driven clock: reads
against a model of the pTVC on randomized histories (before and after compaction),
subscriptions and their resumption, CDC ingestion of mangled streams, leases, garbage
collection and the bound on batches."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from services.storage.batches import TableCache
from services.storage.core import StorageCore, StorageSettings
from services.storage.reads import overlapping, overlaps
from services.storage.shards import MAX_PREPARED_AGE_MS
from services.storage.state import CapabilityRecord, ShardState, StoredBatch
from services.storage.subscriptions import Event, SubscribeSpec
from tidemark.blob import MemoryBlob
from tidemark.cdc import CdcReader, Message, Progress, Updates, write_history
from tidemark.cdc.proto import to_proto
from tidemark.columnar import (
    ColumnType,
    RelationSchema,
    table_from_updates,
    to_ipc,
    updates_from_table,
    version_from_table,
)
from tidemark.consensus.memory import MemoryConsensus
from tidemark.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from tidemark.frontier import u64_frontier
from tidemark.lattice import U64
from tidemark.ptvc import PartialTVC
from tidemark.updates import consolidate, read_updates
from tidemark.v1 import common_pb2, storage_pb2

SCHEMA = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.TEXT))
Row = tuple[Any, ...]
RowUpdate = tuple[Row, int, int]


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


VIEW_WRITER = "tidemark://compute/db/default"
"""The writer of a materialized view's output (a collection whose history may be reset)."""


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def core(clock: Clock) -> AsyncIterator[StorageCore]:
    made = StorageCore(
        MemoryConsensus(),
        MemoryBlob(),
        StorageSettings(lease_ms=10_000, retired_grace_ms=1_000, orphan_grace_ms=60_000),
        clock=clock,
    )
    yield made
    await made.close()


def table(updates: list[RowUpdate]) -> pa.Table:
    return table_from_updates(SCHEMA, updates)


async def collect(events: AsyncIterator[Event]) -> list[Message[Row, int]]:
    """Events as CDC messages with tuple rows."""
    out: list[Message[Row, int]] = []
    async for event in events:
        out.append(event if isinstance(event, Progress) else Updates(updates_from_table(event)))
    return out


def reassemble(
    messages: list[Message[Row, int]], reader: CdcReader[Row, int] | None = None
) -> tuple[list[RowUpdate], Any]:
    reader = reader or CdcReader(U64)
    found: list[RowUpdate] = []
    for updates, _ in reader.push_all(messages):
        found.extend(updates)
    return consolidate(found), reader.frontier


def random_history(rng: random.Random, appends: int) -> Iterator[tuple[list[RowUpdate], int]]:
    """(updates, new upper) for consecutive appends from time 0, rows over a small domain
    so that updates cancel and consolidate."""
    lower = 0
    for _ in range(appends):
        upper = lower + rng.randint(1, 4)
        updates = [
            (
                (rng.randint(0, 4), rng.choice("ab")),
                rng.randrange(lower, upper),
                rng.choice([1, -1]),
            )
            for _ in range(rng.randint(0, 6))
        ]
        yield updates, upper
        lower = upper


# -- reads against the model -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
async def test_reads_match_the_ptvc_model_before_and_after_compaction(
    core: StorageCore, seed: int
) -> None:
    rng = random.Random(seed)
    read, write = await core.create("u1", SCHEMA)
    model: PartialTVC[Row, int] = PartialTVC(U64)
    everything: list[RowUpdate] = []
    for updates, upper in random_history(rng, 25):
        await core.append("u1", write.id, table(updates), u64_frontier(upper), token=str(upper))
        model.append(u64_frontier(upper), updates)
        everything.extend(updates)
        if rng.random() < 0.3:
            # Hold reads from somewhere in the recent past, letting compaction move times.
            since = rng.randint(model.since.elements[0], upper - 1)
            read = await core.downgrade("u1", read.id, u64_frontier(since))
            model.compact(u64_frontier(since))
            await core.compactor.compact("u1")
    for phase in ("before", "after"):
        state = (await core.describe("u1")).state
        assert state.since == model.since and state.upper == model.upper
        lo, hi = model.since.elements[0], model.upper.elements[0]
        for t in range(lo, hi):
            snapshot = await core.snapshot("u1", read.id, t)
            expected = model.read(t)
            assert version_from_table(snapshot.table) == expected, (phase, t)
            assert expected == read_updates(U64, everything, t)
        # The subscription's snapshot is the collection at the capability's frontier, and
        # the rest of the stream every later update at its own time.
        messages = await collect(
            core.subscribe("u1", read.id, SubscribeSpec(stop_at=u64_frontier(hi)))
        )
        history, frontier = reassemble(messages)
        assert frontier == u64_frontier(hi)
        assert read_updates(U64, history, lo) == model.read(lo)
        assert [u for u in history if u[1] > lo] == [
            u for u in consolidate(everything) if u[1] > lo
        ]
        await core.compactor.compact("u1")
        assert len((await core.describe("u1")).state.batches) <= 6


async def test_ten_thousand_single_row_appends_leave_about_log2_batches(
    core: StorageCore,
) -> None:
    read, write = await core.create("u1", SCHEMA)
    rows = [table([((i, "x"), i, 1)]) for i in range(10_000)]
    for i, batch in enumerate(rows):
        await core.append("u1", write.id, batch, u64_frontier(i + 1), token=str(i))
    await core.compactor.idle()
    await core.compactor.compact("u1")
    state = (await core.describe("u1")).state
    assert state.total_rows == 10_000
    assert len(state.batches) <= 14  # log2(10_000) ~ 13.3
    snapshot = await core.snapshot("u1", read.id, 9_999)
    assert snapshot.table.num_rows == 10_000


# -- subscriptions ----------------------------------------------------------------------------


async def test_subscription_pushes_each_append_with_progress(core: StorageCore) -> None:
    read, write = await core.create("u1", SCHEMA, initial_frontier=10)
    await core.append("u1", write.id, table([((1, "a"), 10, 1)]), u64_frontier(12))
    events = core.subscribe("u1", read.id, SubscribeSpec(stop_at=u64_frontier(20)))
    first = [await anext(events), await anext(events)]
    assert updates_from_table(first[0]) == [((1, "a"), 10, 1)]
    assert first[1] == Progress(u64_frontier(0), u64_frontier(12), [(10, 1)])
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # nothing new yet: the stream waits, it does not poll or end
    await core.append("u1", write.id, table([((2, "b"), 13, -1)]), u64_frontier(15))
    assert updates_from_table(await waiting) == [((2, "b"), 13, -1)]
    assert await anext(events) == Progress(u64_frontier(12), u64_frontier(15), [(13, 1)])
    await core.append("u1", write.id, None, u64_frontier(30))
    assert await anext(events) == Progress(u64_frontier(15), u64_frontier(20), [])
    with pytest.raises(StopAsyncIteration):
        await anext(events)


async def test_subscription_options(core: StorageCore) -> None:
    read, write = await core.create("u1", SCHEMA)
    await core.append(
        "u1",
        write.id,
        table([((1, "a"), 0, 1), ((2, "a"), 1, 1), ((3, "b"), 2, 1), ((None, "b"), 3, 1)]),
        u64_frontier(4),
    )
    await core.append("u1", write.id, table([((4, "a"), 5, 1), ((5, "b"), 6, 1)]), u64_frontier(8))
    read = await core.downgrade("u1", read.id, u64_frontier(1))
    # Projection merges rows that became equal; the filter drops rows before sending.
    predicate = storage_pb2.ColumnPredicate(
        column="k", op=storage_pb2.FILTER_OP_GE, value=storage_pb2.FilterValue(int_value=2)
    )
    spec = SubscribeSpec(
        columns=("v",),
        row_filter=storage_pb2.RowFilter(predicates=[predicate]),
        stop_at=u64_frontier(8),
    )
    messages = await collect(core.subscribe("u1", read.id, spec))
    history, frontier = reassemble(messages)
    assert frontier == u64_frontier(8)
    assert history == [(("a",), 1, 1), (("a",), 5, 1), (("b",), 2, 1), (("b",), 6, 1)]
    # Without the snapshot only later times come, and as_of may start later than the hold.
    spec = SubscribeSpec(snapshot=False, as_of=2, stop_at=u64_frontier(7))
    history, frontier = reassemble(await collect(core.subscribe("u1", read.id, spec)))
    assert frontier == u64_frontier(7)
    assert set(history) == {((None, "b"), 3, 1), ((4, "a"), 5, 1), ((5, "b"), 6, 1)}
    # Small messages: the same history in more pieces.
    spec = SubscribeSpec(max_rows=1, stop_at=u64_frontier(8))
    messages = await collect(core.subscribe("u1", read.id, spec))
    assert sum(isinstance(m, Updates) for m in messages) == 6
    assert set(reassemble(messages)[0]) == {
        ((1, "a"), 1, 1),
        ((2, "a"), 1, 1),
        ((3, "b"), 2, 1),
        ((None, "b"), 3, 1),
        ((4, "a"), 5, 1),
        ((5, "b"), 6, 1),
    }


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (SubscribeSpec(as_of=1), FailedPrecondition, "before the read capability"),
        (SubscribeSpec(stop_at=u64_frontier(3)), InvalidArgument, "beyond the starting time"),
        (SubscribeSpec(columns=("nope",)), InvalidArgument, "no column named"),
    ],
)
async def test_subscription_refusals(
    core: StorageCore, spec: SubscribeSpec, error: type[Exception], message: str
) -> None:
    read, _ = await core.create("u1", SCHEMA, initial_frontier=3)
    with pytest.raises(error, match=message):
        await anext(core.subscribe("u1", read.id, spec))


async def test_subscription_ends_when_its_capability_is_dropped(core: StorageCore) -> None:
    read, write = await core.create("u1", SCHEMA)
    await core.append("u1", write.id, None, u64_frontier(1))
    events = core.subscribe("u1", read.id, SubscribeSpec())
    assert isinstance(await anext(events), Progress)
    waiting = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.01)
    await core.drop("u1", read.id)
    with pytest.raises(PermissionDenied):
        await waiting


@pytest.mark.parametrize("resume", ["same_as_of", "from_reported_frontier"])
async def test_resubscribing_reassembles_the_exact_history(core: StorageCore, resume: str) -> None:
    rng = random.Random(7)
    read, write = await core.create("u1", SCHEMA)
    history = list(random_history(rng, 30))
    everything = [u for updates, _ in history for u in updates]
    final = history[-1][1]
    for updates, upper in history[:10]:
        await core.append("u1", write.id, table(updates), u64_frontier(upper))

    reader: CdcReader[Row, int] = CdcReader(U64)
    received: list[RowUpdate] = []
    first = core.subscribe("u1", read.id, SubscribeSpec(stop_at=u64_frontier(final)))
    appended = 10
    async for event in first:
        message = event if isinstance(event, Progress) else Updates(updates_from_table(event))
        for updates, _ in reader.push(message):
            received.extend(updates)
        if isinstance(event, Progress) and appended < 20:
            updates, upper = history[appended]
            await core.append("u1", write.id, table(updates), u64_frontier(upper))
            appended += 1
        if appended == 20:
            break  # disconnect mid-stream
    await first.aclose()
    for updates, upper in history[20:]:
        await core.append("u1", write.id, table(updates), u64_frontier(upper))
    reached = reader.frontier.elements[0]
    if resume == "same_as_of":
        spec = SubscribeSpec(stop_at=u64_frontier(final))
    else:
        # Hold only what is still needed, then ask for the rest without a snapshot.
        read = await core.downgrade("u1", read.id, u64_frontier(reached - 1))
        spec = SubscribeSpec(snapshot=False, as_of=reached - 1, stop_at=u64_frontier(final))
    await core.compactor.compact("u1")
    again = await collect(core.subscribe("u1", read.id, spec))
    for updates, _ in reader.push_all(again):
        received.extend(updates)
    assert reader.frontier == u64_frontier(final)
    assert consolidate(received) == consolidate(everything)


# -- CDC ingestion ----------------------------------------------------------------------------


def cdc_proto(message: Message[Row, int]) -> common_pb2.CdcMessage:
    if isinstance(message, Updates):
        data = to_ipc(table(list(message.updates)))
        return common_pb2.CdcMessage(updates=common_pb2.Updates(arrow_ipc=data))
    return to_proto(message)  # type: ignore[arg-type]


async def stream_of(messages: list[common_pb2.CdcMessage]) -> AsyncIterator[common_pb2.CdcMessage]:
    for message in messages:
        yield message


async def test_ingest_of_a_duplicated_shuffled_rebatched_history(core: StorageCore) -> None:
    rng = random.Random(3)
    history = consolidate(u for updates, _ in random_history(rng, 20) for u in updates)
    final = max(t for _, t, _ in history) + 1
    copies: list[Message[Row, int]] = []
    for _ in range(3):
        cuts = sorted(rng.sample(range(1, final), 6))
        copies.extend(
            write_history(
                history,
                u64_frontier(final),
                cuts=[u64_frontier(c) for c in cuts],
                max_updates=rng.randint(1, 5),
            )
        )
    rng.shuffle(copies)
    read, write = await core.create("u1", SCHEMA)
    result = await core.ingest("u1", write.id, stream_of([cdc_proto(m) for m in copies]))
    assert result.upper == u64_frontier(final)
    assert result.updates == len(history)
    messages = await collect(
        core.subscribe("u1", read.id, SubscribeSpec(stop_at=u64_frontier(final)))
    )
    assert reassemble(messages)[0] == history
    # Feeding the same stream again appends nothing: it is all before the upper now.
    again = await core.ingest("u1", write.id, stream_of([cdc_proto(m) for m in copies]))
    assert again.intervals == 0 and again.upper == u64_frontier(final)


async def test_ingest_refuses_row_form_updates(core: StorageCore) -> None:
    _, write = await core.create("u1", SCHEMA)
    rows = common_pb2.CdcMessage(updates=common_pb2.Updates(updates=[common_pb2.Update(data=b"x")]))
    with pytest.raises(InvalidArgument, match="Arrow IPC"):
        await core.ingest("u1", write.id, stream_of([rows]))


# -- leases and garbage -----------------------------------------------------------------------


async def test_lease_expiry_releases_the_hold_and_acquire_recovers(
    core: StorageCore, clock: Clock
) -> None:
    read, write = await core.create("u1", SCHEMA)
    await core.append("u1", write.id, table([((1, "a"), 0, 1)]), u64_frontier(5))
    other = await core.clone("u1", read.id, holder="laggard")
    read = await core.downgrade("u1", read.id, u64_frontier(4))
    assert (await core.describe("u1")).state.since == u64_frontier(0)
    clock.now += 6_000
    renewed, missing = await core.renew([("u1", read.id), ("u1", write.id), ("u9", read.id)])
    assert {r.id for _, r in renewed} == {read.id, write.id} and missing == [("u9", read.id)]
    clock.now += 6_000  # the clone's lease is over; the others were renewed
    await core.maintenance.run_once()
    state = (await core.describe("u1")).state
    assert state.capability(other.id) is None
    assert state.since == u64_frontier(4)
    with pytest.raises(PermissionDenied):
        await core.snapshot("u1", other.id, 4)
    clock.now += 20_000  # now everyone's lease is over
    await core.maintenance.run_once()
    state = (await core.describe("u1")).state
    # Lapsed leases released every hold, but not the data: the since stays put.
    assert state.capabilities == () and state.since == u64_frontier(4)
    with pytest.raises(PermissionDenied):
        await core.append("u1", write.id, None, u64_frontier(9))
    new_read, new_write = await core.acquire("u1", holder="recovered")
    assert new_read.id != "" and new_read.frontier == u64_frontier(4)
    assert new_write.frontier == u64_frontier(5)
    await core.append("u1", new_write.id, None, u64_frontier(9))
    recovered = await core.snapshot("u1", new_read.id, 4)
    assert version_from_table(recovered.table) == {(1, "a"): 1}


async def test_a_critical_hold_outlives_every_lease_and_only_a_drop_releases_it(
    core: StorageCore, clock: Clock
) -> None:
    read, write = await core.create("u1", SCHEMA, critical_holder="catalog")
    hold = await core.acquire_critical("u1", "catalog")
    assert hold.critical and hold.lease_expires_ms == 0 and hold.frontier == u64_frontier(0)
    assert (await core.acquire_critical("u1", "catalog")).id == hold.id  # one per holder
    await core.append("u1", write.id, table([((1, "a"), 0, 1), ((2, "b"), 3, 1)]), u64_frontier(5))
    hold = await core.downgrade("u1", hold.id, u64_frontier(2))
    # What today's runaway did: a reader that drops the last leased read capability.
    await core.drop("u1", read.id)
    assert (await core.describe("u1")).state.since == u64_frontier(2)
    clock.now += 1_000_000  # every lease is long over
    await core.maintenance.run_once()
    state = (await core.describe("u1")).state
    assert [c.id for c in state.capabilities] == [hold.id] and state.since == u64_frontier(2)
    renewed, missing = await core.renew([("u1", hold.id)])
    assert [r.lease_expires_ms for _, r in renewed] == [0] and missing == []
    again, again_write = await core.acquire("u1", holder="adapter")
    assert again.frontier == u64_frontier(2)
    assert version_from_table((await core.snapshot("u1", again.id, 2)).table) == {(1, "a"): 1}
    await core.drop("u1", again.id)
    await core.drop("u1", again_write.id)
    with pytest.raises(FailedPrecondition):
        await core.downgrade("u1", hold.id, u64_frontier(1))  # backwards: refused, kept
    await core.drop("u1", hold.id)
    state = (await core.describe("u1")).state
    assert state.capabilities == () and state.since.is_empty()
    with pytest.raises(FailedPrecondition, match="lost its history"):
        await core.acquire_critical("u1", "catalog")
    with pytest.raises(InvalidArgument):
        await core.acquire_critical("u1", "")


async def test_reset_history_starts_a_lost_collection_afresh_at_its_upper(
    core: StorageCore, clock: Clock
) -> None:
    read, write = await core.create("u1", SCHEMA, writer=VIEW_WRITER)
    await core.append("u1", write.id, table([((1, "a"), 0, 1)]), u64_frontier(5))
    await core.drop("u1", read.id)  # the since runs away: {}
    assert (await core.describe("u1")).state.since.is_empty()
    hold = await core.reset_history("u1", "catalog")
    assert hold.critical and hold.frontier == u64_frontier(5)
    state = (await core.describe("u1")).state
    assert state.since == u64_frontier(5) and state.upper == u64_frontier(5)
    assert state.batches == () and [c.id for c in state.capabilities] == [hold.id]
    with pytest.raises(PermissionDenied):  # the old writer is revoked
        await core.append("u1", write.id, None, u64_frontier(9))
    assert (await core.acquire_critical("u1", "catalog")).id == hold.id
    _, new_write = await core.acquire("u1", holder="rebuilder")
    await core.append("u1", new_write.id, table([((7, "z"), 5, 1)]), u64_frontier(6))
    assert version_from_table((await core.snapshot("u1", hold.id, 5)).table) == {(7, "z"): 1}
    _, closed_write = await core.create("u2", SCHEMA, writer=VIEW_WRITER)
    await core.append("u2", closed_write.id, None, u64_frontier())  # upper {}: closed
    with pytest.raises(FailedPrecondition, match="closed"):
        await core.reset_history("u2", "catalog")


async def test_a_collection_without_a_writer_never_has_its_history_reset(
    core: StorageCore,
) -> None:
    """A table's rows, a source's or the catalog's log (written by the catalog) cannot be
    written again from anything: a reset would lose them for good, so it is refused and
    changes nothing."""
    for collection_id, writer in (("s1", "tidemark://catalog"), ("u3", "")):
        read, write = await core.create(collection_id, SCHEMA, writer=writer)
        await core.append(collection_id, write.id, table([((1, "a"), 0, 1)]), u64_frontier(5))
        with pytest.raises(FailedPrecondition, match="cannot be reset"):
            await core.reset_history(collection_id, "catalog")
        state = (await core.describe(collection_id)).state
        assert len(state.batches) == 1 and {c.id for c in state.capabilities} == {
            read.id,
            write.id,
        }
        snapshot = await core.snapshot(collection_id, read.id, 4)
        assert version_from_table(snapshot.table) == {(1, "a"): 1}


async def test_orphans_and_retired_blobs_are_deleted_referenced_ones_kept(
    core: StorageCore, clock: Clock
) -> None:
    read, write = await core.create("u1", SCHEMA)
    for i in range(3):
        await core.append("u1", write.id, table([((i, "a"), i, 1)]), u64_frontier(i + 1))
    # A crashed append: its blob was written, its compare-and-set never happened.
    orphan = await core.batches.write("u1", table([((9, "z"), 3, 1)]))
    await core.compactor.idle()
    blob = core.batches.blob
    state = (await core.describe("u1")).state
    assert state.retired  # compaction replaced some batches
    await core.maintenance.run_once(sweep_orphans=True)
    assert orphan.key in await blob.list()  # too young to be called an orphan
    for _ in range(13):  # a minute passes; the holders keep their leases
        clock.now += 5_000
        await core.renew([("u1", read.id), ("u1", write.id)])
    await core.maintenance.run_once(sweep_orphans=True)
    state = (await core.describe("u1")).state
    assert state.retired == ()
    assert await blob.list() == sorted(b.key for b in state.batches)
    snapshot = await core.snapshot("u1", read.id, 2)
    assert version_from_table(snapshot.table) == {(0, "a"): 1, (1, "a"): 1, (2, "a"): 1}


async def test_a_read_of_an_older_state_survives_compaction_and_collection(
    core: StorageCore, clock: Clock
) -> None:
    _, write = await core.create("u1", SCHEMA)
    for i in range(5):
        await core.append("u1", write.id, table([((i, "a"), i, 1)]), u64_frontier(i + 1))
    await core.compactor.idle()
    older = await core.shards.require("u1")
    for i in range(5, 12):
        await core.append("u1", write.id, table([((i, "a"), i, 1)]), u64_frontier(i + 1))
    await core.compactor.idle()
    clock.now += 2_000
    await core.maintenance.run_once()
    listed = await core.batches.blob.list()
    gone = [b.key for b in older.state.batches if b.key not in listed]
    assert gone, "compaction and collection should have deleted a batch of the older state"
    core.batches.cache = TableCache(0)  # every read goes to the blob store
    # A reader that took the older state just before all that starts over, it does not fail
    # and does not mix batches of two states.
    snapshot = await core.reader.snapshot(older, 4)
    assert version_from_table(snapshot) == {(i, "a"): 1 for i in range(5)}


async def test_collection_id_and_capability_errors(core: StorageCore) -> None:
    read, write = await core.create("u1", SCHEMA)
    with pytest.raises(InvalidArgument, match="GlobalId"):
        await core.create("bad id", SCHEMA)
    with pytest.raises(PermissionDenied, match="read capability"):
        await core.append("u1", read.id, None, u64_frontier(3))
    with pytest.raises(PermissionDenied, match="write capability"):
        await core.snapshot("u1", write.id, 0)
    foreign: CapabilityRecord = (await core.create("u2", SCHEMA))[0]
    with pytest.raises(PermissionDenied, match="not a live capability of collection u1"):
        await core.snapshot("u1", foreign.id, 0)


async def test_a_prepared_operation_is_reused_only_on_the_state_it_was_run_on(
    core: StorageCore, clock: Clock
) -> None:
    await core.create("u1", SCHEMA)
    shards = core.shards
    runs: list[int] = []

    def bump(label: str) -> Any:
        def run(state: ShardState, now_ms: int) -> tuple[ShardState, str]:
            runs.append(now_ms)
            return replace(state, created_ms=state.created_ms + 1), label

        return run

    created = (await shards.require("u1")).state.created_ms
    # Run on the state it will meet: the group commit uses the outcome as prepared.
    prepared = shards.prepare("u1", bump("a"))
    assert len(runs) == 1
    clock.now += 5
    assert await shards.update("u1", prepared) == "a"
    assert len(runs) == 1
    stored = await shards.require("u1")
    assert stored.state.created_ms == created + 1
    assert ShardState.decode(stored.data) == stored.state
    # Another change lands in between: the operation runs again, on the state it meets.
    prepared = shards.prepare("u1", bump("b"))
    await shards.update("u1", bump("other"))
    assert await shards.update("u1", prepared) == "b"
    assert len(runs) == 4
    assert (await shards.require("u1")).state.created_ms == created + 3
    # Prepared too long ago: run again, at the time of the commit.
    prepared = shards.prepare("u1", bump("c"))
    clock.now += MAX_PREPARED_AGE_MS + 1
    assert await shards.update("u1", prepared) == "c"
    assert runs[-1] == clock.now and len(runs) == 6
    assert (await shards.require("u1")).state.created_ms == created + 4


def test_overlapping_batches_are_found_from_the_newest_end() -> None:
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, 40), rng.randint(1, 12)))
        bounds = [0, *cuts]
        batches = [
            StoredBatch(f"k{i}", u64_frontier(lo), u64_frontier(hi))
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
        ]
        if rng.random() < 0.3:  # a closed collection: the last batch runs to {}
            batches.append(StoredBatch("last", u64_frontier(bounds[-1]), u64_frontier()))
        lower = rng.randint(0, 45)
        upper = rng.choice([None, lower + rng.randint(1, 10)])
        expected = [b for b in batches if overlaps(b, lower, upper)]
        assert overlapping(batches, lower, upper) == expected
