"""Storage benchmark: ``make bench-storage`` or ``.venv/bin/python bench/storage.py``.

Runs the storage service as its own process on each backend pair, the embedded one (a SQLite
consensus file and a blob directory) and the production one (a private etcd and an S3 endpoint,
``moto_server``), and drives it over gRPC from client processes, through ``StorageClient`` as
any writer does (appends travel as messages of one ``AppendStream`` call per client):

1. **Append throughput**: closed-loop writers, each appending batches of 1, 100 and 10,000
   rows (pre-built Arrow tables, sent as IPC) to its own collection, one append after the
   other (an append must name the upper the previous one left). Reported: updates (rows) per
   second, appends per second and the latency of one append, with 1 and 8 writers.
2. **Append-to-subscriber latency**: one writer appends small batches (10 rows) at a steady
   rate (50 per second, on a fixed grid: a stream, not saturation) while a subscriber (another
   process, its own channel) follows the collection with ``SubscribeAt``. Latency of an
   append: from just before the writer sends it until the subscriber receives the update
   message with its rows (``p50``/``p99``), and until it receives the progress statement that
   completes its time (``done``: the next message).
3. **The floor**: one blob put of the Parquet bytes of one such batch and, right after it, one
   compare-and-set of a value as large as the collection's shard state, in this process,
   through the backend classes the service uses. No append can take less: it writes the blob,
   then commits the state. Measured in the same window as (2), two ways: *paced*, one pair half
   a period after each append (so the pairs meet the same machine, disk, backend and
   background work as the appends, and the same wake-up costs of a process that idles between
   requests), and *back to back* (pairs without pause, in slices alternating with the append
   slices). ``x floor``: the latency's p50 over the paced floor's p50, the target's measure
   (within 3x); ``x b2b``: over the back-to-back floor's, a diagnostic (a hot loop, while
   the appends pay the wake-ups of processes that idle between them).
4. **Snapshot read rate**: one closed-loop client reading ``Snapshot`` of a collection of
   1,000 and of 100,000 rows (consolidated, decoded client-side).

Per backend, (2) and (3) run first, on the fresh storage process (later it would share the
process with the background compaction of everything (1) appends), then (1), then (4).
Prints a table and writes ``bench/results/storage.json``. Each cell reports the CPU (percent of
one core) of the storage process, the backend servers, the client processes and everything
else on the machine during its window, so a disturbed run shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support when run as a script

import grpc  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from bench.common import CpuMeter, Latency, LoggedService, ProcessPool, load_average  # noqa: E402
from tests.support.etcd import running_etcd  # noqa: E402
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server, unique_bucket  # noqa: E402
from tidemark.blob import open_blob  # noqa: E402
from tidemark.clients.storage import Capability, StorageClient  # noqa: E402
from tidemark.columnar import (  # noqa: E402
    ColumnType,
    RelationSchema,
    consolidate,
    to_ipc,
    to_parquet,
)
from tidemark.consensus import Committed, open_consensus  # noqa: E402
from tidemark.errors import TidemarkError  # noqa: E402

SCHEMA = RelationSchema.of(
    ("id", ColumnType.INT64), ("name", ColumnType.TEXT), ("amount", ColumnType.FLOAT64)
)
S3_ENV = {"TIDEMARK_S3_ACCESS_KEY": ACCESS_KEY, "TIDEMARK_S3_SECRET_KEY": SECRET_KEY}
BACKENDS = ("embedded", "etcd+s3")
# Not run by default: both stores in the storage process's memory, so every cost left is the
# service's own (a diagnostic: the floor there is close to nothing).
DIAGNOSTIC_BACKENDS = ("memory",)

# The targets.
TARGET_UPDATES_PER_S = 100_000.0  # at 10,000-row batches, embedded backends
TARGET_BATCH_ROWS = 10_000
TARGET_LATENCY_RATIO = 3.0  # append-to-subscriber p50 over the floor's p50

FILL_BATCH_ROWS = 10_000
SUBSCRIBER_LEAD_S = 0.5  # the subscription is open this long before the first append


# --- work for the client processes ---------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """``time.monotonic()`` values, which every process on the machine shares."""

    begin: float
    measure_from: float
    measure_to: float


class Job(Protocol):
    @property
    def address(self) -> str: ...

    async def run(self, client: StorageClient) -> object: ...


def batch_template(rows: int) -> pa.Table:
    """``rows`` distinct rows (ids ``0..rows-1``) at time 0 with diff 1."""
    ids = pa.array(range(rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"item-{i:08d}" for i in range(rows)], pa.string()),
            "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.25),
            "time": pa.repeat(pa.scalar(0, pa.uint64()), rows),
            "diff": pa.repeat(pa.scalar(1, pa.int64()), rows),
        }
    )


def batch_at(template: pa.Table, number: int, at: int) -> pa.Table:
    """The template's rows shifted to fresh ids (batch ``number``) at time ``at``."""
    rows = template.num_rows
    ids = pc.add(template.column("id"), number * rows)
    table = template.set_column(0, "id", ids)
    return table.set_column(3, "time", pa.repeat(pa.scalar(at, pa.uint64()), rows))


