"""Writing a history down as CDCv2 messages.

How the history is cut into intervals and how updates are grouped into messages is the
writer's free choice: a reader reassembles the same history from any batching, and even from a
mixture of several batchings of it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Generic, TypeVar

from tidemark.cdc.messages import Message, Progress, Updates
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain
from tidemark.updates import Update

D = TypeVar("D")
T = TypeVar("T")


def interval_messages(
    updates: Iterable[Update[D, T]],
    lower: Antichain[T],
    upper: Antichain[T],
    *,
    max_updates: int | None = None,
) -> list[Message[D, T]]:
    """The messages for the interval ``[lower, upper)``: the updates in batches of at most
    ``max_updates`` (all in one when ``None``), then one progress statement for the interval.

    ``updates`` must be consolidated (one non-zero diff per ``(data, time)``) and lie in the
    interval. An empty interval (``lower == upper``) produces no messages.
    """
    if max_updates is not None and max_updates < 1:
        raise InvalidArgument(f"max_updates must be at least 1, got {max_updates}")
    if not lower.frontier_less_equal(upper):
        raise InvalidArgument(f"interval lower {lower!r} is not at or before upper {upper!r}")
    batch = list(updates)
    seen: set[tuple[D, T]] = set()
    counts: dict[T, int] = {}
    for data, time, diff in batch:
        if not lower.less_equal(time) or upper.less_equal(time):
            raise InvalidArgument(f"update at {time!r} lies outside [{lower!r}, {upper!r})")
        if diff == 0:
            raise InvalidArgument(f"update of {data!r} at {time!r} has a zero diff")
        if (data, time) in seen:
            raise InvalidArgument(f"updates are not consolidated: {data!r} at {time!r} repeats")
        seen.add((data, time))
        counts[time] = counts.get(time, 0) + 1
    if lower == upper:
        return []
    step = max_updates or max(len(batch), 1)
    messages: list[Message[D, T]] = [
        Updates(batch[i : i + step]) for i in range(0, len(batch), step)
    ]
    messages.append(Progress(lower, upper, list(counts.items())))
    return messages


def interval_chain(
    lower: Antichain[T], upper: Antichain[T], cuts: Iterable[Antichain[T]]
) -> list[Antichain[T]]:
    """Frontiers ``lower = f0 < f1 < ... < fn = upper`` that split ``[lower, upper)``.

    Any antichains serve as cuts: the i-th boundary is ``upper`` met with the join of
    ``lower`` and the first ``i`` cuts, so the boundaries always advance and stay inside the
    interval (on the u64 timeline: a running maximum of the cuts, capped at ``upper``).
    Repeated boundaries are dropped.
    """
    chain = [lower]
    reached = lower
    for cut in cuts:
        reached = reached.join(cut)
        boundary = reached.meet(upper)
        if boundary != chain[-1]:
            chain.append(boundary)
    if upper != chain[-1]:
        chain.append(upper)
    return chain


def write_history(
    updates: Iterable[Update[D, T]],
    upper: Antichain[T],
    lower: Antichain[T] | None = None,
    *,
    cuts: Sequence[Antichain[T]] = (),
    max_updates: int | None = None,
) -> list[Message[D, T]]:
    """Messages stating a consolidated history that is complete from ``lower`` (default: the
    minimum time) up to ``upper``: one run of ``interval_messages`` per interval of
    ``interval_chain(lower, upper, cuts)``, in time order."""
    lattice = upper.lattice
    start = Antichain.minimum(lattice) if lower is None else lower
    if not start.frontier_less_equal(upper):
        raise InvalidArgument(f"history lower {start!r} is not at or before upper {upper!r}")
    chain = interval_chain(start, upper, cuts)
    # Each update belongs to the first interval whose upper it is not beyond. The chain's
    # regions only grow, so "not beyond the i-th upper" is monotone in i: bisect for it.
    uppers = chain[1:]
    by_interval: list[list[Update[D, T]]] = [[] for _ in uppers]
    for update in updates:
        time = update[1]
        index = bisect_left(range(len(uppers)), True, key=lambda i: not uppers[i].less_equal(time))
        if index == len(uppers) or not start.less_equal(time):
            raise InvalidArgument(f"update at {time!r} lies outside [{start!r}, {upper!r})")
        by_interval[index].append(update)
    messages: list[Message[D, T]] = []
    for (lo, hi), batch in zip(pairwise(chain), by_interval, strict=True):
        messages.extend(interval_messages(batch, lo, hi, max_updates=max_updates))
    return messages


class CdcWriter(Generic[D, T]):
    """Incremental writing for a service whose collection grows an interval at a time: each
    ``append`` states the updates of ``[frontier, upper)`` and advances ``frontier``."""

    def __init__(self, lower: Antichain[T], *, max_updates: int | None = None) -> None:
        self._frontier = lower.copy()
        self._max_updates = max_updates

    @property
    def frontier(self) -> Antichain[T]:
        """Everything not beyond this frontier has been written."""
        return self._frontier.copy()

    def append(self, updates: Iterable[Update[D, T]], upper: Antichain[T]) -> list[Message[D, T]]:
        """Messages for the consolidated ``updates`` of ``[frontier, upper)``."""
        messages = interval_messages(updates, self._frontier, upper, max_updates=self._max_updates)
        self._frontier = upper.copy()
        return messages
