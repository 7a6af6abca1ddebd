"""Reading a collection's updates out of its batches, always from one consistent state.

A read takes the batch list of one state version and loads those blobs. Compaction may
replace them meanwhile; the replaced blobs stay for a grace period, and if one is gone all the
same, the read starts over from the current state, whose batches hold the same updates at
every time the reader may look at. So a read never mixes batches of two states.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import cast

import pyarrow as pa

from services.storage.batches import BatchStore
from services.storage.shards import ShardStore, Versioned
from services.storage.state import ShardState, StoredBatch, frontier_text
from tidemark.columnar import (
    advance_times,
    concat,
    consolidate,
    frontier_bound,
    select_times,
    with_time,
)
from tidemark.errors import FailedPrecondition, NotFound
from tidemark.frontier import u64_frontier
from tidemark.logging import get_logger

log = get_logger("storage.reads")

MAX_READ_ATTEMPTS = 8


def overlaps(batch: StoredBatch, lower: int, upper: int | None) -> bool:
    """Whether ``batch`` may hold times in ``[lower, upper)`` (``None``: no upper end)."""
    batch_lower = frontier_bound(batch.lower)
    batch_upper = frontier_bound(batch.upper)
    starts_before_end = upper is None or batch_lower is None or batch_lower < upper
    ends_after_start = batch_upper is None or batch_upper > lower
    return starts_before_end and ends_after_start


def overlapping(batches: Sequence[StoredBatch], lower: int, upper: int | None) -> list[StoredBatch]:
    """The batches that may hold times in ``[lower, upper)``, in order. A state's batches
    cover consecutive time ranges, oldest first, so the search starts from the newest (reads
    of recent intervals, as subscriptions make, are the common ones) and stops at the first
    batch that ends at or before ``lower``: every older one does too."""
    chosen: list[StoredBatch] = []
    for batch in reversed(batches):
        if overlaps(batch, lower, upper):
            chosen.append(batch)
            continue
        batch_upper = frontier_bound(batch.upper)
        if batch_upper is not None and batch_upper <= lower:
            break
    chosen.reverse()
    return chosen


def within(batch: StoredBatch, lower: int, upper: int | None) -> bool:
    """Whether every time in ``batch`` certainly lies in ``[lower, upper)``: its range does,
    and compaction moved none of its times (which could land outside its range)."""
    batch_lower = frontier_bound(batch.lower)
    batch_upper = frontier_bound(batch.upper)
    since = frontier_bound(batch.since)
    if batch_lower is None or batch_lower < lower or since is None or since > batch_lower:
        return False
    return upper is None or (batch_upper is not None and batch_upper <= upper)


class Reader:
    def __init__(self, shards: ShardStore, batches: BatchStore) -> None:
        self.shards = shards
        self.batches = batches

    async def _load(
        self,
        versioned: Versioned,
        lower: int,
        upper: int | None,
        read_time: int,
        shape: Callable[[ShardState, list[StoredBatch], list[pa.Table]], pa.Table],
    ) -> pa.Table:
        """``shape`` applied to the batches of one state that overlap ``[lower, upper)``;
        each must be exact at ``read_time`` (not compacted past it)."""
        current = versioned
        for _ in range(MAX_READ_ATTEMPTS):
            state = current.state
            chosen = overlapping(state.batches, lower, upper)
            for batch in chosen:
                if not batch.since.less_equal(read_time):
                    raise FailedPrecondition(
                        f"collection {state.collection_id} was compacted to "
                        f"{frontier_text(batch.since)}, past the time {read_time} being read "
                        f"(since {frontier_text(state.since)}); hold a read capability at or "
                        "before the times you read"
                    )
            # Batches in memory (this process wrote them, or read them lately) are used as they
            # are, without a trip through the event loop: a subscriber served so goes on to
            # send the updates before other work queued meanwhile gets the loop.
            cached = [self.batches.cached_batch(b) for b in chosen]
            if all(table is not None for table in cached):
                return shape(state, chosen, cast(list[pa.Table], cached))
            schema = state.schema.update_schema()
            try:
                tables = await asyncio.gather(*(self.batches.read_batch(b, schema) for b in chosen))
            except NotFound:
                log.info("read_restarted", collection=state.collection_id, version=current.version)
                current = await self.shards.require(state.collection_id)
                continue
            return shape(state, chosen, list(tables))
        raise FailedPrecondition(
            f"collection {versioned.state.collection_id}: batches kept disappearing while being "
            "read; retry"
        )

    async def snapshot(self, versioned: Versioned, as_of: int) -> pa.Table:
        """The collection at ``as_of``: every update at or before it, placed at ``as_of`` and
        consolidated, so ``diff`` is each row's multiplicity."""

        def shape(state: ShardState, _: list[StoredBatch], tables: list[pa.Table]) -> pa.Table:
            schema = state.schema.update_schema()
            picked = [select_times(t, None, as_of + 1) for t in tables]
            return consolidate(with_time(concat(picked, schema), as_of))

        return await self._load(versioned, 0, as_of + 1, as_of, shape)

    async def history(
        self, versioned: Versioned, as_of: int, upper: int | None, *, snapshot: bool
    ) -> pa.Table:
        """The updates a subscription starting at ``as_of`` sends first: those before
        ``upper``, with every time at or before ``as_of`` moved to ``as_of`` (``snapshot``) or
        left out (otherwise)."""

        def shape(state: ShardState, _: list[StoredBatch], tables: list[pa.Table]) -> pa.Table:
            schema = state.schema.update_schema()
            picked = [select_times(t, None if snapshot else as_of + 1, upper) for t in tables]
            joined = concat(picked, schema)
            if snapshot:
                joined = advance_times(joined, u64_frontier(as_of))
            return consolidate(joined)

        return await self._load(versioned, 0, upper, as_of, shape)

    async def interval(self, versioned: Versioned, lower: int, upper: int | None) -> pa.Table:
        """The updates with times in ``[lower, upper)`` (``lower >= 1``), exactly as appended.

        Compaction to a since ``s`` moves earlier updates to ``s`` itself, so the updates at
        ``lower`` are only told apart from earlier ones while every batch's since is at most
        ``lower - 1``. Batches cover disjoint time ranges, so the result is consolidated."""

        def shape(
            state: ShardState, batches: list[StoredBatch], tables: list[pa.Table]
        ) -> pa.Table:
            schema = state.schema.update_schema()
            picked = [
                t if within(b, lower, upper) else select_times(t, lower, upper)
                for b, t in zip(batches, tables, strict=True)
            ]
            return concat(picked, schema)

        return await self._load(versioned, lower, upper, lower - 1, shape)
