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
beside it (``_pending``), each changed row's multiplicity there looked up by its row hash, so
that a step inserting under it does not convert all its rows to Python objects. A step's
changed rows are looked up together (``bases``, ``apply_all``): one hashing of them as Arrow
arrays and one binary search of every key's range in the same numpy passes, rather than a
search and a decoded row per change. Over the budget, the
batches are the first to go to disk (as Arrow IPC files, memory-mapped back).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice

import numpy as np
import pyarrow as pa

from services.compute.dataflow.batch import Key, Row
from services.compute.dataflow.columnar import ColumnarBatch, key_hash, row_hashes_of
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.spill import Location, StateBudget

_SPILL_BATCH = 256
"""Keys examined per round when choosing what to spill."""

MATERIALISE_ROWS = 64
"""A changed key with at most this many rows in a batch moves them into the dict; a key with
more keeps them there and collects its changes beside them."""


class _Pending:
    """The changes to a key whose rows stay in a batch."""

    __slots__ = ("base", "changes", "net", "ranges")

    def __init__(self, ranges: list[tuple[ColumnarBatch, int, int]]) -> None:
        self.ranges = ranges
        """Where the key's rows are in each batch (the batches' arrays never change)."""
        base = sum(batch.live_in(lo, hi) for batch, lo, hi in ranges)
        self.changes: dict[Row, int] = {}
        """Net change per row since the batch was loaded (no zeros)."""
        self.base = base
        """The key's rows in the batches."""
        self.net = 0
        """Distinct rows the changes added to the key's (negative: removed)."""


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
        "_key_adjust",
        "_member_id",
        "_pending",
        "_pending_entries",
        "_pending_net",
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
        self._pending: dict[Key, _Pending] = {}
        self._pending_entries = 0
        self._pending_net = 0
        self._key_adjust = 0
        """Keys the pending changes emptied (negative) of those counted in the batches."""

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

    def apply_all(
        self,
        changes_by_key: Mapping[Key, Sequence[tuple[Row, int]]],
        bases: Mapping[Row, int] | None = None,
    ) -> None:
        """``apply`` to every key of ``changes_by_key``. The changed rows of keys that keep
        their rows in a batch learn their multiplicities there together (from ``bases``,
        what ``bases`` answered for these changes earlier, else looked up here), rather
        than by one binary search and one decoded row per change."""
        if not self._batches:
            for key, changes in changes_by_key.items():
                self.apply(key, changes)
            return
        beside: list[tuple[Key, _Pending, Sequence[tuple[Row, int]]]] = []
        for key, changes in changes_by_key.items():
            if key not in self.rows and key not in self._cold:
                pending = self._pending.get(key)
                if pending is None:
                    ranges = self._ranges(key)
                    if self._many_in(ranges):
                        pending = self._pending[key] = _Pending(ranges)
                if pending is not None:
                    beside.append((key, pending, changes))
                    continue
            self.apply(key, changes)
        if bases is None:
            # Looked up after the keys above moved out of the batches (which leaves the
            # other rows there as they are).
            bases = self._bases(
                [(pending.ranges, [row for row, _ in changes]) for _, pending, changes in beside]
            )
        for key, pending, changes in beside:
            self._apply_pending(key, pending, changes, bases)

    @property
    def batched(self) -> bool:
        """Whether some of its rows are held in columnar batches."""
        return bool(self._batches)

    def bases(self, rows_by_key: Mapping[Key, Sequence[Row]]) -> dict[Row, int]:
        """The multiplicity in the batches of each of ``rows_by_key``'s rows whose key keeps
        its rows there, all looked up together: for ``apply_all`` of any of those changes
        later (the batches' rows of such a key change only when the key leaves them; two keys
        sharing a 64-bit hash may let one come back within a step, and its distinct-row count
        is then as approximate as key counts by hash already are)."""
        if not self._batches:
            return {}
        ranged = []
        for key, rows in rows_by_key.items():
            if key in self.rows or key in self._cold:
                continue
            pending = self._pending.get(key)
            ranges = pending.ranges if pending is not None else self._ranges(key)
            if ranges:
                ranged.append((ranges, rows))
        return self._bases(ranged)

    def _bases(
        self, ranged: Sequence[tuple[Sequence[tuple[ColumnarBatch, int, int]], Sequence[Row]]]
    ) -> dict[Row, int]:
        """``bases`` of each row, given where its key's rows are in each batch."""
        if len(self._batches) == 1:
            in_one = self._bases_in(self._batches[0], ranged)
            if in_one is not None:
                return in_one
        rows: list[Row] = []
        # Per batch, per key holding rows there: its rows' first index and count, and range.
        spans: dict[int, tuple[ColumnarBatch, list[tuple[int, int, int, int]]]] = {}
        for ranges, key_rows in ranged:
            first = len(rows)
            rows.extend(key_rows)
            for batch, lo, hi in ranges:
                found = spans.get(id(batch))
                if found is None:
                    found = spans[id(batch)] = (batch, [])
                found[1].append((first, len(key_rows), lo, hi))
        bases = np.zeros(len(rows), dtype=np.int64)
        hashed: dict[pa.Schema, np.ndarray | None] = {}
        for batch, keys in spans.values():
            firsts, counts, lows, highs = np.array(keys, dtype=np.int64).reshape(-1, 4).T
            # Each key's rows' indices, and its range repeated for each of them.
            ends = np.cumsum(counts)
            indices = np.arange(ends[-1] if len(ends) else 0) + np.repeat(
                firsts - ends + counts, counts
            )
            whole = len(indices) == len(rows)  # the usual case: one batch holds every key
            chosen = rows if whole else [rows[i] for i in indices.tolist()]
            schema = batch.table.schema
            if schema not in hashed:
                hashed[schema] = row_hashes_of(rows, schema)
            row_hashes = hashed[schema]
            low, high = np.repeat(lows, counts), np.repeat(highs, counts)
            if row_hashes is None:  # a row Arrow does not take as the batch's: one by one
                counted = np.array(
                    [
                        batch.count_of(row, key_hash(row), lo, hi)
                        for row, lo, hi in zip(chosen, low.tolist(), high.tolist(), strict=True)
                    ],
                    dtype=np.int64,
                )
            else:
                counted = batch.counts_of(chosen, row_hashes[indices], low, high)
            np.add.at(bases, indices, counted)
        return dict(zip(rows, bases.tolist(), strict=True))

    @staticmethod
    def _bases_in(
        batch: ColumnarBatch,
        ranged: Sequence[tuple[Sequence[tuple[ColumnarBatch, int, int]], Sequence[Row]]],
    ) -> dict[Row, int] | None:
        """``_bases`` when every key's rows are in ``batch`` alone (the usual case: the one
        batch a hydration loaded), without sorting rows out by batch; None when some key's
        are elsewhere too, or a row does not fit the batch's types."""
        rows: list[Row] = []
        lows: list[int] = []
        highs: list[int] = []
        counts: list[int] = []
        for ranges, key_rows in ranged:
            if len(ranges) != 1 or ranges[0][0] is not batch:
                return None
            rows.extend(key_rows)
            lows.append(ranges[0][1])
            highs.append(ranges[0][2])
            counts.append(len(key_rows))
        if not rows:
            return {}
        row_hashes = row_hashes_of(rows, batch.table.schema)
        if row_hashes is None:
            return None
        low = np.repeat(np.array(lows, dtype=np.int64), counts)
        high = np.repeat(np.array(highs, dtype=np.int64), counts)
        return dict(zip(rows, batch.counts_of(rows, row_hashes, low, high).tolist(), strict=True))

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
        for key, pending in self._pending.items():
            add_changes(held.setdefault(key, {}), pending.changes.items())
        for key, rows in held.items():
            if rows:
                yield key, rows

    @property
    def spilled_rows(self) -> int:
        """Rows held on disk (spilled keys' rows and batches moved to disk). A batch's row
        that a pending change removed is still on disk: the figure is capped at the rows
        held."""
        on_disk = sum(batch.live_rows for batch in self._batches if batch.on_disk)
        in_batches = sum(batch.live_rows for batch in self._batches)
        spilled = self.row_count - self._hot_rows - self._pending_net - in_batches + on_disk
        return min(spilled, self.row_count)

    def __len__(self) -> int:
        batched = sum(batch.keys for batch in self._batches) + self._key_adjust
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
        for batch in list(self._batches):
            taken = batch.take(key, hashed)
            if taken is not None:
                rows.update(taken)
                if not batch.live_rows:
                    self._drop_batch(batch)
        budget = self._budget
        pending = self._pending.pop(key, None)
        if pending is not None:
            self._pending_entries -= len(pending.changes)
            self._pending_net -= pending.net
            self._key_adjust -= (pending.base + pending.net > 0) - (pending.base > 0)
            if budget is not None:
                budget.held_bytes -= len(pending.changes) * self._row_bytes
            add_changes(rows, pending.changes.items())
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
        self,
        key: Key,
        pending: _Pending | None,
        changes: Iterable[tuple[Row, int]],
        bases: Mapping[Row, int] | None = None,
    ) -> None:
        """Adds ``changes`` beside the key's rows in the batches: each row's multiplicity
        there (from ``bases`` when given) decides whether the change adds or removes a
        distinct row."""
        if pending is None:
            pending = self._pending[key] = _Pending(self._ranges(key))
        ranges = pending.ranges
        held = pending.changes
        entries, net = len(held), pending.net
        for row, diff in changes:
            if not diff:
                continue
            old = held.get(row, 0)
            new = old + diff
            base = None if bases is None else bases.get(row)
            if base is None:
                row_hash = key_hash(row)
                base = sum(batch.count_of(row, row_hash, lo, hi) for batch, lo, hi in ranges)
            pending.net += ((base + new) != 0) - ((base + old) != 0)
            if new:
                held[row] = new
            else:
                del held[row]
        added = len(held) - entries
        self._pending_entries += added
        self._pending_net += pending.net - net
        self.row_count += pending.net - net
        self._key_adjust += (pending.base + pending.net > 0) - (pending.base + net > 0)
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
