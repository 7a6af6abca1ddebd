"""The steady state with the data work on the resident tasks (``spark/step_io.py``,
``RunningDataflow._step_io``): the driver follows the inputs' parts (``SubscribeParts``),
deals them out, and commits the parts the tasks wrote; it never holds an input row.

- A join + aggregate view maintained from a real storage process (a directory, and the S3
  endpoint) through many appends: its output collection and its index equal an independent
  evaluation at every time, while the driver dealt parts and received no input row and no
  output row; the output's batches are the tasks' parts (two per step: one per task).
- A part gone from the blob store (compacted away past its grace period) fails the step
  before any state changed; the runner reads that step's rows through storage and runs it
  again, and the output stays exact.
- Without an index, a step's one part read in slices by every task and its output written
  by the tasks holds each (row, time) once, whether the root keeps rows on one task (a
  reduce) or not (a projection of one, exchanged by row first).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.compute import engines
from services.compute.dataflow.dataflow import Batches
from services.compute.dataflow.keys import shard_of
from services.compute.engines import SparkEngineDataflow
from services.compute.output import OutputWriter, read_back
from services.compute.running import RunningDataflow, RunSettings
from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark.hydration import OutputTarget
from services.compute.spark.jobs import SparkJobs
from services.compute.spark.parts_source import MISSING_PART, s3_credentials
from services.compute.spark.spark_dataflow import IoStep, OutputSink, PartWindow
from services.compute.spec import DataflowInputSpec, DataflowSpec
from services.compute.subscriptions import output_changes
from tests.support.reference_eval import canonical, evaluate
from tests.support.service_process import ServiceProcess
from tests.support.storage import (
    FAST_SETTINGS,
    Backends,
    embedded_backends,
    production_backends,
    start_storage,
)
from tidemark.blob import open_blob
from tidemark.cdc import CdcReader, Message
from tidemark.cdc.proto import from_proto as cdc_from_proto
from tidemark.clients.storage import Capability, PartsInterval, StorageClient
from tidemark.columnar import (
    Column,
    ColumnType,
    RelationSchema,
    from_ipc,
    frontier_bound,
    updates_from_table,
)
from tidemark.errors import Unavailable
from tidemark.lattice import U64
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
RowUpdate = tuple[Row, int, int]

ORDERS = RelationSchema(
    [
        Column("id", ColumnType.INT64, nullable=False),
        Column("customer", ColumnType.INT64, nullable=False),
        Column("amount", ColumnType.DECIMAL, precision=12, scale=2),
    ]
)
CUSTOMERS = RelationSchema(
    [Column("id", ColumnType.INT64, nullable=False), Column("region", ColumnType.TEXT)]
)


def _totals_plan(orders: str, customers: str) -> plan_pb2.Plan:
    """``SELECT region, count(*), sum(amount) FROM orders JOIN customers ON customer = id
    GROUP BY region``."""
    joined = pb.join(pb.get(orders, ORDERS), pb.get(customers, CUSTOMERS), [1], [0])
    root = pb.reduce(joined, [4], [pb.aggregate("count"), pb.aggregate("sum", 2)])
    return pb.plan(root, derive_schema(root))


@pytest.fixture(scope="module", params=["file", "s3"])
def backends(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backends:
    if request.param == "file":
        return embedded_backends(tmp_path_factory.mktemp("step-io"))
    return production_backends(request)


@pytest.fixture(scope="module")
def storage(backends: Backends) -> Iterator[ServiceProcess]:
    # Replaced parts stay a minute: no step here finds one gone.
    process = start_storage(backends, extra=(*FAST_SETTINGS, "--retired-blob-grace", "60"))
    yield process
    process.kill()


@pytest.fixture(scope="module")
def quick_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """Replaced parts are deleted half a second after compaction replaced them."""
    process = start_storage(embedded_backends(tmp_path_factory.mktemp("quick")))
    yield process
    process.kill()


def _rows(data: bytes) -> list[RowUpdate]:
    return updates_from_table(from_ipc(data))


class _History:
    """Every update appended to each input, to evaluate the view at any time."""

    def __init__(self) -> None:
        self.updates: dict[str, list[RowUpdate]] = {}

    def at(self, t: int) -> dict[str, dict[Row, int]]:
        contents: dict[str, dict[Row, int]] = {}
        for cid, updates in self.updates.items():
            version = contents.setdefault(cid, {})
            for row, time_, diff in updates:
                if time_ <= t:
                    version[row] = version.get(row, 0) + diff
        return contents


def _orders_batch(rng: random.Random, live: dict[int, Row], t: int) -> list[RowUpdate]:
    """Some new orders and some retractions of live ones, at ``t``."""
    batch: list[RowUpdate] = []
    for _ in range(rng.randrange(5, 40)):
        if live and rng.random() < 0.3:
            key = rng.choice(sorted(live))
            batch.append((live.pop(key), t, -1))
            continue
        key = rng.randrange(10**9)
        if key in live:
            continue
        amount = None if key % 11 == 0 else Decimal(rng.randrange(-9999, 99999)) / 100
        live[key] = (key, rng.randrange(30), amount)
        batch.append((live[key], t, 1))
    return batch


async def _run_view(
    spark: SparkSession,
    cluster: ResidentCluster,
    address: str,
    *,
    steps: int,
    wrap: Any = None,
    more: Callable[[], bool] = lambda: False,
    on_hydrated: Callable[[Capability, StorageClient], None] | None = None,
    hydrate_from_parts: bool = True,
    index_only: bool = False,
    halfway: Callable[[RunningDataflow], None] | None = None,
    plan_of: Callable[[str, str], plan_pb2.Plan] = _totals_plan,
) -> tuple[RunningDataflow, SparkEngineDataflow, _History, Capability, str, StorageClient]:
    """A view over fresh inputs, maintained by a ``RunningDataflow`` on the Spark engine
    while ``steps`` appends land (and more while ``more()``, up to 400); returns once its
    output is complete through them. ``index_only``: the view keeps its index alone (its
    output collection is created but not written). ``halfway`` hears the running view
    after half of the ``steps`` appends."""
    client = StorageClient(address, timeout=20.0)
    base = secrets.randbelow(10**12) * 10
    orders, customers, view = f"u{base}", f"u{base + 1}", f"u{base + 2}"
    plan = plan_of(orders, customers)
    schema = derive_schema(plan.root)
    history = _History()
    rng = random.Random(base)
    live: dict[int, Row] = {}
    pairs = {
        cid: await client.create(cid, s) for cid, s in ((orders, ORDERS), (customers, CUSTOMERS))
    }
    output = await client.create(view, schema)
    regions = {c: (c, None if c % 9 == 0 else f"r{c % 5}") for c in range(30)}
    history.updates[customers] = [(row, 0, 1) for row in regions.values()]
    history.updates[orders] = _orders_batch(rng, live, 0)
    for cid, pair in pairs.items():
        await client.append(pair.write, history.updates[cid], 1, expected_upper=0)
    # The test's own capabilities outlive a hydration slowed by a loaded machine.
    held = [*(pair.write for pair in pairs.values()), output.read]
    async with client.keep_alive(held, 5.0):
        as_of = 0
        writer = (
            None if index_only else OutputWriter(client, output.write, schema, f"view-{base}", 0)
        )
        dataflow = SparkDataflow(plan, as_of=as_of, cluster=cluster, index_key_columns=[0])
        engine = SparkEngineDataflow(dataflow, SparkJobs(spark))
        spec = DataflowSpec(
            f"view-{base}",
            plan,
            (DataflowInputSpec(orders), DataflowInputSpec(customers)),
            output_collection_id=None if index_only else view,
            index_key_columns=(0,),
        )
        running = RunningDataflow(
            spec,
            plan,
            schema,
            wrap(engine, client, pairs[orders]) if wrap is not None else engine,
            client,
            [pair.read for pair in pairs.values()],
            writer,
            False,
            as_of,
            RunSettings("test", renew_interval_s=2.0, hold_interval_s=0.5),
            hydrate_from_parts=hydrate_from_parts,
        )
        running.start()
        await running.wait_past(as_of, time.monotonic() + 120)
        if on_hydrated is not None:
            on_hydrated(output.read, client)
        upper = 1
        step = 0
        while step < steps or (more() and step < 400):
            step += 1
            t = upper
            if step % 4 == 3:  # customers move regions now and then
                c = rng.randrange(30)
                new = (c, f"r{rng.randrange(5)}-{t}")
                changes = [(regions[c], t, -1), (new, t, 1)]
                regions[c] = new
                history.updates[customers] += changes
                await client.append(pairs[customers].write, changes, t + 1, expected_upper=upper)
                await client.append(pairs[orders].write, [], t + 1, expected_upper=upper)
            else:
                batch = _orders_batch(rng, live, t)
                history.updates[orders] += batch
                await client.append(pairs[orders].write, batch, t + 1, expected_upper=upper)
                await client.append(pairs[customers].write, [], t + 1, expected_upper=upper)
            upper = t + 1
            if halfway is not None and step == steps // 2:
                await running.wait_past(upper - 1, time.monotonic() + 120)
                halfway(running)
            if step % 3 == 0:
                await asyncio.sleep(0.05)  # some steps take one append, others several
        await running.wait_past(upper - 1, time.monotonic() + 120)
    return running, engine, history, output.read, view, client


def _expected(plan_inputs: Mapping[str, Mapping[Row, int]], orders: str, customers: str) -> Any:
    return canonical(evaluate(_totals_plan(orders, customers), plan_inputs))


async def _check_exact(
    running: RunningDataflow, history: _History, client: StorageClient, read: Capability
) -> None:
    """The output collection and the index equal the reference at every time."""
    assert running.upper is not None
    orders, customers = (f.collection_id for f in running.followers)
    for t in range(running.as_of, running.upper):
        want = _expected(history.at(t), orders, customers)
        stored = (await client.snapshot(read, t)).version()
        assert canonical(stored) == want, f"output collection at {t}"
        assert canonical(await running.peek(t, time.monotonic() + 30)) == want, f"index at {t}"


def test_a_view_is_exact_at_every_time_with_no_row_through_the_driver(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    committed: list[PartsInterval] = []
    tasks: list[asyncio.Task[None]] = []

    def follow_output(read: Capability, client: StorageClient) -> None:
        async def collect() -> None:
            async for interval in client.subscribe_parts(read, as_of=0):
                committed.append(interval)

        tasks.append(asyncio.create_task(collect()))

    async def scenario() -> None:
        running, engine, history, read, _view, client = await _run_view(
            spark, cluster, storage.address, steps=24, on_hydrated=follow_output
        )
        collector = tasks[0]
        try:
            assert running.state == "running", running.error
            await _check_exact(running, history, client, read)
            counters = engine.io_counters
            assert counters.input_rows == 0, "the driver dealt input rows"
            assert counters.output_rows == 0, "output rows came back to the driver"
            assert counters.input_parts > 0
            # A step's big orders part is read by key partition: no order passes between
            # the tasks before the join (its key is a plain column).
            assert counters.input_parts_by_key > 0
            assert all(f.rows_received == 0 and f.fallback_rows == 0 for f in running.followers)
            assert sum(f.parts_received for f in running.followers) > 0
            # Each step's output batch is the tasks' parts, one per task with output (an
            # Append would have made one part): seen as committed, before any compaction.
            await asyncio.sleep(0.5)
            collector.cancel()
            per_batch: dict[tuple[Any, ...], int] = {}
            for interval in committed:
                for part in interval.parts:
                    span = (frontier_bound(part.lower), frontier_bound(part.upper))
                    per_batch[span] = per_batch.get(span, 0) + 1
            assert max(per_batch.values()) == 2, per_batch
        finally:
            await running.stop(release=True)
            await client.close()

    asyncio.run(scenario())


def _counts_plan(orders: str, customers: str) -> plan_pb2.Plan:
    """``SELECT count(*) FROM orders JOIN customers ON customer = id GROUP BY region``: two
    regions' groups, kept on two tasks, may make the same row."""
    joined = pb.join(pb.get(orders, ORDERS), pb.get(customers, CUSTOMERS), [1], [0])
    root = pb.project(pb.reduce(joined, [4], [pb.aggregate("count")]), 1)
    return pb.plan(root, derive_schema(root))


