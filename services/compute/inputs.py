"""Following one input collection of a dataflow through storage's SubscribeAt.

A follower holds what has arrived and not yet been handed to the dataflow: update batches
(Arrow tables, times at or beyond what the dataflow has taken) and the input's upper. The
dataflow takes everything before a chosen time in one go, however many batches and times
that spans.

The stream starts at the dataflow's ``as_of`` with the snapshot, so the first statement
carries the contents at ``as_of`` (at time ``as_of``) and every later update up to the upper
at its own time. A broken stream is resumed at the upper already seen (``as_of = upper - 1``
without the snapshot), which the dataflow's read hold (at most its upper - 1) allows.

A follower of ``parts`` (a dataflow whose resident tasks read storage themselves) holds,
instead of rows, the parts that hold each interval's updates after ``as_of``, each with the
window of times it counts for, and hands them over the same way (a part whose window a step
boundary cuts is handed over in both steps, each with its side). ``read_rows`` reads an
interval's rows after all, for a step whose part is gone from the blob store. A dataflow's
parts followers are fed together by one ``PartsFeed`` over ``SubscribePartsJointly``: one
message, and one waking of the driver, each time the least of the inputs' uppers moves.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pyarrow as pa

from services.compute.spark.spark_dataflow import PartWindow
from tidemark.cdc import Progress
from tidemark.clients.storage import Capability, PartsInterval, StorageClient
from tidemark.columnar import RowUpdate, frontier_bound, select_times, updates_from_table
from tidemark.errors import Cancelled, Internal, TidemarkError, Unavailable
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy
from tidemark.tasks import cancel_and_wait

log = get_logger("compute.inputs")

MAX_TIME = 2**64 - 1
"""An input whose upper is ``{}`` (closed) constrains nothing: it counts as this."""

RESUBSCRIBE = RetryPolicy(total_seconds=float("inf"), initial_backoff=0.1, max_backoff=2.0)


class InputFollower:
    def __init__(
        self,
        storage: StorageClient,
        capability: Capability,
        as_of: int,
        on_change: Callable[[], None],
        *,
        snapshot: bool = True,
        parts: bool = False,
    ) -> None:
        """``snapshot``: whether the stream starts with the contents at ``as_of`` (a dataflow
        hydrated from storage's parts instead wants only the updates after it). ``parts``:
        follow the parts holding the updates after ``as_of``, not the updates (with
        ``snapshot``, the contents at ``as_of`` still come as rows first)."""
        self.collection_id = capability.collection_id
        self.snapshot = snapshot
        self.parts = parts
        self.blob_url = ""
        """Where the parts are (known once an interval came)."""
        self.parts_received = 0
        self.fallback_rows = 0
        """Rows read by ``read_rows``."""
        self._windows: list[PartWindow] = []
        self.capability = capability
        self.storage = storage
        self.as_of = as_of
        self.upper: int | None = None
        """Everything before this has arrived (``None`` before the first statement)."""
        self.rows_received = 0
        self._tables: list[pa.Table] = []
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None
        self.error: TidemarkError | None = None
        """Set when the stream failed for good (the capability was lost)."""

    def start(self) -> None:
        """Follows the rows (a follower of ``parts`` is fed by a ``PartsFeed``)."""
        assert not self.parts, "a parts follower is fed by a PartsFeed"
        self._task = asyncio.create_task(self._follow(), name=f"input-{self.collection_id}")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    def take(self, before: int) -> list[RowUpdate]:
        """The held updates at times before ``before`` (removed from the follower)."""
        if not self._tables:
            return []
        table = pa.concat_tables(self._tables) if len(self._tables) > 1 else self._tables[0]
        taken = select_times(table, None, before)
        kept = select_times(table, before, None)
        self._tables = [kept] if kept.num_rows else []
        return updates_from_table(taken) if taken.num_rows else []

    def take_parts(self, before: int) -> list[PartWindow]:
        """The held parts' windows at times before ``before`` (removed from the follower,
        a window that ``before`` cuts keeping its later side)."""
        taken: list[PartWindow] = []
        kept: list[PartWindow] = []
        for window in self._windows:
            if window.upper <= before:
                taken.append(window)
            elif window.lower >= before:
                kept.append(window)
            else:
                taken.append(dataclasses.replace(window, upper=before))
                kept.append(dataclasses.replace(window, lower=before))
        self._windows = kept
        return taken

    async def read_rows(self, lower: int, upper: int) -> list[RowUpdate]:
        """The updates at times in ``[lower, upper)`` (``lower`` > the read hold), read
        through storage (which reads a later state if a part is gone)."""
        tables = []
        async for event in self.storage.subscribe_arrow(
            self.capability, as_of=lower - 1, snapshot=False, stop_at=upper
        ):
            if not isinstance(event, Progress) and event.num_rows:
                tables.append(event)
        rows = [update for table in tables for update in updates_from_table(table)]
        self.fallback_rows += len(rows)
        return rows

    async def read_snapshot(self) -> None:
        """The contents at ``as_of`` as rows at time ``as_of`` (a dataflow small enough to
        hydrate through this process, whose steps then go by parts); the parts follow from
        after ``as_of``."""
        tables = []
        async for event in self.storage.subscribe_arrow(
            self.capability, as_of=self.as_of, snapshot=True, stop_at=self.as_of + 1
        ):
            if not isinstance(event, Progress) and event.num_rows:
                # Later updates come by parts: an interval reaching past as_of is not
                # taken twice.
                tables.append(select_times(event, None, self.as_of + 1))
        self._tables.extend(tables)
        self.rows_received += sum(table.num_rows for table in tables)
        self.upper = self.as_of + 1
        self._on_change()

    @property
    def held_rows(self) -> int:
        return sum(table.num_rows for table in self._tables)

    async def _follow(self) -> None:
        backoff = RESUBSCRIBE.backoffs()
        while True:
            if self.upper is None:
                options = {"as_of": self.as_of, "snapshot": self.snapshot}
            else:
                options = {"as_of": self.upper - 1, "snapshot": False}
            # Batches count only once the statement closing their interval has come: a
            # stream broken half-way through an interval sends all of it again.
            pending: list[pa.Table] = []
            try:
                async for event in self.storage.subscribe_arrow(self.capability, **options):
                    if isinstance(event, Progress):
                        bound = frontier_bound(event.upper)
                        self._tables.extend(pending)
                        self.rows_received += sum(table.num_rows for table in pending)
                        pending = []
                        self.upper = MAX_TIME if bound is None else bound
                        self._on_change()
                        backoff = RESUBSCRIBE.backoffs()
                        if bound is None:
                            return
                    elif event.num_rows:
                        pending.append(event)
                # The server ends a subscription only when it stops; pick it up again.
            except TidemarkError as exc:
                if not self._resumable(exc):
                    return
            await backoff.sleep()

    def _resumable(self, error: TidemarkError) -> bool:
        """Whether a stream that ended with ``error`` is picked up again; otherwise the
        follower failed for good (the capability was lost) and says so."""
        if resumable(error, self.collection_id):
            return True
        self.fail(error)
        return False

    def fail(self, error: TidemarkError) -> None:
        self.error = error
        self._on_change()

    def receive_parts(self, interval: PartsInterval) -> None:
        """Holds ``interval``'s parts, each for the interval's window of times."""
        upper = MAX_TIME if interval.upper is None else interval.upper
        self.blob_url = interval.blob_url
        self._windows.extend(
            PartWindow(part.key, interval.lower, upper, part.bytes) for part in interval.parts
        )
        self.parts_received += len(interval.parts)
        self.upper = upper


def resumable(error: TidemarkError, collections: str) -> bool:
    """Whether an input stream that ended with ``error`` is picked up again (it broke), or
    failed for good (the capability was lost); logs which."""
    if isinstance(error, (Unavailable, Cancelled)):
        log.info("input_stream_broken", collection=collections, error=error.message)
        return True
    log.warning("input_stream_failed", collection=collections, error=error.message)
    return False


class PartsFeed:
    """Feeds a dataflow's parts followers over one ``SubscribePartsJointly`` stream: each
    message holds every input's intervals up to the new meet of their uppers, and wakes the
    dataflow once. A follower that starts with the snapshot reads it first, as rows. A broken
    stream is picked up again at the followers' upper (the same for all, once one message
    came); one that fails for good fails every follower with its error."""

    def __init__(
        self, storage: StorageClient, followers: list[InputFollower], on_change: Callable[[], None]
    ) -> None:
        assert followers and all(f.parts for f in followers)
        self.storage = storage
        self.followers = followers
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="input-parts")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _follow(self) -> None:
        backoff = RESUBSCRIBE.backoffs()
        collections = ",".join(f.collection_id for f in self.followers)
        while True:
            try:
                for follower in self.followers:
                    if follower.upper is None and follower.snapshot:
                        await follower.read_snapshot()
                inputs = [
                    (f.capability, f.as_of if f.upper is None else f.upper - 1)
                    for f in self.followers
                ]
                async for joint in self.storage.subscribe_parts_jointly(inputs):
                    if len(joint.inputs) != len(self.followers):
                        raise Internal(
                            f"a joint parts message for {len(joint.inputs)} inputs, "
                            f"not {len(self.followers)}"
                        )
                    for follower, intervals in zip(self.followers, joint.inputs, strict=True):
                        for interval in intervals:
                            follower.receive_parts(interval)
                        # Every input has passed the meet; one that starts later has also
                        # passed its own start (so it resumes there, not before).
                        upper = MAX_TIME if joint.upper is None else joint.upper
                        follower.upper = max(upper, follower.as_of + 1)
                    self._on_change()
                    backoff = RESUBSCRIBE.backoffs()
                    if joint.upper is None:
                        return
            except TidemarkError as exc:
                if not resumable(exc, collections):
                    for follower in self.followers:
                        follower.fail(exc)
                    return
            await backoff.sleep()
