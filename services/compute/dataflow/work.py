"""Counters of the work stateful operators do, for tests and diagnostics.

Timings are noisy; counts are not. A test can show that a one-row change to a large view costs
a handful of key lookups by reading these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Work:
    """What arrangements were asked to do."""

    key_lookups: int = 0
    """Keys looked up or updated in an arrangement."""
    rows_visited: int = 0
    """Arranged rows read while producing output (join matches, window rows, ...)."""

    def add(self, other: Work) -> None:
        self.key_lookups += other.key_lookups
        self.rows_visited += other.rows_visited

    def reset(self) -> None:
        self.key_lookups = 0
        self.rows_visited = 0


@dataclass(frozen=True)
class StateSize:
    """How much state a dataflow's operators hold: keys in their arrangements, the entries
    under those keys (distinct rows, or kept values such as MIN/MAX's), and the bytes they are
    estimated to take, costed as ``guard.row_bytes`` costs rows (the figure budgets check);
    ``spilled_bytes`` of those bytes are rows a task's state budget moved to local disk
    (``spill.py``), costed the same way."""

    keys: int = 0
    rows: int = 0
    bytes: int = 0
    spilled_bytes: int = 0

    def __add__(self, other: StateSize) -> StateSize:
        return StateSize(
            self.keys + other.keys,
            self.rows + other.rows,
            self.bytes + other.bytes,
            self.spilled_bytes + other.spilled_bytes,
        )
