"""The dataflows of one compute process: installing, dropping, reading and describing them.

``DataflowManager`` is the ``DataflowHost`` both MaintainView and the catalog controller
install through. Installing checks everything that can be checked up front (the plan against
its collections, the output's schema, the capabilities), chooses ``as_of``, sets up the
engine's state and returns; hydration and steps then run in the background
(``running.RunningDataflow``).

``as_of`` (compute.proto, decisions.md): the latest of the inputs' read holds; with an output
collection that already holds data, its upper - 1 instead (a restart continues where the
output stopped without rewriting it), and never before the output's upper otherwise.

A dataflow that fails (its engine lost a Spark task, storage stayed unavailable past its
retries, ...) is restarted by :meth:`DataflowManager.supervise` as a process restart would
restart it: with fresh capabilities, from ``as_of`` = its output's upper - 1, so the output
goes on exactly where it stopped; until then it reports ``failed`` and reads of it are
UNAVAILABLE. Attempts back off from ``restart_initial_s`` to ``restart_max_s``.

A catalog view whose output lost its history (its since ran away to ``{}``: unreadable for
good) is rebuilt when its dataflow is installed: the output's history starts afresh at its
upper and the dataflow writes the view's full contents there (see ``_rebuild_if_lost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pyarrow as pa

from services.compute.dataflow import Row
from services.compute.engines import Engine
from services.compute.oneshot import OneShotPool, result_table
from services.compute.output import OutputWriter
from services.compute.planning import checked_plan
from services.compute.progress import QueryWatch, RunningQueries
from services.compute.running import FAILED, RUNNING, RunningDataflow, RunSettings
from services.compute.spark.queries import QueryInput
from services.compute.spec import DataflowInputSpec, DataflowSpec
from services.compute.subscriptions import output_changes
from tidemark.catalog_items import CATALOG_HOLDER
from tidemark.clients.storage import Capability, PartsListing, SnapshotResult, StorageClient
from tidemark.columnar import RelationSchema, frontier_bound
from tidemark.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TidemarkError,
)
from tidemark.frontier import u64_frontier
from tidemark.logging import get_logger
from tidemark.plan.walk import collections_read, columns_read
from tidemark.v1 import common_pb2, compute_pb2, plan_pb2, storage_pb2

log = get_logger("compute.host")


class CatalogFollower(Protocol):
    """What the host needs of the catalog controller (``services/compute/controller.py``)."""

    @property
    def applied_upper(self) -> int: ...

    async def run(self) -> None: ...

    async def wait_applied(self, catalog_ts: int, timeout_s: float) -> int: ...


@dataclass(frozen=True)
class HostSettings:
    cluster: str
    renew_interval_s: float = 20.0
    hold_interval_s: float = 1.0
    default_wait_s: float = 30.0
    index_history_ms: int = 60_000
    restart_initial_s: float = 1.0
    """Wait before restarting a failed dataflow; doubles with each failed attempt."""
    restart_max_s: float = 30.0
    one_shot_workers: int = 2
    """One-shot peeks evaluated at once; more wait in line (``oneshot.OneShotPool``)."""
    statement_budget_bytes: int = 1 << 30
    """The memory budget of each one-shot peek (0: none)."""
    spark_one_shot_rows: int = 100_000
    spark_hydration_rows: int = 1_000_000
    """Dataflows whose inputs hold at least this many updates hydrate by Spark from the
    inputs' parts (the Spark engine only; negative: never); smaller ones from snapshots
    streamed through this process, which start sooner."""
    """One-shot peeks over at least this many input updates run as Spark jobs (with a Spark
    engine; -1: never), smaller ones in this process."""

    @property
    def holder(self) -> str:
        return f"compute/{self.cluster}"


@dataclass(frozen=True)
class PeekAnswer:
    table: pa.Table
    """The rows, ``time`` (= ``timestamp``) and ``diff``."""
    schema: RelationSchema
    timestamp: int


def _widened(snapshot: SnapshotResult, positions: list[int], width: int) -> dict[Row, int]:
    """A snapshot of some columns as rows of the whole width, None in the others."""
    rows: dict[Row, int] = {}
    for narrow, count in snapshot.version().items():
        row: list[Any] = [None] * width
        for position, value in zip(positions, narrow, strict=True):
            row[position] = value
        key = tuple(row)
        rows[key] = rows.get(key, 0) + count
    return rows


def _unknown_capability(ref: storage_pb2.CapabilityRef) -> Capability:
    """A stand-in naming a capability for calls that only send its reference."""
    return Capability(ref.collection_id, ref.id, "", u64_frontier(), 0)


def _bound(capability: Capability) -> int:
    bound = frontier_bound(capability.frontier)
    if bound is None:
        raise FailedPrecondition(
            f"collection {capability.collection_id!r} has been closed (its frontier is {{}})"
        )
    return bound


class DataflowManager:
    def __init__(self, storage: StorageClient, engine: Engine, settings: HostSettings) -> None:
        self.storage = storage
        self.engine = engine
        self.settings = settings
        self.controller: CatalogFollower | None = None
        self.publish_time: Callable[[int], Awaitable[None]] | None = None
        """``ApplyWrite`` on the data timeline (with an oracle): see ``_rebuild_if_lost``."""
        self._dataflows: dict[str, RunningDataflow] = {}
        self._installing: set[str] = set()
        self._failed = asyncio.Event()  # set when a dataflow fails: the supervisor looks
        self._restarts: dict[str, tuple[int, float]] = {}  # id: attempts, next attempt due
        self.one_shots = OneShotPool(settings.one_shot_workers, settings.statement_budget_bytes)
        self.queries = RunningQueries()
        """The peeks running, and how far they have come (Status, the progress log)."""
        self._run_settings = RunSettings(
            settings.holder,
            settings.renew_interval_s,
            settings.hold_interval_s,
            settings.index_history_ms,
        )

    # -- DataflowHost ---------------------------------------------------------------------------

    async def install(self, spec: DataflowSpec) -> None:
        await self.install_view(spec)

    async def drop(self, dataflow_id: str) -> None:
        running = self._dataflows.pop(dataflow_id, None)
        if running is not None:
            await running.stop(release=True)
            log.info("dataflow_dropped", dataflow=dataflow_id)

    async def drop_view(self, dataflow_id: str) -> None:
        """``drop`` for a client: an unknown id is ``NotFound``."""
        self._get(dataflow_id)
        await self.drop(dataflow_id)

    def running(self) -> list[RunningDataflow]:
        """The installed dataflows (not those still being installed)."""
        return list(self._dataflows.values())

    def dataflow_ids(self) -> set[str]:
        return set(self._dataflows) | set(self._installing)

    # -- installing -----------------------------------------------------------------------------

    async def install_view(self, spec: DataflowSpec) -> tuple[int, RelationSchema]:
        """Installs ``spec``; its ``as_of`` and output schema."""
        dataflow_id = spec.dataflow_id
        if not dataflow_id:
            raise InvalidArgument("a dataflow needs an id")
        if dataflow_id in self._dataflows or dataflow_id in self._installing:
            raise AlreadyExists(f"dataflow {dataflow_id!r} is already installed")
        self._installing.add(dataflow_id)
        try:
            running = await self._prepare(spec)
        finally:
            self._installing.discard(dataflow_id)
        self._dataflows[dataflow_id] = running
        running.start()
        log.info(
            "dataflow_installed",
            dataflow=dataflow_id,
            as_of=running.as_of,
            inputs=[c.collection_id for c in running.inputs],
            output=spec.output_collection_id,
            index=spec.index_key_columns,
            from_catalog=spec.from_catalog,
        )
        return running.as_of, running.schema

    # -- restarting failed dataflows --------------------------------------------------------------

    async def supervise(self, check_interval_s: float = 1.0) -> None:
        """Restart failed dataflows, forever (see the module docs). Also notices, every
        ``check_interval_s``, engines that died under dataflows with nothing to do."""
        loop = asyncio.get_running_loop()
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the event is set, and this loop would then never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(check_interval_s):
                    await self._failed.wait()
            self._failed.clear()
            for dataflow_id, running in list(self._dataflows.items()):
                running.check_engine()
                if running.state == RUNNING:
                    self._restarts.pop(dataflow_id, None)  # it works again
                if running.state != FAILED:
                    continue
                attempts, due = self._restarts.get(dataflow_id, (0, 0.0))
                if loop.time() < due:
                    continue
                delay = min(
                    self.settings.restart_initial_s * 2**attempts, self.settings.restart_max_s
                )
                self._restarts[dataflow_id] = (attempts + 1, loop.time() + delay)
                try:
                    await self._restart(running)
                except TidemarkError as exc:
                    log.warning("dataflow_restart_failed", dataflow=dataflow_id, error=exc.message)
                except Exception:
                    log.exception("dataflow_restart_failed", dataflow=dataflow_id)
            for dataflow_id in set(self._restarts) - set(self._dataflows):
                del self._restarts[dataflow_id]  # dropped meanwhile

    async def _restart(self, failed: RunningDataflow) -> None:
        """Replace ``failed`` with a new dataflow of the same spec. The new one takes fresh
        capabilities before the failed one releases its own, so its inputs stay readable at
        the output's upper - 1 throughout."""
        dataflow_id = failed.dataflow_id
        log.info("dataflow_restarting", dataflow=dataflow_id, error=failed.error)
        spec = replace(
            failed.spec,
            inputs=tuple(DataflowInputSpec(i.collection_id) for i in failed.spec.inputs),
            output_write_capability=None,
        )
        # An engine may key its state by the dataflow's id (the resident Spark tasks do), so
        # the failed one's state goes first; its capabilities stay until the new ones are held.
        await failed.drop_engine()
        running = await self._prepare(spec)
        if self._dataflows.get(dataflow_id) is not failed:
            await running.stop(release=True)  # dropped (or replaced) while this was prepared
            return
        running.restarts = failed.restarts + 1
        running.last_failure = failed.error
        self._dataflows[dataflow_id] = running
        running.start()
        try:
            await failed.stop(release=True)
        except Exception:  # its engine is gone; what it held expires with its leases
            log.exception("failed_dataflow_stop_failed", dataflow=dataflow_id)
        log.info("dataflow_restarted", dataflow=dataflow_id, as_of=running.as_of)

    async def _prepare(self, spec: DataflowSpec) -> RunningDataflow:
        """A dataflow of ``spec``, ready to start. If that fails, the capabilities taken for it
        are dropped again."""
        acquired: list[Capability] = []
        try:
            return await self._prepare_holding(spec, acquired)
        except BaseException:
            for capability in acquired:
                try:
                    await self.storage.drop(capability)
                except TidemarkError as exc:
                    log.info("capability_drop_failed", error=exc.message)
            raise

    async def _prepare_holding(
        self, spec: DataflowSpec, acquired: list[Capability]
    ) -> RunningDataflow:
        input_ids = [i.collection_id for i in spec.inputs]
        if len(set(input_ids)) != len(input_ids):
            raise InvalidArgument(f"an input is named twice: {sorted(input_ids)}")
        read = collections_read(spec.plan)
        if set(input_ids) != read:
            raise InvalidArgument(
                f"the inputs {sorted(input_ids)} are not the collections the plan reads "
                f"{sorted(read)}"
            )
        if spec.output_collection_id is None and spec.index_key_columns is None:
            raise InvalidArgument("a dataflow needs an output: a collection, an index or both")
        schemas = {cid: await self._schema(cid, "input") for cid in input_ids}
        plan, schema = checked_plan(spec.plan, schemas)
        if spec.index_key_columns is not None:
            width = len(schema.columns)
            for column in spec.index_key_columns:
                if not 0 <= column < width:
                    raise InvalidArgument(
                        f"index key column {column} is out of range for {width} output columns"
                    )
        if spec.output_collection_id is not None:
            output_schema = await self._schema(spec.output_collection_id, "output")
            if output_schema != schema:
                raise InvalidArgument(
                    f"output collection {spec.output_collection_id!r} has the schema "
                    f"{output_schema.names} ({output_schema}), which is not the plan's output "
                    f"schema {schema.names} ({schema})"
                )

        inputs = [await self._read_capability(i, acquired) for i in spec.inputs]
        writer = None
        has_data = False
        if spec.output_collection_id is not None:
            if spec.from_catalog and spec.output_write_capability is None:
                await self._rebuild_if_lost(spec.output_collection_id)
            write = await self._write_capability(spec, acquired)
            info = await self.storage.describe(spec.output_collection_id)
            upper = frontier_bound(info.upper)
            if upper is None:
                raise FailedPrecondition(
                    f"output collection {spec.output_collection_id!r} is closed (upper {{}})"
                )
            has_data = info.batch_count > 0
            writer = OutputWriter(self.storage, write, schema, spec.dataflow_id, upper)
        as_of = self._choose_as_of(spec, inputs, writer, has_data)
        estimate = 0
        for cid in input_ids:
            estimate += (await self.storage.describe(cid)).rows
        engine = await self.engine.build(spec.dataflow_id, plan, as_of, spec.index_key_columns)
        return RunningDataflow(
            spec,
            plan,
            schema,
            engine,
            self.storage,
            inputs,
            writer,
            has_data,
            as_of,
            self._run_settings,
            estimate,
            on_failed=self._failed.set,
            hydrate_from_parts=0 <= self.settings.spark_hydration_rows <= estimate,
        )

    async def _rebuild_if_lost(self, collection_id: str) -> None:
        """A catalog view's output whose since ran away to ``{}`` can never be read again,
        but it is derived data: start its history afresh (what ``ALTER MATERIALIZED VIEW …
        REBUILD`` does), with the catalog's durable hold, and this dataflow writes it anew."""
        info = await self.storage.describe(collection_id)
        if info.since.is_empty() and not info.upper.is_empty():
            hold = await self.storage.reset_history(collection_id, CATALOG_HOLDER)
            log.warning("output_history_lost_rebuilding", collection=collection_id)
            since = frontier_bound(hold.frontier)
            if self.publish_time is not None and since is not None:
                # Reads happen at the oracle's read timestamp: it must reach the new since,
                # or the view could not be read until the next write somewhere.
                await self.publish_time(since)

    @staticmethod
    def _choose_as_of(
        spec: DataflowSpec,
        inputs: Sequence[Capability],
        writer: OutputWriter | None,
        has_data: bool,
    ) -> int:
        since = max((_bound(c) for c in inputs), default=0)
        if spec.as_of is not None:
            if spec.as_of < since:
                raise FailedPrecondition(f"as_of {spec.as_of} is before the inputs' since {since}")
            return spec.as_of
        if writer is None:
            return since
        if has_data and writer.upper - 1 >= since:
            return writer.upper - 1
        return max(since, writer.upper)

    async def _schema(self, collection_id: str, role: str) -> RelationSchema:
        try:
            return (await self.storage.describe(collection_id)).schema
        except NotFound:
            raise InvalidArgument(f"{role} collection {collection_id!r} does not exist") from None

    async def _read_capability(
        self, spec: DataflowInputSpec, acquired: list[Capability]
    ) -> Capability:
        if spec.read_capability is None:
            read = await self._acquire_one(spec.collection_id, acquired, write=False)
            if read is None:
                raise FailedPrecondition(
                    f"input collection {spec.collection_id!r} can no longer be read"
                )
            return read
        return await self._checked(spec.collection_id, spec.read_capability, "read")

    async def _write_capability(self, spec: DataflowSpec, acquired: list[Capability]) -> Capability:
        collection_id = spec.output_collection_id
        assert collection_id is not None
        if spec.output_write_capability is None:
            write = await self._acquire_one(collection_id, acquired, write=True)
            if write is None:
                raise FailedPrecondition(f"output collection {collection_id!r} is closed")
            return write
        return await self._checked(collection_id, spec.output_write_capability, "write")

    async def _acquire_one(
        self, collection_id: str, acquired: list[Capability], *, write: bool
    ) -> Capability | None:
        """A fresh write (or read) capability on the collection, the other one of the pair
        dropped; ``None`` if storage no longer grants it. What is held is in ``acquired``."""
        pair = await self.storage.acquire(collection_id, self.settings.holder)
        kept, other = (pair.write, pair.read) if write else (pair.read, pair.write)
        for capability in (pair.read, pair.write):
            if capability.usable:
                acquired.append(capability)
        if other.usable:
            await self.storage.drop(other)
            acquired.remove(other)
        return kept if kept.usable else None

    async def _checked(
        self, collection_id: str, ref: storage_pb2.CapabilityRef, kind: str
    ) -> Capability:
        """The capability ``ref`` names, renewed, after checking it is what it should be."""
        if ref.collection_id != collection_id:
            raise InvalidArgument(
                f"the capability for {collection_id!r} belongs to {ref.collection_id!r}"
            )
        result = await self.storage.renew([_unknown_capability(ref)])
        if not result.renewed:
            raise PermissionDenied(
                f"the {kind} capability for {collection_id!r} is unknown, dropped or expired"
            )
        capability = result.renewed[0]
        if capability.kind != kind:
            raise PermissionDenied(
                f"the capability for {collection_id!r} is a {capability.kind} capability, "
                f"not a {kind} capability"
            )
        return capability

    # -- reads ------------------------------------------------------------------------------------

    def _get(self, dataflow_id: str) -> RunningDataflow:
        running = self._dataflows.get(dataflow_id)
        if running is None:
            raise NotFound(f"no dataflow {dataflow_id!r} is installed")
        return running

    def deadline(self, wait_ms: int, call_remaining_s: float | None) -> float:
        """When a wait must give up: ``wait_ms`` (0: the default), within the call's time."""
        wait = wait_ms / 1000 if wait_ms else self.settings.default_wait_s
        if call_remaining_s is not None:
            wait = min(wait, max(0.0, call_remaining_s - 0.05))
        return time.monotonic() + wait

    async def wait_catalog(self, catalog_ts: int, deadline: float) -> int:
        """Waits until the controller has applied the catalog through ``catalog_ts``;
        without a controller there is nothing to wait for."""
        controller = self.controller
        if controller is None:
            return 0
        return await controller.wait_applied(catalog_ts, max(0.0, deadline - time.monotonic()))

    async def peek_index(
        self,
        dataflow_id: str,
        timestamp: int,
        finishing: plan_pb2.Plan | None,
        deadline: float,
        budget_bytes: int = 0,
        query_id: str = "",
    ) -> PeekAnswer:
        """``budget_bytes``: the finishing plan's memory budget (0: the cluster's);
        ``query_id``: the peek's name in Status while it runs."""
        with self.queries.track(query_id) as watch:
            return await self._peek_index(
                watch, dataflow_id, timestamp, finishing, deadline, budget_bytes
            )

    async def _peek_index(
        self,
        watch: QueryWatch,
        dataflow_id: str,
        timestamp: int,
        finishing: plan_pb2.Plan | None,
        deadline: float,
        budget_bytes: int,
    ) -> PeekAnswer:
        target = self._get(dataflow_id)
        watch.waiting_for = [target]
        if finishing is None:
            contents = await target.peek(timestamp, deadline)
            return PeekAnswer(
                result_table(target.schema, contents, timestamp), target.schema, timestamp
            )
        if not target.has_index:
            raise FailedPrecondition(f"dataflow {dataflow_id!r} keeps no index")
        indexes = {dataflow_id: target}
        for index_id in sorted(collections_read(finishing) - {dataflow_id}):
            running = self._dataflows.get(index_id)
            if running is None or not running.has_index:
                raise InvalidArgument(
                    f"the finishing plan reads {index_id!r}, which is not an index of this cluster"
                )
            indexes[index_id] = running
        plan, schema = checked_plan(finishing, {i: r.schema for i, r in indexes.items()})
        watch.waiting_for = list(indexes.values())
        contents_by_index = {}
        with contextlib.ExitStack() as holds:
            # Every index held before the first read waits: none compacts past the time
            # while another is read.
            for running in indexes.values():
                holds.enter_context(running.read_hold(timestamp))
            for index_id, running in indexes.items():
                contents_by_index[index_id] = await running.peek(timestamp, deadline)
        watch.evaluating()
        read = collections_read(plan)
        result = await self.one_shots.evaluate_finishing(
            plan,
            timestamp,
            {i: c for i, c in contents_by_index.items() if i in read},
            budget_bytes,
        )
        return PeekAnswer(result_table(schema, result, timestamp), schema, timestamp)

    async def peek_one_shot(
        self,
        plan: plan_pb2.Plan,
        inputs: Sequence[DataflowInputSpec],
        timestamp: int,
        deadline: float,
        budget_bytes: int = 0,
        query_id: str = "",
    ) -> PeekAnswer:
        """``budget_bytes``: the evaluation's memory budget (0: the cluster's);
        ``query_id``: the peek's name in Status while it runs."""
        with self.queries.track(query_id) as watch:
            # Reading a collection this process is still writing for the first time (a fresh
            # materialized view) waits for that dataflow's hydration.
            watch.waiting_for = [
                running
                for running in self._dataflows.values()
                if running.writer is not None
                and running.writer.collection_id in {i.collection_id for i in inputs}
            ]
            return await self._peek_one_shot(watch, plan, inputs, timestamp, deadline, budget_bytes)

    async def _peek_one_shot(
        self,
        watch: QueryWatch,
        plan: plan_pb2.Plan,
        inputs: Sequence[DataflowInputSpec],
        timestamp: int,
        deadline: float,
        budget_bytes: int,
    ) -> PeekAnswer:
        input_ids = [i.collection_id for i in inputs]
        read = collections_read(plan)
        if set(input_ids) != read or len(set(input_ids)) != len(input_ids):
            raise InvalidArgument(
                f"the inputs {sorted(input_ids)} are not the collections the plan reads "
                f"{sorted(read)}"
            )
        schemas = {cid: await self._schema(cid, "input") for cid in input_ids}
        checked, schema = checked_plan(plan, schemas)
        read_columns = columns_read(checked)

        async def contents(spec: DataflowInputSpec) -> Callable[[], dict[Row, int]]:
            if spec.read_capability is None:
                raise InvalidArgument(f"input {spec.collection_id!r} has no read capability")
            if spec.read_capability.collection_id != spec.collection_id:
                raise InvalidArgument(
                    f"the capability for {spec.collection_id!r} belongs to "
                    f"{spec.read_capability.collection_id!r}"
                )
            # Only the columns the plan reads are fetched and decoded into rows: the others
            # stay None, which nothing above the Get's Project ever looks at.
            width = len(schemas[spec.collection_id].columns)
            read = read_columns.get(spec.collection_id)
            positions = sorted(read) if read is not None and len(read) < width else None
            names = [schemas[spec.collection_id].columns[i].name for i in positions or ()]
            snapshot = await self.storage.snapshot(
                _unknown_capability(spec.read_capability),
                timestamp,
                columns=names,
                timeout=max(0.01, deadline - time.monotonic()),
            )
            if positions is None:
                return snapshot.version  # decoded into rows on the evaluation's thread
            return functools.partial(_widened, snapshot, positions, width)

        on_spark = await self._on_spark(
            watch, checked, schema, inputs, timestamp, deadline, read_columns
        )
        if on_spark is not None:
            return PeekAnswer(on_spark, schema, timestamp)
        loaded = await asyncio.gather(*(contents(spec) for spec in inputs))
        watch.evaluating()
        result = await self.one_shots.evaluate(
            checked, timestamp, dict(zip(input_ids, loaded, strict=True)), budget_bytes
        )
        return PeekAnswer(result_table(schema, result, timestamp), schema, timestamp)

    async def _on_spark(
        self,
        watch: QueryWatch,
        plan: plan_pb2.Plan,
        schema: RelationSchema,
        inputs: Sequence[DataflowInputSpec],
        timestamp: int,
        deadline: float,
        read_columns: Mapping[str, set[int] | None],
    ) -> pa.Table | None:
        """The one-shot's answer computed by Spark, or ``None`` when it is better computed
        here: the engine has no Spark, or the inputs hold fewer than
        ``spark_one_shot_rows`` updates (a Spark job costs a few hundred milliseconds
        however small its input; the in-process engine answers small inputs sooner)."""
        threshold = self.settings.spark_one_shot_rows
        if threshold < 0 or not self.engine.runs_spark_jobs:
            return None
        capabilities = {}
        for spec in inputs:
            if spec.read_capability is None:
                raise InvalidArgument(f"input {spec.collection_id!r} has no read capability")
            capabilities[spec.collection_id] = _unknown_capability(spec.read_capability)

        async def listing(collection_id: str) -> PartsListing:
            return await self.storage.list_parts(
                capabilities[collection_id],
                timestamp,
                timeout=max(0.01, deadline - time.monotonic()),
            )

        listed = await asyncio.gather(*(listing(spec.collection_id) for spec in inputs))
        chosen = [
            QueryInput(spec.collection_id, parts, read_columns.get(spec.collection_id))
            for spec, parts in zip(inputs, listed, strict=True)
        ]
        if sum(i.rows for i in chosen) < threshold:
            return None  # answered here, whether or not Spark is up
        queries = await self.engine.queries()
        if queries is None:
            return None
        watch.evaluating(sum(len(i.listing.parts) for i in chosen), sum(i.rows for i in chosen))
        return await queries.evaluate(plan, schema, chosen, timestamp, listing)

    def subscribe(
        self, dataflow_id: str, as_of: int | None, snapshot: bool
    ) -> AsyncGenerator[common_pb2.CdcMessage, None]:
        """The output's contents at ``as_of`` (default: upper - 1), then every change; the
        caller closes it (``aclose``) when done, which releases what it holds at once."""
        running = self._get(dataflow_id)
        return output_changes(
            running, self.storage, self.settings.holder, as_of, snapshot, self.deadline(0, None)
        )

    # -- status -----------------------------------------------------------------------------------

    def query_statuses(self, query_ids: Sequence[str] = ()) -> list[compute_pb2.QueryStatus]:
        """The running peeks named (every one when none are)."""
        return self.queries.statuses(query_ids)

    async def status(self) -> list[compute_pb2.DataflowStatus]:
        described = []
        for dataflow_id in sorted(self._dataflows):
            running = self._dataflows[dataflow_id]
            running.check_engine()
            described.append(await _status(running))
        return described

    async def close(self) -> None:
        """Stops every dataflow without releasing its holds: a restarted process continues
        from them."""
        self.one_shots.close()
        for running in list(self._dataflows.values()):
            await running.stop(release=False)
        self._dataflows.clear()


