"""A local copy of the catalog, kept current by following ``Catalog.SubscribeAt``.

Every statement is planned against the catalog as of a catalog time ``c`` (the oracle's read
timestamp of the catalog timeline). Asking the catalog for a snapshot per statement would cost
a round trip and a copy of every item; instead each adapter follows the catalog's changes and
answers ``state_at(c)`` locally once its copy is complete past ``c``.

The copy keeps the current items and the recent changes, so it can also answer for a ``c``
slightly behind its frontier (by undoing the newer changes); for older times it asks the
catalog for a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from tidemark.catalog_items import allocator_key, cluster_named, item_key
from tidemark.change_signal import ChangeSignal
from tidemark.clients.catalog import CatalogChange, CatalogClient
from tidemark.errors import DeadlineExceeded, FailedPrecondition, TidemarkError
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import catalog_pb2

log = get_logger("services.adapter.catalog_cache")

# Changes kept for answering ``state_at`` a little behind the frontier without a round trip.
RECENT_CHANGES = 2048
RESUBSCRIBE = RetryPolicy(total_seconds=1e9, initial_backoff=0.05, max_backoff=1.0)

Listener = Callable[[list[CatalogChange]], None]


def kind_of(item: catalog_pb2.CatalogItem) -> str:
    return item.WhichOneof("body") or ""


class CatalogState:
    """The catalog's items at one catalog time. Never changed once built: it is shared by every
    statement planned at that time (``memo`` caches what they derive from it)."""

    def __init__(self, time: int, items: Mapping[str, catalog_pb2.CatalogItem]) -> None:
        self.time = time
        self._items = dict(items)
        self.memo: dict[str, Any] = {}

    @property
    def items(self) -> list[catalog_pb2.CatalogItem]:
        return list(self._items.values())

    def __iter__(self) -> Iterator[catalog_pb2.CatalogItem]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def get(self, global_id: str) -> catalog_pb2.CatalogItem | None:
        return self._items.get(global_id)

    def allocator(self, name: str) -> catalog_pb2.CatalogItem:
        item = self._items.get(allocator_key(name))
        if item is None:
            raise FailedPrecondition(f"the catalog has no {name!r} id allocator")
        return item

    def of_kind(self, *kinds: str) -> list[catalog_pb2.CatalogItem]:
        return [item for item in self._items.values() if kind_of(item) in kinds]

    def cluster_named(self, name: str) -> catalog_pb2.CatalogItem | None:
        return cluster_named(self._items.values(), name)

    def direct_dependents(self, global_id: str) -> list[catalog_pb2.CatalogItem]:
        return [item for item in self._items.values() if global_id in item.depends_on]

    def dependents(self, global_ids: Iterable[str]) -> list[catalog_pb2.CatalogItem]:
        """Every item that depends, directly or not, on one of ``global_ids`` (not those
        themselves), dependents after what they depend on."""
        start = set(global_ids)
        found: dict[str, catalog_pb2.CatalogItem] = {}
        frontier = list(start)
        while frontier:
            current = frontier.pop()
            for item in self.direct_dependents(current):
                if item.id not in found and item.id not in start:
                    found[item.id] = item
                    frontier.append(item.id)
        return list(found.values())

    def with_changes(self, time: int, changes: Iterable[CatalogChange]) -> CatalogState:
        """A new state: this one with ``changes`` applied."""
        items = dict(self._items)
        _apply(items, changes)
        return CatalogState(time, items)


def _apply(items: dict[str, catalog_pb2.CatalogItem], changes: Iterable[CatalogChange]) -> None:
    # Retractions first: an item's replacement at one time retracts the old row and inserts
    # the new one under the same key.
    ordered = sorted(changes, key=lambda change: change.diff)
    for change in ordered:
        key = item_key(change.item)
        if change.diff < 0:
            if key in items and items[key] == change.item:
                del items[key]
        else:
            items[key] = change.item


def _undo(items: dict[str, catalog_pb2.CatalogItem], changes: Iterable[CatalogChange]) -> None:
    _apply(items, [CatalogChange(c.item, c.time, -c.diff) for c in changes])


class CatalogCache:
    """Follows the catalog from ``start``; ``state_at(c)`` answers from memory once the copy
    is complete past ``c``."""

    def __init__(
        self, catalog: CatalogClient, restart_at: Callable[[], Awaitable[int]] | None = None
    ) -> None:
        self.catalog = catalog
        # Where to start over when the catalog has compacted away where the copy stopped.
        self._restart_at = restart_at
        self._current = CatalogState(0, {})
        self._frontier = 0
        self._recent: deque[CatalogChange] = deque()
        # Times below this may have lost changes from ``_recent``: ask the catalog instead.
        self._recent_from = 0
        self._signal = ChangeSignal()
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._failure: TidemarkError | None = None

    @property
    def frontier(self) -> int:
        """Every catalog time below this is complete in the copy."""
        return self._frontier

    @property
    def failure(self) -> TidemarkError | None:
        """Why following the catalog fails right now (``None`` while it works)."""
        return self._failure

    def latest(self) -> CatalogState:
        """The copy's newest state, at ``frontier - 1``."""
        return self._current

    def add_listener(self, listener: Listener) -> None:
        """``listener(changes)`` is called with every batch of changes applied after the
        first snapshot."""
        self._listeners.append(listener)

    async def start(self, at: int) -> None:
        """Load the catalog as of ``at`` and follow it from there."""
        self._task = asyncio.create_task(self._follow(at), name="catalog-cache")
        await self.wait_for(at + 1, timeout=60.0)

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def wait_for(self, upper: int, timeout: float) -> None:  # noqa: ASYNC109
        """Return once every time below ``upper`` is complete in the copy."""
        try:
            async with asyncio.timeout(timeout):
                while self._frontier < upper:
                    token = self._signal.token
                    if self._frontier >= upper:
                        break
                    await self._signal.wait_past(token)
        except TimeoutError:
            reason = f": {self._failure.message}" if self._failure is not None else ""
            raise DeadlineExceeded(
                f"the adapter's copy of the catalog did not reach catalog time {upper - 1} "
                f"within {timeout:g} s (it is complete below {self._frontier}){reason}"
            ) from None

    async def state_at(self, time: int, timeout: float = 30.0) -> CatalogState:  # noqa: ASYNC109
        """The catalog as of ``time``, waiting (up to ``timeout``) for the copy to get there."""
        await self.wait_for(time + 1, timeout)
        current = self._current
        newer = [c for c in self._recent if c.time > time]
        if not newer:
            return current
        if time < self._recent_from:
            snapshot = await self.catalog.snapshot_at(time, timeout=timeout)
            return CatalogState(time, {item_key(item): item for item in snapshot.items})
        items = dict(current._items)
        _undo(items, newer)
        return CatalogState(time, items)

    # -- following the catalog ------------------------------------------------------------

    async def _follow(self, at: int) -> None:
        backoff = RESUBSCRIBE.backoffs()
        start = at
        while True:
            try:
                first = True
                async for progress in self.catalog.subscribe_at(start):
                    if first:
                        self._load_snapshot(progress.changes, start)
                        first = False
                    else:
                        self._advance(progress.changes, progress.frontier)
                    self._frontier = max(self._frontier, progress.frontier)
                    self._failure = None
                    backoff = RESUBSCRIBE.backoffs()
                    self._signal.notify()
                    start = self._frontier - 1
                raise FailedPrecondition("the catalog ended its subscription")
            except asyncio.CancelledError:
                raise
            except TidemarkError as exc:
                self._failure = exc
                log.warning("catalog_subscription_lost", error=exc.message, resume_at=start)
                await backoff.sleep()
                if (
                    isinstance(exc, FailedPrecondition)
                    and "since" in exc.message
                    and self._restart_at is not None
                ):
                    # Compacted past where we stopped: start over at the newest catalog.
                    with contextlib.suppress(TidemarkError):
                        start = max(start, await self._restart_at())
            except Exception as exc:  # a bug must not stop the copy from following
                log.exception("catalog_cache_failed", error=str(exc))
                await backoff.sleep()

    def _load_snapshot(self, changes: list[CatalogChange], time: int) -> None:
        """The first report of a (re)subscription: the whole catalog at ``time``."""
        items: dict[str, catalog_pb2.CatalogItem] = {}
        _apply(items, [c for c in changes if c.diff > 0])
        old = self._current._items
        if self._frontier == 0:
            self._current = CatalogState(time, items)
            self._recent_from = time
            return
        # A resubscription: whatever differs from our copy changed after our frontier.
        differences = [
            CatalogChange(item, time, -1) for key, item in old.items() if items.get(key) != item
        ] + [CatalogChange(item, time, 1) for key, item in items.items() if old.get(key) != item]
        self._current = CatalogState(time, items)
        if differences:
            self._record(differences)

    def _advance(self, changes: list[CatalogChange], frontier: int) -> None:
        if changes:
            items = dict(self._current._items)
            for time in sorted({c.time for c in changes}):
                _apply(items, [c for c in changes if c.time == time])
            self._current = CatalogState(frontier - 1, items)
            self._record(changes)
        elif frontier - 1 != self._current.time:
            # Nothing changed: the same items now describe a later time too, and what
            # statements derived from them still holds.
            unchanged = CatalogState(frontier - 1, self._current._items)
            unchanged.memo = self._current.memo
            self._current = unchanged

    def _record(self, changes: list[CatalogChange]) -> None:
        """Remember ``changes`` (already applied to the current state) and tell listeners."""
        self._recent.extend(sorted(changes, key=lambda c: c.time))
        while len(self._recent) > RECENT_CHANGES:
            dropped = self._recent.popleft()
            self._recent_from = max(self._recent_from, dropped.time)
        for listener in self._listeners:
            try:
                listener(changes)
            except Exception as exc:
                log.exception("catalog_listener_failed", error=str(exc))
