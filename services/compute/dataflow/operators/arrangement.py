"""An arrangement: a collection indexed by key, ``{key: {row: multiplicity}}``.

Operators keep only the current contents (as of the latest time they processed): the engine
handles times in increasing order and never receives an update at an earlier time, so older
versions are never read again. Multi-versioned history is kept only where reads at past times
are needed (``services.compute.dataflow.index``).

Attached to a task's ``StateBudget`` (``services.compute.dataflow.spill``), an arrangement
keeps only its recently used keys in memory: the budget moves its oldest keys to disk when the
task's state outgrows the budget, and reading a spilled key brings it back. Reads go through
``get`` and ``in`` for that reason; ``rows`` holds only the keys in memory.

A hydrated arrangement holds its bulk as columnar batches (``services.compute.dataflow.columnar``:
Arrow data sorted by key hash, built without a Python object per row) under the dict of
recently used keys: a read of a key that is in neither the dict nor the spill file searches
the batches, and moves the key's rows from its batch into the dict, so that every key lives in
one place and the dict is where changes go. Over the budget, the batches are the first to go
to disk (as Arrow IPC files, memory-mapped back).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

from services.compute.dataflow.batch import Key, Row
from services.compute.dataflow.columnar import ColumnarBatch, key_hash
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.spill import Location, StateBudget

_SPILL_BATCH = 256
"""Keys examined per round when choosing what to spill."""


class Arrangement:
    __slots__ = (
        "__weakref__",
        "_batches",
        "_budget",
        "_cold",
        "_hot_rows",
        "_member_id",
        "_row_bytes",
        "row_count",
        "rows",
    )

    def __init__(self, width: int = 1) -> None:
        self.rows: dict[Key, dict[Row, int]] = {}
        """The keys held in memory (all of them unless spilled) and their rows."""
        self.row_count = 0
        """Distinct rows held over all keys, spilled or not (for budgets and status)."""
        self._row_bytes = row_bytes(width)
        self._hot_rows = 0
        self._cold: dict[Key, Location] = {}
        self._budget: StateBudget | None = None
        self._member_id = 0
        self._batches: list[ColumnarBatch] = []

    def attach(self, budget: StateBudget) -> None:
        """Counts this arrangement's rows in memory against ``budget`` from now on."""
        if self._budget is None:
            self._budget = budget
            self._member_id = budget.attach(self)

    def release(self) -> None:
        """Stops counting against the budget and deletes what was spilled (the state is
        being dropped)."""
        budget = self._budget
        if budget is not None:
            budget.detach(self, self._member_id)
            budget.columnar_disk_bytes -= sum(batch.file_bytes for batch in self._batches)
            self._budget = None
            self._cold = {}
        for batch in self._batches:
            batch.close()
        self._batches = []

    def get(self, key: Key) -> dict[Row, int] | None:
        """The rows under ``key`` (a live view: do not modify, and read it before the next
        ``apply``, which may spill it), or None when there are none."""
        rows = self.rows.get(key)
        if rows is None and self._cold:
            location = self._cold.pop(key, None)
            if location is not None:
                rows = self._unspill(key, location)
        if rows is None and self._batches:
            rows = self._from_batches(key)
        return rows

    def __contains__(self, key: Key) -> bool:
        return self.get(key) is not None

    def apply(self, key: Key, changes: Iterable[tuple[Row, int]]) -> None:
        """Adds ``changes`` to the rows under ``key``; rows that reach zero are removed, and so
        is a key with no rows left, so "no rows" always means "absent"."""
        rows = self.get(key)
        if rows is None:
            rows = self.rows[key] = {}
        before = len(rows)
        for row, diff in changes:
            total = rows.get(row, 0) + diff
            if total:
                rows[row] = total
            else:
                rows.pop(row, None)
        added = len(rows) - before
        self.row_count += added
        self._hot_rows += added
        if not rows:
            del self.rows[key]
        budget = self._budget
        # Also when nothing was added: the key may have just come back from disk.
        if budget is not None and (added or budget.held_bytes > budget.budget_bytes):
            budget.charge(added * self._row_bytes)

    def items(self) -> Iterator[tuple[Key, dict[Row, int]]]:
        """Every key and its rows, spilled ones included (for tests and diagnostics)."""
        yield from self.rows.items()
        if self._budget is not None:
            spill_file = self._budget.file
            for key, location in self._cold.items():
                yield key, spill_file.read(location)
        for batch in self._batches:
            yield from batch.items()

    @property
    def spilled_rows(self) -> int:
        """Rows held on disk (spilled keys' rows and batches moved to disk)."""
        in_memory = sum(batch.live_rows for batch in self._batches if not batch.on_disk)
        return self.row_count - self._hot_rows - in_memory

    def __len__(self) -> int:
        return len(self.rows) + len(self._cold) + sum(batch.keys for batch in self._batches)

    # -- columnar batches ----------------------------------------------------------------------

    def add_batch(self, batch: ColumnarBatch) -> None:
        """Adds the rows of ``batch`` (a hydration's load) under keys this arrangement does
        not hold yet."""
        self._batches.append(batch)
        self.row_count += batch.live_rows
        budget = self._budget
        if budget is not None:
            budget.charge(batch.nbytes)

    def _from_batches(self, key: Key) -> dict[Row, int] | None:
        hashed = key_hash(key)
        for index, batch in enumerate(self._batches):
            rows = batch.take(key, hashed)
            if rows is None:
                continue
            self.rows[key] = rows
            self._hot_rows += len(rows)
            budget = self._budget
            if budget is not None:
                # Charged without relieving, as for a key read back from the spill file.
                budget.held_bytes += len(rows) * self._row_bytes
            if not batch.live_rows:
                self._drop_batch(index)
            return rows
        return None

    def _drop_batch(self, index: int) -> None:
        batch = self._batches.pop(index)
        budget = self._budget
        if budget is not None:
            if batch.on_disk:
                budget.columnar_disk_bytes -= batch.file_bytes
            else:
                budget.held_bytes -= batch.nbytes
        batch.close()

    # -- as a member of a StateBudget ----------------------------------------------------------

    def held_in_memory(self) -> int:
        return self._hot_rows * self._row_bytes + sum(
            batch.nbytes for batch in self._batches if not batch.on_disk
        )

    @property
    def spilled(self) -> dict[Key, Location]:
        return self._cold

    def spill_oldest(self, bytes_wanted: int) -> int:
        budget = self._budget
        if budget is None:
            return 0
        freed = 0
        for batch in self._batches:
            if freed >= bytes_wanted:
                break
            if not batch.on_disk:
                # The dead marks stay in memory: freed is what leaves the heap.
                freed += batch.to_disk(budget.directory)
                budget.columnar_disk_bytes += batch.file_bytes
        rows = self.rows
        while freed < bytes_wanted and rows:
            chosen = []
            for key in islice(rows, _SPILL_BATCH):
                chosen.append(key)
                freed += len(rows[key]) * self._row_bytes
                if freed >= bytes_wanted:
                    break
            contents = [rows.pop(key) for key in chosen]
            cold = self._cold
            for key, location in zip(chosen, budget.file.put(contents), strict=True):
                cold[key] = location
            self._hot_rows -= sum(len(held) for held in contents)
            budget.spilled_keys += len(chosen)
        return freed

    def _unspill(self, key: Key, location: Location) -> dict[Row, int]:
        budget = self._budget
        assert budget is not None
        rows = budget.file.take(location)
        self.rows[key] = rows
        self._hot_rows += len(rows)
        # Charged without relieving: the caller reads these rows before its next apply.
        budget.held_bytes += len(rows) * self._row_bytes
        return rows
