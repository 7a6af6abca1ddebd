"""Timestamps for statements, and table frontiers that let a read at them complete.

Reads happen at ``r = ReadTs(data)``: every acknowledged write is at or below it. A read at
``r`` needs every input's upper beyond ``r``. Tables only move when written, so the adapter
advances a lagging table itself with an empty append (``expected_upper`` = its upper,
``new_upper = r + 1``); a lost race just looks again. Sources and materialized views move on
their own (their feed, their dataflow); compute waits for them.

Uppers seen here are remembered: an upper only grows, so a remembered one is a safe lower
bound that often spares a ``Describe``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from services.adapter.holds import CollectionHolds
from services.adapter.results import INVALID_PARAMETER
from services.adapter.sql.errors import SqlError
from tidemark import timelines
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar.updates import frontier_bound
from tidemark.errors import FailedPrecondition, PermissionDenied
from tidemark.frontier import Antichain


class Timestamps:
    """The oracle's timelines, and the uppers of the collections this adapter reads."""

    def __init__(
        self,
        oracle: OracleClient,
        storage: StorageClient,
        holds: CollectionHolds,
        *,
        data_timeline: str = timelines.DATA,
        catalog_timeline: str = timelines.CATALOG,
    ) -> None:
        self.oracle = oracle
        self.storage = storage
        self.holds = holds
        self.data_timeline = data_timeline
        self.catalog_timeline = catalog_timeline
        self._known_upper: dict[str, int] = {}

    # -- the oracle -----------------------------------------------------------------------

    async def read_ts(self) -> int:
        return await self.oracle.read_ts(self.data_timeline)

    async def as_of_or_now(self, as_of: int | None, position: int = 0) -> int:
        """The time a read ``AS OF as_of`` happens at (no ``AS OF``: now, ``read_ts``). A
        time later than now is refused: making the tables readable there would move their
        uppers past every write timestamp the oracle hands out until then, and hold back
        every write to them."""
        now = await self.read_ts()
        if as_of is None:
            return now
        if as_of > now:
            raise SqlError(
                INVALID_PARAMETER,
                f"AS OF {as_of} is later than the latest complete time, {now}",
                position,
                hint="read AS OF a time that has passed",
            )
        return as_of

    async def write_ts(self) -> int:
        return await self.oracle.write_ts(self.data_timeline)

    async def apply_write(self, timestamp: int) -> None:
        await self.oracle.apply_write(self.data_timeline, timestamp)

    async def catalog_read_ts(self) -> int:
        return await self.oracle.read_ts(self.catalog_timeline)

    async def catalog_write_ts(self) -> int:
        return await self.oracle.write_ts(self.catalog_timeline)

    # -- uppers ---------------------------------------------------------------------------

    def saw_upper(self, collection_id: str, upper: Antichain[int] | int | None) -> None:
        """Remember an upper observed (or produced) for ``collection_id``."""
        value = upper if isinstance(upper, int) or upper is None else frontier_bound(upper)
        if value is None:
            return
        if value > self._known_upper.get(collection_id, -1):
            self._known_upper[collection_id] = value

    def known_upper(self, collection_id: str) -> int | None:
        return self._known_upper.get(collection_id)

    async def upper(self, collection_id: str) -> int | None:
        """The collection's current upper (``None``: closed for good)."""
        info = await self.storage.describe(collection_id)
        value = frontier_bound(info.upper)
        self.saw_upper(collection_id, value)
        return value

    async def advance_table(self, collection_id: str, target: int) -> int:
        """Make the table's upper at least ``target`` (empty appends); the upper found."""
        known = self._known_upper.get(collection_id)
        if known is not None and known >= target:
            return known
        while True:
            upper = await self.upper(collection_id)
            if upper is None:
                raise FailedPrecondition(f"collection {collection_id} is closed")
            if upper >= target:
                return upper
            capability = await self.holds.write(collection_id)
            async with self.holds.append_lock(collection_id):
                try:
                    result = await self.storage.append(
                        capability, None, target, expected_upper=upper
                    )
                except FailedPrecondition:
                    continue  # someone else moved it: look again
                except PermissionDenied:
                    self.holds.forget(collection_id)  # the lease lapsed: acquire afresh
                    continue
            self.saw_upper(collection_id, result.upper)
            return target

    async def make_readable(self, tables: Iterable[str], timestamp: int) -> None:
        """Advance every table in ``tables`` beyond ``timestamp``."""
        pending = [
            self.advance_table(table, timestamp + 1)
            for table in set(tables)
            if (self._known_upper.get(table) or 0) <= timestamp
        ]
        if pending:
            await asyncio.gather(*pending)