@dataclass
class AppendSample:
    latencies_s: list[float] = field(default_factory=list)
    rows: int = 0
    failures: int = 0


@dataclass(frozen=True)
class AppendJob:
    """Closed-loop appends of ``batch_rows``-row batches through each write capability (one
    concurrent writer each); keeps the appends that finished inside the window."""

    address: str
    capabilities: list[Capability]
    batch_rows: int
    window: Window

    async def run(self, client: StorageClient) -> AppendSample:
        sample = AppendSample()
        template = batch_template(self.batch_rows)
        await asyncio.sleep(max(0.0, self.window.begin - time.monotonic()))

        async def writer(capability: Capability) -> None:
            upper = min(capability.frontier)
            number = 0
            while (started := time.monotonic()) < self.window.measure_to:
                data = to_ipc(batch_at(template, number, upper))
                try:
                    await client.append_ipc(capability, data, upper + 1)
                except TidemarkError:
                    if started >= self.window.measure_from:
                        sample.failures += 1
                    return  # the upper is now unknown; this writer is done
                finished = time.monotonic()
                upper, number = upper + 1, number + 1
                if self.window.measure_from <= finished <= self.window.measure_to:
                    sample.latencies_s.append(finished - started)
                    sample.rows += self.batch_rows

        await asyncio.gather(*(writer(c) for c in self.capabilities))
        return sample


@dataclass(frozen=True)
class SentAppend:
    time: int
    sent: float
    acknowledged: float


@dataclass(frozen=True)
class Slices:
    """The latency cell's time line: a warm-up from ``begin``, then ``cycles`` rounds of two
    slices of ``slice_s`` seconds: appends on a grid of ``period_s`` with the paced floor
    half a period after each, then the floor back to back. Appends and floor thus meet the same
    conditions (a machine shared with other work drifts within seconds; the storage process
    compacts in the background)."""

    begin: float
    measure_from: float
    slice_s: float
    cycles: int
    period_s: float

    APPENDS = 0
    BACK_TO_BACK_FLOOR = 1

    def windows(self, phase: int) -> list[tuple[float, float]]:
        starts = (
            self.measure_from + (2 * cycle + phase) * self.slice_s for cycle in range(self.cycles)
        )
        return [(start, start + self.slice_s) for start in starts]

    @property
    def end(self) -> float:
        return self.measure_from + 2 * self.cycles * self.slice_s

    def measured(self, phase: int, at: float) -> bool:
        return any(start <= at < end for start, end in self.windows(phase))

    def next_tick(self, start: float, offset: float = 0.0) -> float:
        """The first time from now on at ``start + offset + k * period_s``: a late operation
        is followed by the next one on the grid, not by a burst."""
        ticks = math.ceil((time.monotonic() - start - offset) / self.period_s)
        return start + offset + max(0, ticks) * self.period_s


@dataclass(frozen=True)
class SteadyAppendJob:
    """Appends of ``batch_rows`` rows on the grid of ``slices.period_s``, through the warm-up
    and the append slices."""

    address: str
    capability: Capability
    batch_rows: int
    slices: Slices

    async def run(self, client: StorageClient) -> list[SentAppend]:
        template = batch_template(self.batch_rows)
        upper = min(self.capability.frontier)
        sent: list[SentAppend] = []
        windows = [(self.slices.begin, self.slices.measure_from)]
        windows += self.slices.windows(Slices.APPENDS)
        number = 0
        for start, end in windows:
            while (next_at := self.slices.next_tick(start)) < end:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                data = to_ipc(batch_at(template, number, upper))
                started = time.monotonic()
                await client.append_ipc(self.capability, data, upper + 1)
                sent.append(SentAppend(upper, started, time.monotonic()))
                upper, number = upper + 1, number + 1
        return sent


