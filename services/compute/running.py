"""One installed dataflow at work: hydrate, then step as its inputs advance.

The runner follows every input (``inputs.InputFollower``), waits until all of them have
passed ``as_of``, hydrates the engine's dataflow from the contents at ``as_of``, and from then
on steps it to the meet of the inputs' uppers whenever that moves, with everything that
arrived in between (one step may span many times). Each step's output goes to the output
collection (``output.OutputWriter``), then to subscribers; only then does the dataflow's
upper move, so an index peek never sees a time its collection output does not have yet. A
dataflow that hydrates from parts (Spark) steps from parts too (``_step_io``): its followers
hold part keys, fed together by one stream (``inputs.PartsFeed``), its tasks read them and
write the output's parts, and this commits them.

In the background it renews its capabilities' leases and moves its read holds up to
``upper - 1``: what a restart at the output's upper needs, and nothing older. At the same
pace it compacts the index, if any: its since trails ``upper - 1`` by the configured history
window, so peeks (and subscriptions) that far back still answer while the index's memory
stays bounded by the window instead of growing with every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from services.compute.changes import ChangeFeed, Step
from services.compute.dataflow import Row, Update
from services.compute.dataflow.work import StateSize
from services.compute.engines import EngineDataflow
from services.compute.inputs import MAX_TIME, InputFollower, PartsFeed
from services.compute.metrics import STEP_SECONDS
from services.compute.output import OutputWriter, read_back
from services.compute.spark.hydration import OutputTarget
from services.compute.spark.parts_source import Relisting, missing_part
from services.compute.spark.spark_dataflow import OutputSink
from services.compute.spec import DataflowSpec
from tidemark.clients.storage import Capability, PartsListing, StorageClient
from tidemark.columnar import RelationSchema, frontier_bound
from tidemark.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    TidemarkError,
    Unavailable,
)
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import plan_pb2

log = get_logger("compute.running")

HYDRATING = "hydrating"
RUNNING = "running"
FAILED = "failed"


@dataclass(frozen=True)
class RunSettings:
    holder: str
    """Who the capabilities this process acquires belong to (``compute/<cluster>``)."""
    renew_interval_s: float
    hold_interval_s: float
    index_history_ms: int = 60_000
    """How far behind ``upper - 1`` an index stays readable (the index's since trails it)."""


class RunningDataflow:
    def __init__(
        self,
        spec: DataflowSpec,
        plan: plan_pb2.Plan,
        schema: RelationSchema,
        engine: EngineDataflow,
        storage: StorageClient,
        inputs: Sequence[Capability],
        writer: OutputWriter | None,
        output_has_data: bool,
        as_of: int,
        settings: RunSettings,
        hydration_rows_estimate: int = 0,
        on_failed: Callable[[], None] | None = None,
        *,
        hydrate_from_parts: bool = False,
    ) -> None:
        """``hydrate_from_parts``: hydrate by the engine's bulk path from the inputs' parts
        (the engine must support it) rather than from snapshots streamed through here."""
        self.spec = spec
        self.on_failed = on_failed
        """Called once the dataflow has failed (the host restarts it)."""
        self.dataflow_id = spec.dataflow_id
        self.plan = plan
        self.schema = schema
        self.engine = engine
        self.storage = storage
        self.inputs = list(inputs)
        self.writer = writer
        self._sink: OutputSink | None = None
        """The output's sink of the last step from parts, kept (its serialized schema too)."""
        self.output_has_data = output_has_data
        self.as_of = as_of
        self.settings = settings
        self.state = HYDRATING
        self.index_since = as_of
        """Index peeks before this are refused (only moves forward, see ``_compact_index``)."""
        self._read_holds: dict[int, int] = {}
        """Times index reads in progress need (how many at each): compaction stops at the
        least (see ``read_hold``)."""
        self.error = ""
        self.restarts = 0
        """How many failed dataflows of this id came before this one (see the host)."""
        self.last_failure = ""
        self._engine_dropped = False
        self.upper: int | None = None
        """The output is complete before this (``None`` until hydrated)."""
        self.output_rows = 0
        """Rows in the output at ``upper - 1``, counted with multiplicity."""
        self.hydration_rows_total = hydration_rows_estimate
        self.hydrated_rows = 0
        self.hydration_parts_total = 0
        self.hydration_parts_done = 0
        """Hydration's progress in the inputs' storage parts at ``as_of`` (0 and 0 where it does
        not go by parts), as Status and the progress log lines report it."""
        # A plan of constants reads no parts: it hydrates in-process, instantly.
        self.steps_from_parts = engine.hydrates_from_parts and bool(inputs)
        """The engine's tasks read the inputs' parts and write the output's themselves, in
        every step after hydration, however the dataflow hydrated."""
        self.hydrates_from_parts = hydrate_from_parts and self.steps_from_parts
        self.started_ms = int(time.time() * 1000)
        self.feed = ChangeFeed()
        self._wake = asyncio.Event()
        self._moved = asyncio.Event()
        self.followers = [
            InputFollower(
                storage,
                capability,
                as_of,
                self._wake.set,
                snapshot=not self.hydrates_from_parts,
                parts=self.steps_from_parts,
            )
            for capability in inputs
        ]
        self.parts_feed = (
            PartsFeed(storage, self.followers, self._wake.set) if self.steps_from_parts else None
        )
        """Feeds the followers when they follow parts (all of them together)."""
        self._task: asyncio.Task[None] | None = None

    # -- description --------------------------------------------------------------------------

    @property
    def has_index(self) -> bool:
        return self.spec.index_key_columns is not None

    @property
    def since(self) -> int:
        """The earliest time the dataflow answers for: an index keeps the history window
        before its upper; a collection output is read from storage, and the holds are at
        upper - 1."""
        if self.has_index:
            return max(self.index_since, self.engine.index_floor)
        if self.upper is None:
            return self.as_of
        return max(self.as_of, self.upper - 1)

    @property
    def input_upper(self) -> int | None:
        """The meet of the inputs' uppers (``None`` until every input has reported one)."""
        uppers = [f.upper for f in self.followers]
        if any(u is None for u in uppers):
            return None
        return min((u for u in uppers if u is not None), default=MAX_TIME)

    def check_engine(self) -> None:
        """Notices an engine that died while this dataflow was idle."""
        failure = self.engine.failure
        if failure is not None and self.state != FAILED:
            self._fail(Unavailable(failure))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"dataflow-{self.dataflow_id}")

    async def stop(self, *, release: bool) -> None:
        """Stops the work; with ``release``, also gives up the dataflow's state and
        capabilities (DropView), otherwise leaves the holds to expire (process shutdown)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._stop_following()
        self.feed.close(NotFound(f"dataflow {self.dataflow_id!r} was dropped"))
        if not release:
            return
        await self.drop_engine()
        capabilities = list(self.inputs)
        if self.writer is not None:
            capabilities.append(self.writer.capability)
        for capability in capabilities:
            try:
                await self.storage.drop(capability)
            except TidemarkError as exc:
                # Already gone (expired, dropped by storage): nothing is held either way.
                log.info("capability_drop_failed", dataflow=self.dataflow_id, error=exc.message)

    async def drop_engine(self) -> None:
        """Gives up the engine's state, once: an engine may key it by the dataflow's id (the
        resident Spark tasks do), and a restarted dataflow of the same id may own it by the
        time this one is stopped."""
        if self._engine_dropped:
            return
        self._engine_dropped = True
        try:
            await self.engine.drop()
        except TidemarkError as exc:
            log.warning("engine_drop_failed", dataflow=self.dataflow_id, error=exc.message)

    def _fail(self, error: TidemarkError) -> None:
        if self.state == FAILED:
            return
        self.state = FAILED
        self.error = error.message
        log.error("dataflow_failed", dataflow=self.dataflow_id, error=error.message)
        self.feed.close(Unavailable(f"dataflow {self.dataflow_id!r} failed: {error.message}"))
        self._signal_moved()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        if self.on_failed is not None:
            self.on_failed()

    async def _run(self) -> None:
        capabilities = list(self.inputs)
        if self.writer is not None:
            capabilities.append(self.writer.capability)
        self.engine.list_parts_with(self._list_parts)
        try:
            if self.parts_feed is not None:
                self.parts_feed.start()
            else:
                for follower in self.followers:
                    follower.start()
            async with self.storage.keep_alive(capabilities, self.settings.renew_interval_s):
                holds = asyncio.create_task(self._move_holds())
                try:
                    await self._hydrate()
                    await self._follow()
                finally:
                    await cancel_and_wait(holds)
        except asyncio.CancelledError:
            raise
        except TidemarkError as exc:
            self._fail(exc)
        except Exception as exc:
            log.exception("dataflow_crashed", dataflow=self.dataflow_id)
            self._fail(Unavailable(f"{type(exc).__name__}: {exc}"))
        finally:
            await self._stop_following()

    async def _stop_following(self) -> None:
        if self.parts_feed is not None:
            await self.parts_feed.stop()
        for follower in self.followers:
            await follower.stop()

    # -- hydration and steps ------------------------------------------------------------------

    async def _list_parts(self, as_of: int) -> dict[str, PartsListing]:
        """The inputs' parts at ``as_of``, under the dataflow's read holds (at most
        ``upper - 1``): how a lost shard's state is rebuilt at ``upper - 1``."""
        listed = await asyncio.gather(
            *(self.storage.list_parts(capability, as_of) for capability in self.inputs)
        )
        return {
            capability.collection_id: listing
            for capability, listing in zip(self.inputs, listed, strict=True)
        }

    async def _wait_inputs(self) -> None:
        await self._wake.wait()
        self._wake.clear()
        for follower in self.followers:
            if follower.error is not None:
                raise follower.error

    async def _hydrate(self) -> None:
        as_of = self.as_of
        while True:
            if not self.hydrates_from_parts:
                self.hydrated_rows = sum(f.rows_received for f in self.followers)
            ready = self.input_upper
            if ready is not None and ready > as_of:
                break
            await self._wait_inputs()
        if self.hydrates_from_parts:
            await self._hydrate_from_parts()
            return
        snapshots = {f.collection_id: f.take(as_of + 1) for f in self.followers}
        loaded = sum(len(updates) for updates in snapshots.values())
        started = time.perf_counter()
        output, upper = await self.engine.hydrate(snapshots)
        STEP_SECONDS.labels("hydrate").observe(time.perf_counter() - started)
        if self.writer is not None and as_of >= self.writer.upper:
            written = output
            if self.output_has_data:
                existing = await self.writer.contents_before_upper(self.settings.holder)
                written = _difference(output, existing, as_of)
            await self.writer.write(written, upper)
        self.output_rows = sum(diff for _, _, diff in output)
        self.hydrated_rows = self.hydration_rows_total = loaded
        self.feed.start(upper)
        self.state = RUNNING
        self._advance(upper)
        log.info(
            "dataflow_hydrated",
            dataflow=self.dataflow_id,
            as_of=as_of,
            rows=loaded,
            output_rows=self.output_rows,
        )

    async def _hydrate_from_parts(self) -> None:
        """Hydration by the engine's bulk path: the inputs' parts at ``as_of`` are listed
        here, read and processed by Spark's executors, and the output at ``as_of`` comes back
        as parts this commits (see ``services/compute/spark/hydration.py``)."""
        as_of = self.as_of
        started = time.perf_counter()
        listings = await self._list_parts(as_of)
        listed = list(listings.values())
        parts_total = sum(len(listing.parts) for listing in listed)
        rows_total = sum(part.rows for listing in listed for part in listing.parts)
        self.hydration_parts_total = parts_total
        self.hydration_rows_total = rows_total

        def on_progress(fraction: float) -> None:  # never moves back
            self.hydration_parts_done = max(
                self.hydration_parts_done, round(parts_total * fraction)
            )
            self.hydrated_rows = max(self.hydrated_rows, round(rows_total * fraction))

        target: OutputTarget | None = None
        existing: Capability | None = None
        writer = self.writer
        try:
            if writer is not None and as_of >= writer.upper:
                previous = None
                if self.output_has_data:
                    found = await writer.existing_parts(self.settings.holder)
                    if found is not None:
                        previous, existing = found
                blob_url = listed[0].blob_url if listed else ""
                target = OutputTarget(writer.collection_id, self.schema, blob_url, previous)
            log.info(
                "dataflow_hydrating_from_parts",
                dataflow=self.dataflow_id,
                as_of=as_of,
                parts=parts_total,
                rows=rows_total,
            )
            relisting = Relisting(log, "hydration_listed_again", dataflow=self.dataflow_id)
            while True:
                try:
                    done = await self.engine.hydrate_from_parts(listings, target, on_progress)
                    break
                except TidemarkError as exc:
                    wait = relisting.wait_before_next(exc)
                    if wait is None:
                        raise
                    await asyncio.sleep(wait)
                    listings = await self._list_parts(as_of)
            if writer is not None and target is not None:
                await writer.write_parts(done.output_parts, (as_of, as_of), done.upper)
        finally:
            if existing is not None:
                with contextlib.suppress(TidemarkError):
                    await self.storage.drop(existing)
        STEP_SECONDS.labels("hydrate").observe(time.perf_counter() - started)
        self.output_rows = done.output_rows
        self.hydrated_rows = rows_total
        self.hydration_parts_done = parts_total
        self.feed.start(done.upper)
        self.state = RUNNING
        self._advance(done.upper)
        log.info(
            "dataflow_hydrated",
            dataflow=self.dataflow_id,
            as_of=as_of,
            rows=rows_total,
            loaded=done.loaded,
            parts=parts_total,
            output_rows=self.output_rows,
            output_parts=len(done.output_parts),
            seconds=round(time.perf_counter() - started, 3),
            by="spark",
        )

    async def _follow(self) -> None:
        while True:
            target = self.input_upper
            assert self.upper is not None
            if target is None or target <= self.upper:
                await self._wait_inputs()
                continue
            if self.steps_from_parts:
                await self._step_io(target)
                continue
            batches = {}
            for follower in self.followers:
                updates = follower.take(target)
                if updates:
                    batches[follower.collection_id] = updates
            lower = self.upper
            started = time.perf_counter()
            output, upper = await self.engine.step(batches, target)
            STEP_SECONDS.labels("step").observe(time.perf_counter() - started)
            if self.writer is not None:
                await self.writer.write(output, upper)
            self.output_rows += sum(diff for _, _, diff in output)
            self.feed.publish(Step(lower, upper, output))
            self._advance(upper)

    async def _step_io(self, target: int) -> None:
        """A step whose data work the engine's tasks do: they read the input parts dealt
        to them and write the output's parts, which this commits as one batch (without an
        output collection, the output stays in the tasks' index). The output's rows come
        back only while the change feed has listeners. A part gone from the blob
        store (compacted away and past its grace period) runs the step again from rows read
        through storage."""
        assert self.upper is not None
        lower = self.upper
        parts = {f.collection_id: f.take_parts(target) for f in self.followers}
        parts = {cid: windows for cid, windows in parts.items() if windows}
        blob_url = next((f.blob_url for f in self.followers if f.blob_url), "")
        writer = self.writer
        sink = None
        if writer is not None and blob_url:
            sink = self._sink
            if sink is None or (sink.collection_id, sink.blob_url) != (
                writer.collection_id,
                blob_url,
            ):
                sink = self._sink = OutputSink(writer.collection_id, blob_url, self.schema)
        # Rows come back for listeners, and for a writer without a sink (no parts path to
        # the output): only an index-only dataflow's rows may stay on the tasks.
        return_rows = self.feed.has_listeners or (writer is not None and sink is None)
        started = time.perf_counter()
        try:
            done = await self.engine.step_io(
                {}, parts, target, blob_url=blob_url, sink=sink, return_rows=return_rows
            )
        except TidemarkError as exc:
            if not missing_part(exc):
                raise
            log.info("step_part_missing", dataflow=self.dataflow_id, lower=lower, error=exc.message)
            batches = {
                f.collection_id: await f.read_rows(lower, target)
                for f in self.followers
                if f.collection_id in parts
            }
            done = await self.engine.step_io(
                batches, {}, target, blob_url=blob_url, sink=sink, return_rows=return_rows
            )
        STEP_SECONDS.labels("step").observe(time.perf_counter() - started)
        upper = done.upper
        if writer is not None:
            if sink is None:
                await writer.write(done.updates or [], upper)
            else:
                times = (done.least or 0, done.greatest or 0)
                await writer.write_parts(done.parts, times, upper, blob_url=blob_url)
        if done.updates is not None:
            self.output_rows += sum(diff for _, _, diff in done.updates)
        else:
            self.output_rows += done.diffs
        if done.updates is not None:
            self.feed.publish(Step(lower, upper, done.updates))
        elif self.feed.has_listeners:
            # A listener came while the step ran without rows: read them back, from the
            # output's parts or the index's history.
            if writer is not None:
                self.feed.publish(Step(lower, upper, await read_back(blob_url, done.parts)))
            else:
                try:
                    changes = await self.engine.index_changes(lower, upper)
                except FailedPrecondition as exc:
                    # The index no longer holds them (a shard rebuilt since): those listeners
                    # end with the reason, and the dataflow goes on.
                    self.feed.end_listeners(exc)
                    self.feed.skip(upper)
                else:
                    self.feed.publish(Step(lower, upper, changes))
        else:
            self.feed.skip(upper)
        self._advance(upper)

    def _advance(self, upper: int) -> None:
        self.upper = upper
        self._signal_moved()

    def _signal_moved(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()

    async def _move_holds(self) -> None:
        """Moves every input read hold up to ``upper - 1`` (never past what a restart at the
        output's upper, or the input streams, still read), and the index's since behind it."""
        while True:
            await asyncio.sleep(self.settings.hold_interval_s)
            if self.upper is None:
                continue
            await self._compact_index()
            target = self.upper - 1
            for position, capability in enumerate(self.inputs):
                held = frontier_bound(capability.frontier)
                if held is not None and held < target:
                    try:
                        self.inputs[position] = await self.storage.downgrade(capability, target)
                    except TidemarkError as exc:
                        # Tried again next round; a capability that is gone also ends the
                        # input's stream, which fails the dataflow with the reason.
                        log.info(
                            "hold_downgrade_failed", dataflow=self.dataflow_id, error=exc.message
                        )

    async def _compact_index(self) -> None:
        """Moves the index's since up to ``upper - 1 - index_history_ms`` when that is later."""
        assert self.upper is not None
        if self.upper >= MAX_TIME:
            # Every input is closed (a plan of constants reads none): the output never
            # changes again, so no history accumulates, and a window measured back from the
            # end of time would refuse every real time.
            return
        target = self.upper - 1 - self.settings.index_history_ms
        if self._read_holds:
            target = min(target, min(self._read_holds))
        if not self.has_index or target <= self.index_since or self.state == FAILED:
            return
        # Advertised before the engine compacts, so Status never shows a since the index can
        # no longer serve; reads past their check hold the target back (``read_hold``).
        self.index_since = target
        try:
            await self.engine.compact_index(target)
        except Unavailable as exc:
            self._fail(exc)
        except TidemarkError as exc:
            # The index keeps more history than it needs until a later round compacts further;
            # reads at and after the since are unaffected.
            log.warning("index_compaction_failed", dataflow=self.dataflow_id, error=exc.message)

    # -- reads --------------------------------------------------------------------------------

    async def wait_past(self, timestamp: int, deadline: float) -> None:
        """Waits until the upper is beyond ``timestamp`` (``deadline``: ``time.monotonic``)."""
        while True:
            self.check_engine()
            if self.state == FAILED:
                raise Unavailable(f"dataflow {self.dataflow_id!r} failed: {self.error}")
            if self.upper is not None and self.upper > timestamp:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                shown = "not hydrated yet" if self.upper is None else f"at {self.upper}"
                raise DeadlineExceeded(
                    f"dataflow {self.dataflow_id!r} did not pass {timestamp} in time (its "
                    f"upper is {shown})"
                )
            moved = self._moved
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await moved.wait()

    @contextlib.contextmanager
    def read_hold(self, timestamp: int) -> Iterator[None]:
        """Keeps the index readable at ``timestamp`` while held: a compaction round stops
        short of it, so a read that passed the since check is not refused half-way by a
        compaction that started after it. ``FailedPrecondition`` when ``timestamp`` is before
        the since already (checked and held with no await between, on the event loop)."""
        if not self.has_index:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        if timestamp < self.since:
            raise FailedPrecondition(
                f"timestamp {timestamp} is before the since {self.since} of dataflow "
                f"{self.dataflow_id!r}"
            )
        self._read_holds[timestamp] = self._read_holds.get(timestamp, 0) + 1
        try:
            yield
        finally:
            left = self._read_holds.pop(timestamp) - 1
            if left:
                self._read_holds[timestamp] = left

    async def peek(self, timestamp: int, deadline: float) -> dict[Row, int]:
        """The output at ``timestamp`` from the index, once complete there."""
        with self.read_hold(timestamp):
            await self.wait_past(timestamp, deadline)
            try:
                return await self.engine.peek(timestamp)
            except Unavailable as exc:
                self._fail(exc)
                raise

    async def index_changes(self, lower: int, upper: int) -> list[Update]:
        """The output's changes at times in ``[lower, upper)`` from the index's history (all
        complete: ``upper`` is at most the dataflow's upper)."""
        if lower <= self.since:
            raise FailedPrecondition(
                f"changes from {lower} on are before the since {self.since} of dataflow "
                f"{self.dataflow_id!r}"
            )
        try:
            return await self.engine.index_changes(lower, upper)
        except Unavailable as exc:
            self._fail(exc)
            raise

    async def state_size(self) -> StateSize:
        """The operator state's size (zero while failed, or when the engine does not answer
        in time: Status must not hang on a busy or lost task)."""
        if self.state == FAILED:
            return StateSize()
        try:
            async with asyncio.timeout(5.0):
                return await self.engine.state_size()
        except (TidemarkError, TimeoutError):
            return StateSize()


def _difference(target: list[Update], existing: dict[Row, int], time: int) -> list[Update]:
    """Updates at ``time`` turning ``existing`` into the contents ``target`` states."""
    wanted: dict[Row, int] = {}
    for row, _, diff in target:
        wanted[row] = wanted.get(row, 0) + diff
    changes = []
    for row in wanted.keys() | existing.keys():
        diff = wanted.get(row, 0) - existing.get(row, 0)
        if diff:
            changes.append((row, time, diff))
    return changes
