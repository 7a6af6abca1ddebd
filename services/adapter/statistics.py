"""Row counts of storage collections for the optimizer's join ordering, fetched from storage
with one ``List`` call and reused for a few seconds.

Statistics only steer choices (which input a join starts from); a stale or missing count
never changes an answer. So a failed refresh keeps the last counts and is only logged, and a
statement never waits on more than one refresh.
"""

from __future__ import annotations

import asyncio
import time

from tidemark.clients.storage import StorageClient
from tidemark.errors import TidemarkError
from tidemark.logging import get_logger
from tidemark.plan.optimize import NO_STATISTICS, Statistics

log = get_logger("services.adapter.statistics")


class CollectionStatistics:
    def __init__(self, storage: StorageClient, *, max_age_seconds: float = 5.0) -> None:
        self.storage = storage
        self.max_age_seconds = max_age_seconds
        self._current = NO_STATISTICS
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    @property
    def current(self) -> Statistics:
        return self._current

    async def fresh(self) -> Statistics:
        """Counts no older than ``max_age_seconds`` when storage answers, else the last."""
        if time.monotonic() - self._fetched_at < self.max_age_seconds:
            return self._current
        async with self._lock:
            if time.monotonic() - self._fetched_at < self.max_age_seconds:
                return self._current
            try:
                collections = await self.storage.list()
            except TidemarkError as exc:
                log.warning("statistics_refresh_failed", error=exc.message)
            else:
                self._current = Statistics({c.collection_id: c.rows for c in collections})
            self._fetched_at = time.monotonic()
        return self._current
