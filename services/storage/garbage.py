"""Deleting blobs that no shard state references any more.

Two kinds of garbage:

- retired blobs: batches compaction replaced. The state lists them with the time they were
  retired; they are deleted once ``retired_grace_ms`` has passed, so that reads of the older
  state finish first (a read that is slower still starts over; see
  :mod:`services.storage.reads`), and then dropped from the state.
- orphans: blobs written by an append or a merge whose compare-and-set never happened (the
  process crashed, or the compare-and-set failed in an unknown way). They are found by
  listing the shard's blobs. A blob is only deleted once it is older than
  ``orphan_grace_ms``: an append refuses to commit a blob older than half of that (see
  :class:`services.storage.operations.Policy`), so a blob that old can no longer become
  referenced. This assumes the storage processes' clocks agree to well within that margin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.storage.batches import BatchStore
from services.storage.operations import forget_retired
from services.storage.shards import ShardStore, Versioned
from tidemark.logging import get_logger
from tidemark.part_keys import written_ms

log = get_logger("storage.garbage")


class GarbageCollector:
    def __init__(
        self,
        shards: ShardStore,
        batches: BatchStore,
        *,
        retired_grace_ms: int,
        orphan_grace_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self.shards = shards
        self.batches = batches
        self.retired_grace_ms = retired_grace_ms
        self.orphan_grace_ms = orphan_grace_ms
        self.clock = clock

    def retired_due(self, versioned: Versioned) -> list[str]:
        now = self.clock()
        return [
            r.key for r in versioned.state.retired if now - r.retired_ms >= self.retired_grace_ms
        ]

    async def collect_retired(self, versioned: Versioned) -> int:
        """Delete the retired blobs whose grace period is over; how many."""
        due = self.retired_due(versioned)
        if not due:
            return 0
        await asyncio.gather(*(self.batches.delete(key) for key in due))
        await self.shards.update(versioned.state.collection_id, forget_retired(due))
        log.debug("retired_deleted", collection=versioned.state.collection_id, blobs=len(due))
        return len(due)

    async def sweep_orphans(self, collection_id: str) -> int:
        """Delete the shard's blobs that its state does not reference and that are too old to
        become referenced; how many."""
        listed = await self.batches.keys(collection_id)
        # Read the state after listing: any blob committed before the listing is in it.
        state = (await self.shards.require(collection_id)).state
        referenced = {k for b in state.batches for k in b.keys} | {r.key for r in state.retired}
        now = self.clock()
        doomed = []
        for key in listed:
            written = written_ms(key)
            if key in referenced or written is None:
                continue
            if now - written > self.orphan_grace_ms:
                doomed.append(key)
        await asyncio.gather(*(self.batches.delete(key) for key in doomed))
        if doomed:
            log.info("orphans_deleted", collection=collection_id, blobs=len(doomed))
        return len(doomed)
