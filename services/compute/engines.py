"""Where a maintained dataflow's operator state lives: resident Spark tasks (production), or
this process (``--engine local``: no JVM, for tools and tests that are not about Spark).

Both give a :class:`EngineDataflow` with the ``Dataflow`` contract (``hydrate`` once, then
``step``) plus ``peek`` at past times when the dataflow keeps an index. Every call runs in a
worker thread, so a long step never stalls the event loop; the calls of one dataflow are
made one at a time by its runner (peeks may overlap with steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pyspark.sql import SparkSession

from services.compute.dataflow import Dataflow, Index, Row, Update
from services.compute.dataflow.dataflow import Batches
from services.compute.dataflow.guard import Guard
from services.compute.dataflow.index import with_index
from services.compute.dataflow.spill import TaskStateBudget
from services.compute.dataflow.work import StateSize
from services.compute.spark import ResidentCluster, SparkDataflow, spark_session
from services.compute.spark import requests as rq
from services.compute.spark.hydration import OutputTarget, Staged, early_loads, stage
from services.compute.spark.jobs import SparkJobs
from services.compute.spark.liveness import ClusterStart
from services.compute.spark.parts_source import Relisting, missing_part, s3_credentials
from services.compute.spark.queries import SparkQueries, translated_job_error
from services.compute.spark.spark_dataflow import IoCounters, IoStep, OutputSink, PartWindow
from services.compute.spark.staging import delete_prefix, run_prefix
from tidemark.clients.storage import PartsListing, WrittenPart
from tidemark.errors import FailedPrecondition, Internal, Unavailable
from tidemark.logging import get_logger
from tidemark.rpc.tls import TlsSettings
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import plan_pb2

log = get_logger("compute.engines")

SESSION_ATTEMPTS = 3
PROGRESS_INTERVAL_S = 1.0
"""How often a hydration by Spark reports how far its jobs have come."""

T = TypeVar("T")

PartsLister = Callable[[int], Coroutine[object, object, Mapping[str, PartsListing]]]
"""The inputs' parts at a time, by collection (listed under the dataflow's read holds)."""


@dataclass(frozen=True)
class BulkHydrated:
    """A hydration from storage's parts: the output's upper (``as_of + 1``), the output parts
    written for the caller to commit, the output's rows at ``as_of`` (with multiplicity) and
    the input updates loaded into the operators' state."""

    upper: int
    output_parts: list[WrittenPart]
    output_rows: int
    loaded: int


class EngineDataflow(Protocol):
    @property
    def failure(self) -> str | None:
        """Why the engine can no longer run this dataflow (a lost Spark task), if so."""
        ...

    @property
    def hydrates_from_parts(self) -> bool:
        """Whether :meth:`hydrate_from_parts` works (the bulk path)."""
        ...

    @property
    def shard_restores(self) -> int:
        """Shards of this dataflow rebuilt on a task that replaced a lost one."""
        ...

    @property
    def index_floor(self) -> int:
        """The earliest time the index answers for as far as the engine goes (a rebuilt
        shard's index starts where its state was rebuilt)."""
        ...

    def list_parts_with(self, lister: PartsLister) -> None:
        """How to list the inputs' parts at a time, for rebuilding a lost shard (the bulk
        path); without it a lost shard fails the dataflow."""
        ...

    async def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]: ...

    async def hydrate_from_parts(
        self,
        listings: Mapping[str, PartsListing],
        output: OutputTarget | None,
        on_progress: Callable[[float], None],
    ) -> BulkHydrated:
        """Hydrates at ``as_of`` from the inputs' parts listed at ``as_of``, with the output
        at ``as_of`` written as parts to ``output`` (not committed); ``on_progress`` hears
        the fraction of the work done now and then."""
        ...

    async def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]: ...

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
        """A step whose tasks read the inputs' ``parts`` and write the output's parts to
        ``sink`` themselves (``SparkDataflow.step_io``); only where
        ``hydrates_from_parts``."""
        ...

    async def peek(self, time: int) -> dict[Row, int]:
        """The output at ``time`` from the index (``FailedPrecondition`` without one)."""
        ...

    async def index_changes(self, lower: int, upper: int) -> list[Update]:
        """The output's changes at times in ``[lower, upper)`` from the index's history
        (``FailedPrecondition`` without an index, or once compacted past ``lower - 1``)."""
        ...

    async def compact_index(self, since: int) -> None:
        """Refuses index peeks before ``since`` from now on and folds the index's history up
        to it into its base (``FailedPrecondition`` without an index)."""
        ...

    async def state_size(self) -> StateSize:
        """Keys, entries and estimated bytes of the operator state, over all shards."""
        ...

    async def drop(self) -> None: ...


