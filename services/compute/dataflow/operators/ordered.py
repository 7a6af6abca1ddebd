"""A multiset of rows whose present rows are kept in a total order (top-k, window functions).

The sort key must end with the whole row (``ordering.compile_sort_key``), so no two distinct
rows tie. The present rows are kept in ``SortedWeights``, weighted by their multiplicity, so an
update costs O(log n) and so does finding the row at a position counted in copies.
"""

from __future__ import annotations

from collections.abc import Iterator

from services.compute.dataflow.batch import Row
from services.compute.dataflow.operators.sorted_weights import SortedWeights
from services.compute.dataflow.ordering import SortKey


class OrderedRows:
    __slots__ = ("counts", "ordered", "values")

    def __init__(self) -> None:
        self.counts: dict[Row, int] = {}
        # (sort key, row) for every row with a positive multiplicity, weighted by it.
        self.ordered = SortedWeights()
        self.values = 0
        """Column values over the rows in ``counts`` (for the state's size)."""

    def update(self, row: Row, diff: int, sort_key: SortKey) -> None:
        """Adds ``diff`` to ``row``'s multiplicity, keeping ``ordered`` in step."""
        if not diff:
            return
        counts = self.counts
        before = counts.get(row, 0)
        after = before + diff
        if after:
            counts[row] = after
            if not before:
                self.values += len(row)
        else:
            del counts[row]
            self.values -= len(row)
        if after > 0:
            if before > 0:
                self.ordered.reweight((sort_key(row), row), after)
            else:
                self.ordered.insert((sort_key(row), row), after)
        elif before > 0:
            self.ordered.remove((sort_key(row), row))

    def copies(self) -> Iterator[Row]:
        """The present rows in order, each as many times as its multiplicity."""
        for (_, row), count in self.ordered:
            for _ in range(count):
                yield row

    def window(self, low: int, high: int | None) -> list[tuple[Row, int]]:
        """The present rows at positions [low, high) of the order (counting each copy; None:
        to the end), each with how many of its copies fall there. O(log n) to the first."""
        return [(entry[1], count) for entry, count in self.ordered.between(low, high)]

    def __bool__(self) -> bool:
        return bool(self.counts)