async def _status(running: RunningDataflow) -> compute_pb2.DataflowStatus:
    upper = running.upper
    input_upper = running.input_upper
    lag = 0
    if upper is not None and input_upper is not None and input_upper > upper:
        lag = input_upper - upper
    size = await running.state_size()
    status = compute_pb2.DataflowStatus(
        dataflow_id=running.dataflow_id,
        state=running.state,
        as_of=running.as_of,
        upper=common_pb2.Frontier(elements=[upper if upper is not None else running.as_of]),
        since=common_pb2.Frontier(elements=[running.since]),
        input_collection_ids=[f.collection_id for f in running.followers],
        output_collection_ids=[running.writer.collection_id] if running.writer else [],
        has_index=running.has_index,
        hydrated_rows=running.hydrated_rows,
        hydration_rows_total=running.hydration_rows_total,
        hydration_parts_done=running.hydration_parts_done,
        hydration_parts_total=running.hydration_parts_total,
        lag_ms=lag,
        arrangement_keys=size.keys,
        state_rows=size.rows,
        state_bytes=size.bytes,
        state_spilled_bytes=size.spilled_bytes,
        index_rows=running.output_rows if running.has_index else 0,
        from_catalog=running.spec.from_catalog,
        error=running.error,
        restarts=running.restarts,
        last_failure=running.last_failure,
        shard_restores=running.engine.shard_restores,
    )
    return status
