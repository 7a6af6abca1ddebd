"""An index: the output of a dataflow arranged by key columns, readable at past times.

Unlike operator state, an index is multi-versioned, because a peek asks for the contents at a
chosen time ``t`` in ``[since, upper)``. Per key it holds a consolidated base (every update at
or before ``since``) and the later updates in time order. Reading at ``t`` adds the base and the
updates at times ``<= t``. ``compact(since)`` folds the updates at or before the new ``since``
into the base: afterwards reads before it are refused, and memory holds one entry per live row
plus the history not yet compacted.

The keys live in a ``SpillingMap``: attached to a task's ``StateBudget`` (as the operators'
state is), the keys held longest go to disk with their rows and history, a bucket at a time.
A step's changes and a lookup bring a key's bucket back; a whole read (``contents_at``) reads
the spilled buckets without bringing them back, so a peek does not push the state out. Only
the keys with history not yet compacted are listed in memory, so that compaction visits them
alone.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from services.compute.dataflow.batch import Key, Row, Update
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.ordering import canonical_float
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.spilling_map import Bucket, SpillingMap
from services.compute.dataflow.work import StateSize
from tidemark.errors import FailedPrecondition, InvalidArgument


class IndexEntry:
    """One key's rows: the consolidated ``base`` and the later changes, ``times[i]`` being the
    time of ``changes[i]`` (ascending)."""

    __slots__ = ("base", "changes", "times")

    def __init__(self) -> None:
        self.base: dict[Row, int] = {}
        self.times: list[int] = []
        self.changes: list[tuple[Row, int]] = []

    def size(self) -> int:
        """Entries held: the base's rows and the changes."""
        return len(self.base) + len(self.changes)


