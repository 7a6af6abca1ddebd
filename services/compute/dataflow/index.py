"""An index: the output of a dataflow arranged by key columns, readable at past times.

Unlike operator state, an index is multi-versioned, because a peek asks for the contents at a
chosen time ``t`` in ``[since, upper)``. Per key it holds a consolidated base (every update at
or before ``since``) and the later updates in time order. Reading at ``t`` adds the base and the
updates at times ``<= t``. ``compact(since)`` folds the updates at or before the new ``since``
into the base: afterwards reads before it are refused, and memory holds one entry per live row
plus the history not yet compacted.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from services.compute.dataflow.batch import Key, Row, Update
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.ordering import canonical_float
from tidemark.errors import FailedPrecondition, InvalidArgument


class Index:
    def __init__(self, key_columns: Sequence[int], *, since: int) -> None:
        self.key_columns = tuple(key_columns)
        self._key = columns_key(list(key_columns))
        self._since = since
        self._upper = since
        self._base: dict[Key, dict[Row, int]] = {}
        # Per key: the update times (ascending) and the (row, diff) at each position.
        self._times: dict[Key, list[int]] = {}
        self._changes: dict[Key, list[tuple[Row, int]]] = {}

    @property
    def since(self) -> int:
        return self._since

    @property
    def upper(self) -> int:
        return self._upper

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
        for row, time, diff in ordered:
            key = self._key(row)
            if time <= self._since:
                _add(self._base, key, row, diff)
            else:
                self._times.setdefault(key, []).append(time)
                self._changes.setdefault(key, []).append((row, diff))
        self._upper = upper

    def compact(self, since: int) -> None:
        """Allows reads only at ``since`` and later, and folds older history into the base."""
        if since < self._since:
            raise FailedPrecondition(f"index since cannot move back from {self._since} to {since}")
        self._since = since
        for key in list(self._times):
            times = self._times[key]
            cut = bisect.bisect_right(times, since)
            if not cut:
                continue
            changes = self._changes[key]
            for row, diff in changes[:cut]:
                _add(self._base, key, row, diff)
            if cut == len(times):
                del self._times[key], self._changes[key]
            else:
                self._times[key] = times[cut:]
                self._changes[key] = changes[cut:]

    def contents_at(self, time: int) -> dict[Row, int]:
        """The whole output at ``time``: ``{row: multiplicity}``."""
        self._check_readable(time)
        contents: dict[Row, int] = {}
        for key in self._base.keys() | self._times.keys():
            self._collect(key, time, contents)
        return contents

    def lookup(self, key: Sequence[object], time: int) -> dict[Row, int]:
        """The output rows whose key columns equal ``key``, at ``time``."""
        self._check_readable(time)
        contents: dict[Row, int] = {}
        wanted = tuple(canonical_float(v) if v.__class__ is float else v for v in key)
        self._collect(wanted, time, contents)
        return contents

    def history_size(self) -> int:
        """Updates held beyond the base (what compaction would shrink)."""
        return sum(len(times) for times in self._times.values())

    def _collect(self, key: Key, time: int, into: dict[Row, int]) -> None:
        for row, count in self._base.get(key, {}).items():
            _accumulate(into, row, count)
        times = self._times.get(key)
        if times:
            changes = self._changes[key]
            for row, diff in changes[: bisect.bisect_right(times, time)]:
                _accumulate(into, row, diff)

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


def _add(base: dict[Key, dict[Row, int]], key: Key, row: Row, diff: int) -> None:
    rows = base.get(key)
    if rows is None:
        rows = base[key] = {}
    _accumulate(rows, row, diff)
    if not rows:
        del base[key]
