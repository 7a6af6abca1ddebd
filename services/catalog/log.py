"""The durable catalog log: what the catalog needs from storage, and an in-memory stand-in.

The catalog's rows are opaque bytes (canonical ``CatalogItem`` encodings) in one collection
on the u64 catalog timeline. :class:`CatalogLog` is the handful of operations the catalog uses
on it; :class:`services.catalog.storage_log.StorageCatalogLog` implements them on the storage
service and :class:`MemoryCatalogLog` in memory, for unit tests.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from tidemark.clients.catalog import CatalogUpperMismatch
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.updates import consolidate

LogUpdate = tuple[bytes, int, int]
"""``(row, time, diff)``."""


@dataclass(frozen=True)
class LogFrontiers:
    since: int
    upper: int


@dataclass(frozen=True)
class LogReport:
    """Every update with a time below ``upper`` not reported before: the log is complete
    through ``upper``."""

    updates: list[LogUpdate]
    upper: int


class CatalogLog(ABC):
    """One durable, totally ordered collection of rows (see the module docs)."""

    @abstractmethod
    async def open(self) -> LogFrontiers:
        """Create the collection if it does not exist, take the capabilities to read and write
        it, and return its frontiers."""

    @abstractmethod
    async def upper(self) -> int:
        """The collection's current upper, freshly read."""

    @abstractmethod
    async def compare_and_append(
        self, updates: Sequence[LogUpdate], expected_upper: int, new_upper: int
    ) -> None:
        """Append iff the upper is ``expected_upper``; raises :class:`CatalogUpperMismatch`
        with the current upper otherwise. Durable when it returns."""

    @abstractmethod
    def follow(self, as_of: int, *, snapshot: bool) -> AsyncIterator[LogReport]:
        """Reports in upper order, forever. With ``snapshot`` the first report holds the
        contents at ``as_of`` (times advanced to ``as_of``) and every later update; without,
        only updates at times after ``as_of``. ``as_of`` must not be before the since."""

    @abstractmethod
    async def downgrade_since(self, since: int) -> None:
        """Allow the collection to forget history before ``since``."""

    @abstractmethod
    async def close(self) -> None:
        """Stop background work. The capabilities stay (a restart re-acquires them)."""


class MemoryCatalogLog(CatalogLog):
    """The log in memory, with the same compare-and-append contract. Survives a catalog's
    close, so tests can restart a catalog on it."""

    def __init__(self) -> None:
        self.since = 0
        self.current_upper = 0
        self.updates: list[LogUpdate] = []
        self.appends = 0
        self.opened = 0
        self._advanced = asyncio.Event()

    async def open(self) -> LogFrontiers:
        self.opened += 1
        return LogFrontiers(self.since, self.current_upper)

    async def upper(self) -> int:
        return self.current_upper

    async def compare_and_append(
        self, updates: Sequence[LogUpdate], expected_upper: int, new_upper: int
    ) -> None:
        if expected_upper != self.current_upper:
            raise CatalogUpperMismatch(expected_upper, self.current_upper)
        for _, time, _ in updates:
            if not expected_upper <= time < new_upper:
                raise InvalidArgument(f"update at {time} outside [{expected_upper}, {new_upper})")
        self.updates.extend(updates)
        self.current_upper = new_upper
        self.appends += 1
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def follow(self, as_of: int, *, snapshot: bool) -> AsyncIterator[LogReport]:
        if as_of < self.since:
            raise FailedPrecondition(f"as_of {as_of} is before the since {self.since}")
        while self.current_upper <= as_of:
            await self._advanced.wait()
        reported = self.current_upper
        first = [
            (data, max(time, as_of), diff)
            for data, time, diff in self.updates
            if (snapshot or time > as_of) and time < reported
        ]
        yield LogReport(consolidate(first), reported)
        while True:
            if self.current_upper == reported:
                await self._advanced.wait()
                continue
            upper = self.current_upper
            fresh = [u for u in self.updates if reported <= u[1] < upper]
            reported = upper
            yield LogReport(consolidate(fresh), upper)

    async def downgrade_since(self, since: int) -> None:
        if since > self.since:
            self.since = since
            self.updates = consolidate(
                (data, max(time, since), diff) for data, time, diff in self.updates
            )

    async def close(self) -> None:
        return None
