"""A multiset of rows whose present rows are kept in a total order (top-k, window functions).

The sort key must end with the whole row (``ordering.compile_sort_key``), so no two distinct
rows tie and a binary search finds a row's place. An update costs O(log n) comparisons plus
the list shift.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

from services.compute.dataflow.batch import Row
from services.compute.dataflow.ordering import SortKey


class OrderedRows:
    __slots__ = ("counts", "ordered")

    def __init__(self) -> None:
        self.counts: dict[Row, int] = {}
        # (sort key, row) for every row with a positive multiplicity, in order.
        self.ordered: list[tuple[tuple[Any, ...], Row]] = []

    def update(self, row: Row, diff: int, sort_key: SortKey) -> None:
        """Adds ``diff`` to ``row``'s multiplicity, keeping ``ordered`` in step."""
        if not diff:
            return
        counts = self.counts
        before = counts.get(row, 0)
        after = before + diff
        if after:
            counts[row] = after
        else:
            del counts[row]
        if before <= 0 < after:
            bisect.insort(self.ordered, (sort_key(row), row))
        elif after <= 0 < before:
            del self.ordered[bisect.bisect_left(self.ordered, (sort_key(row), row))]

    def copies(self) -> Iterator[Row]:
        """The present rows in order, each as many times as its multiplicity."""
        counts = self.counts
        for _, row in self.ordered:
            for _ in range(counts[row]):
                yield row

    def __bool__(self) -> bool:
        return bool(self.counts)
