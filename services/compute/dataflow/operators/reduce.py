"""Reduce: grouping with aggregates, one arrangement entry per group.

A group holds its total multiplicity, one incremental state per aggregate, and the output row
it last emitted. At each time the step touches a group, the group folds in that time's changes,
computes its row again (None when the total is not positive), and emits the difference from
the last row at that time: a retraction and an insertion, or nothing if the row is unchanged.

The groups live in a ``SpillingMap``: attached to a task's ``StateBudget``, the groups held
longest go to disk with their whole state (MIN/MAX's ordered values included) and come back
when a step touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update, keyed_by_time
from services.compute.dataflow.columnar import float_columns_of, python_rows
from services.compute.dataflow.guard import CHECK_EVERY, row_bytes, rows_bytes
from services.compute.dataflow.operators.aggregates import Aggregate, add_summed_parts
from services.compute.dataflow.operators.base import SpillingGroupedState, StatefulOperator
from services.compute.dataflow.ordering import canonical_float
from services.compute.dataflow.spilling_map import SpillingMap

Evaluator = Callable[[Row], Any]


def fold_changes(
    states: Sequence[Aggregate], specs: Sequence[AggregateSpec], changes: list[tuple[Row, int]]
) -> int:
    """Adds a group's ``changes`` to its aggregates' ``states``; returns their sum of diffs."""
    diffs = [diff for _, diff in changes]
    for state, spec in zip(states, specs, strict=True):
        read = spec.value
        state.add_all(
            [None] * len(diffs) if read is None else [read(row) for row, _ in changes], diffs
        )
    return sum(diffs)


class AggregateSpec:
    """One aggregate: what it reads from a row (None for COUNT(*)) and how to make its state."""

    def __init__(self, value: Evaluator | None, new_state: Callable[[], Aggregate]) -> None:
        self.value = value
        self.new_state = new_state


class ReduceOperator(StatefulOperator):
    def __init__(self, group_key: KeyFunction, aggregates: Sequence[AggregateSpec]) -> None:
        self.group_key = group_key
        self.aggregates = list(aggregates)
        self.routes = (group_key,)
        kinds = [type(spec.new_state()) for spec in self.aggregates]
        # Only MIN/MAX and DISTINCT keep values; COUNT and SUM groups skip counting them.
        self.keeps_values = any(kind.values_held is not Aggregate.values_held for kind in kinds)
        widths = [kind.parts_width for kind in kinds]
        self.part_widths: list[int] = [width or 0 for width in widths]
        """Per aggregate, how many numbers its partial aggregate takes in a partial row (0
        for one that keeps its values, whose reduce does not combine)."""
        self.combines = None not in widths
        # A partial row: the group's key, its sum of diffs, then each aggregate's parts.
        self._partial_tail = 1 + sum(self.part_widths)

    def combine(self, updates: list[Update]) -> list[Update]:
        """One partial row per group and time: ``(*key, rows, *parts)`` at that time with a
        diff of 1, where ``rows`` is the group's sum of diffs and ``parts`` each aggregate's
        state over those changes alone (``Aggregate.parts``). A group whose changes cancel
        out sends nothing: it would change nothing where it lands."""
        out: list[Update] = []
        new_states = [spec.new_state for spec in self.aggregates]
        for time, by_key in keyed_by_time(updates, self.group_key).items():
            for key, changes in by_key.items():
                states = [new_state() for new_state in new_states]
                rows = fold_changes(states, self.aggregates, changes)
                parts = [part for state in states for part in state.parts()]
                if rows or any(parts):
                    out.append(((*key, rows, *parts), time, 1))
        return out

    def combined_route(self, partial: Row) -> Key:
        return partial[: len(partial) - self._partial_tail]

    def new_state(self) -> ReduceState:
        return ReduceState(self)


class Group:
    __slots__ = ("aggregates", "output", "rows")

    def __init__(self, aggregates: list[Aggregate]) -> None:
        self.rows = 0
        self.aggregates = aggregates
        self.output: Row | None = None

    def is_empty(self) -> bool:
        return (
            self.rows == 0
            and self.output is None
            and all(state.is_empty() for state in self.aggregates)
        )


class ReduceState(SpillingGroupedState):
    def __init__(self, spec: ReduceOperator) -> None:
        super().__init__()
        self.spec = spec
        self.group_key = spec.group_key
        self.groups: SpillingMap[Group] = SpillingMap(self._group_bytes)
        self.key_width = 0
        self.values = 0
        """Distinct values the groups' MIN/MAX and DISTINCT states keep."""

    def _group_bytes(self, key: Key, group: Group) -> int:
        # A group holds its output row; a kept value costs about a one-column row.
        values = sum(state.values_held() for state in group.aggregates)
        return row_bytes(len(key) + len(self.spec.aggregates)) + row_bytes(1) * values

    def row_count(self) -> int:
        return len(self.groups) + self.values

    def held_bytes(self) -> int:
        groups = len(self.groups)
        width = self.key_width + len(self.spec.aggregates)
        return rows_bytes(groups, groups * width) + row_bytes(1) * self.values

    def load_group_states(self, table: pa.Table, key_width: int) -> None:
        """Loads, into the empty state, groups that Spark aggregated (hydration by Spark of a
        Reduce whose aggregates are sums of diffs): each row of ``table`` holds a group's key
        (its first ``key_width`` columns), its sum of diffs, and each aggregate's partial
        aggregates in order (``aggregates.add_summed_parts``). The groups get the output
        row they would have emitted, so later steps retract it as usual."""
        width = table.num_columns
        key_columns = table.select(list(range(key_width)))
        keys = python_rows(key_columns, float_columns_of(key_columns.schema))
        columns = [table.column(i).to_pylist() for i in range(key_width, width)]
        spec = self.spec
        loaded: dict[Key, Group] = {}
        for key, values in zip(keys, zip(*columns, strict=True), strict=True):
            rows, *parts = values
            if rows is None:  # a global aggregate over no rows: no group
                continue
            group = loaded.get(key)
            if group is None:
                group = loaded[key] = Group([a.new_state() for a in spec.aggregates])
            group.rows += rows
            remaining = iter(parts)
            for state in group.aggregates:
                add_summed_parts(state, remaining)
        groups = self.groups
        base = row_bytes(key_width + len(spec.aggregates))
        for position, key in enumerate(groups.in_bucket_order(loaded)):
            if position % CHECK_EVERY == 0:
                self.guard.check(0)
            group = loaded[key]
            if group.rows > 0:
                group.output = (*key, *(state.result(group.rows) for state in group.aggregates))
            if group.is_empty():
                continue
            groups.add(groups.bucket(key), key, group, base)
            groups.settle()
        self.key_width = key_width

    def process_combined(self, partials: list[Update]) -> list[Update]:
        return self._visit(keyed_by_time(partials, self._partial_key), self._update_from_parts)

    def _partial_key(self, partial: Row) -> Key:
        # The wire loses the identity of the one canonical NaN the groups are found by.
        return tuple(
            canonical_float(value) if value.__class__ is float else value
            for value in self.spec.combined_route(partial)
        )

    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self._fold_into_group(key, changes, time, out, self._add_changes)

    def _update_from_parts(
        self, key: Key, partials: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self._fold_into_group(key, partials, time, out, self._add_partials)

    def _add_changes(self, group: Group, key_width: int, changes: list[tuple[Row, int]]) -> None:
        """Adds a group's input changes (rows of the reduce's input) to ``group``."""
        group.rows += fold_changes(group.aggregates, self.spec.aggregates, changes)

    def _add_partials(self, group: Group, key_width: int, partials: list[tuple[Row, int]]) -> None:
        """Adds partial rows (``ReduceOperator.combine``), each ``diff`` times, to ``group``."""
        widths = self.spec.part_widths
        for partial, diff in partials:
            group.rows += partial[key_width] * diff
            start = key_width + 1
            for state, width in zip(group.aggregates, widths, strict=True):
                state.add_parts(partial[start : start + width], diff)
                start += width

    def _fold_into_group(
        self,
        key: Key,
        changes: list[tuple[Row, int]],
        time: int,
        out: list[Update],
        add: Callable[[Group, int, list[tuple[Row, int]]], None],
    ) -> None:
        """Folds a group's ``changes`` at ``time`` in (with ``add``: input rows or partial
        rows) and emits the change of its output row."""
        self.work.key_lookups += 1
        groups = self.groups
        bucket = groups.bucket(key)
        entries = bucket.entries
        assert entries is not None
        group = entries.get(key)
        fresh = group is None
        if group is None:
            group = Group([a.new_state() for a in self.spec.aggregates])
        self.key_width = len(key)
        states = group.aggregates
        keeps_values = self.spec.keeps_values
        values_before = sum(state.values_held() for state in states) if keeps_values else 0
        add(group, len(key), changes)
        values_after = sum(state.values_held() for state in states) if keeps_values else 0
        self.values += values_after - values_before
        output: Row | None = None
        if group.rows > 0:
            output = (*key, *(state.result(group.rows) for state in states))
        if output != group.output:
            if group.output is not None:
                out.append((group.output, time, -1))
            if output is not None:
                out.append((output, time, 1))
            group.output = output
        base = row_bytes(len(key) + len(states))
        kept = row_bytes(1)
        if group.is_empty():
            if not fresh:
                groups.discard(bucket, key, base + kept * values_before)
        elif fresh:
            groups.add(bucket, key, group, base + kept * values_after)
        elif values_after != values_before:
            groups.resize(bucket, kept * (values_after - values_before))
        groups.settle()
