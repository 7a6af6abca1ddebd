"""Keeps idle tables' uppers moving with the oracle's read time.

A table's upper only moves when someone appends to it. Reads advance the tables they read
themselves, but a materialized view or an index over a table nobody writes or reads would
stop advancing with it (its upper is the least of its inputs' uppers), and so would every
subscription or materialized view joined with it. Every ``interval`` this task advances every
table of the catalog past the current read timestamp with empty appends, the way a single
coordinator would close out each table's timestamp. Several adapters doing it at once is
harmless: an advance that finds the upper already moved leaves it alone.
"""

from __future__ import annotations

import asyncio

from services.adapter.catalog_cache import CatalogCache
from services.adapter.timestamps import Timestamps
from tidemark.errors import TidemarkError
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait

log = get_logger("services.adapter.table_ticker")


class TableTicker:
    def __init__(self, timestamps: Timestamps, cache: CatalogCache, interval_s: float) -> None:
        self.timestamps = timestamps
        self.cache = cache
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="table-ticker")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def tick(self) -> None:
        """Advances every table past the current read timestamp."""
        tables = [item.id for item in self.cache.latest().of_kind("table")]
        if not tables:
            return
        read_ts = await self.timestamps.read_ts()
        await self.timestamps.make_readable(tables, read_ts)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
            except (TidemarkError, OSError) as exc:
                # A table dropped mid-tick or a backend outage: the next tick tries again.
                log.warning("table_tick_failed", error=str(exc))
