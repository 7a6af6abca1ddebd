"""What a storage process reuses of its own work: batches it wrote are served to its subscribers
from memory (only once a committed state lists them), and a state it is writing is not decoded
again when the watch brings it back. Two cores on one consensus and blob store stand for two
storage processes serving the same shard."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pyarrow as pa
import pytest

from services.storage.batches import TableCache
from services.storage.core import StorageCore, StorageSettings
from services.storage.shards import ShardStore, Versioned
from services.storage.state import ShardState
from services.storage.subscriptions import SubscribeSpec
from services.storage.watch import ShardWatch
from tidemark.blob import MemoryBlob
from tidemark.cdc import CdcReader, Message, Progress, Updates
from tidemark.columnar import ColumnType, RelationSchema, table_from_updates, updates_from_table
from tidemark.consensus import CasResult
from tidemark.consensus.memory import MemoryConsensus
from tidemark.frontier import u64_frontier
from tidemark.lattice import U64
from tidemark.updates import consolidate

SCHEMA = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.TEXT))
RowUpdate = tuple[tuple[Any, ...], int, int]
APPENDS = 12


class CountingBlob(MemoryBlob):
    """One process's view of a shared in-memory store, counting the batches it fetches."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__(objects)
        self.gets: list[str] = []

    async def get(self, key: str) -> bytes | None:
        self.gets.append(key)
        return await super().get(key)


def storage_core(consensus: MemoryConsensus, blob: CountingBlob) -> StorageCore:
    return StorageCore(consensus, blob, StorageSettings(lease_ms=60_000))


@pytest.fixture
async def two_cores() -> AsyncIterator[tuple[StorageCore, StorageCore]]:
    consensus, objects = MemoryConsensus(), dict[str, bytes]()
    writer = storage_core(consensus, CountingBlob(objects))
    other = storage_core(consensus, CountingBlob(objects))
    yield writer, other
    await writer.close()
    await other.close()


def history(seed: int) -> list[tuple[list[RowUpdate], int]]:
    """(updates, new upper) for appends 0..APPENDS-1, each at its own time; rows repeat and
    cancel across appends."""
    rng = random.Random(seed)
    return [
        ([((rng.randint(0, 3), rng.choice("ab")), t, rng.choice([1, -1])) for _ in range(3)], t + 1)
        for t in range(APPENDS)
    ]


async def reassembled(events: AsyncIterator[pa.Table | Progress[int]]) -> list[RowUpdate]:
    reader: CdcReader[tuple[Any, ...], int] = CdcReader(U64)
    found: list[RowUpdate] = []
    async for event in events:
        message: Message[tuple[Any, ...], int] = (
            event if isinstance(event, Progress) else Updates(updates_from_table(event))
        )
        for updates, _ in reader.push_all([message]):
            found.extend(updates)
    return consolidate(found)


async def append(core: StorageCore, write_id: str, updates: list[RowUpdate], upper: int) -> None:
    await core.append("u1", write_id, table_from_updates(SCHEMA, updates), u64_frontier(upper))


def blob_reads(core: StorageCore) -> list[str]:
    assert isinstance(core.batches.blob, CountingBlob)
    return core.batches.blob.gets


async def test_subscribers_get_exactly_the_committed_updates_from_memory_or_from_blobs(
    two_cores: tuple[StorageCore, StorageCore],
) -> None:
    writer, other = two_cores
    read, write = await writer.create("u1", SCHEMA)
    spec = SubscribeSpec(stop_at=u64_frontier(APPENDS))
    served_locally = asyncio.ensure_future(reassembled(writer.subscribe("u1", read.id, spec)))
    served_elsewhere = asyncio.ensure_future(reassembled(other.subscribe("u1", read.id, spec)))
    await asyncio.sleep(0.01)  # both subscriptions are open before the first append
    # A batch the writing process holds in memory but no state ever lists: as from an append
    # whose compare-and-set failed. Nobody may be served it.
    decoy = table_from_updates(SCHEMA, [((9, "decoy"), t, 1) for t in range(APPENDS)])
    await writer.batches.write("u1", decoy)
    expected: list[RowUpdate] = []
    for updates, upper in history(seed=5):
        await append(writer, write.id, updates, upper)
        expected.extend(updates)
    local, remote = await asyncio.wait_for(asyncio.gather(served_locally, served_elsewhere), 10)
    assert local == remote == consolidate(expected)
    assert all(row != (9, "decoy") for row, _, _ in local)
    # The writer served its subscriber from the tables it had written, the other process read
    # the batches from the blob store.
    assert blob_reads(writer) == []
    assert blob_reads(other)


