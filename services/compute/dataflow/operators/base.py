"""The shapes every operator has."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update, keyed_by_time
from services.compute.dataflow.columnar import float_columns_of, python_rows
from services.compute.dataflow.guard import CHECK_EVERY, UNGUARDED, Guard, row_bytes
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.spilling_map import SpillingMap
from services.compute.dataflow.work import Work
from tidemark.errors import Internal

GroupUpdate = Callable[[Key, list[tuple[Row, int]], int, list[Update]], None]
"""Applies one group's changes at a time, appending its output changes."""


class LinearOperator(ABC):
    """Maps input updates to output updates one at a time: the output for a batch is the sum
    of the outputs for its updates, so it can run anywhere, on any split of the data."""

    @abstractmethod
    def apply(self, inputs: Sequence[list[Update]]) -> list[Update]: ...


class OperatorState(ABC):
    """One shard's state of a stateful operator.

    ``process`` takes every input update of the step (one list per operator input; any times,
    in any order, all at or beyond the times seen before) and returns the output updates, each
    at the exact time its input changed. It handles the step's times in increasing order, so
    the output at time ``t`` depends only on input at times ``<= t``.

    ``guard`` (set by the worker that owns the state) is checked in loops that can run long,
    so that a cancelled or over-budget evaluation stops part-way
    (``services.compute.dataflow.guard``).
    """

    def __init__(self) -> None:
        self.work = Work()
        self.guard: Guard = UNGUARDED

    @abstractmethod
    def process(self, inputs: Sequence[list[Update]]) -> list[Update]: ...

    def process_combined(self, partials: list[Update]) -> list[Update]:
        """``process`` of an input that every shard summed before the exchange
        (``StatefulOperator.combine``): one partial row per key and time from each shard."""
        raise Internal(f"{type(self).__name__} takes no partial rows")

    def load(self, inputs: Sequence[list[Update]]) -> None:
        """``process`` into an empty state, where the output is not wanted (a hydration whose
        output Spark computes): an operator that keeps no output may skip computing it."""
        self.process(inputs)

    def load_columnar(self, inputs: Sequence[pa.Table | None], time: int) -> None:
        """``load`` of inputs given as Arrow tables (the input's columns, then a last column of
        multiplicities; None for an empty input), all at ``time``. States that hold columnar
        data build it from the tables; the others get the rows."""
        updates: list[list[Update]] = []
        for table in inputs:
            if table is None:
                updates.append([])
                continue
            width = table.num_columns - 1
            rows = python_rows(table.select(list(range(width))), float_columns_of(table.schema))
            diffs = table.column(width).to_pylist()
            updates.append([(row, time, diff) for row, diff in zip(rows, diffs, strict=True)])
        self.load(updates)

    @abstractmethod
    def key_count(self) -> int:
        """How many keys the arrangements hold (for diagnostics)."""

    def attach(self, budget: StateBudget) -> None:
        """Keeps the state within a task's memory budget from now on, spilling what does not
        fit (``services.compute.dataflow.spill``). State that cannot spill ignores it."""
        return

    def release(self) -> None:
        """The state is being dropped: let go of what ``attach`` took."""
        return

    def spilled_bytes(self) -> int:
        """Of ``held_bytes``, the rows moved to local disk by the budget."""
        return 0

    def row_count(self) -> int:
        """How many entries (distinct rows or values) the state holds: one per key unless the
        operator knows better. Kept as changes apply, so reading it costs O(1)."""
        return self.key_count()

    def held_bytes(self) -> int:
        """The estimated memory of the state (for budgets and ``Status``): one narrow row per
        key unless the operator knows better. O(1): it is read before every node runs."""
        return self.key_count() * row_bytes(1)


class GroupedState(OperatorState):
    """State kept per group key (reduce, top-k): a step visits its times in increasing order
    and, at each, only the groups whose input changed then."""

    group_key: KeyFunction

    def process(self, inputs: Sequence[list[Update]]) -> list[Update]:
        (updates,) = inputs
        return self._visit(keyed_by_time(updates, self.group_key), self._update_group)

    def _visit(
        self, keyed: dict[int, dict[Key, list[tuple[Row, int]]]], update: GroupUpdate
    ) -> list[Update]:
        """Runs ``update`` on each group ``keyed`` changes, time by time in increasing order;
        its output changes."""
        out: list[Update] = []
        guard = self.guard
        for time in sorted(keyed):
            changes_by_key = keyed[time]
            for position, key in enumerate(self._visit_order(changes_by_key)):
                if position % CHECK_EVERY == 0:
                    guard.check(len(out) * row_bytes(len(key) + 1))
                update(key, changes_by_key[key], time, out)
        return out

    def _visit_order(self, keys: dict[Key, list[tuple[Row, int]]]) -> Iterable[Key]:
        """The order a time's groups are visited in (state that spills visits a large batch's
        buckets one after the other)."""
        return keys

    @abstractmethod
    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        """Apply one group's ``changes`` at ``time``, appending its output changes to ``out``."""


class SpillingGroupedState(GroupedState):
    """Grouped state whose groups live in a ``SpillingMap`` (reduce, top-k): attached to a
    task's budget, the groups held longest go to disk whole, and a large batch visits its
    groups bucket by bucket."""

    groups: SpillingMap[Any]

    def key_count(self) -> int:
        return len(self.groups)

    def attach(self, budget: StateBudget) -> None:
        self.groups.attach(budget)

    def release(self) -> None:
        self.groups.release()

    def spilled_bytes(self) -> int:
        return self.groups.spilled_bytes

    def _visit_order(self, keys: dict[Key, list[tuple[Row, int]]]) -> Iterable[Key]:
        return self.groups.in_bucket_order(keys)


class StatefulOperator(ABC):
    """The description of a stateful operator: how to route each input's rows to the shard
    that owns their key, and how to make a shard's empty state.

    An operator that ``combines`` has one input, and a state that adds up over its changes
    (a reduce whose aggregates are COUNT, SUM and AVG, or none): each shard sums its share of
    the step per key and time (``combine``) before the exchange, so a key's changes cross as
    one partial row, routed by ``combined_route`` to the shard its rows would have gone to,
    where ``OperatorState.process_combined`` folds them in."""

    routes: tuple[KeyFunction, ...]
    combines: bool = False

    def combine(self, updates: list[Update]) -> list[Update]:
        """``updates`` summed into one partial row per key and time."""
        raise Internal(f"{type(self).__name__} does not combine its input")

    def combined_route(self, partial: Row) -> Key:
        """The key of a partial row, which ``routes[0]`` gave its updates."""
        raise Internal(f"{type(self).__name__} does not combine its input")

    @abstractmethod
    def new_state(self) -> OperatorState: ...
