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
one place. A change to a key with few rows in a batch moves them the same way; a key with many
(a join's customer with thousands of orders) keeps them in the batch and collects its changes
beside it (``_pending``), so that a step inserting under it does not convert all its rows to
Python objects. Those changes are not looked up in the batch: whether a change adds or removes
a distinct row is settled when a read moves the key out, and until then the row counts
(``row_count``, ``len``) count what is held, as a spine counts updates before its batches
merge. Over the budget, the
batches are the first to go to disk (as Arrow IPC files, memory-mapped back).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from services.compute.dataflow.batch import Key, Row
from services.compute.dataflow.columnar import ColumnarBatch, key_hash
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.spill import Location, StateBudget

_SPILL_BATCH = 256
"""Keys examined per round when choosing what to spill."""

MATERIALISE_ROWS = 64
"""A changed key with at most this many rows in a batch moves them into the dict; a key with
more keeps them there and collects its changes beside them."""


def add_changes(rows: dict[Row, int], changes: Iterable[tuple[Row, int]]) -> None:
    """Adds ``changes`` to the multiplicities in ``rows``, removing rows that reach zero."""
    for row, diff in changes:
        total = rows.get(row, 0) + diff
        if total:
            rows[row] = total
        else:
            rows.pop(row, None)


class Arrangement:
    __slots__ = (
        "__weakref__",
        "_batches",
        "_budget",
        "_cold",
        "_hot_rows",
        "_member_id",
        "_pending",
        "_pending_entries",
        "_row_bytes",
        "row_count",
        "rows",
    )

    def __init__(self, width: int = 1) -> None:
        self.rows: dict[Key, dict[Row, int]] = {}
        """The keys held in memory (all of them unless spilled) and their rows."""
        self.row_count = 0
        """Rows held over all keys, spilled or not (for budgets and status): distinct rows,
        but a key that keeps its rows in a batch counts its batch rows and, beside them,
        each row a change touched since, until a read moves the key out of the batch (as a
        spine counts its updates until its batches merge). Knowing whether a change beside
        the batch adds or removes a distinct row would mean finding the row in the batch,
        which was a third of a task's step."""
        self._row_bytes = row_bytes(width)
        self._hot_rows = 0
        self._cold: dict[Key, Location] = {}
        self._budget: StateBudget | None = None
        self._member_id = 0
        self._batches: list[ColumnarBatch] = []
        self._pending: dict[Key, dict[Row, int]] = {}
        """Per key whose rows stay in a batch: the net change per row since the batch was
        loaded (no zeros)."""
        self._pending_entries = 0

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
        self._pending = {}

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
        if self._batches and key not in self.rows and key not in self._cold:
            pending = self._pending.get(key)
            if pending is not None or self._many_in(self._ranges(key)):
                self._apply_pending(key, pending, changes)
                return
        rows = self.get(key)
        if rows is None:
            rows = self.rows[key] = {}
        before = len(rows)
        add_changes(rows, changes)
        added = len(rows) - before
        self.row_count += added
        self._hot_rows += added
        if not rows:
            del self.rows[key]
        budget = self._budget
        # Also when nothing was added: the key may have just come back from disk.
        if budget is not None and (added or budget.held_bytes > budget.budget_bytes):
            budget.charge(added * self._row_bytes)

    @property
    def batched(self) -> bool:
        """Whether some of its rows are held in columnar batches."""
        return bool(self._batches)

    def items(self) -> Iterator[tuple[Key, dict[Row, int]]]:
        """Every key and its rows, spilled ones included (for tests and diagnostics)."""
        yield from self.rows.items()
        if self._budget is not None:
            spill_file = self._budget.file
            for key, location in self._cold.items():
                yield key, spill_file.read(location)
        if not self._batches:
            return
        held: dict[Key, dict[Row, int]] = {}
        for batch in self._batches:
            for key, rows in batch.items():
                held.setdefault(key, {}).update(rows)
        for key, changes in self._pending.items():
            add_changes(held.setdefault(key, {}), changes.items())
        for key, rows in held.items():
            if rows:
                yield key, rows

    @property
    def spilled_rows(self) -> int:
        """Rows held on disk: the spilled keys' rows and the live rows of the batches moved
        to disk, counted as held as ``row_count`` counts them (changes beside a batch are in
        memory)."""
        on_disk = sum(batch.live_rows for batch in self._batches if batch.on_disk)
        in_batches = sum(batch.live_rows for batch in self._batches)
        return self.row_count - self._hot_rows - self._pending_entries - in_batches + on_disk

    def __len__(self) -> int:
        """Keys held: a key keeping its rows in a batch counts until a read moves it out,
        even when its changes beside the batch have removed every row."""
        batched = sum(batch.keys for batch in self._batches)
        return len(self.rows) + len(self._cold) + batched

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
        """Moves the key's rows out of the batches, with its pending changes, into the dict."""
        hashed = key_hash(key)
        rows: dict[Row, int] = {}
        taken_rows = 0
        for batch in list(self._batches):
            taken = batch.take(key, hashed)
            if taken is not None:
                rows.update(taken)
                taken_rows += len(taken)
                if not batch.live_rows:
                    self._drop_batch(batch)
        budget = self._budget
        entries = 0
        pending = self._pending.pop(key, None)
        if pending is not None:
            entries = len(pending)
            self._pending_entries -= entries
            if budget is not None:
                budget.held_bytes -= entries * self._row_bytes
            add_changes(rows, pending.items())
        # Counted as its batch rows and its changes beside them until now: now distinct.
        self.row_count += len(rows) - taken_rows - entries
        if not rows:
            return None
        self.rows[key] = rows
        self._hot_rows += len(rows)
        if budget is not None:
            # Charged without relieving, as for a key read back from the spill file.
            budget.held_bytes += len(rows) * self._row_bytes
        return rows

    @staticmethod
    def _many_in(ranges: Sequence[tuple[ColumnarBatch, int, int]]) -> bool:
        """Whether a key whose rows are at ``ranges`` keeps them in the batches."""
        return sum(batch.live_in(lo, hi) for batch, lo, hi in ranges) > MATERIALISE_ROWS

    def _ranges(self, key: Key) -> list[tuple[ColumnarBatch, int, int]]:
        """Where the key's rows are in each batch that holds any."""
        hashed = key_hash(key)
        ranges = [(batch, *batch.key_range(hashed)) for batch in self._batches]
        return [r for r in ranges if r[1] < r[2]]

    def _apply_pending(
        self, key: Key, held: dict[Row, int] | None, changes: Iterable[tuple[Row, int]]
    ) -> None:
        """Adds ``changes`` beside the key's rows in the batches, each changed row held
        (and counted) once there until the key leaves the batches."""
        if held is None:
            held = self._pending[key] = {}
        entries = len(held)
        add_changes(held, changes)
        added = len(held) - entries
        self._pending_entries += added
        self.row_count += added
        if not held:
            del self._pending[key]
        budget = self._budget
        if budget is not None and (added or budget.held_bytes > budget.budget_bytes):
            budget.charge(added * self._row_bytes)

    def _drop_batch(self, batch: ColumnarBatch) -> None:
        self._batches.remove(batch)
        budget = self._budget
        if budget is not None:
            if batch.on_disk:
                budget.columnar_disk_bytes -= batch.file_bytes
            else:
                budget.held_bytes -= batch.nbytes
        batch.close()

    # -- as a member of a StateBudget ----------------------------------------------------------

    def held_in_memory(self) -> int:
        return (self._hot_rows + self._pending_entries) * self._row_bytes + sum(
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
        rows: dict[Row, int] = budget.file.take(location)
        self.rows[key] = rows
        self._hot_rows += len(rows)
        # Charged without relieving: the caller reads these rows before its next apply.
        budget.held_bytes += len(rows) * self._row_bytes
        return rows
