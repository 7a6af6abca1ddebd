"""Background compaction: merge a shard's batches so it keeps few of them.

Batches are kept like the digits of a binary counter (log-structured merging): scanning from
the oldest, a batch that is not more than twice as large as everything after it that is
already being merged joins that merge. Appending ``n`` single rows then leaves about
``log2(n)`` batches, and each update is rewritten about ``log2(n)`` times in total.

A merge reads its batches, moves their times up to the shard's since and consolidates
(``advance_by``), writes the result as one new blob and swaps it in with one compare-and-set.
Readers see either the old batches or the merged one, never a mixture; the old blobs are
retired and deleted later by the garbage collector. When the since is ``{}`` nothing can be
read any more and the batches are dropped outright.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from services.storage.batches import BatchStore
from services.storage.operations import Policy, replace_batches
from services.storage.shards import ShardStore
from services.storage.state import ShardState, StoredBatch
from tidemark.columnar import advance_by, concat
from tidemark.errors import Aborted, NotFound, TidemarkError
from tidemark.logging import get_logger

log = get_logger("storage.compaction")

# Merges (or attempts) in one compaction call; a shard that still needs more is picked up
# again by the next append or maintenance pass.
MAX_ROUNDS = 64
# Merging this many rows is worth a hop to a worker thread (the event loop keeps serving).
THREAD_ROWS = 20_000


def plan_merges(batches: Sequence[StoredBatch]) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of at least two consecutive batches to merge, oldest first."""
    runs: list[tuple[int, int, int]] = []  # (start, end, rows)
    for index, batch in enumerate(batches):
        runs.append((index, index + 1, max(batch.rows, 1)))
        while len(runs) >= 2 and runs[-2][2] < 2 * runs[-1][2]:
            newer = runs.pop()
            older = runs.pop()
            runs.append((older[0], newer[1], older[2] + newer[2]))
    return [(start, end) for start, end, _ in runs if end - start >= 2]


def needs_compaction(state: ShardState) -> bool:
    if state.since.is_empty():
        return bool(state.batches)
    return bool(plan_merges(state.batches))


class Compactor:
    """Runs compactions in the background, at most one at a time per shard.

    A requested compaction starts after ``delay_s``: appends arriving meanwhile join the same
    merge instead of each paying for one (a burst of ``k`` small appends is then merged once,
    not about ``k`` times), and the appends themselves do not queue behind merge writes. A
    shard with ``urgent_batches`` batches or more is compacted without waiting."""

    def __init__(
        self,
        shards: ShardStore,
        batches: BatchStore,
        policy: Policy,
        *,
        delay_s: float = 0.2,
        urgent_batches: int = 64,
    ) -> None:
        self.shards = shards
        self.batches = batches
        self.policy = policy
        self.delay_s = delay_s
        self.urgent_batches = urgent_batches
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    def request(self, collection_id: str) -> None:
        """Compact ``collection_id`` soon if it needs it (cheap to call after every append)."""
        if collection_id in self._running:
            self._again.add(collection_id)
            return
        seen = self.shards.latest_seen(collection_id)
        if seen is not None and not needs_compaction(seen.state):
            return
        self._running[collection_id] = asyncio.create_task(self._run(collection_id))

    async def _run(self, collection_id: str) -> None:
        try:
            while True:
                seen = self.shards.latest_seen(collection_id)
                if seen is None or len(seen.state.batches) < self.urgent_batches:
                    await asyncio.sleep(self.delay_s)
                self._again.discard(collection_id)
                try:
                    await self.compact(collection_id)
                except TidemarkError as exc:
                    log.warning("compaction_failed", collection=collection_id, error=exc.message)
                    return
                except Exception:
                    log.exception("compaction_crashed", collection=collection_id)
                    return
                if collection_id not in self._again:
                    return
        finally:
            self._running.pop(collection_id, None)

    async def compact(self, collection_id: str) -> int:
        """Merge until the shard needs no more merging; the number of merges done."""
        merges = 0
        for _ in range(MAX_ROUNDS):
            versioned = self.shards.latest_seen(collection_id) or await self.shards.require(
                collection_id
            )
            state = versioned.state
            if state.since.is_empty():
                if not state.batches:
                    return merges
                await self._swap(state, state.batches, None, 0, None)
                return merges + 1
            runs = plan_merges(state.batches)
            if not runs:
                return merges
            start, end = runs[0]
            if not await self._merge(state, state.batches[start:end]):
                # Someone else changed these batches; look at the current state again.
                await self.shards.require(collection_id)
            else:
                merges += 1
        return merges

    async def _merge(self, state: ShardState, chosen: Sequence[StoredBatch]) -> bool:
        schema = state.schema.update_schema()
        try:
            tables = await asyncio.gather(*(self.batches.read_batch(b, schema) for b in chosen))
        except NotFound:
            return False
        joined = concat(list(tables), schema)
        if joined.num_rows >= THREAD_ROWS:
            merged = await asyncio.to_thread(advance_by, joined, state.since)
        else:
            merged = advance_by(joined, state.since)
        if merged.num_rows == 0:
            return await self._swap(state, chosen, None, 0, None)
        written = await self.batches.write(state.collection_id, merged)
        batch = StoredBatch(
            written.key,
            chosen[0].lower,
            chosen[-1].upper,
            state.since,
            written.rows,
            written.bytes,
        )
        return await self._swap(state, chosen, batch, written.written_ms, written.key)

    async def _swap(
        self,
        state: ShardState,
        chosen: Sequence[StoredBatch],
        batch: StoredBatch | None,
        written_ms: int,
        new_key: str | None,
    ) -> bool:
        keys = [b.key for b in chosen]
        operation = replace_batches(keys, batch, written_ms, self.policy)
        try:
            evicted = await self.shards.update(state.collection_id, operation)
        except Aborted:
            # Someone else changed these batches first. Delete the merged blob, unless the
            # state refers to it after all (it is then no longer this merge's to delete).
            if new_key is not None:
                with contextlib.suppress(TidemarkError):
                    current = await self.shards.require(state.collection_id)
                    if all(b.key != new_key for b in current.state.batches):
                        await self.batches.delete(new_key)
            return False
        # Any other failure leaves the outcome open: the orphan sweep deals with the blob.
        for key in evicted:
            # If this fails the orphan sweep deletes it later.
            with contextlib.suppress(TidemarkError):
                await self.batches.delete(key)
        log.debug(
            "batches_merged",
            collection=state.collection_id,
            merged=len(keys),
            rows=batch.rows if batch else 0,
        )
        return True

    async def idle(self) -> None:
        """Wait until no compaction is running (for tests and shutdown)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
