"""The background pass over every shard: expire leases, compact, collect garbage.

Leases are checked against the wall clock on every change to a shard, but a shard nobody
touches needs someone to write the expiry down so its since can advance; this pass does. Any
number of storage processes may run it at once: every change it makes is a compare-and-set
that re-checks what it decided.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from services.storage.compaction import Compactor
from services.storage.garbage import GarbageCollector
from services.storage.operations import no_change
from services.storage.shards import ShardStore, Versioned
from tidemark.errors import TidemarkError
from tidemark.logging import get_logger

log = get_logger("storage.maintenance")


class Maintenance:
    def __init__(
        self,
        shards: ShardStore,
        compactor: Compactor,
        garbage: GarbageCollector,
        *,
        interval_s: float,
        orphan_sweep_interval_s: float,
        clock: Callable[[], int],
    ) -> None:
        self.shards = shards
        self.compactor = compactor
        self.garbage = garbage
        self.interval_s = interval_s
        self.orphan_sweep_interval_s = orphan_sweep_interval_s
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self.orphan_sweep_interval_s * random.random()
        while True:
            # Jitter keeps several storage processes from running in lockstep.
            await asyncio.sleep(self.interval_s * (0.75 + random.random() / 2))
            sweep = loop.time() >= next_sweep
            if sweep:
                next_sweep = loop.time() + self.orphan_sweep_interval_s
            try:
                await self.run_once(sweep_orphans=sweep)
            except TidemarkError as exc:
                log.warning("maintenance_failed", error=exc.message)
            except Exception:
                log.exception("maintenance_crashed")

    async def run_once(self, *, sweep_orphans: bool = False) -> None:
        """One pass over every shard."""
        for versioned in await self.shards.scan():
            try:
                await self._tend(versioned, sweep_orphans)
            except TidemarkError as exc:
                log.warning(
                    "shard_maintenance_failed",
                    collection=versioned.state.collection_id,
                    error=exc.message,
                )

    async def _tend(self, versioned: Versioned, sweep_orphans: bool) -> None:
        collection_id = versioned.state.collection_id
        now = self.clock()
        if any(c.expired(now) for c in versioned.state.capabilities):
            await self.shards.update(collection_id, no_change())
        self.compactor.request(collection_id)
        await self.garbage.collect_retired(versioned)
        if sweep_orphans:
            await self.garbage.sweep_orphans(collection_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