class Engine(Protocol):
    name: str
    runs_spark_jobs: bool
    """Whether :meth:`queries` gives Spark jobs (asking needs no running session)."""

    async def build(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan,
        as_of: int,
        index_key_columns: Sequence[int] | None,
    ) -> EngineDataflow:
        """Lowers ``plan`` and sets up its (empty) state; raises ``InvalidArgument`` for a
        plan the engine refuses and ``Unavailable`` when the runtime is down."""
        ...

    def describe(self) -> tuple[str, str]:
        """``(master, application id)`` for Status (empty when not applicable)."""
        ...

    async def queries(self) -> SparkQueries | None:
        """What runs one-shot queries as Spark jobs (``None``: this engine has no Spark)."""
        ...

    async def close(self) -> None: ...


# -- in-process -------------------------------------------------------------------------------


class LocalDataflow:
    """A dataflow whose state lives in this process. Its guard holds it to its memory budget
    (over it, hydration or a step fails with ``ResourceExhausted`` and the dataflow reports
    failed; others go on) and stops a hydration or step whose runner was stopped (a drop)."""

    def __init__(
        self,
        plan: plan_pb2.Plan,
        as_of: int,
        index_key_columns: Sequence[int] | None,
        guard: Guard | None = None,
    ) -> None:
        self.guard = guard or Guard()
        self._dataflow = Dataflow(plan, as_of=as_of, guard=self.guard)
        self._index = None if index_key_columns is None else Index(index_key_columns, since=as_of)
        # Peeks read the index from other threads while a step may be adding to it.
        self._lock = threading.Lock()

    @property
    def failure(self) -> str | None:
        return None

    @property
    def hydrates_from_parts(self) -> bool:
        return False

    @property
    def shard_restores(self) -> int:
        return 0

    @property
    def index_floor(self) -> int:
        return 0

    def list_parts_with(self, lister: PartsLister) -> None:
        return None  # one process: nothing to rebuild a shard of

    async def hydrate_from_parts(
        self,
        listings: Mapping[str, PartsListing],
        output: OutputTarget | None,
        on_progress: Callable[[float], None],
    ) -> BulkHydrated:
        raise FailedPrecondition("the in-process engine hydrates from snapshots")

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
        raise FailedPrecondition("the in-process engine steps on rows")

    def _apply(self, output: list[Update], upper: int) -> None:
        if self._index is not None:
            self._index.apply(output, upper)

    def _hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        with self._lock:
            output, upper = self._dataflow.hydrate(snapshots)
            self._apply(output, upper)
            return output, upper

    def _step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        with self._lock:
            output, upper = self._dataflow.step(batches, input_upper)
            self._apply(output, upper)
            return output, upper

    def _peek(self, time: int) -> dict[Row, int]:
        if self._index is None:
            raise FailedPrecondition("the dataflow keeps no index")
        with self._lock:
            return self._index.contents_at(time)

    def _compact_index(self, since: int) -> None:
        if self._index is None:
            raise FailedPrecondition("the dataflow keeps no index")
        with self._lock:
            self._index.compact(since)

    def _index_changes(self, lower: int, upper: int) -> list[Update]:
        if self._index is None:
            raise FailedPrecondition("the dataflow keeps no index")
        with self._lock:
            return self._index.changes_between(lower, upper)

    async def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        return await self._guarded(asyncio.to_thread(self._hydrate, snapshots))

    async def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        return await self._guarded(asyncio.to_thread(self._step, batches, input_upper))

    async def _guarded(
        self, work: Coroutine[object, object, tuple[list[Update], int]]
    ) -> tuple[list[Update], int]:
        try:
            return await work
        except asyncio.CancelledError:
            # The runner stopped (a drop, a shutdown): the thread stops at its next check.
            # The state is half-updated from then on; nothing uses this dataflow again.
            self.guard.cancel("the dataflow was stopped")
            raise

    async def peek(self, time: int) -> dict[Row, int]:
        return await asyncio.to_thread(self._peek, time)

    async def index_changes(self, lower: int, upper: int) -> list[Update]:
        return await asyncio.to_thread(self._index_changes, lower, upper)

    async def compact_index(self, since: int) -> None:
        await asyncio.to_thread(self._compact_index, since)

    async def state_size(self) -> StateSize:
        return with_index(self._dataflow.state_size(), self._index)

    async def drop(self) -> None:
        self.guard.cancel("the dataflow was dropped")