@dataclass(frozen=True)
class Interval:
    """One progress statement as the subscriber saw it."""

    upper: int
    completed: float
    """When the progress statement arrived (``time.monotonic()``)."""
    first_updates: float | None
    """When the first update message of its interval arrived (``None``: it had none)."""
    updates: int
    """Updates the statement counts."""


@dataclass(frozen=True)
class SubscribeJob:
    """Follows a collection through ``SubscribeAt`` until ``until``, noting when each message
    arrives. Messages are timed as they come off the stream, undecoded: a progress statement
    names its upper and counts, and the update messages before it belong to its interval."""

    address: str
    capability: Capability
    begin: float
    until: float

    async def run(self, client: StorageClient) -> list[Interval]:
        seen: list[Interval] = []
        first_updates: float | None = None
        await asyncio.sleep(max(0.0, self.begin - time.monotonic()))
        with suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, self.until - time.monotonic())):
                async for message in client.subscribe_raw(self.capability):
                    received = time.monotonic()
                    if message.WhichOneof("kind") != "progress":
                        first_updates = first_updates or received
                        continue
                    elements = message.progress.upper.elements
                    counted = sum(c.count for c in message.progress.counts)
                    upper = min(elements) if elements else 2**64
                    seen.append(Interval(upper, received, first_updates, counted))
                    first_updates = None
        return seen


@dataclass
class SnapshotSample:
    latencies_s: list[float] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True)
class SnapshotJob:
    """One closed-loop reader of the whole collection at its read capability's frontier."""

    address: str
    capability: Capability
    window: Window

    async def run(self, client: StorageClient) -> SnapshotSample:
        sample = SnapshotSample()
        await asyncio.sleep(max(0.0, self.window.begin - time.monotonic()))
        while (started := time.monotonic()) < self.window.measure_to:
            result = await client.snapshot(self.capability, timeout=60.0)
            finished = time.monotonic()
            if self.window.measure_from <= started and finished <= self.window.measure_to:
                sample.latencies_s.append(finished - started)
                sample.rows += result.table.num_rows
        return sample


def client_process_main(conn: multiprocessing.connection.Connection) -> None:
    """A client process: runs the jobs it receives (``None`` ends it), with one channel per
    storage address, kept across jobs."""
    with asyncio.Runner() as runner:
        clients: dict[str, StorageClient] = {}
        while (job := conn.recv()) is not None:
            if job.address not in clients:
                clients[job.address] = runner.run(_connected_client(job.address))
            try:
                conn.send(runner.run(job.run(clients[job.address])))
            except Exception as exc:  # reported to the parent, which stops the benchmark
                conn.send(RuntimeError(f"{type(job).__name__} failed: {exc!r}"))
        for client in clients.values():
            runner.run(client.close())


async def _connected_client(address: str) -> StorageClient:
    return StorageClient(address, timeout=60.0)


class ClientPool(ProcessPool):
    """Storage client processes, each running the jobs it is handed."""

    def __init__(self, size: int) -> None:
        super().__init__(client_process_main, size)


# --- the storage process and its backends -------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str
    consensus_url: str
    blob_url: str
    pids: list[int]
    env: dict[str, str]


@contextmanager
def running_backend(name: str, work_dir: Path) -> Iterator[Backend]:
    with ExitStack() as stack:
        if name == "memory":
            yield Backend(name, "memory://", "memory://", [], {})
            return
        if name == "embedded":
            yield Backend(
                name,
                f"sqlite://{work_dir / 'consensus.db'}",
                f"file://{work_dir / 'blobs'}",
                [],
                {},
            )
            return
        etcd = stack.enter_context(running_etcd(work_dir / "etcd"))
        s3 = S3Server()
        s3.start()
        stack.callback(s3.close)
        yield Backend(
            name,
            etcd.url,
            s3.url(unique_bucket("bench-storage")),
            [pid for pid in (etcd.pid, s3.pid) if pid is not None],
            S3_ENV,
        )


# --- setting up collections (from this process) -------------------------------------------


def new_collection_id() -> str:
    return f"u{uuid.uuid4().int % 10**12}"


