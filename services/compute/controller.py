"""The cluster's catalog controller: runs the dataflows the catalog assigns to this cluster.

It subscribes to the catalog, keeps its contents in memory and, whenever a progress report
completes more catalog time, works out the dataflows this cluster should run (one per
materialized view and index whose ``cluster_id`` is this cluster's; see ``catalog_plans``)
and makes the host match: it installs new ones, drops removed ones, and drops and reinstalls
one whose spec changed. Specs are compared, not catalog rows: a change that leaves the
dataflow as it was (a rename, a new owner) keeps it running, while a change elsewhere that
alters it (the view an index reads replaced) reinstalls it. Only dataflows it installed are
ever dropped; those installed through ``MaintainView`` are not its business. Stopping the
controller leaves its dataflows installed: the host owns their life after that.

``applied_upper`` is the catalog time the controller has acted on: every install and drop the
catalog called for at the times below it has been attempted. A failed attempt does not hold it
back. The failure is logged, shown by :meth:`CatalogController.failures`, and retried with
backoff (at once when the catalog changes the dataflow again). Holding ``applied_upper`` back
would make every ``Peek`` on the cluster wait on one broken item, including peeks that have
nothing to do with it; a peek of the failed dataflow itself finds no such dataflow, an error
rather than a wrong answer.

The subscription survives catalog restarts: it resubscribes, with backoff, at the last complete
time it saw (``frontier - 1``), whose snapshot replaces the contents, so nothing is installed
twice. If the catalog has compacted that time away meanwhile, it starts over at the current
catalog time, which works the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from structlog.typing import FilteringBoundLogger

from services.compute.catalog_plans import cluster_dataflows
from services.compute.spec import DataflowHost, DataflowSpec
from tidemark.catalog_contents import CatalogContents
from tidemark.catalog_items import cluster_named
from tidemark.change_signal import ChangeSignal
from tidemark.clients.catalog import CatalogClient
from tidemark.errors import DeadlineExceeded, FailedPrecondition, TidemarkError
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import catalog_pb2

logger = get_logger("tidemark.compute.controller")

StartTime = Callable[[], Awaitable[int]]


@dataclass(frozen=True)
class ControllerRetry:
    """Delays between attempts (resubscribing, reinstalling): jittered, doubling from
    ``initial_backoff`` up to ``max_backoff``, forever."""

    initial_backoff: float = 0.1
    max_backoff: float = 10.0

    def delay(self, attempt: int) -> float:
        """The wait after the ``attempt``-th failure in a row (1 for the first)."""
        base = min(self.initial_backoff * 2.0 ** min(attempt - 1, 30), self.max_backoff)
        return base * (0.5 + random.random() / 2)


DEFAULT_RETRY = ControllerRetry()


@dataclass
class _Failure:
    action: Literal["install", "drop"]
    # The spec an install failed for; a new spec is tried at once.
    spec: DataflowSpec | None
    error: str
    attempts: int
    retry_at: float


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, TidemarkError) else repr(exc)


class CatalogController:
    """See the module docs. ``run`` it in a task; cancel the task to stop."""

    def __init__(
        self,
        *,
        cluster_name: str,
        catalog: CatalogClient,
        host: DataflowHost,
        start_time: StartTime,
        retry: ControllerRetry = DEFAULT_RETRY,
    ) -> None:
        """``start_time``: where a fresh subscription starts, a catalog time readable now (the
        oracle's catalog read time)."""
        self.cluster_name = cluster_name
        self.catalog = catalog
        self.host = host
        self.retry = retry
        self._start_time = start_time
        self._contents = CatalogContents()
        self._cluster_id: str | None = None
        self._applied_upper = 0
        self._applied = ChangeSignal()
        self._contents_changed = asyncio.Event()
        self._installed: dict[str, DataflowSpec] = {}
        self._failures: dict[str, _Failure] = {}
        self._invalid: dict[str, str] = {}
        self.started_at: int | None = None
        """The catalog time the first subscription started at (``None`` before it did)."""
        self.follow_error: str | None = None
        """Why following the catalog fails right now (``None`` while it works)."""

    @property
    def _log(self) -> FilteringBoundLogger:
        # Bound per use, not once: a logger bound before logging is configured keeps the
        # configuration of that moment.
        return logger.bind(cluster=self.cluster_name)

    # -- public view -----------------------------------------------------------------------
    @property
    def cluster_id(self) -> str | None:
        """The GlobalId of the cluster item named ``cluster_name``, as of ``applied_upper``
        (``None`` before it is seen, and after it is dropped)."""
        return self._cluster_id

    @property
    def applied_upper(self) -> int:
        """Every catalog change at a time below this has been applied (see the module docs)."""
        return self._applied_upper

    @property
    def caught_up(self) -> bool:
        """Whether every catalog change up to the time the controller started at has been
        applied: the cluster runs (or is installing) what the catalog held then."""
        return self.started_at is not None and self._applied_upper > self.started_at

    def installed(self) -> dict[str, DataflowSpec]:
        """The dataflows this controller installed and has not dropped, by id."""
        return dict(self._installed)

    def failures(self) -> dict[str, str]:
        """Why a catalog item of this cluster is not running as the catalog says, by id: its
        spec could not be built, or its install or drop failed (and is being retried)."""
        found = dict(self._invalid)
        found.update({dataflow_id: f.error for dataflow_id, f in self._failures.items()})
        return found

    async def wait_applied(self, catalog_ts: int, timeout_s: float) -> int:
        """Wait until ``applied_upper > catalog_ts``; returns ``applied_upper``. Raises
        ``DeadlineExceeded`` after ``timeout_s`` seconds."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._applied_upper <= catalog_ts:
                    await self._applied.wait_past(self._applied.token)
        except TimeoutError:
            raise DeadlineExceeded(
                f"cluster {self.cluster_name!r} has applied the catalog below time "
                f"{self._applied_upper}, not yet catalog time {catalog_ts} "
                f"(waited {timeout_s:g} s)"
            ) from None
        return self._applied_upper

    # -- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Follow the catalog and reconcile, until cancelled."""
        self._log.info("compute_controller_started")
        follower = asyncio.create_task(self._follow(), name="controller-follow")
        try:
            await self._reconcile_forever()
        finally:
            await cancel_and_wait(follower)

    async def _follow(self) -> None:
        """Keep ``_contents`` current, resubscribing after any failure."""
        failures = 0
        fresh = True
        while True:
            try:
                start = await self._start_time() if fresh else self._contents.frontier - 1
                if self.started_at is None:
                    self.started_at = start
                self._log.info("compute_catalog_subscribing", at=start)
                first = True
                async for progress in self.catalog.subscribe_at(start):
                    self._contents.apply(progress, snapshot=first)
                    first = False
                    failures = 0
                    self.follow_error = None
                    self._contents_changed.set()
                fresh = self._contents.frontier == 0
                self._log.warning("compute_catalog_subscription_ended")
            except asyncio.CancelledError:
                raise
            except FailedPrecondition as exc:
                # The catalog compacted the time we meant to resume at: start over at the
                # current time (its snapshot replaces the contents all the same). A current
                # time already compacted means the oracle's timeline is not the catalog's.
                self.follow_error = exc.message
                if fresh:
                    self.follow_error += (
                        "; the oracle's catalog read time is older than the catalog's history: "
                        "does this cluster read the oracle timeline the catalog writes?"
                    )
                failures += 1
                fresh = True
                self._log.warning("compute_catalog_resume_failed", error=self.follow_error)
            except Exception as exc:
                failures += 1
                fresh = self._contents.frontier == 0
                self.follow_error = _message(exc)
                self._log.warning(
                    "compute_catalog_subscription_failed", error=_message(exc), attempt=failures
                )
            await asyncio.sleep(self.retry.delay(max(failures, 1)))

    async def _reconcile_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            timeout = None
            if self._failures:
                next_retry = min(f.retry_at for f in self._failures.values())
                timeout = max(0.0, next_retry - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._contents_changed.wait()
            self._contents_changed.clear()
            frontier, items = self._contents.frontier, self._contents.items()
            if frontier == 0:
                continue
            try:
                await self._reconcile(items)
            except Exception as exc:  # a bug must not stop the cluster following the catalog
                self._log.exception("compute_controller_reconcile_failed", error=_message(exc))
                await asyncio.sleep(self.retry.max_backoff)
                self._contents_changed.set()
                continue
            if frontier > self._applied_upper:
                self._applied_upper = frontier
                self._applied.notify()

    async def _reconcile(self, items: list[catalog_pb2.CatalogItem]) -> None:
        """Make the installed dataflows match the catalog ``items``."""
        cluster = cluster_named(items, self.cluster_name)
        cluster_id = None if cluster is None else cluster.id
        if cluster_id != self._cluster_id:
            self._log.info("compute_cluster_changed", cluster_id=cluster_id)
            self._cluster_id = cluster_id
        desired, invalid = cluster_dataflows(items, cluster_id)
        self._report_invalid(invalid)
        for dataflow_id in sorted(self._installed):
            if desired.get(dataflow_id) != self._installed[dataflow_id]:
                await self._drop(dataflow_id)
        for dataflow_id in sorted(desired):
            if dataflow_id not in self._installed:
                await self._install(desired[dataflow_id])
        # Forget failures the catalog has made moot (the item went, or changed back).
        self._failures = {
            dataflow_id: failure
            for dataflow_id, failure in self._failures.items()
            if self._still_pending(dataflow_id, failure, desired)
        }

    def _still_pending(
        self, dataflow_id: str, failure: _Failure, desired: dict[str, DataflowSpec]
    ) -> bool:
        installed = self._installed.get(dataflow_id)
        if failure.action == "drop":
            return installed is not None and desired.get(dataflow_id) != installed
        return installed is None and desired.get(dataflow_id) == failure.spec

    def _report_invalid(self, invalid: dict[str, str]) -> None:
        for item_id, error in sorted(invalid.items()):
            if self._invalid.get(item_id) != error:
                self._log.error("compute_catalog_item_invalid", item_id=item_id, error=error)
        self._invalid = invalid

    def _due(self, dataflow_id: str, action: str, spec: DataflowSpec | None) -> bool:
        failure = self._failures.get(dataflow_id)
        if failure is None or failure.action != action or failure.spec != spec:
            return True
        return failure.retry_at <= asyncio.get_running_loop().time()

    def _failed(
        self,
        dataflow_id: str,
        action: Literal["install", "drop"],
        spec: DataflowSpec | None,
        exc: Exception,
    ) -> None:
        previous = self._failures.get(dataflow_id)
        same = previous is not None and previous.action == action and previous.spec == spec
        attempts = previous.attempts + 1 if previous is not None and same else 1
        delay = self.retry.delay(attempts)
        error = f"{action} failed: {_message(exc)}"
        self._failures[dataflow_id] = _Failure(
            action, spec, error, attempts, asyncio.get_running_loop().time() + delay
        )
        self._log.warning(
            f"compute_dataflow_{action}_failed",
            dataflow_id=dataflow_id,
            error=_message(exc),
            attempt=attempts,
            retry_in_s=round(delay, 3),
        )

    async def _drop(self, dataflow_id: str) -> None:
        if not self._due(dataflow_id, "drop", None):
            return
        try:
            await self.host.drop(dataflow_id)
        except Exception as exc:
            self._failed(dataflow_id, "drop", None, exc)
            return
        del self._installed[dataflow_id]
        self._failures.pop(dataflow_id, None)
        self._log.info("compute_dataflow_dropped", dataflow_id=dataflow_id)

    async def _install(self, spec: DataflowSpec) -> None:
        if not self._due(spec.dataflow_id, "install", spec):
            return
        try:
            await self.host.install(spec)
        except Exception as exc:
            self._failed(spec.dataflow_id, "install", spec, exc)
            return
        self._installed[spec.dataflow_id] = spec
        failure = self._failures.pop(spec.dataflow_id, None)
        self._log.info(
            "compute_dataflow_installed",
            dataflow_id=spec.dataflow_id,
            inputs=[i.collection_id for i in spec.inputs],
            output=spec.output_collection_id,
            index_key_columns=spec.index_key_columns,
            attempts=1 if failure is None else failure.attempts + 1,
        )
