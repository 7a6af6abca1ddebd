"""Reading CDCv2 back: from a stream that may be duplicated, reordered and re-batched, recover
the history in frontier order, each update exactly once.

The reader keeps four pieces of evidence (after the CDCv2 design):

- ``reported``: everything not beyond it has been handed out; later news about those times is
  dropped on arrival.
- ``held``: updates received but not yet handed out, grouped by time. They wait for their
  time to complete and recognise duplicates of themselves.
- ``progress``: the counts of every time not beyond it have been incorporated. A progress
  statement is grafted on only once this frontier is at or beyond its lower bound, so the
  covered region never has holes.
- ``outstanding``: per time, announced count minus distinct updates received. A time with a
  positive number is still waiting for updates; a negative number means updates came before
  their progress statement.

The history is complete wherever both ``progress`` and ``outstanding`` agree: the reported
frontier is their meet. Memory holds only unreported updates, counts for unreported times, and
progress statements that cannot be grafted on yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Generic, TypeAlias, TypeVar

from tidemark.cdc.messages import Message, Progress, Updates
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain, MutableAntichain
from tidemark.lattice import Lattice
from tidemark.updates import Update

D = TypeVar("D")
T = TypeVar("T")

Report: TypeAlias = tuple[list[Update[D, T]], Antichain[T]]
"""Updates whose times just completed, and the frontier through which the history is now
complete."""


class CdcReader(Generic[D, T]):
    """Push-based CDCv2 reader: feed it messages in any order, collect ``(updates, frontier)``
    reports in frontier order.

    ``lower`` is where reading starts (default: the minimum time); updates not beyond it are
    ignored, so a reader can resume a stream at a frontier it already has. Malformed or
    contradictory input raises ``InvalidArgument``; a contradiction discovered while grafting
    progress statements leaves the reader unusable (every later push raises).
    """

    def __init__(self, lattice: Lattice[T], lower: Antichain[T] | None = None) -> None:
        start = Antichain.minimum(lattice) if lower is None else lower.copy()
        self.lattice = lattice
        self._reported = start
        # Grouped by time: a report hands out whole times, however many updates each has.
        self._held: dict[T, dict[D, int]] = {}
        self._held_count = 0
        self._progress = start.copy()
        self._outstanding: MutableAntichain[T] = MutableAntichain(lattice)
        # A dict as an ordered set: literal duplicates of a waiting statement are kept once.
        self._queue: dict[Progress[T], None] = {}
        self._failure: InvalidArgument | None = None

    # -- inspection ---------------------------------------------------------------------
    @property
    def frontier(self) -> Antichain[T]:
        """The frontier reported last: every update not beyond it has been handed out."""
        return self._reported.copy()

    @property
    def pending_updates(self) -> int:
        """How many distinct updates the reader holds (all beyond ``frontier``)."""
        return self._held_count

    @property
    def held_updates(self) -> list[Update[D, T]]:
        """The updates held, not yet reported."""
        return [(data, time, diff) for time, at in self._held.items() for data, diff in at.items()]

    @property
    def pending_progress(self) -> int:
        """Progress statements waiting for the gap before their lower bound to close."""
        return len(self._queue)

    # -- input ----------------------------------------------------------------------------
    def push(self, message: Message[D, T]) -> list[Report[D, T]]:
        """Take one message; return the report it completes, if any (at most one)."""
        if self._failure is not None:
            raise InvalidArgument(f"CDC reader stopped by earlier input: {self._failure.message}")
        if isinstance(message, Updates):
            self._accept_updates(message.updates)
        elif isinstance(message, Progress):
            if message.lower.lattice != self.lattice:
                raise InvalidArgument(
                    f"progress on timeline {message.lower.lattice!r}, reader on {self.lattice!r}"
                )
            self._accept_progress(message)
        else:
            raise InvalidArgument(f"not a CDC message: {type(message).__name__}")
        return self._report()

    def push_all(self, messages: Iterable[Message[D, T]]) -> list[Report[D, T]]:
        """Push several messages; the reports in order."""
        reports: list[Report[D, T]] = []
        for message in messages:
            reports.extend(self.push(message))
        return reports

    def _accept_updates(self, updates: Iterable[Update[D, T]]) -> None:
        # Everything is checked before any state changes, so a rejected batch leaves no trace.
        fresh: dict[tuple[D, T], int] = {}
        for data, time, diff in updates:
            if not self._reported.less_equal(time):
                continue
            key = (data, time)
            known = self._held.get(time, {}).get(data, fresh.get(key))
            if known is None:
                fresh[key] = diff
            elif known != diff:
                raise InvalidArgument(
                    f"conflicting updates for {data!r} at {time!r}: diff {known} and {diff}"
                )
        arrivals = Counter(time for _, time in fresh)
        for time, n in arrivals.items():
            counted = not self._progress.less_equal(time)
            if counted and self._outstanding.count(time) < n:
                raise InvalidArgument(
                    f"more distinct updates at {time!r} than its progress statement counts"
                )
        for (data, time), diff in fresh.items():
            self._held.setdefault(time, {})[data] = diff
        self._held_count += len(fresh)
        self._outstanding.update_iter((time, -n) for time, n in arrivals.items())

    def _accept_progress(self, progress: Progress[T]) -> None:
        # The queue never holds a statement that could be grafted, so only a statement that
        # can be grafted itself moves `progress`, and only then can queued ones follow.
        if not progress.lower.frontier_less_equal(self._progress):
            self._queue.setdefault(progress, None)
            return
        self._graft(progress)
        while True:
            ready = next(
                (p for p in self._queue if p.lower.frontier_less_equal(self._progress)), None
            )
            if ready is None:
                break
            del self._queue[ready]
            self._graft(ready)
        for time, n in self._outstanding.counts().items():
            if n < 0 and not self._progress.less_equal(time):
                self._failure = InvalidArgument(
                    f"more distinct updates at {time!r} than its progress statement counts"
                )
                raise self._failure

    def _graft(self, progress: Progress[T]) -> None:
        # Counts for times not beyond `progress` are already in; the statement covers every
        # other time between `progress` and its upper.
        self._outstanding.update_iter(
            (time, count) for time, count in progress.counts if self._progress.less_equal(time)
        )
        self._progress = self._progress.join(progress.upper)

    def _report(self) -> list[Report[D, T]]:
        bound = self._progress.meet(self._outstanding.frontier())
        if bound == self._reported:
            return []
        ready: list[Update[D, T]] = []
        for time in [t for t in self._held if not bound.less_equal(t)]:
            at = self._held.pop(time)
            ready.extend((data, time, diff) for data, diff in at.items())
            self._held_count -= len(at)
        self._reported = bound
        return [(ready, bound.copy())]


def read_cdc(
    lattice: Lattice[T], messages: Iterable[Message[D, T]], lower: Antichain[T] | None = None
) -> Iterator[Report[D, T]]:
    """Pull-based reading: the reports of ``CdcReader`` over ``messages``, lazily."""
    reader: CdcReader[D, T] = CdcReader(lattice, lower)
    for message in messages:
        yield from reader.push(message)


async def read_cdc_async(
    lattice: Lattice[T], messages: AsyncIterable[Message[D, T]], lower: Antichain[T] | None = None
) -> AsyncIterator[Report[D, T]]:
    """``read_cdc`` over an asynchronous stream (e.g. a gRPC request or response stream)."""
    reader: CdcReader[D, T] = CdcReader(lattice, lower)
    async for message in messages:
        for report in reader.push(message):
            yield report
