"""An arrangement: a collection indexed by key, ``{key: {row: multiplicity}}``.

Operators keep only the current contents (as of the latest time they processed): the engine
handles times in increasing order and never receives an update at an earlier time, so older
versions are never read again. Multi-versioned history is kept only where reads at past times
are needed (``services.compute.dataflow.index``).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.compute.dataflow.batch import Key, Row


class Arrangement:
    __slots__ = ("row_count", "rows")

    def __init__(self) -> None:
        self.rows: dict[Key, dict[Row, int]] = {}
        self.row_count = 0
        """Distinct rows held over all keys (kept as changes apply, for memory budgets)."""

    def get(self, key: Key) -> dict[Row, int] | None:
        """The rows under ``key`` (a live view: do not modify), or None when there are none."""
        return self.rows.get(key)

    def apply(self, key: Key, changes: Iterable[tuple[Row, int]]) -> None:
        """Adds ``changes`` to the rows under ``key``; rows that reach zero are removed, and so
        is a key with no rows left, so "no rows" always means "absent"."""
        rows = self.rows.get(key)
        if rows is None:
            rows = self.rows[key] = {}
        before = len(rows)
        for row, diff in changes:
            total = rows.get(row, 0) + diff
            if total:
                rows[row] = total
            else:
                rows.pop(row, None)
        self.row_count += len(rows) - before
        if not rows:
            del self.rows[key]

    def __len__(self) -> int:
        return len(self.rows)
