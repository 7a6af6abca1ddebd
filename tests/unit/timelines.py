"""Small timelines for the property tests of the time core, and brute-force oracles.

Each timeline has a finite grid of times closed under join and meet, so the tests can check a
claim against every time there is (within the grid) instead of trusting the code under test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tidemark.frontier import Antichain
from tidemark.lattice import U64, U64_PAIRS, Lattice

Time = Any
UpdateT = tuple[str, Time, int]


@dataclass(frozen=True)
class Timeline:
    name: str
    lattice: Lattice[Any]
    grid: tuple[Time, ...]
    """Every time the tests draw; closed under join and meet, contains the minimum."""
    beyond_grid: tuple[Time, ...]
    """A frontier whose times are exactly those beyond every grid time's reach: a time outside
    the grid is at or beyond one of these, and no grid time is."""

    def __str__(self) -> str:
        return self.name

    def times(self) -> st.SearchStrategy[Time]:
        return st.sampled_from(self.grid)

    def time_lists(self, min_size: int = 0, max_size: int = 4) -> st.SearchStrategy[list[Time]]:
        return st.lists(self.times(), min_size=min_size, max_size=max_size)

    def frontiers(self, min_size: int = 0, max_size: int = 4) -> st.SearchStrategy[Antichain[Any]]:
        """Antichains built by inserting a few grid times; ``{}`` when none are drawn."""
        return self.time_lists(min_size, max_size).map(lambda ts: Antichain(self.lattice, ts))

    def updates(self, max_size: int = 16) -> st.SearchStrategy[list[UpdateT]]:
        return st.lists(st.tuples(DATA, self.times(), DIFFS), max_size=max_size)


DATA = st.sampled_from(["a", "b", "c", "d"])
DIFFS = st.integers(-3, 3)

U64_TIMELINE = Timeline("u64", U64, tuple(range(7)), (7,))

_PAIR_SIDE = 5
PAIR_TIMELINE = Timeline(
    "pairs",
    U64_PAIRS,
    tuple((a, b) for a in range(_PAIR_SIDE) for b in range(_PAIR_SIDE)),
    ((_PAIR_SIDE, 0), (0, _PAIR_SIDE)),
)

TIMELINES = [U64_TIMELINE, PAIR_TIMELINE]
TIMELINE_IDS = [tl.name for tl in TIMELINES]


# -- brute-force oracles ----------------------------------------------------------------------
def minimal(lattice: Lattice[Any], times: Iterable[Time]) -> frozenset[Time]:
    """The times of ``times`` that no other one of them is strictly below."""
    pool = set(times)
    return frozenset(t for t in pool if not any(lattice.less_than(s, t) for s in pool))


def upset(lattice: Lattice[Any], elements: Iterable[Time], grid: Iterable[Time]) -> frozenset[Time]:
    """The grid times at or beyond some element: the reach of a frontier within the grid."""
    held = list(elements)
    return frozenset(t for t in grid if any(lattice.less_equal(e, t) for e in held))


def brute_read(lattice: Lattice[Any], updates: Iterable[UpdateT], t: Time) -> dict[str, int]:
    """The version at ``t`` summed the slow way, for comparison with the library's reads."""
    totals: dict[str, int] = {}
    for data, time, diff in updates:
        if lattice.less_equal(time, t):
            totals[data] = totals.get(data, 0) + diff
    return {d: n for d, n in totals.items() if n != 0}
