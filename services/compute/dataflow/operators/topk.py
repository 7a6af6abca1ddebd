"""TopK: per group, the rows at positions [offset, offset + limit) of a total order.

A group keeps each row's multiplicity and a sorted list of the rows with a positive one (by the
order's key, which ends with the whole row, so no two distinct rows tie). At each time the step
touches a group it updates the list (a binary search per changed row), walks the list from the
front until the window is filled, and emits the difference from the window it last emitted.
That walk covers offset + limit positions, not the group.
"""

from __future__ import annotations

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update
from services.compute.dataflow.operators.base import GroupedState, StatefulOperator
from services.compute.dataflow.operators.ordered import OrderedRows
from services.compute.dataflow.ordering import SortKey


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


class TopKState(GroupedState):
    def __init__(self, spec: TopKOperator) -> None:
        super().__init__()
        self.spec = spec
        self.group_key = spec.group_key
        self.groups: dict[Key, TopKGroup] = {}

    def key_count(self) -> int:
        return len(self.groups)

    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self.work.key_lookups += 1
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = TopKGroup()
        sort_key = self.spec.sort_key
        for row, diff in changes:
            group.rows.update(row, diff, sort_key)
        window = self._window(group)
        previous = group.output
        for row, count in window.items():
            change = count - previous.get(row, 0)
            if change:
                out.append((row, time, change))
        for row, count in previous.items():
            if row not in window:
                out.append((row, time, -count))
        group.output = window
        if not group.rows:
            del self.groups[key]

    def _window(self, group: TopKGroup) -> dict[Row, int]:
        low = self.spec.offset
        high = None if self.spec.limit is None else low + self.spec.limit
        window: dict[Row, int] = {}
        position = 0
        counts = group.rows.counts
        for _, row in group.rows.ordered:
            if high is not None and position >= high:
                break
            self.work.rows_visited += 1
            end = position + counts[row]
            kept = (end if high is None else min(end, high)) - max(position, low)
            if kept > 0:
                window[row] = kept
            position = end
        return window
