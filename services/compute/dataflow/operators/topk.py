"""TopK: per group, the rows at positions [offset, offset + limit) of a total order.

A group keeps each row's multiplicity and the rows with a positive one in order
(``OrderedRows``: by the order's key, which ends with the whole row, so no two distinct rows
tie). At each time the step touches a group it updates the order (O(log n) per changed row),
reads the window from position ``offset`` (O(log n) to find it, then one step per row in it),
and emits the difference from the window it last emitted: only rows entering or leaving the
window, or changing their count in it. No step costs time in proportion to the group's size.
"""

from __future__ import annotations

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update
from services.compute.dataflow.guard import rows_bytes
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
        self.rows_held = 0
        self.values_held = 0

    def key_count(self) -> int:
        return len(self.groups)

    def row_count(self) -> int:
        return self.rows_held

    def held_bytes(self) -> int:
        return rows_bytes(self.rows_held, self.values_held)

    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self.work.key_lookups += 1
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = TopKGroup()
        sort_key = self.spec.sort_key
        rows = group.rows
        rows_before, values_before = len(rows.counts), rows.values
        for row, diff in changes:
            rows.update(row, diff, sort_key)
        self.rows_held += len(rows.counts) - rows_before
        self.values_held += rows.values - values_before
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
        window = dict(group.rows.window(low, high))
        self.work.rows_visited += len(window)
        return window
