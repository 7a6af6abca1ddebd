"""The storage service as a real process over gRPC, on the embedded backends (SQLite file +
directory) and on the production ones (etcd + S3 endpoint): every call, every error, leases,
subscriptions with reconnection, CDC ingestion and garbage collection."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.service_process import ServiceProcess
from tests.support.storage import (
    SHORT_LEASE,
    Backends,
    embedded_backends,
    production_backends,
    start_storage,
)
from tidemark.blob import open_blob
from tidemark.cdc import CdcReader, Message, Progress, Updates, write_history
from tidemark.cdc.proto import frontier_to_proto
from tidemark.clients.storage import (
    CLOSED,
    Capability,
    PartsInterval,
    StorageClient,
    WrittenPart,
    row_filter,
    where,
)
from tidemark.columnar import (
    Column,
    ColumnType,
    RelationSchema,
    from_parquet,
    table_from_updates,
    to_ipc,
    to_parquet,
    updates_from_table,
)
from tidemark.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from tidemark.frontier import u64_frontier
from tidemark.lattice import U64
from tidemark.part_keys import new_part_key
from tidemark.retry import RetryPolicy
from tidemark.rpc import call
from tidemark.rpc.client import stream as stream_call
from tidemark.updates import consolidate, read_updates
from tidemark.v1 import common_pb2, storage_pb2

SCHEMA = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.TEXT))
EVERY_TYPE = RelationSchema(
    [
        Column("flag", ColumnType.BOOL),
        Column("n", ColumnType.INT64, nullable=False),
        Column("x", ColumnType.FLOAT64),
        Column("amount", ColumnType.DECIMAL, precision=12, scale=2),
        Column("name", ColumnType.TEXT),
        Column("blob", ColumnType.BYTES),
        Column("day", ColumnType.DATE),
        Column("at", ColumnType.TIMESTAMP),
        Column("doc", ColumnType.JSON),
    ]
)
Row = tuple[Any, ...]
QUICK_RETRY = RetryPolicy(total_seconds=3.0, initial_backoff=0.05, max_backoff=0.3)
_ids = itertools.count(1)


def new_id() -> str:
    return f"u{next(_ids)}"


@pytest.fixture(scope="module", params=["embedded", "etcd_s3"])
def backends(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backends:
    if request.param == "embedded":
        return embedded_backends(tmp_path_factory.mktemp("storage"))
    return production_backends(request)


@pytest.fixture(scope="module")
def storage(backends: Backends) -> Iterator[ServiceProcess]:
    process = start_storage(backends)
    yield process
    process.kill()


@pytest.fixture
async def client(storage: ServiceProcess) -> AsyncIterator[StorageClient]:
    made = StorageClient(storage.address, timeout=10.0, retry=QUICK_RETRY)
    yield made
    await made.close()


@pytest.fixture(params=["stream", "unary"])
async def append_client(
    storage: ServiceProcess, request: pytest.FixtureRequest
) -> AsyncIterator[StorageClient]:
    """A client sending appends over AppendStream, or as Append calls."""
    made = StorageClient(
        storage.address, timeout=10.0, retry=QUICK_RETRY, append_stream=request.param == "stream"
    )
    yield made
    await made.close()


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    """Wait until ``check()`` holds (for background work: leases, garbage collection)."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition did not come true in time"
        await asyncio.sleep(0.1)


# -- collections and appends ------------------------------------------------------------------


