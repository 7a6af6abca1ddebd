"""The catalog's behaviour, independent of gRPC and of storage.

A :class:`Catalog` serves compare-and-append, snapshots and subscriptions from an in-memory
:class:`~services.catalog.history.CatalogHistory`, and keeps that history in step with the
durable :class:`~services.catalog.log.CatalogLog`:

- appends run one at a time in this process. Each is validated against the exact contents at
  its expected upper, then appended to the log (whose own compare-and-append settles races with
  other catalog processes) and recorded in the history; it is then published to the oracle
  with ``ApplyWrite(timeline, new_upper - 1)`` before the caller hears of it;
- a follower subscribes to the log and records intervals the history lacks (appends made by
  other catalog processes; after a restart, everything);
- maintenance moves ``since`` so that the history covers a bounded window of catalog time,
  lets the log compact to it, and retries a publication to the oracle that failed.

On first start (an empty log) the catalog appends its initial items: the id allocators and,
unless disabled, a default database, schema and cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.catalog.history import CatalogHistory
from services.catalog.index import CatalogIndex, Step, steps_from_updates
from services.catalog.items import Row
from services.catalog.log import CatalogLog, LogUpdate
from services.catalog.validation import consolidate_request, plan_append
from tidemark.cdc import Message, interval_messages
from tidemark.clients.catalog import CatalogUpperMismatch
from tidemark.errors import Indeterminate, TidemarkError, Unavailable
from tidemark.frontier import Antichain
from tidemark.lattice import U64
from tidemark.logging import get_logger
from tidemark.v1 import catalog_pb2

logger = get_logger("tidemark.catalog")

# The storage collection holding the catalog. The system allocator starts above it, so no
# catalog item can ever be bound to this id.
CATALOG_COLLECTION_ID = "s1"
SYSTEM_OWNER = "system"
# Rows per CDCv2 Updates message of a subscription.
SUBSCRIBE_BATCH_ROWS = 1000
# How many committed appends are remembered to answer a repeated request.
RECENT_APPENDS = 1024
# A failure to follow the log counts as current for this long: retries come at most 2 s
# apart, so a log that keeps failing keeps the catalog NOT_SERVING, while a follow that
# resumed (and has nothing to report until the next write) lets it serve again.
FOLLOW_FAILURE_FRESH_S = 5.0


class TimestampOracle(Protocol):
    """What the catalog asks of the oracle (``tidemark.clients.oracle.OracleClient``)."""

    async def write_ts(self, timeline: str) -> int: ...

    async def apply_write(self, timeline: str, timestamp: int) -> None: ...


@dataclass(frozen=True)
class CatalogSettings:
    timeline: str = "catalog"
    # How much catalog time (ms) SnapshotAt/SubscribeAt can look back.
    history_ms: int = 3_600_000
    maintenance_seconds: float = 5.0
    # Longest wait of a SnapshotAt for an incomplete time when the call has no deadline.
    max_wait_seconds: float = 60.0
    # How long start-up waits for the follower to read the log up to its upper.
    catch_up_seconds: float = 60.0
    bootstrap_defaults: bool = True


@dataclass(frozen=True)
class Snapshot:
    as_of: int
    since: int
    upper: int
    rows: list[Row]


def bootstrap_items(defaults: bool) -> list[catalog_pb2.CatalogItem]:
    """The items of a new catalog. System ids start at s2 (s1 is the catalog's collection)."""
    items: list[catalog_pb2.CatalogItem] = []
    next_system = 2
    if defaults:
        database, schema, cluster = (f"s{next_system + i}" for i in range(3))
        next_system += 3
        items += [
            catalog_pb2.CatalogItem(
                id=database,
                name=catalog_pb2.QualifiedName(database="tidemark"),
                owner=SYSTEM_OWNER,
                database=catalog_pb2.Database(),
            ),
            catalog_pb2.CatalogItem(
                id=schema,
                name=catalog_pb2.QualifiedName(database="tidemark", schema="public"),
                owner=SYSTEM_OWNER,
                schema=catalog_pb2.Schema(),
            ),
            catalog_pb2.CatalogItem(
                id=cluster,
                name=catalog_pb2.QualifiedName(item="default"),
                owner=SYSTEM_OWNER,
                # What sizes mean is the compute layer's business; "local" runs in-process.
                cluster=catalog_pb2.Cluster(size="local", replication_factor=1),
            ),
        ]
    for name, next_id in (("system", next_system), ("user", 1)):
        items.append(
            catalog_pb2.CatalogItem(
                owner=SYSTEM_OWNER,
                id_allocator=catalog_pb2.IdAllocator(name=name, next=next_id),
            )
        )
    return items


def _log_updates(steps: Iterable[Step]) -> list[LogUpdate]:
    return [update for step in steps for update in step.updates()]


def _digest(steps: Iterable[Step]) -> bytes:
    """A fingerprint of an append's consolidated updates."""
    digest = hashlib.sha256()
    for data, at, diff in sorted(_log_updates(steps)):
        digest.update(b"%d:%d:%d:" % (at, diff, len(data)))
        digest.update(data)
    return digest.digest()


class Catalog:
    """See the module docs. ``start`` before use, ``close`` after."""

    def __init__(
        self,
        log: CatalogLog,
        oracle: TimestampOracle,
        settings: CatalogSettings | None = None,
    ) -> None:
        self.log = log
        self.oracle = oracle
        self.settings = settings or CatalogSettings()
        self.history = CatalogHistory(0)
        self._append_lock = asyncio.Lock()
        # Bounds and fingerprints of the latest appends committed here, to recognise repeats.
        self._recent: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._log_since = 0
        # A published write the oracle has not acknowledged yet.
        self._unpublished: int | None = None
        self._follow_error: str | None = None
        self._follow_failed_at = 0.0

    # -- life cycle ------------------------------------------------------------------------
    async def start(self) -> None:
        frontiers = await self.log.open()
        self._log_since = frontiers.since
        if frontiers.upper == 0:
            await self._bootstrap()
        self.history = CatalogHistory(frontiers.since)
        self._tasks.append(asyncio.create_task(self._follow(), name="catalog-follower"))
        upper = await self.log.upper()
        await self.history.wait_until_complete(upper - 1, self.settings.catch_up_seconds)
        # A previous life may have crashed between appending and publishing: publish now, so
        # every read timestamp handed out from here on sees what the log holds.
        await self._publish(self.history.upper - 1)
        self._tasks.append(asyncio.create_task(self._maintain(), name="catalog-maintenance"))
        logger.info(
            "catalog_started",
            since=self.history.since,
            upper=self.history.upper,
            items=len(self.history.index),
        )

    def readiness(self) -> str | None:
        """Why the catalog cannot serve right now, or ``None`` when it can: it has caught up
        with its log (``start`` did that before the server started), keeps following it, and
        has told the oracle about every write it committed."""
        if (
            self._follow_error is not None
            and time.monotonic() - self._follow_failed_at < FOLLOW_FAILURE_FRESH_S
        ):
            return f"following the catalog log fails: {self._follow_error}"
        if self._unpublished is not None:
            return f"catalog time {self._unpublished} is not yet published to the oracle"
        return None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.log.close()

    async def _bootstrap(self) -> None:
        ts = await self.oracle.write_ts(self.settings.timeline)
        updates = [
            catalog_pb2.CatalogUpdate(item=item, time=ts, diff=1)
            for item in bootstrap_items(self.settings.bootstrap_defaults)
        ]
        steps = plan_append(CatalogIndex(), updates, 0, ts + 1)
        try:
            await self.log.compare_and_append(_log_updates(steps), 0, ts + 1)
            logger.info("catalog_bootstrapped", time=ts, items=len(updates))
        except CatalogUpperMismatch:
            logger.info("catalog_bootstrapped_elsewhere")

    # -- writing ---------------------------------------------------------------------------
    async def compare_and_append(
        self,
        expected_upper: int,
        new_upper: int,
        updates: Sequence[catalog_pb2.CatalogUpdate],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the caller's deadline)
    ) -> int:
        """Validate and append (see the module docs); returns the new upper. A repeat of an
        append this process committed (the client retrying after a lost reply) is answered
        as the original was."""
        try:
            async with self._append_lock:
                history = self.history
                if history.upper != expected_upper:
                    await self._reach(expected_upper, timeout)
                steps = plan_append(history.index, updates, expected_upper, new_upper)
                await self.log.compare_and_append(_log_updates(steps), expected_upper, new_upper)
                history.add_interval(steps, new_upper, lower=expected_upper)
                self._remember(expected_upper, new_upper, steps)
            logger.debug("catalog_appended", upper=new_upper, updates=sum(map(len, steps)))
        except CatalogUpperMismatch:
            if not self._is_repeat(expected_upper, new_upper, updates):
                raise
            logger.info("catalog_append_repeated", upper=new_upper)
        # Outside the lock: the next append may go to the log while this one is published.
        # Publications may then reach the oracle out of order, which is harmless: ApplyWrite
        # keeps the maximum, and this reply waits for its own.
        await self._publish(new_upper - 1)
        return new_upper

    def _remember(self, expected_upper: int, new_upper: int, steps: Sequence[Step]) -> None:
        self._recent[(expected_upper, new_upper)] = _digest(steps)
        while len(self._recent) > RECENT_APPENDS:
            self._recent.popitem(last=False)

    def _is_repeat(
        self,
        expected_upper: int,
        new_upper: int,
        updates: Sequence[catalog_pb2.CatalogUpdate],
    ) -> bool:
        """Whether this exact append (same bounds, same consolidated updates) committed here.
        Oracle write timestamps are unique, so two different appends never share bounds."""
        recorded = self._recent.get((expected_upper, new_upper))
        if recorded is None:
            return False
        try:
            steps = consolidate_request(updates, expected_upper, new_upper)
        except TidemarkError:
            return False
        return _digest(steps) == recorded

    async def _reach(self, expected_upper: int, timeout: float | None) -> None:  # noqa: ASYNC109
        """Make the history end exactly at ``expected_upper`` or raise the mismatch."""
        history = self.history
        if history.upper > expected_upper:
            raise CatalogUpperMismatch(expected_upper, history.upper)
        # The history may lag the log (another catalog process appended): ask the log.
        actual = await self.log.upper()
        if actual != expected_upper:
            raise CatalogUpperMismatch(expected_upper, actual)
        await history.wait_until_complete(expected_upper - 1, self._wait_limit(timeout))
        if history.upper != expected_upper:
            raise CatalogUpperMismatch(expected_upper, history.upper)

    async def _publish(self, timestamp: int) -> None:
        """``ApplyWrite`` on the oracle, so every later read timestamp covers ``timestamp``."""
        if timestamp < 0:
            return
        try:
            await self.oracle.apply_write(self.settings.timeline, timestamp)
        except TidemarkError as exc:
            if self._unpublished is None or self._unpublished < timestamp:
                self._unpublished = timestamp
            if isinstance(exc, Unavailable):
                raise Indeterminate(
                    f"the catalog change up to {timestamp} is durable, but the oracle could not "
                    f"be told: {exc.message}"
                ) from exc
            raise
        if self._unpublished is not None and self._unpublished <= timestamp:
            self._unpublished = None

    # -- reading ---------------------------------------------------------------------------
    def _wait_limit(self, timeout: float | None) -> float:
        limit = self.settings.max_wait_seconds
        return limit if timeout is None else max(0.0, min(timeout, limit))

    async def snapshot_at(self, timestamp: int, *, timeout: float | None = None) -> Snapshot:  # noqa: ASYNC109
        """Every item as of ``timestamp``, waiting (bounded) for it to complete."""
        history = self.history
        history.check_readable(timestamp)
        await history.wait_until_complete(timestamp, self._wait_limit(timeout))
        rows = history.rows_at(timestamp)
        return Snapshot(timestamp, history.since, history.upper, rows)

    async def subscribe_at(self, timestamp: int) -> AsyncIterator[Message[bytes, int]]:
        """CDCv2 messages: the contents at ``timestamp``, then each later interval."""
        history = self.history
        hold = history.hold(timestamp)
        try:
            await history.wait_until_complete(timestamp, None)
            upper = history.upper
            updates = [(row.data, timestamp, 1) for row in history.rows_at(timestamp)]
            updates += _log_updates(history.steps_between(timestamp + 1, upper))
            for message in _interval(updates, timestamp, upper):
                yield message
            frontier = upper
            hold.move(frontier - 1)
            while True:
                await history.wait_until_complete(frontier, None)
                upper = history.upper
                steps = history.steps_between(frontier, upper)
                for message in _interval(_log_updates(steps), frontier, upper):
                    yield message
                frontier = upper
                hold.move(frontier - 1)
        finally:
            hold.release()

    # -- background work -------------------------------------------------------------------
    async def _follow(self) -> None:
        """Record what the log reports, resuming after failures from where the history ends."""
        failures = 0
        while True:
            history = self.history
            fresh = history.upper == history.since
            as_of = history.since if fresh else history.upper - 1
            try:
                async for report in self.log.follow(as_of, snapshot=fresh):
                    failures = 0
                    self._follow_error = None
                    history.add_interval(steps_from_updates(report.updates), report.upper)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                message = exc.message if isinstance(exc, TidemarkError) else repr(exc)
                self._follow_error = message
                self._follow_failed_at = time.monotonic()
                logger.warning("catalog_follow_failed", error=message, attempt=failures)
            await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.settings.maintenance_seconds)
            try:
                await self.maintain()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                message = exc.message if isinstance(exc, TidemarkError) else repr(exc)
                logger.warning("catalog_maintenance_failed", error=message)

    async def maintain(self) -> None:
        """One round of maintenance (see the module docs)."""
        if self._unpublished is not None:
            await self._publish(self._unpublished)
        history = self.history
        since = history.advance_since(history.upper - 1 - self.settings.history_ms)
        if since > self._log_since:
            await self.log.downgrade_since(since)
            self._log_since = since


def _interval(updates: list[LogUpdate], lower: int, upper: int) -> list[Message[bytes, int]]:
    return interval_messages(
        updates,
        Antichain(U64, [lower]),
        Antichain(U64, [upper]),
        max_updates=SUBSCRIBE_BATCH_ROWS,
    )