class LocalEngine:
    """``budget_bytes``: each dataflow's memory budget (0: none)."""

    name = "local"
    runs_spark_jobs = False

    def __init__(self, budget_bytes: int = 0) -> None:
        self.budget_bytes = budget_bytes

    async def build(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan,
        as_of: int,
        index_key_columns: Sequence[int] | None,
    ) -> EngineDataflow:
        return LocalDataflow(
            plan, as_of, index_key_columns, Guard(self.budget_bytes, f"dataflow {dataflow_id}")
        )

    def describe(self) -> tuple[str, str]:
        return "", ""

    async def queries(self) -> SparkQueries | None:
        return None

    async def close(self) -> None:
        return None


# -- Spark ------------------------------------------------------------------------------------


class SparkEngineDataflow:
    """A dataflow held by resident Spark tasks. Its guard holds the batches the driver
    passes between nodes to the dataflow's memory budget, and stops the driver's walk of a
    hydration or step whose runner was stopped."""

    def __init__(self, dataflow: SparkDataflow, jobs: SparkJobs) -> None:
        self._dataflow = dataflow
        self._jobs = jobs
        self._lister: PartsLister | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def failure(self) -> str | None:
        # A dataflow whose shard could not be rebuilt on a new task fails alone.
        cluster = self._dataflow.cluster
        return cluster.failure or cluster.broken(self._dataflow.dataflow_id)

    @property
    def hydrates_from_parts(self) -> bool:
        return True

    @property
    def shard_restores(self) -> int:
        return self._dataflow.shard_restores

    @property
    def index_floor(self) -> int:
        return self._dataflow.index_floor

    def list_parts_with(self, lister: PartsLister) -> None:
        self._lister = lister
        self._loop = asyncio.get_running_loop()
        self._dataflow.rebuild = self._rebuild_shard

    def _rebuild_shard(self, shard: int, as_of: int, ask: Callable[[rq.Request], object]) -> None:
        """Rebuilds shard ``shard`` as of ``as_of`` on the task ``ask`` talks to, by the bulk
        path: the inputs' parts at ``as_of``, one Spark job staging that shard's rows alone,
        and a ``Hydrate`` of the task. Nothing is written to the output. Runs in the thread
        that replaces the task (the event loop is free; the listing runs there)."""
        lister, loop, dataflow = self._lister, self._loop, self._dataflow
        assert lister is not None and loop is not None
        relisting = Relisting(log, "shard_rebuild_listed_again", dataflow=dataflow.dataflow_id)
        while True:
            # Listed again after a part was compacted away under the job or the task's own
            # read of it (as queries do). The task reads every input before it loads any, so
            # a load that failed so left its state empty.
            listings = asyncio.run_coroutine_threadsafe(lister(as_of), loop).result()
            try:
                staged, staging_url, prefix = self._stage_shard(listings, shard, as_of)
                try:
                    ask(staged.loads[shard])
                finally:
                    self._delete_staged(staging_url, prefix)
                break
            except Exception as exc:
                wait = relisting.wait_before_next(exc)
                if wait is None:
                    raise translated_job_error(exc) from exc
                time.sleep(wait)

    def _stage_shard(
        self, listings: Mapping[str, PartsListing], shard: int, time: int
    ) -> tuple[Staged, str, str]:
        dataflow = self._dataflow
        urls = [listing.blob_url for listing in listings.values()]
        if not urls:
            raise FailedPrecondition("a dataflow that reads no collection has no parts to rebuild")
        staging_url = urls[0]
        prefix = run_prefix(dataflow.dataflow_id)
        try:
            staged = stage(
                self._jobs.spark,
                dataflow.plan,
                dataflow.graph,
                dataflow_id=dataflow.dataflow_id,
                as_of=time,
                shards=dataflow.shards,
                index_key_columns=dataflow.index_key_columns,
                listings=listings,
                staging_url=staging_url,
                prefix=prefix,
                output=None,
                count_output=False,
                only_shard=shard,
            )
        except BaseException:
            self._delete_staged(staging_url, prefix)
            raise
        return staged, staging_url, prefix

    @staticmethod
    def _delete_staged(staging_url: str, prefix: str) -> None:
        try:
            # A loop of this thread's own: the blob store needs no other.
            asyncio.run(delete_prefix(staging_url, prefix))
        except Exception as exc:  # left for a later sweep of the staging prefix
            log.warning("hydration_staging_cleanup_failed", prefix=prefix, error=str(exc))

    async def hydrate_from_parts(
        self,
        listings: Mapping[str, PartsListing],
        output: OutputTarget | None,
        on_progress: Callable[[float], None],
    ) -> BulkHydrated:
        dataflow = self._dataflow
        urls = [listing.blob_url for listing in listings.values()]
        if output is not None:
            urls.append(output.blob_url)
        if not urls:
            raise FailedPrecondition("a dataflow that reads no collection hydrates in-process")
        staging_url = urls[0]
        prefix = run_prefix(dataflow.dataflow_id)
        group = self._jobs.new_group()
        # The nodes the tasks read from the parts alone (a join of stored collections) load
        # while Spark's jobs run: the tasks' reading and the jobs overlap.
        early, preloaded = early_loads(
            dataflow.graph,
            listings,
            dataflow_id=dataflow.dataflow_id,
            as_of=dataflow.as_of,
            shards=dataflow.shards,
        )
        action = functools.partial(
            stage,
            self._jobs.spark,
            dataflow.plan,
            dataflow.graph,
            dataflow_id=dataflow.dataflow_id,
            as_of=dataflow.as_of,
            shards=dataflow.shards,
            index_key_columns=dataflow.index_key_columns,
            listings=listings,
            staging_url=staging_url,
            prefix=prefix,
            output=output,
            count_output=False,
            preloaded=preloaded,
        )

        # The Spark jobs read every input about twice (the operators' inputs, then the
        # output), and the tasks' loads come after them: rows read over twice the inputs'
        # rows, held below 1 until the loads are done.
        rows_total = 2 * sum(part.rows for listing in listings.values() for part in listing.parts)

        async def watch() -> None:
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL_S)
                progress = self._jobs.progress(group)
                if progress is not None:
                    on_progress(min(0.95, progress.read_fraction(rows_total)))

        watcher = asyncio.create_task(watch())
        preloading: asyncio.Future[tuple[int, int]] | None = None
        if early:
            preloading = asyncio.ensure_future(asyncio.to_thread(dataflow.load_staged, early))

            def stop_jobs(done: asyncio.Future[tuple[int, int]]) -> None:
                """A failed load makes the jobs pointless: they stop rather than run on."""
                if not done.cancelled() and done.exception() is not None:
                    self._jobs.cancel(group)

            preloading.add_done_callback(stop_jobs)
        try:
            try:
                staged = await self._guarded_any(
                    self._jobs.run(action, f"hydrate {dataflow.dataflow_id}", group=group)
                )
            except BaseException as failure:
                # The load is waited for all the same, never left running into the next
                # attempt or a restart. A load that failed first stopped the jobs: its
                # error is the cause.
                if preloading is not None:
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(preloading)
                    cause = _failure_of(preloading)
                    if cause is not None and not isinstance(failure, asyncio.CancelledError):
                        raise cause from failure
                raise
            early_done = await asyncio.shield(preloading) if preloading is not None else None
            started = time.perf_counter()
            loaded, index_rows = await self._guarded_any(
                asyncio.to_thread(dataflow.load_staged, staged.loads)
            )
            if early_done is not None:
                loaded += early_done[0]
            log.info(
                "hydration_loaded",
                dataflow=dataflow.dataflow_id,
                rows=loaded,
                seconds=round(time.perf_counter() - started, 3),
            )
        except Exception as exc:
            if preloading is not None and missing_part(exc):
                # The tasks hold the early load's state already: listing again and loading
                # once more would count it twice. The dataflow restarts from empty state.
                raise Internal(
                    f"dataflow {dataflow.dataflow_id!r}: an input's part was compacted away "
                    "while it hydrated; the dataflow restarts"
                ) from exc
            raise translated_job_error(exc) from exc
        finally:
            await cancel_and_wait(watcher)
            try:
                await delete_prefix(staging_url, prefix)
            except Exception as exc:  # left for a later sweep of the staging prefix
                log.warning("hydration_staging_cleanup_failed", prefix=prefix, error=str(exc))
        on_progress(1.0)
        rows = staged.output_rows if staged.output_rows is not None else index_rows
        return BulkHydrated(dataflow.as_of + 1, staged.output_parts, rows, loaded)

    async def _guarded_any(self, work: Coroutine[object, object, T]) -> T:
        try:
            return await work
        except asyncio.CancelledError:
            self._dataflow.guard.cancel("the dataflow was stopped")
            raise

    async def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        return await self._guarded(self._dataflow.ahydrate(snapshots))

    async def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        return await self._guarded(self._dataflow.astep(batches, input_upper))

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
        work = self._dataflow.astep_io(
            batches,
            parts,
            input_upper,
            blob_url=blob_url,
            environment=s3_credentials(),
            sink=sink,
            return_rows=return_rows,
        )
        return await self._guarded_any(work)

    @property
    def io_counters(self) -> IoCounters:
        return self._dataflow.io_counters

    async def _guarded(
        self, work: Coroutine[object, object, tuple[list[Update], int]]
    ) -> tuple[list[Update], int]:
        try:
            return await work
        except asyncio.CancelledError:
            self._dataflow.guard.cancel("the dataflow was stopped")
            raise

    async def peek(self, time: int) -> dict[Row, int]:
        return await asyncio.to_thread(self._dataflow.peek, time)

    async def index_changes(self, lower: int, upper: int) -> list[Update]:
        return await asyncio.to_thread(self._dataflow.index_changes, lower, upper)

    async def compact_index(self, since: int) -> None:
        await asyncio.to_thread(self._dataflow.compact_index, since)

    async def state_size(self) -> StateSize:
        dataflow = self._dataflow
        if dataflow.cluster.rebuilding(dataflow.dataflow_id):
            # Its requests wait until its shard is rebuilt on a new task: Status, which
            # gives up after a few seconds, must not leave a thread waiting that long.
            raise Unavailable(f"dataflow {dataflow.dataflow_id!r} is being rebuilt")
        return await asyncio.to_thread(dataflow.state_size)

    async def drop(self) -> None:
        self._dataflow.guard.cancel("the dataflow was dropped")
        if self._dataflow.cluster.failure is None:
            await asyncio.to_thread(self._dataflow.drop)


