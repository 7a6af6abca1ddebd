"""The catalog in memory: its current contents and its recent history.

:class:`CatalogHistory` holds the contents at ``upper - 1`` (an indexed :class:`CatalogIndex`)
and the steps of every time in ``(since, upper)``, so it can answer "the catalog as of ``t``"
for any ``t`` in ``[since, upper)`` by rewinding the steps after ``t`` on a copy. It learns new
intervals from the catalog's own appends and from following the durable log; an interval it
already has is ignored, so both sources may report the same append.

Readers that must not lose history (subscriptions part-way through) place a :class:`Hold` on
a time; ``since`` never passes a held time.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence

from services.catalog.index import CatalogIndex, Step
from services.catalog.items import Row
from tidemark.errors import DeadlineExceeded, FailedPrecondition, Internal


class Hold:
    """Keeps the history readable at ``time`` (``since <= time``) until released."""

    def __init__(self, history: CatalogHistory, time: int) -> None:
        self._history = history
        self.time = time
        self._released = False
        history._holds[time] += 1

    def move(self, time: int) -> None:
        """Move the hold to a later time."""
        if self._released or time <= self.time:
            return
        self._history._drop_hold(self.time)
        self.time = time
        self._history._holds[time] += 1

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._history._drop_hold(self.time)


class CatalogHistory:
    """Contents at ``upper - 1`` plus the steps of ``(since, upper)`` (see the module docs)."""

    def __init__(self, since: int) -> None:
        self.index = CatalogIndex()
        self.since = since
        self.upper = since
        self._steps: list[Step] = []
        self._step_times: list[int] = []
        self._advanced = asyncio.Event()
        self._holds: Counter[int] = Counter()
        self._current_rows: list[Row] | None = None

    # -- learning new intervals ------------------------------------------------------------
    def add_interval(self, steps: Sequence[Step], upper: int, lower: int | None = None) -> bool:
        """Record the steps of the interval ending at ``upper`` (and starting at ``lower``,
        when the caller knows it). Steps before the history's upper are already recorded (by
        our own append, or an earlier report of the same interval) and skipped; an interval
        the history already covers is ignored. Returns whether anything changed."""
        if upper <= self.upper:
            return False
        if lower is not None and lower != self.upper:
            raise Internal(f"catalog history ends at {self.upper}, the interval starts at {lower}")
        fresh = [step for step in steps if step.time >= self.upper]
        for step in fresh:
            if step.time >= upper:
                raise Internal(f"catalog step at {step.time} is not below its upper {upper}")
            if self._step_times and step.time <= self._step_times[-1]:
                raise Internal(f"catalog steps out of order at {step.time}")
            self.index.apply(step)
            self._steps.append(step)
            self._step_times.append(step.time)
        if fresh:
            self._current_rows = None
        self.upper = upper
        self._advanced.set()
        self._advanced = asyncio.Event()
        return True

    # -- reading ---------------------------------------------------------------------------
    def check_readable(self, time: int) -> None:
        if time < self.since:
            raise FailedPrecondition(
                f"catalog time {time} is before the catalog's since {self.since}; its history "
                "has been compacted"
            )

    async def wait_until_complete(self, time: int, timeout: float | None) -> None:  # noqa: ASYNC109
        """Wait until ``time`` is below the upper; ``DeadlineExceeded`` after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.upper <= time:
            advanced = self._advanced
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(
                    f"catalog time {time} is not complete yet (the catalog's upper is {self.upper})"
                )
            try:
                async with asyncio.timeout(remaining):
                    await advanced.wait()
            except TimeoutError:
                continue

    def rows_at(self, time: int) -> list[Row]:
        """Every item as of ``time``, which must lie in ``[since, upper)``."""
        self.check_readable(time)
        if time >= self.upper:
            raise Internal(f"catalog time {time} is not complete (upper {self.upper})")
        later = self._steps[bisect_right(self._step_times, time) :]
        if not later:
            if self._current_rows is None:
                self._current_rows = list(self.index.rows.values())
            return self._current_rows
        rows = dict(self.index.rows)
        for step in reversed(later):
            for row in step.added:
                del rows[row.key]
            for row in step.removed:
                rows[row.key] = row
        return list(rows.values())

    def steps_between(self, lower: int, upper: int) -> list[Step]:
        """The recorded steps with times in ``[lower, upper)``; ``lower`` must be after
        ``since`` (earlier steps may have been dropped)."""
        if lower <= self.since:
            raise Internal(f"catalog steps from {lower} asked for, since is {self.since}")
        start = bisect_right(self._step_times, lower - 1)
        end = bisect_right(self._step_times, upper - 1)
        return self._steps[start:end]

    # -- compaction ------------------------------------------------------------------------
    def hold(self, time: int) -> Hold:
        """Keep ``time`` readable; ``time`` must be readable now."""
        self.check_readable(time)
        return Hold(self, time)

    def _drop_hold(self, time: int) -> None:
        self._holds[time] -= 1
        if self._holds[time] <= 0:
            del self._holds[time]

    def advance_since(self, target: int) -> int:
        """Move ``since`` towards ``target``, never past a hold or ``upper - 1`` (the current
        contents stay readable), and drop the steps it no longer needs. Returns ``since``."""
        limit = min([target, self.upper - 1, *self._holds])
        if limit > self.since:
            self.since = limit
            drop = bisect_right(self._step_times, limit)
            del self._steps[:drop]
            del self._step_times[:drop]
        return self.since

    @property
    def step_count(self) -> int:
        return len(self._steps)
