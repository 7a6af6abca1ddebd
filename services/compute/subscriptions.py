"""Subscribe: a dataflow's output as CDCv2 messages, its contents at ``as_of`` and then every
change after it.

With an index the snapshot is an index peek at ``as_of`` and the changes come from the
dataflow's own steps (``changes.ChangeFeed``), so nothing goes through storage; the changes
of steps whose rows stayed on the Spark tasks (no subscriber was listening, and the dataflow
has no output collection) come from the index's history. Without one,
or when the feed no longer holds the changes after ``as_of``, the output collection has the
exact history, and the stream is storage's SubscribeAt on it,
read with a capability taken for the stream's lifetime.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

from services.compute.running import RunningDataflow
from tidemark.cdc import Progress
from tidemark.cdc.proto import to_proto as cdc_to_proto
from tidemark.clients.storage import StorageClient
from tidemark.columnar import RelationSchema, frontier_bound, table_from_updates, to_ipc
from tidemark.errors import FailedPrecondition, TidemarkError
from tidemark.frontier import u64_frontier
from tidemark.logging import get_logger
from tidemark.v1 import common_pb2

log = get_logger("compute.subscriptions")


async def output_changes(
    running: RunningDataflow,
    storage: StorageClient,
    holder: str,
    as_of: int | None,
    snapshot: bool,
    deadline: float,
) -> AsyncGenerator[common_pb2.CdcMessage, None]:
    """``as_of`` unset: the dataflow's latest complete time (once hydrated, within
    ``deadline``)."""
    if as_of is None:
        await running.wait_past(running.as_of, deadline)
        assert running.upper is not None
        as_of = running.upper - 1
    # Changes the feed no longer holds (steps whose rows stayed on the Spark tasks, which
    # write the output collection themselves) are in the output collection.
    messages: AsyncGenerator[common_pb2.CdcMessage, None]
    if running.has_index and (running.writer is None or running.feed.covers(as_of)):
        messages = _from_index(running, as_of, snapshot, deadline)
    else:
        messages = _from_collection(running, storage, holder, as_of, snapshot)
    # Closed with this one: a subscriber gone leaves no listener or capability behind
    # until the inner generator happens to be collected.
    async with contextlib.aclosing(messages):
        async for message in messages:
            yield message


async def _from_index(
    running: RunningDataflow, as_of: int, snapshot: bool, deadline: float
) -> AsyncGenerator[common_pb2.CdcMessage, None]:
    # The index's history from as_of on is read under a hold, so that a compaction round
    # starting meanwhile stops short of as_of rather than fail the reads half-way.
    with running.read_hold(as_of):
        await running.wait_past(running.as_of, deadline)
        # Listening before the peek: a step landing meanwhile is queued, not lost. Steps
        # whose rows stayed on the tasks (nobody was listening) are read from the index's
        # history.
        feed = running.feed
        if feed.covers(as_of):
            listener, live_from = feed.listen(as_of), as_of + 1
        else:
            listener, live_from = feed.follow(as_of)
        try:
            contents = await running.peek(as_of, deadline) if snapshot else {}
            missed = (
                await running.index_changes(as_of + 1, live_from) if live_from > as_of + 1 else []
            )
        except BaseException:
            feed.remove(listener)
            raise
    try:
        start = [(row, as_of, n) for row, n in contents.items()]
        if start:
            yield _updates_message(running.schema, start)
        counts = [(as_of, len(start))] if start else []
        yield cdc_to_proto(Progress(u64_frontier(0), u64_frontier(as_of + 1), counts))
        if live_from > as_of + 1:
            if missed:
                yield _updates_message(running.schema, missed)
            yield cdc_to_proto(
                Progress(u64_frontier(as_of + 1), u64_frontier(live_from), _counts(missed))
            )
        async for step in listener.steps():
            if step.updates:
                yield _updates_message(running.schema, step.updates)
            yield cdc_to_proto(
                Progress(u64_frontier(step.lower), u64_frontier(step.upper), _counts(step.updates))
            )
    finally:
        # A subscriber gone before the live steps leaves no listener behind.
        feed.remove(listener)


async def _from_collection(
    running: RunningDataflow, storage: StorageClient, holder: str, as_of: int, snapshot: bool
) -> AsyncGenerator[common_pb2.CdcMessage, None]:
    writer = running.writer
    assert writer is not None
    pair = await storage.acquire(writer.collection_id, holder)
    try:
        if pair.write.usable:
            await storage.drop(pair.write)
        since = frontier_bound(pair.read.frontier) if pair.read.usable else None
        if since is None or since > as_of:
            raise FailedPrecondition(
                f"as_of {as_of} is before the since of output {writer.collection_id!r}"
            )
        async for message in storage.subscribe_raw(pair.read, as_of=as_of, snapshot=snapshot):
            yield message
    finally:
        if pair.read.usable:
            try:
                await storage.drop(pair.read)
            except TidemarkError as exc:
                log.info("capability_drop_failed", error=exc.message)


def _updates_message(
    schema: RelationSchema, updates: Sequence[tuple[tuple[object, ...], int, int]]
) -> common_pb2.CdcMessage:
    table = table_from_updates(schema, updates)
    return common_pb2.CdcMessage(updates=common_pb2.Updates(arrow_ipc=to_ipc(table)))


def _counts(updates: Sequence[tuple[object, int, int]]) -> list[tuple[int, int]]:
    """Distinct updates per time (step outputs are consolidated)."""
    tally: dict[int, int] = {}
    for _, time, _ in updates:
        tally[time] = tally.get(time, 0) + 1
    return sorted(tally.items())