async def create_collections(address: str, count: int) -> list[tuple[Capability, Capability]]:
    """``count`` fresh collections: their (read, write) capabilities."""
    async with StorageClient(address) as client:
        pairs = [await client.create(new_collection_id(), SCHEMA) for _ in range(count)]
    return [(pair.read, pair.write) for pair in pairs]


async def fill_collection(address: str, rows: int) -> Capability:
    """A collection of ``rows`` distinct rows, appended in batches of up to 10,000, once its
    background compaction has settled; its read capability."""
    async with StorageClient(address) as client:
        pair = await client.create(new_collection_id(), SCHEMA)
        done, upper = 0, 0
        while done < rows:
            size = min(FILL_BATCH_ROWS, rows - done)
            table = batch_at(batch_template(size), 0, upper)
            table = table.set_column(0, "id", pc.add(table.column("id"), done))
            await client.append_ipc(pair.write, to_ipc(table), upper + 1)
            done, upper = done + size, upper + 1
        batches = -1
        for _ in range(50):
            await asyncio.sleep(0.2)
            now = (await client.describe(pair.read.collection_id)).batch_count
            if now == batches:
                break
            batches = now
        return pair.read


async def state_bytes(address: str, collection_id: str) -> int:
    async with StorageClient(address) as client:
        return (await client.describe(collection_id)).state_bytes


# --- the floor ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    blob_bytes: int
    state_bytes: int
    period_ms: float
    """Time from the start of one put to the start of the next (0: back to back)."""
    total: Latency
    blob_put: Latency
    compare_and_set: Latency


class FloorSamples:
    def __init__(self) -> None:
        self.totals: list[float] = []
        self.puts: list[float] = []
        self.sets: list[float] = []

    def floor(self, blob_bytes: int, state_bytes: int, period_s: float) -> Floor:
        return Floor(
            blob_bytes,
            state_bytes,
            round(period_s * 1000, 3),
            Latency.of(self.totals),
            Latency.of(self.puts),
            Latency.of(self.sets),
        )


async def measure_floors(
    backend: Backend,
    blob: bytes,
    size_of_state: Callable[[], Awaitable[int]],
    slices: Slices,
) -> tuple[Floor, Floor]:
    """The floor paced like the appends (half a period after each) and back to back (in its
    own slices): one blob put of ``blob`` and right after it one compare-and-set of a value as
    large as the state (``size_of_state()``, asked as measuring starts), in this process,
    through the backend classes the service uses, under keys of its own."""
    consensus = open_consensus(backend.consensus_url)
    store = await open_blob(backend.blob_url)
    key = f"bench/floor/{uuid.uuid4().hex}"
    version: int | None = None

    async def pair(value: bytes, samples: FloorSamples | None) -> None:
        nonlocal version
        started = time.monotonic()
        await store.put(f"floor/{time.time_ns()}-{uuid.uuid4().hex}.parquet", blob)
        put_done = time.monotonic()
        result = await consensus.compare_and_set(key, version, value)
        finished = time.monotonic()
        if not isinstance(result, Committed):
            raise RuntimeError(f"the floor's compare-and-set lost a race it cannot: {result}")
        version = result.version
        if samples is not None:
            samples.totals.append(finished - started)
            samples.puts.append(put_done - started)
            samples.sets.append(finished - put_done)

    paced, back_to_back = FloorSamples(), FloorSamples()
    half = slices.period_s / 2
    try:
        for _ in range(10):  # warm up the connections, and the key
            await pair(b"x", None)
        await asyncio.sleep(max(0.0, slices.measure_from - time.monotonic()))
        state_size = await size_of_state()
        value = os.urandom(state_size)
        windows = [
            *((w, paced) for w in slices.windows(Slices.APPENDS)),
            *((w, back_to_back) for w in slices.windows(Slices.BACK_TO_BACK_FLOOR)),
        ]
        for (start, end), samples in sorted(windows, key=lambda w: w[0][0]):
            if samples is back_to_back:
                await asyncio.sleep(max(0.0, start - time.monotonic()))
                while time.monotonic() < end:
                    await pair(value, samples)
                continue
            while (next_at := slices.next_tick(start, half)) < end:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                await pair(value, samples)
    finally:
        await store.close()
        await consensus.close()
    return (
        paced.floor(len(blob), state_size, slices.period_s),
        back_to_back.floor(len(blob), state_size, 0.0),
    )