async def test_create_append_snapshot_describe_list(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, EVERY_TYPE, initial_frontier=100, holder="tester")
    assert pair.read.kind == "read" and pair.write.kind == "write"
    assert pair.read.frontier == pair.write.frontier == u64_frontier(100)
    assert len(pair.read.id) == 32 and pair.read.id != pair.write.id
    row = (
        True,
        1,
        2.5,
        decimal.Decimal("3.25"),
        "text",
        b"\x01",
        datetime.date(2025, 1, 2),
        datetime.datetime(2025, 1, 2, 3, 4, 5, 6),
        '{"a": 1}',
    )
    other = (None, 2, None, None, None, None, None, None, None)
    result = await client.append(pair.write, [(row, 100, 2), (other, 101, 1)], 105)
    assert result.upper == u64_frontier(105) and not result.already_committed
    at_100 = await client.snapshot(pair.read, 100)
    assert at_100.version() == {row: 2}
    assert at_100.as_of == 100 and at_100.upper == u64_frontier(105)
    assert (await client.snapshot(pair.read, 104)).version() == {row: 2, other: 1}
    assert (await client.snapshot(pair.read)).as_of == 100
    info = await client.describe(cid)
    assert info.schema == EVERY_TYPE
    assert (info.since, info.upper) == (u64_frontier(100), u64_frontier(105))
    assert info.batch_count == 1 and info.rows == 2 and info.bytes > 0
    assert {(c.kind, c.holder) for c in info.capabilities} == {
        ("read", "tester"),
        ("write", "tester"),
    }
    assert all(len(c.id_prefix) == 8 for c in info.capabilities)  # never the whole secret
    assert pair.read.id.startswith(next(c.id_prefix for c in info.capabilities if c.kind == "read"))
    assert 0 < info.state_bytes < 4096
    listed = {c.collection_id: c for c in await client.list()}
    assert listed[cid].upper == u64_frontier(105)


async def test_create_errors(client: StorageClient) -> None:
    cid = new_id()
    await client.create(cid, SCHEMA)
    with pytest.raises(AlreadyExists, match=cid):
        await client.create(cid, SCHEMA)
    with pytest.raises(InvalidArgument, match="GlobalId"):
        await client.create("table_1", SCHEMA)
    bad = common_pb2.RelationSchema(columns=[common_pb2.Column(name="time", type=2)])
    with pytest.raises(InvalidArgument, match="reserved"):
        await call_raw(
            client, "Create", storage_pb2.CreateRequest(collection_id=new_id(), schema=bad)
        )
    with pytest.raises(NotFound, match="u999999"):
        await client.describe("u999999")


async def call_raw(client: StorageClient, method: str, request: Any) -> Any:
    return await call(getattr(client.stub, method), request, timeout=5.0)


async def test_append_rules_and_errors(append_client: StorageClient) -> None:
    client = append_client
    cid = new_id()
    pair = await client.create(cid, SCHEMA, initial_frontier=10)
    write = pair.write
    with pytest.raises(InvalidArgument, match=r"time 9 lies outside \[\{10\}, \{20\}\)"):
        await client.append(write, [((1, "a"), 9, 1)], 20)
    with pytest.raises(InvalidArgument, match=r"time 20 lies outside"):
        await client.append(write, [((1, "a"), 20, 1)], 20)
    with pytest.raises(InvalidArgument, match=r"time 3 lies outside"):  # even if they cancel
        await client.append(write, [((1, "a"), 3, 1), ((1, "a"), 3, -1)], 20)
    with pytest.raises(FailedPrecondition, match=r"not beyond the upper.*upper \{10\}"):
        await client.append(write, [], 10)
    with pytest.raises(PermissionDenied, match="read capability"):
        await client.append(pair.read, [], 20)
    fake = Capability(cid, "0" * 32, "write", u64_frontier(10), 0)
    with pytest.raises(PermissionDenied, match="not a live capability"):
        await client.append(fake, [], 20)
    with pytest.raises(FailedPrecondition, match=r"expected upper \{5\}.*upper \{10\}"):
        await client.append(write, [], 20, expected_upper=5)
    wrong_columns = table_from_updates(RelationSchema.of(("k", ColumnType.INT64)), [((1,), 10, 1)])
    with pytest.raises(InvalidArgument, match="missing"):
        await client.append(write, wrong_columns, 20)
    no_upper = storage_pb2.AppendRequest(capability=write.ref)
    with pytest.raises(InvalidArgument, match="new_upper is required"):
        await call_raw(client, "Append", no_upper)
    with pytest.raises(InvalidArgument, match="Arrow IPC"):
        await client.append_ipc(write, b"garbage", 20)
    # Nothing of the refused appends is visible.
    assert (await client.describe(cid)).upper == u64_frontier(10)

    # Compare-and-append between two write capabilities: the lagging one is told the upper.
    second = await client.clone(write)
    first = await client.append(write, [((1, "a"), 10, 1)], 20, token="tok-1")
    with pytest.raises(FailedPrecondition, match=r"is at \{10\}.*upper \{20\}"):
        await client.append(second, [((2, "b"), 15, 1)], 30)
    # A retry of an append that already happened is answered as such, not applied again.
    retry = await client.append(write, [((1, "a"), 10, 1)], 20, token="tok-1")
    assert retry.already_committed and retry.upper == first.upper
    second = await client.downgrade(second, 20)
    await client.append(second, [((2, "b"), 25, 1)], 30)
    assert (await client.snapshot(pair.read, 29)).version() == {(1, "a"): 1, (2, "b"): 1}
    await client.append(second, [], CLOSED)
    with pytest.raises(FailedPrecondition, match=r"upper \{\}"):
        await client.append(second, [], CLOSED)