async def test_a_process_that_did_not_write_the_batches_reads_them_from_the_blob_store(
    two_cores: tuple[StorageCore, StorageCore],
) -> None:
    writer, other = two_cores
    read, write = await writer.create("u1", SCHEMA)
    expected: list[RowUpdate] = []
    for updates, upper in history(seed=8)[:6]:
        await append(writer, write.id, updates, upper)
        expected.extend(updates)
    # The other process appends next, and the writer forgot what it wrote: every process
    # serves every batch, whoever wrote it and whatever it still holds in memory.
    writer.batches.cache = TableCache(writer.settings.cache_bytes)
    for updates, upper in history(seed=8)[6:]:
        await append(other, write.id, updates, upper)
        expected.extend(updates)
    spec = SubscribeSpec(stop_at=u64_frontier(APPENDS))
    for core in (writer, other):
        assert await reassembled(core.subscribe("u1", read.id, spec)) == consolidate(expected)
    assert blob_reads(writer)


async def test_a_read_of_batches_in_memory_completes_without_waiting(
    two_cores: tuple[StorageCore, StorageCore],
) -> None:
    writer, other = two_cores
    _, write = await writer.create("u1", SCHEMA)
    for updates, upper in history(seed=3)[:4]:
        await append(writer, write.id, updates, upper)
    state = await writer.shards.require("u1")
    # Driven by hand: a read that suspended (on a blob fetch, or to let other tasks run first)
    # would not finish within the first step. A subscriber so served sends its updates before
    # anything else the event loop has queued meanwhile.
    read = writer.reader.interval(state, 1, 3)
    with pytest.raises(StopIteration) as finished:
        read.send(None)
    assert consolidate(updates_from_table(finished.value.value)) == consolidate(
        [u for updates, _ in history(seed=3)[1:3] for u in updates]
    )
    # A process without those tables in memory fetches them.
    fetched = await other.reader.interval(await other.shards.require("u1"), 1, 3)
    assert fetched.equals(finished.value.value)
    assert blob_reads(other) and not blob_reads(writer)


class WatchFirstConsensus(MemoryConsensus):
    """Replies to a compare-and-set only after its watchers have seen the write, as an etcd
    watch event can overtake the reply to the transaction that caused it."""

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        result = await super().compare_and_set(key, expected_version, data)
        for _ in range(5):
            await asyncio.sleep(0)
        return result


async def test_the_state_being_written_is_not_decoded_when_the_watch_brings_it_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consensus = WatchFirstConsensus()
    mine, theirs = ShardStore(consensus), ShardStore(consensus)
    watch = ShardWatch(mine)
    decoded: list[bytes] = []
    real_decode = ShardState.decode

    def counting_decode(data: bytes) -> ShardState:
        decoded.append(data)
        return real_decode(data)

    monkeypatch.setattr(ShardState, "decode", staticmethod(counting_decode))
    state = ShardState("u1", SCHEMA, u64_frontier(0), u64_frontier(0))
    created = await mine.create("u1", state)
    states = cast(AsyncGenerator[Versioned, None], watch.states("u1", at_least=created.version))
    assert (await anext(states)).version == created.version
    decoded.clear()

    moved = ShardState("u1", SCHEMA, u64_frontier(0), u64_frontier(5))
    seen = asyncio.ensure_future(anext(states))
    await mine.update("u1", lambda current, now: (moved, None))
    delivered = await seen
    assert delivered.state is moved  # the very value written, not a decoded copy
    assert delivered.state.upper == u64_frontier(5)
    assert decoded == []

    # A state another process wrote is decoded, once.
    elsewhere = ShardState("u1", SCHEMA, u64_frontier(0), u64_frontier(9))
    await theirs.update("u1", lambda current, now: (elsewhere, None))
    delivered = await anext(states)
    assert delivered.state == elsewhere
    assert delivered.state is not elsewhere
    assert decoded.count(elsewhere.encode()) == 1
    await states.aclose()
    await watch.close()
    await mine.close()
    await theirs.close()