# --- cells --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    seconds: float
    warmup_s: float
    batch_sizes: list[int]
    writer_counts: list[int]
    latency_rows: int
    latency_rate: float
    latency_slice: float
    snapshot_rows: list[int]
    backends: list[str]
    storage_args: list[str]


@dataclass(frozen=True)
class AppendCell:
    backend: str
    batch_rows: int
    writers: int
    updates_per_s: float
    appends_per_s: float
    append: Latency
    failures: int
    cpu_percent: dict[str, float]

    @property
    def storage_us_per_update(self) -> float:
        """Storage CPU per appended row: what an update costs the service itself."""
        if not self.updates_per_s:
            return 0.0
        return round(self.cpu_percent["storage"] / 100 / self.updates_per_s * 1e6, 2)


@dataclass(frozen=True)
class LatencyCell:
    backend: str
    batch_rows: int
    appends_per_s: float
    to_updates: Latency
    """From sending an append until the subscriber received the update message with its rows."""
    to_complete: Latency
    """... until the subscriber received the progress statement completing its time."""
    append_ack: Latency
    missing: int
    """Appends (of the whole run) whose updates the subscriber did not get (should be 0)."""
    floor: Floor
    """Paced like the appends: the fair comparison (both pay the same wake-ups)."""
    floor_back_to_back: Floor
    cpu_percent: dict[str, float]

    @property
    def ratio_to_floor(self) -> float:
        """Append-to-subscriber p50 over the paced floor's p50: the target's measure."""
        return _ratio(self.to_updates, self.floor)

    @property
    def ratio_to_back_to_back_floor(self) -> float:
        return _ratio(self.to_updates, self.floor_back_to_back)


def _ratio(latency: Latency, floor: Floor) -> float:
    return round(latency.p50_ms / floor.total.p50_ms, 2) if floor.total.p50_ms else 0.0


@dataclass(frozen=True)
class SnapshotCell:
    backend: str
    rows: int
    snapshots_per_s: float
    rows_per_s: float
    snapshot: Latency
    cpu_percent: dict[str, float]


