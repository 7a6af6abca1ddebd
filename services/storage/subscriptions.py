"""SubscribeAt: a collection's history as CDCv2 events, pushed as it grows.

A subscription starting at ``as_of`` states one history: every update at or before ``as_of``
moved to ``as_of`` (the snapshot; left out with ``snapshot=False``), and every later update at
its own time. It sends that history interval by interval, each as update batches and then a
progress statement:

- first, once the upper has passed ``as_of``, everything before the upper, with
  ``Progress({0}, upper)``: the history has no updates before ``as_of``, so the statement can
  start at ``{0}`` and a fresh CDCv2 reader takes it as is;
- then, for every state in which the upper moved, ``Progress(previous upper, new upper)``.

The states come from the shard's watch (pushed, not polled). Every statement is a fact about
the one history, so a client that reconnects and mixes messages of several subscriptions with
the same ``as_of`` still reassembles it exactly. A client that has the history through
``{r}`` can instead resume with ``as_of = r - 1`` and ``snapshot=False``.

While the stream is open the server keeps the capability's lease alive; if the capability is
dropped or expires, the stream ends with PERMISSION_DENIED.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeAlias

import pyarrow as pa

from services.storage.operations import Policy, expire_leases, require_capability, use
from services.storage.reads import Reader, overlapping
from services.storage.shaping import compile_shape
from services.storage.shards import ShardStore
from services.storage.state import CapabilityKind, ShardState, StoredBatch, frontier_text
from services.storage.watch import ShardWatch
from tidemark.cdc import Progress
from tidemark.columnar import bound_frontier, counts_by_time, frontier_bound, slices
from tidemark.errors import FailedPrecondition, InvalidArgument, PermissionDenied, TidemarkError
from tidemark.frontier import Antichain, u64_frontier
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import storage_pb2

log = get_logger("storage.subscriptions")


@dataclass(frozen=True)
class PartsEvent:
    """A parts-only subscription's interval: the batches holding its updates at times in
    ``[lower, upper)`` (``upper`` ``None``: no end), checked exact at ``lower - 1``."""

    lower: int
    upper: int | None
    batches: tuple[StoredBatch, ...]


Event: TypeAlias = pa.Table | Progress[int] | PartsEvent
"""An update batch (the shaped columns, ``time``, ``diff``) or a progress statement; or, in
a parts-only subscription, a ``PartsEvent`` per interval instead of both."""

DEFAULT_MAX_ROWS = 65_536
# Well under the gRPC message limit (tidemark.rpc.server.MAX_MESSAGE_BYTES), whatever the rows.
MAX_MESSAGE_DATA_BYTES = 16 << 20


@dataclass(frozen=True)
class SubscribeSpec:
    snapshot: bool = True
    columns: tuple[str, ...] = ()
    row_filter: storage_pb2.RowFilter | None = None
    stop_at: Antichain[int] | None = None
    """End once the upper reaches this (``None``: never; ``{}`` ends with the collection)."""
    as_of: int | None = None
    max_rows: int = 0
    parts_only: bool = False
    """Name the parts holding each interval's updates instead of sending them (no
    snapshot, no shaping)."""


def _before(a: int | None, b: int | None) -> bool:
    """``a < b`` where ``None`` is beyond every time."""
    return b is None if a is None else (b is None or a < b)


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if _before(b, a) else a


class Subscriptions:
    def __init__(
        self,
        shards: ShardStore,
        watch: ShardWatch,
        reader: Reader,
        policy: Policy,
        clock: Callable[[], int],
    ) -> None:
        self.shards = shards
        self.watch = watch
        self.reader = reader
        self.policy = policy
        self.clock = clock

    async def subscribe(
        self, collection_id: str, capability_id: str, spec: SubscribeSpec
    ) -> AsyncIterator[Event]:
        """Checks the request before the first event, so errors come before any data."""
        start = await self.shards.require(collection_id)
        state = expire_leases(start.state, self.clock())
        record = require_capability(state, capability_id, CapabilityKind.READ)
        held = frontier_bound(record.frontier)
        assert held is not None  # a stored capability never has the empty frontier
        as_of = held if spec.as_of is None else spec.as_of
        if as_of < held:
            raise FailedPrecondition(
                f"as_of {as_of} is before the read capability's frontier "
                f"{frontier_text(record.frontier)} (collection {collection_id} has since "
                f"{frontier_text(state.since)})"
            )
        if spec.parts_only and (spec.snapshot or spec.columns or spec.row_filter is not None):
            raise InvalidArgument("a parts-only subscription has no snapshot, columns or filter")
        stop = None if spec.stop_at is None else frontier_bound(spec.stop_at)
        if stop is not None and stop <= as_of:
            raise InvalidArgument(f"stop_at {{{stop}}} must be beyond the starting time {as_of}")
        shape = compile_shape(state.schema, spec.columns, spec.row_filter)
        max_rows = spec.max_rows or DEFAULT_MAX_ROWS
        self.watch.offer(collection_id, start)
        keeper = asyncio.create_task(self._keep_alive(collection_id, capability_id))
        try:
            sent: int | None = None
            started = False
            async for versioned in self.watch.states(collection_id, at_least=start.version):
                state = expire_leases(versioned.state, self.clock())
                require_capability(state, capability_id, CapabilityKind.READ)
                target = _earliest(frontier_bound(state.upper), stop)
                if spec.parts_only:
                    # The first interval starts after ``as_of`` (no snapshot).
                    last = sent if started else as_of
                    assert last is not None
                    if not _before(last, target):
                        continue
                    yield _parts(state, last + 1 if not started else last, target)
                    started, sent = True, target
                    if target is None or target == stop:
                        return
                    continue
                if not started:
                    if not _before(as_of, target):
                        continue
                    table = await self.reader.history(
                        versioned, as_of, target, snapshot=spec.snapshot
                    )
                    lower = 0
                else:
                    assert sent is not None
                    if not _before(sent, target):
                        continue
                    table = await self.reader.interval(versioned, sent, target)
                    lower = sent
                shaped = shape.apply(table)
                for piece in slices(shaped, max_rows, MAX_MESSAGE_DATA_BYTES):
                    if piece.num_rows:
                        yield piece
                yield Progress(u64_frontier(lower), bound_frontier(target), counts_by_time(shaped))
                started, sent = True, target
                if target is None or target == stop:
                    return
        finally:
            await cancel_and_wait(keeper)

    async def _keep_alive(self, collection_id: str, capability_id: str) -> None:
        period = self.policy.lease_ms / 4 / 1000
        while True:
            await asyncio.sleep(period)
            try:
                await self.shards.update(
                    collection_id, use(capability_id, CapabilityKind.READ, self.policy)
                )
            except PermissionDenied:
                return  # the state says so too; the stream ends when it sees that
            except TidemarkError as exc:
                log.warning("lease_renewal_failed", collection=collection_id, error=exc.message)


def _parts(state: ShardState, lower: int, upper: int | None) -> PartsEvent:
    """The batches of ``state`` that may hold updates in ``[lower, upper)``, each still
    exact at ``lower - 1`` (as ``Reader.interval`` requires of what it reads)."""
    chosen = overlapping(state.batches, lower, upper)
    for batch in chosen:
        if not batch.since.less_equal(lower - 1):
            raise FailedPrecondition(
                f"collection {state.collection_id} was compacted to "
                f"{frontier_text(batch.since)}, past the time {lower - 1} being read "
                f"(since {frontier_text(state.since)}); hold a read capability at or before "
                "the times you read"
            )
    return PartsEvent(lower, upper, tuple(chosen))