@pytest.mark.parametrize("plan_of", [_totals_plan, _counts_plan], ids=["reduce", "projected"])
def test_an_index_only_view_keeps_its_rows_on_the_tasks_and_replays_them_from_the_index(
    spark: SparkSession,
    cluster: ResidentCluster,
    storage: ServiceProcess,
    plan_of: Callable[[str, str], plan_pb2.Plan],
) -> None:
    """A view without an output collection: no step with nobody subscribed sends its rows
    to the driver (they stay in the tasks' index). A subscriber from the first time, which
    comes halfway (after steps whose rows the change feed never held), gets the index's
    contents then and every change since from the index's history, then the live steps:
    exactly the view's changes at every time."""
    received: list[Message[Row, int]] = []
    subscribers: list[asyncio.Task[None]] = []
    rows_before: list[int] = []

    def subscribe(running: RunningDataflow) -> None:
        rows_before.append(engine_of(running).io_counters.output_rows)

        async def collect() -> None:
            deadline = time.monotonic() + 120
            async for message in output_changes(
                running, running.storage, "test", 0, True, deadline
            ):
                received.append(cdc_from_proto(message, _rows))

        subscribers.append(asyncio.create_task(collect()))

    def engine_of(running: RunningDataflow) -> SparkEngineDataflow:
        assert isinstance(running.engine, SparkEngineDataflow)
        return running.engine

    async def scenario() -> None:
        running, _engine, history, _read, _view, client = await _run_view(
            spark,
            cluster,
            storage.address,
            steps=24,
            index_only=True,
            halfway=subscribe,
            plan_of=plan_of,
        )
        try:
            assert running.state == "running", running.error
            assert running.writer is None
            assert rows_before == [0], "a step with no subscriber sent its rows to the driver"
            orders, customers = (f.collection_id for f in running.followers)
            reader: CdcReader[Row, int] = CdcReader(U64)
            changes: list[RowUpdate] = []
            deadline = time.monotonic() + 60
            complete = False
            while not complete:
                for message in received:
                    for batch, frontier in reader.push(message):
                        changes.extend(batch)
                        complete = not frontier.less_equal(running.upper - 1)
                received.clear()
                if complete:
                    break
                assert time.monotonic() < deadline, "the subscription stalled"
                await asyncio.sleep(0.1)
            assert running.upper is not None
            for t in range(running.as_of, running.upper):
                want = canonical(evaluate(plan_of(orders, customers), history.at(t)))
                got: dict[Row, int] = {}
                for row, at, diff in changes:
                    if at <= t:
                        got[row] = got.get(row, 0) + diff
                assert canonical({r: n for r, n in got.items() if n}) == want, f"changes at {t}"
                assert canonical(await running.peek(t, time.monotonic() + 30)) == want
        finally:
            for task in subscribers:
                task.cancel()
            await running.stop(release=True)
            await client.close()

    asyncio.run(scenario())


