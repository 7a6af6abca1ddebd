"""Distinct and Threshold: the multiplicity of each row, keyed by the whole row.

Both emit only when a row's multiplicity crosses zero in a way that changes their output, at
the time it happens.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.compute.dataflow.batch import Row, Update, by_time, whole_row
from services.compute.dataflow.guard import row_bytes, rows_bytes
from services.compute.dataflow.operators.base import OperatorState, StatefulOperator
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.spilling_map import SpillingMap


class DistinctOperator(StatefulOperator):
    """Each row with positive multiplicity, once; with ``threshold``, each row with its
    multiplicity if positive."""

    def __init__(self, threshold: bool) -> None:
        self.threshold = threshold
        self.routes = (whole_row,)

    def new_state(self) -> DistinctState:
        return DistinctState(self.threshold)


def _count_bytes(row: Row, count: int) -> int:
    return row_bytes(len(row))


class DistinctState(OperatorState):
    def __init__(self, threshold: bool) -> None:
        super().__init__()
        self.threshold = threshold
        self.counts: SpillingMap[int] = SpillingMap(_count_bytes)
        self.values = 0

    def key_count(self) -> int:
        return len(self.counts)

    def held_bytes(self) -> int:
        return rows_bytes(len(self.counts), self.values)

    def attach(self, budget: StateBudget) -> None:
        self.counts.attach(budget)

    def release(self) -> None:
        self.counts.release()

    def spilled_bytes(self) -> int:
        return self.counts.spilled_bytes

    def process(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        counts = self.counts
        out: list[Update] = []
        for time, changes in by_time(updates):
            self.work.key_lookups += len(changes)
            rows = counts.in_bucket_order(changes)
            for row in rows:
                diff = changes[row]
                if not diff:
                    continue
                bucket = counts.bucket(row)
                entries = bucket.entries
                assert entries is not None
                before = entries.get(row, 0)
                after = before + diff
                if after:
                    if before:
                        entries[row] = after
                    else:
                        counts.add(bucket, row, after, row_bytes(len(row)))
                        self.values += len(row)
                else:
                    counts.discard(bucket, row, row_bytes(len(row)))
                    self.values -= len(row)
                if self.threshold:
                    change = max(after, 0) - max(before, 0)
                else:
                    change = (after > 0) - (before > 0)
                if change:
                    out.append((row, time, change))
                counts.settle()
        return out