def _failure_of(future: asyncio.Future[T]) -> BaseException | None:
    """What ``future`` raised, if it is done and raised."""
    if not future.done() or future.cancelled():
        return None
    return future.exception()


class SparkEngine:
    """One SparkSession per process and one ``ResidentCluster`` shared by its dataflows.

    The session starts in the background when the process starts (it takes seconds, and the
    process should answer Status meanwhile); the first install waits for it. A cluster that
    lost a task stays failed for the dataflows on it, and the next install starts a new one
    (the host restarts failed dataflows, so the first of those restarts does).
    """

    name = "spark"
    runs_spark_jobs = True

    def __init__(
        self,
        master: str,
        shards: int,
        settings: dict[str, str],
        *,
        app_name: str = "tidemark-compute",
        budget_bytes: int = 0,
        tls: TlsSettings | None = None,
        state_budget: TaskStateBudget | None = None,
        start: ClusterStart | None = None,
    ) -> None:
        """``budget_bytes``: each dataflow's memory budget for what its driver holds
        (0: none). ``tls``: the compute's mTLS files, for the resident tasks' sockets too.
        ``state_budget``: what each resident task may hold of operator state in memory and
        spilled to its local disk (None: no bound). ``start``: how resident clusters start
        and how their tasks are watched (the defaults when None)."""
        self.start_settings = start or ClusterStart()
        self.state_budget = state_budget
        self.budget_bytes = budget_bytes
        self.tls = tls
        self.master = master
        self.app_name = app_name
        self.shards = shards
        self._settings = settings
        self._session: SparkSession | None = None
        self._starting: asyncio.Task[SparkSession] | None = None
        self._cluster: ResidentCluster | None = None
        self._cluster_lock = asyncio.Lock()
        self._warming: asyncio.Task[None] | None = None
        self._queries: SparkQueries | None = None
        self._hydrations: SparkJobs | None = None

    def start(self) -> None:
        """Begins starting the session and the resident cluster (idempotent), so the first
        install does not wait for them."""
        if self._starting is None:
            self._starting = asyncio.create_task(asyncio.to_thread(self._make_session))
            self._warming = asyncio.create_task(self._warm())

    async def _warm(self) -> None:
        try:
            await self.cluster()
        except Exception as exc:  # the next install tries again and reports it
            log.warning("resident_cluster_start_failed", error=str(exc))

    def _make_session(self) -> SparkSession:
        # The JVM now and then fails to launch on a loaded machine (the gateway exits before
        # reporting its port); it starts on a second try.
        for attempt in range(1, SESSION_ATTEMPTS + 1):
            try:
                session = spark_session(
                    self.master,
                    # The resident tasks, plus room for bulk jobs beside them.
                    min_slots=self.shards + 4,
                    app_name=self.app_name,
                    settings=self._settings,
                )
                break
            except Exception as exc:
                if attempt == SESSION_ATTEMPTS:
                    raise
                log.warning("spark_session_retry", attempt=attempt, error=str(exc))
                time.sleep(2.0 * attempt)
        log.info(
            "spark_session_started",
            master=session.sparkContext.master,
            application_id=session.sparkContext.applicationId,
        )
        return session

    async def session(self) -> SparkSession:
        self.start()
        starting = self._starting
        assert starting is not None
        try:
            self._session = await asyncio.shield(starting)
        except Exception as exc:
            # The JVM may fail to launch on a loaded machine: the next caller starts it again,
            # rather than the process staying without Spark for good.
            if self._starting is starting:
                self._starting = None
            raise Unavailable(f"the Spark session could not start: {exc}") from exc
        return self._session

    async def cluster(self) -> ResidentCluster:
        """The running resident cluster, started (again) if there is none or it failed."""
        async with self._cluster_lock:
            current = self._cluster
            if current is not None and current.failure is None:
                return current
            session = await self.session()
            if current is not None:
                log.warning("resident_cluster_replaced", failure=current.failure)
                await current.astop()
            # A lost task is replaced and its shards rebuilt; the cluster only fails (and
            # its dataflows restart on a new one) when that cannot be done.
            start = self.start_settings
            fresh = ResidentCluster(
                session,
                self.shards,
                tls=self.tls,
                state_budget=self.state_budget,
                connect_timeout=start.connect_timeout_s,
                start_attempts=start.attempts,
                liveness=start.liveness,
                replace_lost=True,
            )
            try:
                await fresh.astart()
            except Exception:
                self._cluster = None
                raise
            self._cluster = fresh
            log.info("resident_cluster_started", shards=self.shards, task_pids=fresh.task_pids)
            return fresh

    async def build(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan,
        as_of: int,
        index_key_columns: Sequence[int] | None,
    ) -> EngineDataflow:
        cluster = await self.cluster()

        def make() -> SparkDataflow:
            return SparkDataflow(
                plan,
                as_of=as_of,
                cluster=cluster,
                dataflow_id=dataflow_id,
                index_key_columns=index_key_columns,
                guard=Guard(self.budget_bytes, f"dataflow {dataflow_id}"),
            )

        if self._hydrations is None:
            self._hydrations = SparkJobs(await self.session(), prefix="hydration")
        return SparkEngineDataflow(await asyncio.to_thread(make), self._hydrations)

    async def queries(self) -> SparkQueries | None:
        if self._queries is None:
            self._queries = SparkQueries(await self.session())
        return self._queries

    def describe(self) -> tuple[str, str]:
        if self._session is None:
            return self.master, ""
        context = self._session.sparkContext
        return context.master or self.master, context.applicationId or ""

    async def close(self) -> None:
        if self._warming is not None:
            await cancel_and_wait(self._warming)
        if self._cluster is not None:
            await self._cluster.astop()
            self._cluster = None
