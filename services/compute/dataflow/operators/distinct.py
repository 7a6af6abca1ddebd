"""Distinct and Threshold: the multiplicity of each row, keyed by the whole row.

Both emit only when a row's multiplicity crosses zero in a way that changes their output, at
the time it happens.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.compute.dataflow.batch import Row, Update, by_time
from services.compute.dataflow.guard import rows_bytes
from services.compute.dataflow.operators.base import OperatorState, StatefulOperator


def _whole_row(row: Row) -> Row:
    return row


class DistinctOperator(StatefulOperator):
    """Each row with positive multiplicity, once; with ``threshold``, each row with its
    multiplicity if positive."""

    def __init__(self, threshold: bool) -> None:
        self.threshold = threshold
        self.routes = (_whole_row,)

    def new_state(self) -> DistinctState:
        return DistinctState(self.threshold)


class DistinctState(OperatorState):
    def __init__(self, threshold: bool) -> None:
        super().__init__()
        self.threshold = threshold
        self.counts: dict[Row, int] = {}
        self.values = 0

    def key_count(self) -> int:
        return len(self.counts)

    def held_bytes(self) -> int:
        return rows_bytes(len(self.counts), self.values)

    def process(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        counts = self.counts
        out: list[Update] = []
        for time, changes in by_time(updates):
            self.work.key_lookups += len(changes)
            for row, diff in changes.items():
                if not diff:
                    continue
                before = counts.get(row, 0)
                after = before + diff
                if after:
                    counts[row] = after
                    if not before:
                        self.values += len(row)
                else:
                    del counts[row]
                    self.values -= len(row)
                if self.threshold:
                    change = max(after, 0) - max(before, 0)
                else:
                    change = (after > 0) - (before > 0)
                if change:
                    out.append((row, time, change))
        return out