class Index:
    def __init__(self, key_columns: Sequence[int], *, since: int) -> None:
        self.key_columns = tuple(key_columns)
        self._key = columns_key(list(key_columns))
        self._since = since
        self._upper = since
        self._row_bytes = row_bytes(0)
        """The estimated cost of one held row (every output row has the same width, known
        from the first update)."""
        self._keys: SpillingMap[IndexEntry] = SpillingMap(self._entry_bytes)
        self._history: dict[Key, int] = {}
        """The keys with changes after the base, and the time of each one's first change:
        compaction visits only those it folds something of."""
        self._history_size = 0
        self._rows = 0

    @property
    def since(self) -> int:
        return self._since

    @property
    def upper(self) -> int:
        return self._upper

    # -- the budget ----------------------------------------------------------------------------

    def attach(self, budget: StateBudget) -> None:
        """Keeps the index within a task's memory budget from now on: what does not fit
        spills."""
        self._keys.attach(budget)

    def release(self) -> None:
        """The index is being dropped: let go of what ``attach`` took."""
        self._keys.release()

    def held_bytes(self) -> int:
        """The estimated memory of the index, spilled keys included (as operator state's)."""
        return self._rows * self._row_bytes

    def spilled_bytes(self) -> int:
        """Of ``held_bytes``, the keys moved to local disk by the budget."""
        return self._keys.spilled_bytes

    def row_count(self) -> int:
        """Rows and changes held (the base's rows, and the history not yet compacted)."""
        return self._rows

    def key_count(self) -> int:
        return len(self._keys)

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
        if ordered and self._rows == 0:
            self._row_bytes = row_bytes(len(ordered[0][0]))
        by_key: dict[Key, list[Update]] = {}
        key_of = self._key
        for update in ordered:
            key = key_of(update[0])
            changes = by_key.get(key)
            if changes is None:
                by_key[key] = [update]
            else:
                changes.append(update)
        since = self._since
        for key in self._keys.in_bucket_order(by_key):
            self._change(key, by_key[key], since)
        self._upper = upper

    def _change(self, key: Key, updates: list[Update], since: int) -> None:
        keys = self._keys
        bucket = keys.bucket(key)
        entries = bucket.entries
        assert entries is not None
        entry = entries.get(key)
        fresh = entry is None
        if entry is None:
            entry = IndexEntry()
        before = entry.size()
        for row, time, diff in updates:
            if time <= since:
                _accumulate(entry.base, row, diff)
            else:
                if not entry.times:
                    self._history[key] = time
                entry.times.append(time)
                entry.changes.append((row, diff))
                self._history_size += 1
        self._resized(bucket, key, entry, fresh, before)

    def _resized(
        self, bucket: Bucket[IndexEntry], key: Key, entry: IndexEntry, fresh: bool, before: int
    ) -> None:
        """Tells the map of ``entry``'s change in size (held ``before`` entries), adding or
        dropping it, then lets the budget spill."""
        keys = self._keys
        after = entry.size()
        self._rows += after - before
        cost = self._row_bytes
        if after == 0:
            if not fresh:
                keys.discard(bucket, key, before * cost)
        elif fresh:
            keys.add(bucket, key, entry, after * cost)
        elif after != before:
            keys.resize(bucket, (after - before) * cost)
        keys.settle()

    def compact(self, since: int) -> None:
        """Allows reads only at ``since`` and later, and folds older history into the base."""
        if since < self._since:
            raise FailedPrecondition(f"index since cannot move back from {self._since} to {since}")
        self._since = since
        history = self._history
        due = [key for key, first in history.items() if first <= since]
        keys = self._keys
        for key in keys.in_bucket_order(due):
            bucket = keys.bucket(key)
            entries = bucket.entries
            assert entries is not None
            entry = entries[key]
            before = entry.size()
            times = entry.times
            cut = bisect.bisect_right(times, since)
            for row, diff in entry.changes[:cut]:
                _accumulate(entry.base, row, diff)
            entry.times = times[cut:]
            entry.changes = entry.changes[cut:]
            self._history_size -= cut
            if entry.times:
                history[key] = entry.times[0]
            else:
                del history[key]
            self._resized(bucket, key, entry, False, before)

    # -- reads -----------------------------------------------------------------------------------

    def contents_at(self, time: int) -> dict[Row, int]:
        """The whole output at ``time``: ``{row: multiplicity}``."""
        self._check_readable(time)
        contents: dict[Row, int] = {}
        for _, entry in self._keys.items():
            _collect(entry, time, contents)
        return contents

    def lookup(self, key: Sequence[object], time: int) -> dict[Row, int]:
        """The output rows whose key columns equal ``key``, at ``time``."""
        self._check_readable(time)
        contents: dict[Row, int] = {}
        wanted = tuple(canonical_float(v) if v.__class__ is float else v for v in key)
        entry = self._keys.get(wanted)
        if entry is not None:
            _collect(entry, time, contents)
        self._keys.settle()
        return contents

    def changes_between(self, lower: int, upper: int) -> list[Update]:
        """The output's changes at times in ``[lower, upper)``, from the history not yet
        compacted: what a subscriber starting at ``lower - 1`` missed (the steps' outputs,
        which stayed where the index is). Only the keys with history are visited."""
        if lower <= self._since:
            raise FailedPrecondition(
                f"changes from {lower} on are not all kept: the index's since is {self._since}"
            )
        if upper > self._upper:
            raise FailedPrecondition(
                f"time {upper - 1} is not complete yet: the index's upper is {self._upper}"
            )
        keys = self._keys
        changes: list[Update] = []
        for key in keys.in_bucket_order(list(self._history)):
            entry = keys.get(key)
            assert entry is not None
            times = entry.times
            start, end = bisect.bisect_left(times, lower), bisect.bisect_left(times, upper)
            changes.extend(
                (row, time, diff)
                for time, (row, diff) in zip(
                    times[start:end], entry.changes[start:end], strict=True
                )
            )
            keys.settle()
        return changes

    def history_size(self) -> int:
        """Updates held beyond the base (what compaction would shrink)."""
        return self._history_size

    def _entry_bytes(self, key: Key, entry: IndexEntry) -> int:
        return entry.size() * self._row_bytes

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


def _collect(entry: IndexEntry, time: int, into: dict[Row, int]) -> None:
    for row, count in entry.base.items():
        _accumulate(into, row, count)
    times = entry.times
    if times:
        for row, diff in entry.changes[: bisect.bisect_right(times, time)]:
            _accumulate(into, row, diff)


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