async def test_a_chunked_append_is_one_append(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA, initial_frontier=10)
    chunks = [
        to_ipc(
            table_from_updates(SCHEMA, [((k, f"v{k}"), 10 + k % 3, 1) for k in range(i, i + 50)])
        )
        for i in range(0, 200, 50)
    ]
    first = await client.append_chunked(pair.write, chunks, 20, token="bulk-1", expected_upper=10)
    assert first.upper == u64_frontier(20) and not first.already_committed
    description = await client.describe(cid)
    assert sum(b.rows for b in description.batches) == 200 and len(description.batches) == 1
    # The same token again: answered as the append that already happened, not applied twice.
    retry = await client.append_chunked(pair.write, chunks, 20, token="bulk-1", expected_upper=10)
    assert retry.already_committed and retry.upper == first.upper
    assert (await client.snapshot(pair.read, 19)).version() == {(k, f"v{k}"): 1 for k in range(200)}
    # A refused chunked append (stale expected upper, a chunk of other columns, a time out of
    # range) changes nothing.
    other = to_ipc(table_from_updates(RelationSchema.of(("k", ColumnType.INT64)), [((1,), 20, 1)]))
    late = to_ipc(table_from_updates(SCHEMA, [((1, "x"), 30, 1)]))
    with pytest.raises(FailedPrecondition):
        await client.append_chunked(pair.write, chunks, 30, expected_upper=10)
    with pytest.raises(InvalidArgument):
        await client.append_chunked(pair.write, [chunks[0], other], 30, expected_upper=20)
    with pytest.raises(InvalidArgument, match="lies outside"):
        await client.append_chunked(pair.write, [late], 30, expected_upper=20)
    assert (await client.describe(cid)).upper == u64_frontier(20)


async def test_snapshot_waits_for_the_upper_and_checks_the_capability(
    client: StorageClient,
) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA, initial_frontier=5)
    waiting = asyncio.create_task(client.snapshot(pair.read, 7))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await client.append(pair.write, [((1, "a"), 6, 1)], 8)
    assert (await waiting).version() == {(1, "a"): 1}
    with pytest.raises(FailedPrecondition, match=r"at \{5\}"):
        await client.snapshot(pair.read, 4)
    with pytest.raises(PermissionDenied, match="write capability"):
        await client.snapshot(pair.write, 7)
    filtered = await client.snapshot(
        pair.read, 7, columns=["v"], filter=row_filter(where("k", "in", [1, 3]))
    )
    assert filtered.version() == {("a",): 1}
    with pytest.raises(InvalidArgument, match="cannot be compared"):
        await client.snapshot(pair.read, 7, filter=row_filter(where("k", "=", "one")))


# -- capabilities -----------------------------------------------------------------------------


