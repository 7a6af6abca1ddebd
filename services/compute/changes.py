"""A dataflow's output changes, step by step, for Subscribe.

Every step's output (its updates at exact times in ``[lower, upper)``) is published to the
listeners present, and kept in a bounded window of recent steps, so a subscriber starting a
little in the past replays what it missed before following live steps. A listener only sees
changes at times after its ``as_of``; the snapshot at ``as_of`` is the subscriber's business.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.compute.dataflow import Update
from tidemark.errors import FailedPrecondition, TidemarkError, Unavailable

RETAINED_UPDATES = 100_000
"""Most updates kept for replay (the latest steps are kept whole)."""

MAX_BEHIND_STEPS = 10_000
"""A listener this many steps behind is cut off rather than held in memory."""


@dataclass(frozen=True)
class Step:
    lower: int
    upper: int
    updates: list[Update]


class Listener:
    def __init__(self, feed: ChangeFeed, as_of: int, replay: list[Step]) -> None:
        self._feed = feed
        self.as_of = as_of
        self._queue: asyncio.Queue[Step | TidemarkError] = asyncio.Queue()
        for step in replay:
            self._queue.put_nowait(step)

    def _offer(self, item: Step | TidemarkError) -> None:
        if isinstance(item, Step) and self._queue.qsize() >= MAX_BEHIND_STEPS:
            self._feed.remove(self)
            self._queue.put_nowait(Unavailable("the subscriber fell too far behind the dataflow"))
            return
        self._queue.put_nowait(item)

    async def steps(self) -> AsyncIterator[Step]:
        """Steps with changes after ``as_of``, each trimmed to ``(as_of, upper)``."""
        try:
            while True:
                item = await self._queue.get()
                if isinstance(item, TidemarkError):
                    raise item
                if item.upper <= self.as_of + 1:
                    continue
                if item.lower <= self.as_of:
                    updates = [u for u in item.updates if u[1] > self.as_of]
                    item = Step(self.as_of + 1, item.upper, updates)
                yield item
        finally:
            self._feed.remove(self)


class ChangeFeed:
    def __init__(self) -> None:
        self._window: deque[Step] = deque()
        self._window_updates = 0
        self._covered_from: int | None = None
        """The window holds every change at this time and later (``None``: not started)."""
        self._upper: int | None = None
        self._listeners: set[Listener] = set()
        self._closed: TidemarkError | None = None

    def start(self, upper: int) -> None:
        """The output is complete (hydrated) before ``upper``; changes are published from
        there on."""
        self._covered_from = upper
        self._upper = upper

    def publish(self, step: Step) -> None:
        self._upper = step.upper
        self._window.append(step)
        self._window_updates += len(step.updates)
        while len(self._window) > 1 and self._window_updates > RETAINED_UPDATES:
            dropped = self._window.popleft()
            self._window_updates -= len(dropped.updates)
            self._covered_from = dropped.upper
        for listener in list(self._listeners):
            listener._offer(step)

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def skip(self, upper: int) -> None:
        """The output moved to ``upper`` without its changes being kept (no listener wanted
        them): the window restarts there, and subscribers from before it are refused."""
        self._upper = upper
        self._window.clear()
        self._window_updates = 0
        self._covered_from = upper

    def end_listeners(self, error: TidemarkError) -> None:
        """Ends the listeners present with ``error`` (their changes cannot be given); later
        ones are welcome."""
        for listener in list(self._listeners):
            listener._offer(error)
        self._listeners.clear()

    def close(self, error: TidemarkError) -> None:
        """Ends every listener with ``error`` (the dataflow was dropped or failed)."""
        self._closed = error
        for listener in list(self._listeners):
            listener._offer(error)
        self._listeners.clear()

    def covers(self, as_of: int) -> bool:
        """Whether ``listen(as_of)`` would find every change after ``as_of`` (retained or
        still to come)."""
        if self._covered_from is None or self._upper is None:
            return True  # not hydrated: ``listen`` says so
        return not (as_of + 1 < self._upper and as_of + 1 < self._covered_from)

    def listen(self, as_of: int) -> Listener:
        """A listener for the changes after ``as_of``: the retained ones first, then live."""
        if self._closed is not None:
            raise self._closed
        if self._covered_from is None or self._upper is None:
            raise FailedPrecondition("the dataflow is not hydrated yet")
        if as_of + 1 < self._upper and as_of + 1 < self._covered_from:
            raise FailedPrecondition(
                f"changes after {as_of} are no longer retained; subscribe at "
                f"{self._covered_from - 1} or later"
            )
        replay = [step for step in self._window if step.upper > as_of + 1]
        listener = Listener(self, as_of, replay)
        self._listeners.add(listener)
        return listener

    def follow(self, as_of: int) -> tuple[Listener, int]:
        """A listener for the live changes only, and the time they start at: the output's
        upper now. The changes between ``as_of`` and that time are the caller's to find
        (from the index's history, when the feed no longer holds them)."""
        if self._closed is not None:
            raise self._closed
        if self._covered_from is None or self._upper is None:
            raise FailedPrecondition("the dataflow is not hydrated yet")
        listener = Listener(self, as_of, [])
        self._listeners.add(listener)
        return listener, self._upper

    def remove(self, listener: Listener) -> None:
        self._listeners.discard(listener)
