"""The catalog's durable read holds on the storage collections of its objects.

Every table, source and materialized view keeps its contents in a storage collection. Leased
read capabilities come and go with the processes that read (adapters, compute); if the
collection's since depended on them, a crash at the wrong moment could let it run away and
the object could never be read again. So the catalog holds each such collection with a
*critical* read capability (storage.proto: no lease, moved and dropped only explicitly) under
the holder name :data:`CATALOG_HOLDER`. The adapter creates the collection with that hold in
place (``Create`` with ``critical_holder``), so it is held from its first moment; this module
keeps the holds in line with the catalog, one pass (:meth:`CatalogHolds.reconcile`) at a time:

- a collection of a current object gets the hold if it lacks it (one made before holds
  existed); ``AcquireCapabilities(critical)`` returns the existing hold, so the id of the
  capability never needs to be stored anywhere but in the collection's own state;
- the hold trails the collection's upper by ``history_ms`` (the window ``AS OF`` reads in,
  the adapter's ``--history-seconds``), moved only in steps of a tenth of it, so storage can
  compact older times and one pass does not write every collection. It never passes
  ``upper - 1`` of a materialized view reading the collection: a view whose compute was down
  for longer than the window must still be able to go on from where its output stopped;
- a hold on a collection that is no object's any more is dropped: at once when the object was
  seen in an earlier pass (``DROP``), else once the collection is older than ``orphan_grace_ms``
  (dropped while this process was down, or created by an adapter whose append then lost: an
  adapter creates the collection before the append that names it, so a young unnamed one is
  left alone);
- a collection of a current object whose since is already ``{}`` has lost its history: it is
  reported (once) and left for ``ALTER MATERIALIZED VIEW … REBUILD``.

Only collections that carry the catalog's hold, or belong to a current object, are touched:
the catalog's own log collection and anything created outside the catalog are not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from tidemark.catalog_items import CATALOG_HOLDER, collection_of
from tidemark.clients.storage import Capability, CollectionInfo, StorageClient
from tidemark.columnar import frontier_bound
from tidemark.errors import FailedPrecondition, NotFound, PermissionDenied, TidemarkError
from tidemark.logging import get_logger
from tidemark.plan.walk import collections_read
from tidemark.v1 import catalog_pb2, plan_pb2

logger = get_logger("tidemark.catalog.holds")


@dataclass(frozen=True)
class HoldSettings:
    history_ms: int = 900_000
    interval_seconds: float = 5.0
    orphan_grace_ms: int = 300_000


@dataclass
class PassReport:
    """What one pass did, for logs and tests."""

    taken: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


class CatalogHolds:
    def __init__(
        self,
        storage: StorageClient,
        items: Callable[[], Iterable[catalog_pb2.CatalogItem]],
        settings: HoldSettings | None = None,
        *,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.storage = storage
        self.items = items
        """The catalog's current items (the history's latest state)."""
        self.settings = settings or HoldSettings()
        self.clock_ms = clock_ms
        self._holds: dict[str, Capability] = {}
        self._seen: set[str] = set()
        """Collections of objects seen in an earlier pass: gone now means dropped."""
        self._reported_lost: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="catalog-holds")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                report = await self.reconcile()
                if report.taken or report.released:
                    logger.info(
                        "catalog_holds_changed", taken=report.taken, released=report.released
                    )
            except asyncio.CancelledError:
                raise
            except TidemarkError as exc:
                logger.warning("catalog_holds_pass_failed", error=exc.message)
            except Exception:
                logger.exception("catalog_holds_pass_crashed")
            await asyncio.sleep(self.settings.interval_seconds)

    async def reconcile(self) -> PassReport:
        """One pass over the catalog and storage's collections (see the module docs)."""
        report = PassReport()
        items = list(self.items())
        wanted = {cid for item in items if (cid := collection_of(item))}
        listed = await self.storage.list()
        uppers = {info.collection_id: frontier_bound(info.upper) for info in listed}
        bounds = _reader_bounds(items, uppers)
        for info in listed:
            cid = info.collection_id
            try:
                if cid in wanted:
                    await self._keep(info, bounds.get(cid), report)
                elif self._holds_it(info) and self._released_object(info):
                    await self._release(cid)
                    report.released.append(cid)
            except (NotFound, PermissionDenied):
                self._holds.pop(cid, None)  # gone meanwhile; the next pass looks again
            except TidemarkError as exc:
                logger.warning("catalog_hold_failed", collection=cid, error=exc.message)
        self._seen = wanted
        return report

    @staticmethod
    def _holds_it(info: CollectionInfo) -> bool:
        return any(c.critical and c.holder == CATALOG_HOLDER for c in info.capabilities)

    def _released_object(self, info: CollectionInfo) -> bool:
        if info.collection_id in self._seen:
            return True
        return self.clock_ms() - info.created_ms >= self.settings.orphan_grace_ms

    async def _keep(self, info: CollectionInfo, bound: int | None, report: PassReport) -> None:
        cid = info.collection_id
        if info.since.is_empty():
            self._holds.pop(cid, None)
            if not info.upper.is_empty() and cid not in self._reported_lost:
                self._reported_lost.add(cid)
                logger.error("catalog_object_history_lost", collection=cid)
            report.lost.append(cid)
            return
        self._reported_lost.discard(cid)
        hold = self._holds.get(cid)
        if hold is None or not self._holds_it(info):
            try:
                hold = await self.storage.acquire_critical(cid, CATALOG_HOLDER)
            except FailedPrecondition:  # the since ran away since the listing
                report.lost.append(cid)
                return
            if cid not in self._seen and not self._holds_it(info):
                report.taken.append(cid)
            self._holds[cid] = hold
        upper = frontier_bound(info.upper)
        current = frontier_bound(hold.frontier)
        if upper is None or current is None:
            return  # closed: nothing more to compact
        target = upper - self.settings.history_ms
        if bound is not None:
            target = min(target, bound)
        step = min(60_000, self.settings.history_ms // 10)
        if target - current >= max(step, 1):
            self._holds[cid] = await self.storage.downgrade(hold, target)
            report.moved.append(cid)

    async def _release(self, collection_id: str) -> None:
        hold = self._holds.pop(collection_id, None)
        if hold is None:
            hold = await self.storage.acquire_critical(collection_id, CATALOG_HOLDER)
        await self.storage.drop(hold)
        logger.info("catalog_hold_released", collection=collection_id)


def _reader_bounds(
    items: Iterable[catalog_pb2.CatalogItem], uppers: dict[str, int | None]
) -> dict[str, int]:
    """Per collection, the latest time its hold may reach for the materialized views reading
    it: the least ``upper - 1`` of their outputs (a view restarts there)."""
    bounds: dict[str, int] = {}
    for item in items:
        if item.WhichOneof("body") != "materialized_view":
            continue
        output_upper = uppers.get(collection_of(item))
        if output_upper is None:
            continue  # not created yet, or closed
        try:
            read = collections_read(plan_pb2.Plan.FromString(item.materialized_view.plan))
        except DecodeError:  # a plan this process cannot read bounds nothing
            continue
        for cid in read:
            bounds[cid] = min(bounds.get(cid, output_upper - 1), output_upper - 1)
    return bounds
