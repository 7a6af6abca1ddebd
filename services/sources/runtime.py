"""Follows the catalog and keeps one ingestion task per source that needs one.

The catalog subscription (as compute's controller has it) keeps the current items; after each
change the set of :class:`~tidemark.sources.plan.SourcePlan` is compared with the running
tasks: a new source starts a task, a dropped one stops its task, a changed one restarts it.
A task whose ingestion fails starts over after a backoff (a new reader; recovery makes it
exactly once). A task that finds its collections closed (the source was dropped, and the
catalog will say so shortly) waits for the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from services.sources import metrics
from services.sources.readers import READERS, ReaderFactory
from tidemark import timelines
from tidemark.catalog_contents import CatalogContents
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.errors import FailedPrecondition
from tidemark.logging import get_logger
from tidemark.sources.ingest import CollectionClosed, Ingestion, SharedReadTs
from tidemark.sources.plan import SourcePlan, source_plans
from tidemark.sources.reader import SourceBatch
from tidemark.tasks import cancel_and_wait

log = get_logger("services.sources.runtime")


@dataclass(frozen=True)
class RuntimeSettings:
    holder: str = "sources"
    data_timeline: str = timelines.DATA
    catalog_timeline: str = timelines.CATALOG
    advance_interval: float = 1.0
    read_poll_interval: float = 0.05
    retry_initial: float = 0.2
    retry_max: float = 5.0


@dataclass
class _Running:
    plan: SourcePlan
    task: asyncio.Task[None]
    ingestion: Ingestion | None = None


class SourcesRuntime:
    def __init__(
        self,
        catalog: CatalogClient,
        storage: StorageClient,
        oracle: OracleClient,
        settings: RuntimeSettings | None = None,
        readers: Mapping[int, ReaderFactory] | None = None,
    ) -> None:
        self.catalog = catalog
        self.storage = storage
        self.oracle = oracle
        self.settings = settings or RuntimeSettings()
        self.readers = dict(READERS if readers is None else readers)
        self._contents = CatalogContents()
        self._changed = asyncio.Event()
        self._running: dict[str, _Running] = {}
        # One look at the oracle's read time per poll, for every source.
        self._read_ts = SharedReadTs(
            oracle, self.settings.data_timeline, self.settings.read_poll_interval / 2
        )
        self._task: asyncio.Task[None] | None = None
        self.follow_error: str | None = "the catalog has not been read yet"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sources-runtime")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        for running in list(self._running.values()):
            await cancel_and_wait(running.task)
        self._running.clear()
        metrics.RUNNING.set(0)

    def readiness(self) -> str | None:
        """Ready once the catalog has been read (the ingestions then start)."""
        return self.follow_error

    def running(self) -> dict[str, SourcePlan]:
        return {id_: r.plan for id_, r in self._running.items()}

    # -- following the catalog ------------------------------------------------------------

    async def _run(self) -> None:
        follower = asyncio.create_task(self._follow(), name="sources-follow")
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                self._reconcile()
        finally:
            await cancel_and_wait(follower)

    async def _follow(self) -> None:
        failures = 0
        while True:
            try:
                if self._contents.frontier == 0:
                    start = await self.oracle.read_ts(self.settings.catalog_timeline)
                else:
                    start = self._contents.frontier - 1
                first = True
                async for progress in self.catalog.subscribe_at(start):
                    self._contents.apply(progress, snapshot=first)
                    first = False
                    failures = 0
                    self.follow_error = None
                    self._changed.set()
                log.warning("sources_catalog_subscription_ended")
            except asyncio.CancelledError:
                raise
            except FailedPrecondition as exc:
                self._contents = CatalogContents()  # compacted past us: start afresh
                failures += 1
                self.follow_error = exc.message
            except Exception as exc:
                failures += 1
                self.follow_error = str(exc)
                log.warning("sources_catalog_subscription_failed", error=str(exc))
            await asyncio.sleep(min(self.settings.retry_max, 0.1 * 2**failures))

    def _reconcile(self) -> None:
        plans = source_plans(self._contents.items(), self.readers.keys())
        wanted = {id_: plan for id_, plan in plans.items() if plan.complete()}
        for id_, running in list(self._running.items()):
            plan = wanted.get(id_)
            if plan is None or plan.key() != running.plan.key():
                log.info("source_stopping", source=running.plan.name(), id=id_)
                running.task.cancel()
                del self._running[id_]
        for id_, plan in wanted.items():
            if id_ not in self._running:
                log.info("source_starting", source=plan.name(), id=id_)
                task = asyncio.create_task(self._ingest_forever(plan), name=f"source-{id_}")
                self._running[id_] = _Running(plan, task)
        metrics.RUNNING.set(len(self._running))

    # -- one source -----------------------------------------------------------------------

    async def _ingest_forever(self, plan: SourcePlan) -> None:
        name = plan.name()
        failures = 0
        while True:
            reader = self.readers[plan.format](plan)
            ingestion = Ingestion(
                name=name,
                reader=reader,
                targets=plan.targets(),
                storage=self.storage,
                oracle=self.oracle,
                timeline=self.settings.data_timeline,
                holder=self.settings.holder,
                advance_interval=self.settings.advance_interval,
                read_poll_interval=self.settings.read_poll_interval,
                read_ts=self._read_ts,
                on_batch=lambda batch, t: self._observe(name, batch, t),
            )
            running = self._running.get(plan.id)
            if running is not None:
                running.ingestion = ingestion
            try:
                await ingestion.run()
                failures = 0
            except asyncio.CancelledError:
                raise
            except CollectionClosed as exc:
                # Dropped: the catalog will stop this task; until then, do not spin.
                log.info("source_collections_closed", source=name, error=exc.message)
                failures = max(failures, 5)
            except Exception as exc:
                failures += 1
                metrics.RESTARTS.labels(name).inc()
                log.warning(
                    "source_ingestion_failed", source=name, error=str(exc), attempt=failures
                )
            finally:
                with contextlib.suppress(Exception):
                    await reader.close()
            delay = self.settings.retry_initial * 2 ** max(0, failures - 1)
            await asyncio.sleep(min(self.settings.retry_max, delay))

    def _observe(self, name: str, batch: SourceBatch, t: int) -> None:
        metrics.BATCHES.labels(name).inc()
        metrics.ROWS.labels(name).inc(batch.row_count())
        metrics.BOUND_AT.labels(name).set(t)