class Bench:
    """One backend's storage process, its meter and the client pool."""

    def __init__(
        self, pool: ClientPool, backend: Backend, storage: LoggedService, settings: Settings
    ) -> None:
        self.pool = pool
        self.backend = backend
        self.storage = storage
        self.settings = settings
        self.meter = CpuMeter(
            {"storage": [storage.pid], "backend": backend.pids, "clients": pool.pids}
        )

    def window(self, lead_s: float = 0.3) -> Window:
        begin = time.monotonic() + lead_s  # every process has its job by then
        measure_from = begin + self.settings.warmup_s
        return Window(begin, measure_from, measure_from + self.settings.seconds)

    def metered(self, window: Window, cpu: dict[str, float]) -> Callable[[], None]:
        def during() -> None:
            time.sleep(max(0.0, window.measure_from - time.monotonic()))
            self.meter.start()
            time.sleep(max(0.0, window.measure_to - time.monotonic()))
            cpu.update(self.meter.stop())

        return during

    def appends(self, batch_rows: int, writers: int) -> AppendCell:
        pairs = asyncio.run(create_collections(self.storage.address, writers))
        shares: list[list[Capability]] = [[] for _ in range(self.pool.size)]
        for index, (_, write) in enumerate(pairs):
            shares[index % self.pool.size].append(write)
        window = self.window()
        jobs = [
            AppendJob(self.storage.address, share, batch_rows, window) if share else None
            for share in shares
        ]
        cpu: dict[str, float] = {}
        samples: list[AppendSample] = self.pool.run(jobs, self.metered(window, cpu))
        latencies = [s for sample in samples for s in sample.latencies_s]
        rows = sum(sample.rows for sample in samples)
        return AppendCell(
            self.backend.name,
            batch_rows,
            writers,
            round(rows / self.settings.seconds, 1),
            round(len(latencies) / self.settings.seconds, 1),
            Latency.of(latencies),
            sum(sample.failures for sample in samples),
            cpu,
        )

    def latency(self) -> LatencyCell:
        ((read, write),) = asyncio.run(create_collections(self.storage.address, 1))
        begin = time.monotonic() + 0.3 + SUBSCRIBER_LEAD_S  # every process has its job by then
        slice_s = self.settings.latency_slice
        cycles = max(1, round(self.settings.seconds / slice_s))
        period_s = 1 / self.settings.latency_rate
        slices = Slices(begin, begin + self.settings.warmup_s, slice_s, cycles, period_s)
        subscriber = SubscribeJob(
            self.storage.address, read, begin - SUBSCRIBER_LEAD_S, slices.end + 2.0
        )
        rows = self.settings.latency_rows
        writer = SteadyAppendJob(self.storage.address, write, rows, slices)
        # The floor's batch: the same rows, as Parquet.
        blob = to_parquet(consolidate(batch_at(batch_template(rows), 0, 0)))
        floors: list[Floor] = []
        cpu: dict[str, float] = {}

        def during() -> None:
            async def floors_and_cpu() -> None:
                async def size_of_state() -> int:
                    self.meter.start()
                    return await state_bytes(self.storage.address, read.collection_id)

                floors.extend(await measure_floors(self.backend, blob, size_of_state, slices))
                await asyncio.sleep(max(0.0, slices.end - time.monotonic()))
                cpu.update(self.meter.stop())

            asyncio.run(floors_and_cpu())

        sent, seen = self.pool.run([writer, subscriber], during)
        measured = [a for a in sent if slices.measured(Slices.APPENDS, a.sent)]
        to_updates, to_complete = match_intervals(measured, seen)
        missing = rows * len(sent) - sum(interval.updates for interval in seen)
        paced, back_to_back = floors
        return LatencyCell(
            self.backend.name,
            rows,
            round(len(measured) / (slice_s * cycles), 1),
            Latency.of(to_updates),
            Latency.of(to_complete),
            Latency.of([a.acknowledged - a.sent for a in measured]),
            missing,
            paced,
            back_to_back,
            cpu,
        )

    def snapshots(self, rows: int) -> SnapshotCell:
        read = asyncio.run(fill_collection(self.storage.address, rows))
        window = self.window()
        cpu: dict[str, float] = {}
        (sample,) = self.pool.run(
            [SnapshotJob(self.storage.address, read, window)], self.metered(window, cpu)
        )
        assert isinstance(sample, SnapshotSample)
        return SnapshotCell(
            self.backend.name,
            rows,
            round(len(sample.latencies_s) / self.settings.seconds, 1),
            round(sample.rows / self.settings.seconds, 1),
            Latency.of(sample.latencies_s),
            cpu,
        )


def match_intervals(
    appends: Sequence[SentAppend], intervals: Sequence[Interval]
) -> tuple[list[float], list[float]]:
    """For each append that the subscriber saw: the time from its sending until its update
    message arrived, and until the progress statement whose upper passed its time did."""
    to_updates: list[float] = []
    to_complete: list[float] = []
    index = 0
    for append in sorted(appends, key=lambda a: a.time):
        # Uppers only grow along the stream, so one forward scan serves every append.
        while index < len(intervals) and intervals[index].upper <= append.time:
            index += 1
        if index == len(intervals):
            break
        interval = intervals[index]
        to_complete.append(interval.completed - append.sent)
        to_updates.append((interval.first_updates or interval.completed) - append.sent)
    return to_updates, to_complete


# --- output -------------------------------------------------------------------------------


def cpu_text(cpu: dict[str, float]) -> str:
    return "/".join(
        f"{cpu.get(name, 0):.0f}" for name in ("storage", "backend", "clients", "other")
    )


APPEND_HEADER = (
    f"{'backend':<9} {'rows/append':>11} {'writers':>7} {'updates/s':>10} {'appends/s':>9} "
    f"{'p50 ms':>8} {'p99 ms':>8} {'storage us/upd':>14}   cpu % storage/backend/clients/other"
)


def format_append(cell: AppendCell) -> str:
    failures = f"  ({cell.failures} failed)" if cell.failures else ""
    return (
        f"{cell.backend:<9} {cell.batch_rows:>11,} {cell.writers:>7} {cell.updates_per_s:>10,.0f} "
        f"{cell.appends_per_s:>9,.0f} {cell.append.p50_ms:>8.2f} {cell.append.p99_ms:>8.2f} "
        f"{cell.storage_us_per_update:>14.2f}   {cpu_text(cell.cpu_percent)}{failures}"
    )


