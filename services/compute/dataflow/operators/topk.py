"""TopK: per group, the rows at positions [offset, offset + limit) of a total order.

A group keeps each row's multiplicity and the rows with a positive one in order
(``OrderedRows``: by the order's key, which ends with the whole row, so no two distinct rows
tie). At each time the step touches a group it updates the order (O(log n) per changed row),
reads the window from position ``offset`` (O(log n) to find it, then one step per row in it),
and emits the difference from the window it last emitted: only rows entering or leaving the
window, or changing their count in it. Without a limit, the window is everything past the
first ``offset`` copies, so the group keeps those copies instead and emits the changed rows'
own change less theirs. No step costs time in proportion to the group's size.

The groups live in a ``SpillingMap``: attached to a task's ``StateBudget``, the groups held
longest go to disk, their ordered rows with them, and come back when a step touches them.
"""

from __future__ import annotations

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update
from services.compute.dataflow.guard import rows_bytes
from services.compute.dataflow.operators.base import SpillingGroupedState, StatefulOperator
from services.compute.dataflow.operators.ordered import OrderedRows
from services.compute.dataflow.ordering import SortKey
from services.compute.dataflow.spilling_map import SpillingMap


class TopKOperator(StatefulOperator):
    def __init__(
        self, group_key: KeyFunction, sort_key: SortKey, offset: int, limit: int | None
    ) -> None:
        self.group_key = group_key
        self.sort_key = sort_key
        self.offset = offset
        self.limit = limit
        self.routes = (group_key,)

    def new_state(self) -> TopKState:
        return TopKState(self)


class TopKGroup:
    __slots__ = ("output", "rows")

    def __init__(self) -> None:
        self.rows = OrderedRows()
        self.output: dict[Row, int] = {}
        """With a limit, the window last emitted; without one, the first ``offset`` copies
        (the rows not emitted), so that neither holds more than offset + limit copies."""


def _group_bytes(key: Key, group: TopKGroup) -> int:
    return rows_bytes(len(group.rows.counts), group.rows.values)


class TopKState(SpillingGroupedState):
    def __init__(self, spec: TopKOperator) -> None:
        super().__init__()
        self.spec = spec
        self.group_key = spec.group_key
        self.groups: SpillingMap[TopKGroup] = SpillingMap(_group_bytes)
        self.rows_held = 0
        self.values_held = 0

    def row_count(self) -> int:
        return self.rows_held

    def held_bytes(self) -> int:
        return rows_bytes(self.rows_held, self.values_held)

    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self.work.key_lookups += 1
        groups = self.groups
        bucket = groups.bucket(key)
        entries = bucket.entries
        assert entries is not None
        group = entries.get(key)
        fresh = group is None
        if group is None:
            group = TopKGroup()
        size_before = _group_bytes(key, group)
        sort_key = self.spec.sort_key
        rows = group.rows
        counts = rows.counts
        rows_before, values_before = len(counts), rows.values
        present_before = {row: max(counts.get(row, 0), 0) for row, _ in changes}
        for row, diff in changes:
            rows.update(row, diff, sort_key)
        self.rows_held += len(counts) - rows_before
        self.values_held += rows.values - values_before
        if self.spec.limit is None:
            self._emit_past_offset(group, present_before, time, out)
        else:
            self._emit_window(group, time, out)
        size_after = _group_bytes(key, group)
        if not rows:
            if not fresh:
                groups.discard(bucket, key, size_before)
        elif fresh:
            groups.add(bucket, key, group, size_after)
        elif size_after != size_before:
            groups.resize(bucket, size_after - size_before)
        groups.settle()

    def _emit_window(self, group: TopKGroup, time: int, out: list[Update]) -> None:
        """The difference between the window now and the one last emitted: O(log n) to find
        the window, then O(limit)."""
        low = self.spec.offset
        assert self.spec.limit is not None
        window = dict(group.rows.window(low, low + self.spec.limit))
        self.work.rows_visited += len(window)
        previous = group.output
        for row, count in window.items():
            change = count - previous.get(row, 0)
            if change:
                out.append((row, time, change))
        for row, count in previous.items():
            if row not in window:
                out.append((row, time, -count))
        group.output = window

    def _emit_past_offset(
        self, group: TopKGroup, present_before: dict[Row, int], time: int, out: list[Update]
    ) -> None:
        """Without a limit the window is every copy but the first ``offset``: its change is
        the changed rows' own change less the change of those first copies, so the work is
        O(log n + offset), not the group's size."""
        offset = self.spec.offset
        prefix = dict(group.rows.window(0, offset)) if offset else {}
        self.work.rows_visited += len(prefix)
        counts = group.rows.counts
        change: dict[Row, int] = {}
        for row, before in present_before.items():
            change[row] = max(counts.get(row, 0), 0) - before
        for row, count in prefix.items():
            change[row] = change.get(row, 0) - count
        for row, count in group.output.items():
            change[row] = change.get(row, 0) + count
        out.extend((row, time, diff) for row, diff in change.items() if diff)
        group.output = prefix
