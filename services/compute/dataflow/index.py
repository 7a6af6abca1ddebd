"""An index: the output of a dataflow arranged by key columns, readable at past times.

Unlike operator state, an index is multi-versioned, because a peek asks for the contents at a
chosen time ``t`` in ``[since, upper)``. Per key it holds a consolidated base (every update at
or before ``since``) and the later updates in time order. Reading at ``t`` adds the base and the
updates at times ``<= t``. ``compact(since)`` folds the updates at or before the new ``since``
into the base: afterwards reads before it are refused, and memory holds one entry per live row
plus the history not yet compacted.

The base, the bulk of an index, lives in a ``SpillingMap``: attached to a task's
``StateBudget`` (as the operators' state is), the keys held longest go to disk with their
rows, a bucket at a time, and come back when compaction folds changes into them or a lookup
reads them; a whole read (``contents_at``) reads the spilled buckets without bringing them
back, so a peek does not push the state out. The history not yet compacted (the index's
window: recent changes) stays in memory, per key, where a step appends to it without reading
the base at all.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from services.compute.dataflow.batch import Key, Row, Update
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.ordering import canonical_float
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.spilling_map import SpillingMap
from services.compute.dataflow.work import StateSize
from tidemark.errors import FailedPrecondition, InvalidArgument

SETTLE_EVERY = 256
"""Keys changed in the base between two looks of the budget at what to spill (a
hydration's whole output is one batch)."""


class Index:
    def __init__(self, key_columns: Sequence[int], *, since: int) -> None:
        self.key_columns = tuple(key_columns)
        self._key = columns_key(list(key_columns))
        self._since = since
        self._upper = since
        self._row_bytes = row_bytes(0)
        """The estimated cost of one held row (every output row has the same width, known
        from the first update)."""
        self._base: SpillingMap[dict[Row, int]] = SpillingMap(self._rows_bytes)
        self._base_rows = 0
        # Per key with history: the update times (ascending) and the (row, diff) at each.
        self._times: dict[Key, list[int]] = {}
        self._changes: dict[Key, list[tuple[Row, int]]] = {}
        self._history_size = 0

    @property
    def since(self) -> int:
        return self._since

    @property
    def upper(self) -> int:
        return self._upper

    # -- the budget ----------------------------------------------------------------------------

    def attach(self, budget: StateBudget) -> None:
        """Keeps the index's base within a task's memory budget from now on: what does not
        fit spills."""
        self._base.attach(budget)

    def release(self) -> None:
        """The index is being dropped: let go of what ``attach`` took."""
        self._base.release()

    def held_bytes(self) -> int:
        """The estimated memory of the index, spilled rows included (as operator state's)."""
        return self.row_count() * self._row_bytes

    def spilled_bytes(self) -> int:
        """Of ``held_bytes``, the base's rows moved to local disk by the budget."""
        return self._base.spilled_bytes

    def row_count(self) -> int:
        """Rows and changes held (the base's rows, and the history not yet compacted)."""
        return self._base_rows + self._history_size

    def key_count(self) -> int:
        return len(self._base)

    # -- changes ---------------------------------------------------------------------------------

    def apply(self, updates: Iterable[Update], upper: int) -> None:
        """Adds a dataflow step's output: updates at times in ``[self.upper, upper)``."""
        if upper < self._upper:
            raise InvalidArgument(f"index upper cannot move back from {self._upper} to {upper}")
        ordered = sorted(updates, key=_time)
        if ordered and not self._upper <= ordered[0][1] <= ordered[-1][1] < upper:
            raise InvalidArgument(
                f"updates at times {ordered[0][1]}..{ordered[-1][1]} are not all in "
                f"[{self._upper}, {upper})"
            )
        if ordered and self.row_count() == 0:
            self._row_bytes = row_bytes(len(ordered[0][0]))
        key_of = self._key
        since = self._since
        into_base: dict[Key, list[tuple[Row, int]]] = {}
        times, changes = self._times, self._changes
        for row, time, diff in ordered:
            key = key_of(row)
            if time <= since:  # compacted past the upper: straight into the base
                into_base.setdefault(key, []).append((row, diff))
                continue
            held = times.get(key)
            if held is None:
                times[key] = [time]
                changes[key] = [(row, diff)]
            else:
                held.append(time)
                changes[key].append((row, diff))
            self._history_size += 1
        if into_base:
            self._fold(into_base)
        self._upper = upper

    def compact(self, since: int) -> None:
        """Allows reads only at ``since`` and later, and folds older history into the base."""
        if since < self._since:
            raise FailedPrecondition(f"index since cannot move back from {self._since} to {since}")
        self._since = since
        folded: dict[Key, list[tuple[Row, int]]] = {}
        for key in list(self._times):
            times = self._times[key]
            cut = bisect.bisect_right(times, since)
            if not cut:
                continue
            changes = self._changes[key]
            folded[key] = changes[:cut]
            self._history_size -= cut
            if cut == len(times):
                del self._times[key], self._changes[key]
            else:
                self._times[key] = times[cut:]
                self._changes[key] = changes[cut:]
        if folded:
            self._fold(folded)

    def _fold(self, changes_by_key: dict[Key, list[tuple[Row, int]]]) -> None:
        """Adds changes into the base, key by key (bucket after bucket, for many keys),
        letting the budget spill every ``SETTLE_EVERY`` keys."""
        base = self._base
        cost = self._row_bytes
        for position, key in enumerate(base.in_bucket_order(changes_by_key), 1):
            bucket = base.bucket(key)
            entries = bucket.entries
            assert entries is not None
            rows = entries.get(key)
            fresh = rows is None
            if rows is None:
                rows = {}
            before = len(rows)
            for row, diff in changes_by_key[key]:
                _accumulate(rows, row, diff)
            after = len(rows)
            self._base_rows += after - before
            if fresh:
                if after:
                    base.add(bucket, key, rows, after * cost)
            elif not after:
                base.discard(bucket, key, before * cost)
            elif after != before:
                base.resize(bucket, (after - before) * cost)
            if position % SETTLE_EVERY == 0:
                base.settle()  # no rows are held across it: the next key's are looked up
        base.settle()

    # -- reads -----------------------------------------------------------------------------------

    def contents_at(self, time: int) -> dict[Row, int]:
        """The whole output at ``time``: ``{row: multiplicity}``."""
        self._check_readable(time)
        contents: dict[Row, int] = {}
        for _, rows in self._base.items():
            for row, count in rows.items():
                _accumulate(contents, row, count)
        for key, times in self._times.items():
            for row, diff in self._changes[key][: bisect.bisect_right(times, time)]:
                _accumulate(contents, row, diff)
        return contents

    def lookup(self, key: Sequence[object], time: int) -> dict[Row, int]:
        """The output rows whose key columns equal ``key``, at ``time``."""
        self._check_readable(time)
        wanted = tuple(canonical_float(v) if v.__class__ is float else v for v in key)
        rows = self._base.get(wanted)
        contents = dict(rows) if rows else {}
        self._base.settle()
        times = self._times.get(wanted)
        if times:
            for row, diff in self._changes[wanted][: bisect.bisect_right(times, time)]:
                _accumulate(contents, row, diff)
        return contents

    def changes_between(self, lower: int, upper: int) -> list[Update]:
        """The output's changes at times in ``[lower, upper)``, from the history not yet
        compacted: what a subscriber starting at ``lower - 1`` missed (the steps' outputs,
        which stayed where the index is)."""
        if lower <= self._since:
            raise FailedPrecondition(
                f"changes from {lower} on are not all kept: the index's since is {self._since}"
            )
        if upper > self._upper:
            raise FailedPrecondition(
                f"time {upper - 1} is not complete yet: the index's upper is {self._upper}"
            )
        found: list[Update] = []
        for key, times in self._times.items():
            start, end = bisect.bisect_left(times, lower), bisect.bisect_left(times, upper)
            found.extend(
                (row, time, diff)
                for time, (row, diff) in zip(
                    times[start:end], self._changes[key][start:end], strict=True
                )
            )
        return found

    def history_size(self) -> int:
        """Updates held beyond the base (what compaction would shrink)."""
        return self._history_size

    def _rows_bytes(self, key: Key, rows: dict[Row, int]) -> int:
        return len(rows) * self._row_bytes

    def _check_readable(self, time: int) -> None:
        if time < self._since:
            raise FailedPrecondition(
                f"time {time} is before the index's since {self._since}; it has been compacted"
            )
        if time >= self._upper:
            raise FailedPrecondition(
                f"time {time} is not complete yet: the index's upper is {self._upper}"
            )


def _time(update: Update) -> int:
    return update[1]


def _accumulate(into: dict[Row, int], row: Row, diff: int) -> None:
    total = into.get(row, 0) + diff
    if total:
        into[row] = total
    else:
        into.pop(row, None)


def with_index(size: StateSize, index: Index | None) -> StateSize:
    """A dataflow's state size with its index's memory counted in: the bytes it holds and
    those it spilled (its keys and rows are the output's, not operator state's)."""
    if index is None:
        return size
    return StateSize(
        size.keys,
        size.rows,
        size.bytes + index.held_bytes(),
        size.spilled_bytes + index.spilled_bytes(),
    )