LATENCY_HEADER = (
    f"{'backend':<9} {'rows':>4} {'appends/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'done p50':>8} "
    f"{'ack p50':>8} {'floor p50':>9} {'(put+cas)':>13} {'x floor':>8} {'b2b p50':>8} "
    f"{'x b2b':>6}   cpu % storage/backend/clients/other"
)


def format_latency(cell: LatencyCell) -> str:
    floor = cell.floor
    parts = f"{floor.blob_put.p50_ms:.2f}+{floor.compare_and_set.p50_ms:.2f}"
    missing = f"  ({cell.missing} updates never seen)" if cell.missing else ""
    return (
        f"{cell.backend:<9} {cell.batch_rows:>4} {cell.appends_per_s:>9.0f} "
        f"{cell.to_updates.p50_ms:>8.2f} {cell.to_updates.p99_ms:>8.2f} "
        f"{cell.to_complete.p50_ms:>8.2f} {cell.append_ack.p50_ms:>8.2f} "
        f"{floor.total.p50_ms:>9.2f} {parts:>13} {cell.ratio_to_floor:>7.2f}x "
        f"{cell.floor_back_to_back.total.p50_ms:>8.2f} {cell.ratio_to_back_to_back_floor:>5.2f}x"
        f"   {cpu_text(cell.cpu_percent)}{missing}"
    )


SNAPSHOT_HEADER = (
    f"{'backend':<9} {'rows':>8} {'snapshots/s':>11} {'rows/s':>11} {'p50 ms':>8} {'p99 ms':>8}"
    "   cpu % storage/backend/clients/other"
)


def format_snapshot(cell: SnapshotCell) -> str:
    return (
        f"{cell.backend:<9} {cell.rows:>8,} {cell.snapshots_per_s:>11,.1f} "
        f"{cell.rows_per_s:>11,.0f} {cell.snapshot.p50_ms:>8.2f} {cell.snapshot.p99_ms:>8.2f}"
        f"   {cpu_text(cell.cpu_percent)}"
    )


def target_results(
    appends: Sequence[AppendCell], latencies: Sequence[LatencyCell]
) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for cell in appends:
        if cell.backend == "embedded" and cell.batch_rows == TARGET_BATCH_ROWS:
            results.append(
                {
                    "what": f"appends of {TARGET_BATCH_ROWS:,} rows on embedded, "
                    f"{cell.writers} writer(s): updates/s",
                    "value": cell.updates_per_s,
                    "target": f">= {TARGET_UPDATES_PER_S:,.0f}",
                    "met": cell.updates_per_s >= TARGET_UPDATES_PER_S,
                }
            )
    for latency in latencies:
        # Against the floor measured like the appends: paced, so both pay the same wake-ups of
        # threads and processes that idle between requests. (The back-to-back floor is a hot
        # loop; its multiple is reported beside, as a diagnostic.)
        results.append(
            {
                "what": f"append-to-subscriber p50 on {latency.backend}: multiple of the "
                "floor (paced like the appends)",
                "value": latency.ratio_to_floor,
                "target": f"<= {TARGET_LATENCY_RATIO:g}",
                "met": 0 < latency.ratio_to_floor <= TARGET_LATENCY_RATIO,
            }
        )
    return results


def machine_description(load_before: float) -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "pyarrow": pa.__version__,
        "platform": platform.platform(),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(load_average(), 2),
    }


# --- main ---------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    parser.add_argument("--batch-sizes", default="1,100,10000", help="rows per append")
    parser.add_argument("--writers", default="1,8", help="concurrent writers (own collections)")
    parser.add_argument("--latency-rows", type=int, default=10, help="rows per timed append")
    parser.add_argument("--latency-rate", type=float, default=50.0, help="timed appends per second")
    parser.add_argument(
        "--latency-slice",
        type=float,
        default=0.5,
        help="seconds per slice: appends (and the paced floor), then the back-to-back floor",
    )
    parser.add_argument("--snapshot-rows", default="1000,100000", help="collection sizes read")
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only the append-to-subscriber latency and its floor (no throughput, no snapshots)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="embedded, etcd+s3; also memory (both stores inside the storage process)",
    )
    parser.add_argument(
        "--storage-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for the storage process, e.g. --storage-arg=--cache-megabytes=512",
    )
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "storage.json"
    )
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {*BACKENDS, *DIAGNOSTIC_BACKENDS}
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    settings = Settings(
        seconds=args.seconds,
        warmup_s=args.warmup,
        batch_sizes=[] if args.latency_only else _ints(args.batch_sizes),
        writer_counts=_ints(args.writers),
        latency_rows=args.latency_rows,
        latency_rate=args.latency_rate,
        latency_slice=args.latency_slice,
        snapshot_rows=[] if args.latency_only else _ints(args.snapshot_rows),
        backends=backends,
        storage_args=args.storage_arg,
    )
    return settings, args.output