def test_a_view_hydrated_through_the_driver_still_steps_from_parts(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    """A view too small for hydration by Spark takes its inputs' contents at ``as_of`` as
    rows; every later update reaches the tasks as parts, none as rows through the driver."""

    async def scenario() -> None:
        running, engine, history, read, _view, client = await _run_view(
            spark, cluster, storage.address, steps=12, hydrate_from_parts=False
        )
        try:
            assert running.state == "running", running.error
            assert not running.hydrates_from_parts and running.steps_from_parts
            await _check_exact(running, history, client, read)
            at_as_of = sum(
                1 for contents in history.at(running.as_of).values() for n in contents.values() if n
            )
            assert sum(f.rows_received for f in running.followers) == at_as_of
            assert all(not f.held_rows for f in running.followers)
            counters = engine.io_counters
            assert counters.input_rows == 0, "a step dealt input rows"
            assert counters.input_parts > 0
        finally:
            await running.stop(release=True)
            await client.close()

    asyncio.run(scenario())


class _GoneOnFirstHydration:
    """The engine, but its first hydration fails as one whose listed part was compacted
    away under the Spark jobs does."""

    def __init__(self, engine: SparkEngineDataflow, _client: StorageClient, _orders: Any) -> None:
        self.engine = engine
        self.listings: list[Mapping[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def hydrate_from_parts(
        self,
        listings: Mapping[str, Any],
        output: OutputTarget | None,
        on_progress: Callable[[float], None],
    ) -> Any:
        self.listings.append(listings)
        if len(self.listings) == 1:
            key = next(part.key for listing in listings.values() for part in listing.parts)
            raise Unavailable(f"Spark job failed: {MISSING_PART}: {key} (compacted away)")
        return await self.engine.hydrate_from_parts(listings, output, on_progress)


def test_a_hydration_that_finds_a_part_gone_lists_again_instead_of_failing(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    wrapped: list[_GoneOnFirstHydration] = []

    def wrap(engine: SparkEngineDataflow, client: StorageClient, orders: Any) -> Any:
        wrapped.append(_GoneOnFirstHydration(engine, client, orders))
        return wrapped[0]

    async def scenario() -> None:
        running, _engine, history, read, _view, client = await _run_view(
            spark, cluster, storage.address, steps=4, wrap=wrap
        )
        try:
            assert running.state == "running", running.error
            assert running.restarts == 0
            first, second = wrapped[0].listings
            assert first is not second, "the inputs were not listed again"
            await _check_exact(running, history, client, read)
        finally:
            await running.stop(release=True)
            await client.close()

    asyncio.run(scenario())


def test_a_part_gone_after_the_join_loaded_fails_the_dataflow_rather_than_load_it_twice(
    spark: SparkSession,
    cluster: ResidentCluster,
    storage: ServiceProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tasks load the join from the parts while the staging job runs. When the job then
    finds a part gone, listing again and hydrating once more would load the join a second
    time into the same state: the dataflow fails instead (its host restarts it from empty
    state), and no second hydration is tried."""
    staged: list[frozenset[int]] = []
    real_stage = engines.stage

    def gone_after_the_early_load(*args: Any, **kwargs: Any) -> Any:
        staged.append(kwargs["preloaded"])
        raise Unavailable(f"Spark job failed: {MISSING_PART}: some-part (compacted away)")

    monkeypatch.setattr(engines, "stage", gone_after_the_early_load)

    kept: list[SparkEngineDataflow] = []

    def keep(engine: SparkEngineDataflow, _client: StorageClient, _orders: Any) -> Any:
        kept.append(engine)
        return engine

    async def scenario() -> None:
        try:
            with pytest.raises(Unavailable, match="restarts") as failed:
                await _run_view(spark, cluster, storage.address, steps=1, wrap=keep)
        finally:
            for engine in kept:  # its state on the shared tasks
                await engine.drop()
        assert "failed" in str(failed.value)
        assert len(staged) == 1, "a second hydration was tried on the loaded state"
        assert staged[0], "the join was not loaded while the staging job ran"

    asyncio.run(scenario())
    assert engines.stage is not real_stage


class _CompactingFirst:
    """The engine, but before its first step from parts, the first part that step names is
    compacted away and its blob deleted (appends that trigger storage's merges, then the
    retired-blob grace period): the tasks find it gone."""

    def __init__(self, engine: SparkEngineDataflow, client: StorageClient, orders: Any) -> None:
        self.engine = engine
        self.client = client
        self.orders = orders
        self.gone: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def step_io(
        self,
        batches: Batches,
        parts: Mapping[str, Sequence[PartWindow]],
        input_upper: int,
        *,
        blob_url: str,
        sink: OutputSink | None,
        return_rows: bool,
    ) -> IoStep:
        windows = [w for listed in parts.values() for w in listed]
        if not self.gone and windows and not batches:
            await self._compact_away(blob_url, windows[0].key)
        return await self.engine.step_io(
            batches, parts, input_upper, blob_url=blob_url, sink=sink, return_rows=return_rows
        )

    async def _compact_away(self, blob_url: str, key: str) -> None:
        """Waits (the test keeps appending, so storage keeps merging) until ``key`` is gone."""
        async with await open_blob(blob_url) as blob:
            deadline = time.monotonic() + 90
            while await blob.get(key) is not None:
                assert time.monotonic() < deadline, "storage never compacted the part away"
                await asyncio.sleep(0.1)
        self.gone.append(key)


def test_a_part_gone_from_the_blob_store_runs_the_step_from_rows(
    spark: SparkSession, cluster: ResidentCluster, quick_storage: ServiceProcess
) -> None:
    async def scenario() -> None:
        wrapped: list[_CompactingFirst] = []

        def wrap(engine: SparkEngineDataflow, client: StorageClient, orders: Any) -> Any:
            wrapped.append(_CompactingFirst(engine, client, orders))
            return wrapped[0]

        running, engine, history, read, _view, client = await _run_view(
            spark,
            cluster,
            quick_storage.address,
            steps=8,
            wrap=wrap,
            more=lambda: not wrapped or not wrapped[0].gone,
        )
        try:
            assert running.state == "running", running.error
            assert wrapped[0].gone, "no step from parts ran"
            # That step's rows were read through storage, once.
            assert sum(f.fallback_rows for f in running.followers) > 0
            assert engine.io_counters.input_rows > 0
            await _check_exact(running, history, client, read)
        finally:
            await running.stop(release=True)
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("make_plan", [_totals_plan, _counts_plan], ids=["reduce", "projected"])
def test_each_step_writes_every_output_row_once_without_an_index(
    spark: SparkSession,
    cluster: ResidentCluster,
    storage: ServiceProcess,
    make_plan: Callable[[str, str], plan_pb2.Plan],
) -> None:
    """Steps of one part each, dealt to every task in slices, written by the tasks without
    an index: a reduce's output stays on the task that made it, any other root's is
    exchanged by row first. Either way the step's parts hold each (row, time) once, and the
    output collection equals an independent evaluation at every time."""

    async def scenario() -> None:
        client = StorageClient(storage.address, timeout=20.0)
        base = secrets.randbelow(10**12) * 10
        orders, customers, view = f"u{base}", f"u{base + 1}", f"u{base + 2}"
        plan = make_plan(orders, customers)
        schema = derive_schema(plan.root)
        rng = random.Random(base)
        history = _History()
        live: dict[int, Row] = {}
        pairs = {
            cid: await client.create(cid, s)
            for cid, s in ((orders, ORDERS), (customers, CUSTOMERS))
        }
        output = await client.create(view, schema)
        # Regions whose groups live on every task (by the key hash the exchange uses).
        names = [f"r{i}" for i in range(100)]
        regions = [
            name
            for shard in range(cluster.shards)
            for name in [n for n in names if shard_of((n,), cluster.shards) == shard][:3]
        ]
        history.updates[customers] = [
            ((c, regions[c % len(regions)]), 0, 1) for c in range(len(regions))
        ]

        def alike(t: int) -> list[RowUpdate]:
            """An order more in every region, and every third time one fewer too: the
            regions' counts stay equal, so the projected rows of every region change
            alike, on every task."""
            batch: list[RowUpdate] = []
            width = len(regions)
            for region in range(width):
                key = t * width + region
                live[key] = (key, region, Decimal(rng.randrange(999)))
                batch.append((live[key], t, 1))
                if t % 3 == 2:
                    batch.append((live.pop(key - width), t, -1))
            return batch

        history.updates[orders] = alike(0)
        for cid, pair in pairs.items():
            await client.append(pair.write, history.updates[cid], 1, expected_upper=0)
        writer = OutputWriter(client, output.write, schema, f"view-{base}", 0)
        dataflow = SparkDataflow(plan, as_of=0, cluster=cluster)
        try:
            hydrated, upper = dataflow.hydrate(
                {cid: [(row, 0, diff) for row, diff in history.at(0)[cid].items()] for cid in pairs}
            )
            await writer.write(hydrated, upper)
            listing = await client.list_parts(pairs[orders].read, 0)
            sink = OutputSink(view, listing.blob_url, schema)
            twice = 0
            for t in range(1, 13):
                batch = alike(t)
                history.updates[orders] += batch
                await client.append(pairs[orders].write, batch, t + 1, expected_upper=t)
                await client.append(pairs[customers].write, [], t + 1, expected_upper=t)
                windows = [
                    PartWindow(part.key, interval.lower, interval.upper or t + 1, part.bytes)
                    async for interval in client.subscribe_parts(
                        pairs[orders].read, as_of=t - 1, stop_at=t + 1
                    )
                    for part in interval.parts
                ]
                assert len(windows) == 1
                done = await asyncio.to_thread(
                    dataflow.step_io,
                    {},
                    {orders: windows},
                    t + 1,
                    blob_url=listing.blob_url,
                    environment=s3_credentials(),
                    sink=sink,
                    return_rows=False,
                )
                written = await read_back(listing.blob_url, done.parts)
                seen = [(row, time_) for row, time_, _ in written]
                assert len(seen) == len(set(seen)), f"a row written twice at step {t}"
                await writer.write_parts(
                    done.parts, (done.least or 0, done.greatest or 0), done.upper
                )
                want = canonical(evaluate(plan, history.at(t)))
                twice += sum(1 for n in want.values() if n > 1)
                stored = (await client.snapshot(output.read, t)).version()
                assert canonical(stored) == want, f"output collection at {t}"
            assert dataflow.io_counters.input_parts == 12
            if make_plan is _counts_plan:
                assert twice, "no two groups ever made the same row: nothing was exchanged"
        finally:
            dataflow.drop()
            await client.close()

    asyncio.run(scenario())