async def test_capability_calls_and_errors(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    await client.append(pair.write, [((1, "a"), 0, 1)], 10)
    clone = await client.clone(pair.read, holder="reader-2")
    assert clone.frontier == u64_frontier(0) and clone.id != pair.read.id
    assert clone.holder == "reader-2"
    moved = await client.downgrade(pair.read, 6)
    assert moved.frontier == u64_frontier(6)
    with pytest.raises(FailedPrecondition, match=r"from \{6\} to \{3\}"):
        await client.downgrade(pair.read, 3)
    assert (await client.describe(cid)).since == u64_frontier(0)
    await client.drop(clone)
    assert (await client.describe(cid)).since == u64_frontier(6)
    with pytest.raises(PermissionDenied):
        await client.drop(clone)
    with pytest.raises(PermissionDenied):
        await client.snapshot(clone, 6)
    acquired = await client.acquire(cid, holder="recovery")
    assert acquired.read.frontier == u64_frontier(6)
    assert acquired.write.frontier == u64_frontier(10)
    renewal = await client.renew([pair.read, clone, acquired.write])
    assert {c.id for c in renewal.renewed} == {pair.read.id, acquired.write.id}
    assert renewal.missing == [(cid, clone.id)]
    assert all(c.lease_expires_ms > time.time() * 1000 for c in renewal.renewed)
    gone = await client.downgrade(pair.read, CLOSED)
    assert gone.frontier == CLOSED
    with pytest.raises(PermissionDenied):
        await client.clone(pair.read)
    no_frontier = storage_pb2.DowngradeCapabilityRequest(capability=acquired.read.ref)
    with pytest.raises(InvalidArgument, match="frontier is required"):
        await call_raw(client, "DowngradeCapability", no_frontier)
    with pytest.raises(NotFound):
        await client.acquire("u888888")


async def test_lease_expiry_releases_the_hold_and_acquire_recovers(backends: Backends) -> None:
    process = start_storage(backends, extra=SHORT_LEASE)
    try:
        async with StorageClient(process.address, retry=QUICK_RETRY) as client:
            await check_lease_expiry(client)
    finally:
        process.kill()


async def check_lease_expiry(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    await client.append(pair.write, [((1, "a"), 0, 1)], 10)
    laggard = await client.clone(pair.read, holder="laggard")
    keeper = client.keep_alive([pair.read, pair.write], every=0.25)
    async with keeper:
        await client.downgrade(pair.read, 8)
        assert (await client.describe(cid)).since == u64_frontier(0)

        async def released() -> bool:
            return (await client.describe(cid)).since == u64_frontier(8)

        await eventually(released)  # the 1.5 s lease of the laggard ran out
        with pytest.raises(PermissionDenied, match="expired"):
            await client.snapshot(laggard, 8)
        assert keeper.lost == set()
    info = await client.describe(cid)
    assert {c.holder for c in info.capabilities} == {""}  # the kept ones only

    async def all_expired() -> bool:
        return not (await client.describe(cid)).capabilities

    await eventually(all_expired)
    # Lapsed leases released their holds but not the data: the since stayed where the last
    # holder had it, and the collection can be taken back and read.
    recovered = await client.acquire(cid)
    assert recovered.read.usable and recovered.read.frontier == u64_frontier(8)
    assert recovered.write.frontier == u64_frontier(10)
    await client.append(recovered.write, [((2, "b"), 12, 1)], 20)
    snapshot = await client.snapshot(recovered.read, 8)
    assert snapshot.version() == {(1, "a"): 1}


async def test_a_keeper_told_a_longer_lease_renews_on_the_one_storage_grants(
    backends: Backends,
) -> None:
    # Configured for leases of a minute (every 20 s) against storage's 1.5 s: the keeper
    # learns the length from its first renewal and renews every 0.5 s from then on.
    process = start_storage(backends, extra=SHORT_LEASE)
    try:
        async with StorageClient(process.address, retry=QUICK_RETRY) as client:
            cid = new_id()
            pair = await client.create(cid, SCHEMA)
            await client.append(pair.write, [((1, "a"), 0, 1)], 10)
            keeper = client.keep_alive([pair.read, pair.write], every=20.0)
            async with keeper:
                await asyncio.sleep(4.0)
                assert keeper.lease_ms == 1_500
                assert keeper.lost == set()
                await client.append(pair.write, [((2, "b"), 10, 1)], 20)
                assert (await client.snapshot(pair.read, 10)).version() == {
                    (1, "a"): 1,
                    (2, "b"): 1,
                }
    finally:
        process.kill()


# -- subscriptions ----------------------------------------------------------------------------


async def test_subscriber_reconnects_and_reassembles_the_exact_history(
    client: StorageClient,
) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    rng = random.Random(11)
    everything: list[tuple[Row, int, int]] = []
    appended = asyncio.Event()

    async def writer() -> None:
        write = pair.write
        for step in range(40):
            lower, upper = step * 3, step * 3 + 3
            updates = [
                (
                    (rng.randint(0, 5), rng.choice("ab")),
                    rng.randrange(lower, upper),
                    rng.choice((1, -1)),
                )
                for _ in range(rng.randint(0, 4))
            ]
            everything.extend(updates)
            await client.append(write, updates, upper)
            appended.set()
            await asyncio.sleep(0.01)

    writing = asyncio.create_task(writer())
    await appended.wait()
    reader: CdcReader[Row, int] = CdcReader(U64)
    received: list[tuple[Row, int, int]] = []
    messages = client.subscribe(pair.read, stop_at=120)
    async for message in messages:
        for updates, _ in reader.push(message):
            received.extend(updates)
        if isinstance(message, Progress) and reader.frontier.elements[0] >= 30:
            break
    await messages.aclose()  # the connection goes away mid-stream
    reached = reader.frontier.elements[0]
    # Keep only the hold still needed, and pick up where the stream left off.
    held = await client.downgrade(pair.read, reached - 1)
    async for message in client.subscribe(held, snapshot=False, as_of=reached - 1, stop_at=120):
        for updates, _ in reader.push(message):
            received.extend(updates)
    await writing
    assert reader.frontier == u64_frontier(120)
    assert consolidate(received) == consolidate(everything)
    # A second, independent subscription from the same start says the same, even mixed in.
    again: CdcReader[Row, int] = CdcReader(U64)
    mixed: list[Message[Row, int]] = []
    async for message in client.subscribe(held, stop_at=120):
        mixed.append(message)
    async for message in client.subscribe(held, stop_at=120, max_rows_per_message=2):
        mixed.append(message)
    random.Random(3).shuffle(mixed)
    found = [u for updates, _ in again.push_all(mixed) for u in updates]
    assert again.frontier == u64_frontier(120)
    for t in range(reached - 1, 120):
        assert read_updates(U64, found, t) == read_updates(U64, everything, t)


async def test_subscription_options_and_errors(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    await client.append(pair.write, [((1, "a"), 0, 1), ((2, "b"), 1, 1), ((3, "a"), 2, 1)], 3)
    events = []
    async for event in client.subscribe_arrow(
        pair.read, columns=["v"], filter=row_filter(where("k", ">", 1)), stop_at=3
    ):
        events.append(event)
    assert [e.to_pylist() for e in events[:-1]] == [  # type: ignore[union-attr]
        [{"v": "a", "time": 2, "diff": 1}, {"v": "b", "time": 1, "diff": 1}]
    ]
    assert events[-1] == Progress(u64_frontier(0), u64_frontier(3), [(1, 1), (2, 1)])
    raw = [m async for m in client.subscribe_raw(pair.read, snapshot=False, stop_at=3)]
    # Without the snapshot, the update at the starting time 0 is left out.
    assert [m.WhichOneof("kind") for m in raw] == ["updates", "progress"]
    assert [(c.time, c.count) for c in raw[1].progress.counts] == [(1, 1), (2, 1)]
    with pytest.raises(PermissionDenied):
        await anext(client.subscribe(pair.write))
    with pytest.raises(InvalidArgument, match="no column named"):
        await anext(client.subscribe(pair.read, columns=["nope"]))
    later = await client.downgrade(await client.clone(pair.read), 2)
    with pytest.raises(FailedPrecondition, match=r"as_of 1 is before .* \{2\}"):
        await anext(client.subscribe(later, as_of=1))
    with pytest.raises(InvalidArgument, match="beyond the starting time"):
        await anext(client.subscribe(later, stop_at=2))


async def test_a_parts_subscription_names_the_parts_of_every_interval(
    client: StorageClient,
) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    await client.append(pair.write, [((1, "a"), 0, 1), ((2, "b"), 1, 1)], 2)
    stream = client.subscribe_parts(pair.read, as_of=0, stop_at=4)
    first = await anext(stream)
    # Without the snapshot: the interval after as_of, in the one batch holding times 0 and 1.
    assert (first.lower, first.upper) == (1, 2)
    assert len(first.parts) == 1 and first.parts[0].rows == 2
    await client.append(pair.write, [((3, "c"), 3, 1), ((1, "a"), 3, -1)], 4, expected_upper=2)
    second = await anext(stream)
    assert (second.lower, second.upper) == (2, 4)
    assert [p.rows for p in second.parts] == [2]
    assert second.parts[0].key not in {p.key for p in first.parts}
    assert [p async for p in stream] == []  # ends at stop_at
    # The parts hold the updates, read straight from the blob store.
    async with await open_blob(second.blob_url) as blob:
        data = await blob.get_existing(second.parts[0].key)
    assert sorted(updates_from_table(from_parquet(data))) == [((1, "a"), 3, -1), ((3, "c"), 3, 1)]
    with pytest.raises(PermissionDenied):
        await anext(client.subscribe_parts(pair.write))


async def _read_window(interval: PartsInterval, lower: int, upper: int) -> list[Any]:
    """The updates of ``interval``'s parts at times in ``[lower, upper)``, from the blob
    store, as a reader of the parts keeps them."""
    found = []
    async with await open_blob(interval.blob_url) as blob:
        for part in interval.parts:
            data = await blob.get_existing(part.key)
            found += [u for u in updates_from_table(from_parquet(data)) if lower <= u[1] < upper]
    return found


async def test_a_joint_parts_subscription_moves_with_the_inputs_meet(
    client: StorageClient,
) -> None:
    left, right = await client.create(new_id(), SCHEMA), await client.create(new_id(), SCHEMA)
    await client.append(left.write, [((1, "a"), 0, 1)], 1)
    await client.append(right.write, [((2, "b"), 0, 1)], 1)
    stream = client.subscribe_parts_jointly([(left.read, 0), (right.read, 0)])
    # The left moves to 5 in two appends, the right to 3: one message, when the meet moves
    # to 3; the left's second interval [3, 5) is cut there.
    await client.append(left.write, [((3, "c"), 1, 1)], 3, expected_upper=1)
    await client.append(left.write, [((4, "d"), 4, 1), ((1, "a"), 4, -1)], 5, expected_upper=3)
    await client.append(right.write, [((5, "e"), 2, 1)], 3, expected_upper=1)
    first = await asyncio.wait_for(anext(stream), 10)
    assert (first.lower, first.upper) == (1, 3)
    left_intervals, right_intervals = first.inputs
    assert [(i.lower, i.upper) for i in left_intervals] == [(1, 3)]
    assert [(i.lower, i.upper) for i in right_intervals] == [(1, 3)]
    got_left = [u for i in left_intervals for u in await _read_window(i, i.lower, i.upper)]
    assert got_left == [((3, "c"), 1, 1)]
    assert await _read_window(right_intervals[0], 1, 3) == [((5, "e"), 2, 1)]
    # The right catches up to 6: the meet moves to 5, with the left's cut side.
    await client.append(right.write, [((6, "f"), 5, 1)], 6, expected_upper=3)
    second = await asyncio.wait_for(anext(stream), 10)
    assert (second.lower, second.upper) == (3, 5)
    assert [(i.lower, i.upper) for i in second.inputs[0]] == [(3, 5)]
    assert sorted(await _read_window(second.inputs[0][0], 3, 5)) == [
        ((1, "a"), 4, -1),
        ((4, "d"), 4, 1),
    ]
    assert [(i.lower, i.upper) for i in second.inputs[1]] == [(3, 5)]
    assert await _read_window(second.inputs[1][0], 3, 5) == []
    # A closed input counts as beyond every time: the meet is the right's upper.
    await client.append(left.write, [], CLOSED, expected_upper=5)
    third = await asyncio.wait_for(anext(stream), 10)
    assert (third.lower, third.upper) == (5, 6)
    assert [(i.lower, i.upper) for i in third.inputs[0]] == [(5, 6)]
    assert await _read_window(third.inputs[1][0], 5, 6) == [((6, "f"), 5, 1)]
    # Both closed: the last message's upper is empty, and the stream ends.
    await client.append(right.write, [], CLOSED, expected_upper=6)
    rest = [m async for m in stream]
    assert [(m.lower, m.upper) for m in rest] == [(6, None)]
    assert [[(i.lower, i.upper) for i in side] for side in rest[0].inputs] == [
        [(6, None)],
        [(6, None)],
    ]


async def test_a_joint_parts_subscription_refuses_what_one_input_would(
    client: StorageClient,
) -> None:
    pair = await client.create(new_id(), SCHEMA)
    await client.append(pair.write, [((1, "a"), 0, 1)], 2)
    with pytest.raises(InvalidArgument, match="at least one input"):
        await anext(client.subscribe_parts_jointly([]))
    with pytest.raises(PermissionDenied):
        await anext(client.subscribe_parts_jointly([(pair.read, 0), (pair.write, 0)]))
    later = await client.downgrade(await client.clone(pair.read), 2)
    with pytest.raises(FailedPrecondition, match=r"as_of 1 is before .* \{2\}"):
        await anext(client.subscribe_parts_jointly([(pair.read, 0), (later, 1)]))
    request = storage_pb2.SubscribePartsJointlyRequest(
        inputs=[
            storage_pb2.SubscribeRequest(
                capability=pair.read.ref,
                options=storage_pb2.SubscribeOptions(
                    no_snapshot=True, stop_at=frontier_to_proto(u64_frontier(4))
                ),
            )
        ]
    )
    with pytest.raises(InvalidArgument, match="no stop_at"):
        async for _ in stream_call(client.stub.SubscribePartsJointly, request):
            pass


async def _put_part(blob_url: str, collection_id: str, updates: list[Any]) -> WrittenPart:
    """A Parquet part of ``updates`` written to the blob store as a compute task writes
    one: under a key storage would make, not committed."""
    data = to_parquet(table_from_updates(SCHEMA, updates))
    key = new_part_key(collection_id, int(time.time() * 1000))
    async with await open_blob(blob_url) as blob:
        await blob.put(key, data)
    return WrittenPart(key, len(updates), len(data))


async def test_parts_commit_over_the_append_stream_or_as_calls(
    append_client: StorageClient,
) -> None:
    """``append_parts`` through either way keeps AppendParts' rules: a commit lands once (its
    retry is recognised), a refused one changes nothing, and the stream goes on after it."""
    client = append_client
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    await client.append(pair.write, [((0, "z"), 0, 1)], 1)
    blob_url = (await client.list_parts(pair.read, 0)).blob_url
    first = await _put_part(blob_url, cid, [((1, "a"), 1, 1), ((2, "b"), 2, 1)])
    landed = await client.append_parts(
        pair.write, [first], 3, times=(1, 2), token="step-1", expected_upper=1
    )
    assert landed.upper == u64_frontier(3) and not landed.already_committed
    again = await client.append_parts(
        pair.write, [first], 3, times=(1, 2), token="step-1", expected_upper=1
    )
    assert again.already_committed and again.upper == u64_frontier(3)
    second = await _put_part(blob_url, cid, [((1, "a"), 3, -1)])
    with pytest.raises(FailedPrecondition):
        await client.append_parts(pair.write, [second], 4, times=(3, 3), expected_upper=1)
    with pytest.raises(InvalidArgument, match="lies outside"):
        await client.append_parts(pair.write, [second], 4, times=(3, 5), expected_upper=3)
    assert (await client.describe(cid)).upper == u64_frontier(3)
    await client.append_parts(pair.write, [second], 4, times=(3, 3), expected_upper=3)
    assert (await client.snapshot(pair.read, 3)).version() == {(0, "z"): 1, (2, "b"): 1}


async def test_an_append_stream_message_without_an_append_is_refused(
    client: StorageClient,
) -> None:
    request = storage_pb2.AppendStreamRequest(sequence=7)

    async def requests() -> AsyncIterator[storage_pb2.AppendStreamRequest]:
        yield request

    call = client.stub.AppendStream(requests())
    answer = await asyncio.wait_for(anext(aiter(call)), 10)
    assert answer.sequence == 7 and answer.WhichOneof("result") == "error"
    assert answer.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "an append or append_parts" in answer.error.message
    call.cancel()


async def test_subscriber_is_pushed_appends_made_through_another_storage_process(
    client: StorageClient, backends: Backends
) -> None:
    other = start_storage(backends)
    try:
        async with StorageClient(other.address, retry=QUICK_RETRY) as elsewhere:
            cid = new_id()
            pair = await client.create(cid, SCHEMA)
            await client.append(pair.write, [], 1)
            stream = client.subscribe(pair.read, stop_at=4)
            assert await anext(stream) == Progress(u64_frontier(0), u64_frontier(1), [])
            for t in range(1, 4):
                await elsewhere.append(pair.write, [((t, "x"), t, 1)], t + 1)
            rest = [m async for m in stream]
    finally:
        other.kill()
    assert [m for m in rest if isinstance(m, Progress)] == [
        Progress(u64_frontier(t), u64_frontier(t + 1), [(t, 1)]) for t in range(1, 4)
    ] or sum(len(m.counts) for m in rest if isinstance(m, Progress)) == 3
    updates = [u for m in rest if isinstance(m, Updates) for u in m.updates]
    assert sorted(updates) == [((t, "x"), t, 1) for t in range(1, 4)]


async def test_subscribers_of_the_writing_and_of_another_process_get_the_same_history(
    client: StorageClient, backends: Backends
) -> None:
    # The process that appends serves its subscriber from the batches it holds in memory; the
    # other one reads them from the blob store. Both must give exactly the committed history.
    other = start_storage(backends)
    try:
        async with StorageClient(other.address, retry=QUICK_RETRY) as elsewhere:
            pair = await client.create(new_id(), SCHEMA)
            rng = random.Random(21)

            async def follow(through: StorageClient) -> list[tuple[Row, int, int]]:
                reader: CdcReader[Row, int] = CdcReader(U64)
                found: list[tuple[Row, int, int]] = []
                async for message in through.subscribe(pair.read, stop_at=30):
                    for updates, _ in reader.push(message):
                        found.extend(updates)
                assert reader.frontier == u64_frontier(30)
                return consolidate(found)

            followers = [asyncio.create_task(follow(c)) for c in (client, elsewhere)]
            everything: list[tuple[Row, int, int]] = []
            for t in range(30):
                updates = [
                    ((rng.randint(0, 4), rng.choice("ab")), t, rng.choice((1, -1)))
                    for _ in range(rng.randint(0, 3))
                ]
                everything.extend(updates)
                await client.append(pair.write, updates, t + 1)
            local, remote = await asyncio.wait_for(asyncio.gather(*followers), 30)
    finally:
        other.kill()
    assert local == remote == consolidate(everything)


# -- CDC ingestion ----------------------------------------------------------------------------


async def test_ingest_cdc_of_a_duplicated_shuffled_rebatched_history(client: StorageClient) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    rng = random.Random(5)
    history = consolidate(
        ((rng.randint(0, 9), rng.choice("abc")), rng.randrange(0, 50), rng.choice((1, -1, 2)))
        for _ in range(120)
    )
    copies: list[Message[Row, int]] = []
    for _ in range(3):
        cuts = [u64_frontier(c) for c in sorted(rng.sample(range(1, 50), 8))]
        copies.extend(
            write_history(history, u64_frontier(50), cuts=cuts, max_updates=rng.randint(2, 9))
        )
    rng.shuffle(copies)
    result = await client.ingest_cdc(pair.write, copies)
    assert result.upper == u64_frontier(50)
    assert result.updates == len(history)
    reader: CdcReader[Row, int] = CdcReader(U64)
    found = []
    async for message in client.subscribe(pair.read, stop_at=50):
        found.extend(u for updates, _ in reader.push(message) for u in updates)
    assert consolidate(found) == history
    with pytest.raises(PermissionDenied):
        await client.ingest_cdc(pair.read, copies[:1])


# -- garbage ----------------------------------------------------------------------------------


async def test_orphaned_and_retired_blobs_are_deleted(
    client: StorageClient, backends: Backends
) -> None:
    cid = new_id()
    pair = await client.create(cid, SCHEMA)
    blob = await open_blob(backends.blob_url)
    try:
        # What a crashed append leaves: a batch blob no state refers to, written a while ago.
        old_ms = int(time.time() * 1000) - 60_000
        orphan = f"shards/{cid}/{old_ms:013d}-{'0' * 32}.parquet"
        await blob.put(orphan, b"left behind")
        for t in range(8):
            await client.append(pair.write, [((t, "a"), t, 1)], t + 1)

        async def merged_and_only_referenced_left() -> bool:
            info = await client.describe(cid)
            listed = await blob.list(f"shards/{cid}/")
            # Eight single rows merge into one batch; every other blob is gone.
            return info.batch_count == 1 and listed == sorted(b.key for b in info.batches)

        async with client.keep_alive([pair.read, pair.write], every=0.5):
            await eventually(merged_and_only_referenced_left)
        info = await client.describe(cid)
        assert info.batch_count == 1
        assert orphan not in await blob.list(f"shards/{cid}/")
        assert (await client.snapshot(pair.read, 7)).version() == {(t, "a"): 1 for t in range(8)}
    finally:
        await blob.close()


async def test_health_reports_serving(storage: ServiceProcess) -> None:
    async with grpc.aio.insecure_channel(storage.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        response = await health.Check(health_pb2.HealthCheckRequest(service="tidemark.v1.Storage"))
        assert response.status == health_pb2.HealthCheckResponse.SERVING
