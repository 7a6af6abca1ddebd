"""The two CDCv2 statements: batches of updates and progress over an interval of times.

Both are facts about the final history that stay true forever once written, which is what lets
a stream of them be duplicated, reordered and re-batched without changing what it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain
from tidemark.updates import Update

D = TypeVar("D")
T = TypeVar("T")


@dataclass(frozen=True)
class Updates(Generic[D, T]):
    """Update statements: each ``(data, time, diff)`` is the fully accumulated, non-zero change
    of ``data`` at ``time``. Across a whole stream each ``(data, time)`` has one diff."""

    updates: Sequence[Update[D, T]]

    def __post_init__(self) -> None:
        updates = tuple(self.updates)
        for update in updates:
            if len(update) != 3:
                raise InvalidArgument(f"a CDC update is (data, time, diff), got {update!r}")
            if update[2] == 0:
                raise InvalidArgument(f"a CDC update has a zero diff: {update!r}")
        object.__setattr__(self, "updates", updates)


@dataclass(frozen=True)
class Progress(Generic[T]):
    """Every time at or beyond ``lower`` and not at or beyond ``upper`` has exactly the number
    of distinct updates listed in ``counts``; times not listed have none. ``upper == {}`` closes
    the stream."""

    lower: Antichain[T]
    upper: Antichain[T]
    counts: Sequence[tuple[T, int]] = ()

    def __post_init__(self) -> None:
        counts = tuple(self.counts)
        if self.lower.lattice != self.upper.lattice:
            raise InvalidArgument("progress bounds are on different timelines")
        if not self.lower.frontier_less_equal(self.upper):
            raise InvalidArgument(
                f"progress lower {self.lower!r} is not at or before its upper {self.upper!r}"
            )
        seen: set[T] = set()
        for time, count in counts:
            if not self.lower.less_equal(time) or self.upper.less_equal(time):
                raise InvalidArgument(
                    f"progress count at {time!r} lies outside [{self.lower!r}, {self.upper!r})"
                )
            if count < 0:
                raise InvalidArgument(f"progress count at {time!r} is negative: {count}")
            if time in seen:
                raise InvalidArgument(f"progress counts time {time!r} more than once")
            seen.add(time)
        # Own copies: an Antichain can be mutated in place, a statement must not change.
        object.__setattr__(self, "lower", self.lower.copy())
        object.__setattr__(self, "upper", self.upper.copy())
        object.__setattr__(self, "counts", counts)


Message: TypeAlias = Updates[D, T] | Progress[T]
"""A CDCv2 message."""
