"""Update batches: ``(row, time, diff)`` triples, grouped by time and consolidated."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

from services.compute.dataflow.ordering import natively_ordered, row_key

Row: TypeAlias = tuple[Any, ...]
Update: TypeAlias = tuple[Row, int, int]
"""``(row, time, diff)``: at ``time`` the multiplicity of ``row`` changes by ``diff``."""

Key: TypeAlias = tuple[Any, ...]
KeyFunction: TypeAlias = Callable[[Row], Key]


def whole_row(row: Row) -> Key:
    """The key that is the row itself (a distinct's route, an exchange by row)."""
    return row


def consolidate(updates: Iterable[Update]) -> list[Update]:
    """Sums the diffs of equal ``(row, time)`` and drops zeros, then sorts canonically: by
    row (column by column, NULLs last, NaN above other floats), then time. Equal inputs give
    equal lists however they were batched or sharded."""
    sums: dict[tuple[Row, int], int] = {}
    for row, time, diff in updates:
        key = (row, time)
        sums[key] = sums.get(key, 0) + diff
    kept = [(row, time, diff) for (row, time), diff in sums.items() if diff]
    if all(natively_ordered(row) for row, _, _ in kept):
        # row_key differs from Python's own order only at NULLs and NaNs: without them the
        # triples sort as they are, never comparing a diff ((row, time) is unique), with no
        # key built per update (a quarter to a half of the time).
        kept.sort()
    else:
        kept.sort(key=_canonical)
    return kept


def _canonical(update: Update) -> tuple[Any, ...]:
    return (row_key(update[0]), update[1])


def by_time(updates: Iterable[Update]) -> list[tuple[int, dict[Row, int]]]:
    """The updates' net change per row at each time, times in increasing order."""
    times: dict[int, dict[Row, int]] = {}
    for row, time, diff in updates:
        changes = times.get(time)
        if changes is None:
            changes = times[time] = {}
        changes[row] = changes.get(row, 0) + diff
    return sorted(times.items())


def keyed_by_time(
    updates: Iterable[Update], key_of: KeyFunction
) -> dict[int, dict[Key, list[tuple[Row, int]]]]:
    """The updates grouped by time, then by key: ``{time: {key: [(row, diff), ...]}}``."""
    times: dict[int, dict[Key, list[tuple[Row, int]]]] = {}
    for row, time, diff in updates:
        keyed = times.get(time)
        if keyed is None:
            keyed = times[time] = {}
        key = key_of(row)
        changes = keyed.get(key)
        if changes is None:
            keyed[key] = [(row, diff)]
        else:
            changes.append((row, diff))
    return times


def accumulate(updates: Iterable[Update], time: int) -> dict[Row, int]:
    """The collection the updates describe at ``time``: every update at or before it."""
    contents: dict[Row, int] = {}
    for row, t, diff in updates:
        if t <= time:
            total = contents.get(row, 0) + diff
            if total:
                contents[row] = total
            else:
                del contents[row]
    return contents