def run_backend(
    pool: ClientPool, name: str, settings: Settings, work_dir: Path
) -> tuple[list[AppendCell], LatencyCell, list[SnapshotCell]]:
    with running_backend(name, work_dir / name.replace("+", "-")) as backend:
        saved = {key: os.environ.get(key) for key in backend.env}
        os.environ.update(backend.env)  # the floor opens the blob store from this process
        storage = LoggedService(
            "services.storage",
            [
                *("--consensus-url", backend.consensus_url, "--blob-url", backend.blob_url),
                *settings.storage_args,
            ],
            work_dir / f"storage-{name.replace('+', '-')}.log",
            env=backend.env,
        )
        try:
            bench = Bench(pool, backend, storage, settings)
            # Latency first, on a fresh process: afterwards it would share the process with
            # the background compaction of the millions of rows the throughput cells append.
            print(f"\n[{name}] append-to-subscriber latency\n{LATENCY_HEADER}", flush=True)
            latency = bench.latency()
            print(format_latency(latency), flush=True)
            if settings.batch_sizes:
                print(f"\n[{name}] append throughput\n{APPEND_HEADER}", flush=True)
            appends = []
            for rows in settings.batch_sizes:
                for writers in settings.writer_counts:
                    appends.append(bench.appends(rows, writers))
                    print(format_append(appends[-1]), flush=True)
            if settings.snapshot_rows:
                print(f"\n[{name}] snapshot reads\n{SNAPSHOT_HEADER}", flush=True)
            snapshots = []
            for rows in settings.snapshot_rows:
                snapshots.append(bench.snapshots(rows))
                print(format_snapshot(snapshots[-1]), flush=True)
        finally:
            storage.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return appends, latency, snapshots


def main(argv: Sequence[str] | None = None) -> None:
    settings, output = parse_settings(argv)
    load_before = load_average()
    print(
        f"Storage benchmark: {os.cpu_count()} CPUs, {settings.seconds:g} s per cell after "
        f"{settings.warmup_s:g} s warm-up; backends {', '.join(settings.backends)}",
        flush=True,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-storage-"))
    pool = ClientPool(2)
    appends: list[AppendCell] = []
    latencies: list[LatencyCell] = []
    snapshots: list[SnapshotCell] = []
    try:
        for name in settings.backends:
            backend_appends, latency, backend_snapshots = run_backend(
                pool, name, settings, work_dir
            )
            appends += backend_appends
            latencies.append(latency)
            snapshots += backend_snapshots
    finally:
        pool.close()
        shutil.rmtree(work_dir, ignore_errors=True)

    targets = target_results(appends, latencies)
    print(
        "\nappends: p50/p99 of one append, client-side (StorageClient: a message of its "
        "AppendStream call). append-to-subscriber: p50/p99 from "
        "sending an append until the subscriber has its update message; done: until it has the "
        "progress statement completing it; ack: the append's reply. floor: one blob put of the "
        "same batch, then one compare-and-set of a state of the same size, in-process, paced "
        "like the appends (b2b: back to back). Latency cpu % covers its append and b2b slices."
    )
    for result in targets:
        verdict = "met" if result["met"] else "MISSED"
        print(f"target {result['what']}: {result['value']} (target {result['target']}): {verdict}")
    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "storage",
        "machine": machine_description(load_before),
        "settings": asdict(settings),
        "appends": [
            {**asdict(cell), "storage_us_per_update": cell.storage_us_per_update}
            for cell in appends
        ],
        "append_to_subscriber": [
            {
                **asdict(cell),
                "ratio_to_floor": cell.ratio_to_floor,
                "ratio_to_back_to_back_floor": cell.ratio_to_back_to_back_floor,
            }
            for cell in latencies
        ],
        "snapshots": [asdict(cell) for cell in snapshots],
        "targets": targets,
    }
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")


if __name__ == "__main__":
    main()
