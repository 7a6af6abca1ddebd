"""Window: per partition, every row extended with its window functions' values.

A partition keeps its rows in order (``OrderedRows``, sorted by the window's order and then
the whole row; O(log n) per changed row) and the output it last emitted. At each time the step
touches a partition, the partition folds in that time's changes, computes its whole output
again, and emits the difference from the last output. Partitions the step does not touch
cost nothing, so the work follows the partitions that changed; within a changed partition it
is O(n log n) in the partition's size n (a sort-free pass over the ordered rows; sliding
aggregate states, where only MIN/MAX pay a log factor). Recomputing a partition whole is
simple and always right: a change at one position can move every later row number, rank and frame.

The partitions live in a ``SpillingMap``: attached to a task's ``StateBudget``, the partitions
held longest go to disk whole, their ordered rows and last output with them, and come back
when a step touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update
from services.compute.dataflow.guard import rows_bytes
from services.compute.dataflow.operators.aggregates import Aggregate
from services.compute.dataflow.operators.base import SpillingGroupedState, StatefulOperator
from services.compute.dataflow.operators.ordered import OrderedRows
from services.compute.dataflow.ordering import SortKey
from services.compute.dataflow.spilling_map import SpillingMap
from tidemark.v1 import plan_pb2

Evaluator = Callable[[Row], Any]
_Kind = plan_pb2.WindowFunction
_Bound = plan_pb2.WindowFrameBound
_ROWS = plan_pb2.WindowFrame.MODE_ROWS

# The frame of an unset `frame`: RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW.
DEFAULT_FRAME = plan_pb2.WindowFrame(
    mode=plan_pb2.WindowFrame.MODE_RANGE,
    start=_Bound(kind=_Bound.KIND_UNBOUNDED_PRECEDING),
    end=_Bound(kind=_Bound.KIND_CURRENT_ROW),
)


@dataclass(frozen=True)
class WindowFunctionSpec:
    """One lowered window function. ``argument`` and ``default`` evaluate on a row;
    ``new_aggregate`` makes an aggregate's incremental state (None for the other kinds)."""

    kind: int
    argument: Evaluator | None = None
    default: Evaluator | None = None
    offset: int = 1
    frame: plan_pb2.WindowFrame = field(default_factory=lambda: DEFAULT_FRAME)
    new_aggregate: Callable[[], Aggregate] | None = None


class WindowOperator(StatefulOperator):
    def __init__(
        self,
        partition_key: KeyFunction,
        sort_key: SortKey,
        peer_key: SortKey,
        functions: Sequence[WindowFunctionSpec],
    ) -> None:
        self.partition_key = partition_key
        self.sort_key = sort_key
        self.peer_key = peer_key
        self.functions = list(functions)
        self.routes = (partition_key,)

    def new_state(self) -> WindowState:
        return WindowState(self)


class WindowPartition:
    __slots__ = ("output", "rows")

    def __init__(self) -> None:
        self.rows = OrderedRows()
        self.output: dict[Row, int] = {}


def _partition_bytes(key: Key, partition: WindowPartition) -> int:
    # The rows, and the output: each row again, extended by one value per function.
    rows = partition.rows
    extended = sum(len(row) for row in partition.output)
    return rows_bytes(len(rows.counts), rows.values) + rows_bytes(len(partition.output), extended)


class WindowState(SpillingGroupedState):
    def __init__(self, spec: WindowOperator) -> None:
        super().__init__()
        self.spec = spec
        self.group_key = spec.partition_key
        self.groups: SpillingMap[WindowPartition] = SpillingMap(_partition_bytes)
        self.rows_held = 0
        self.bytes_held = 0
        """The partitions' sizes summed (``_partition_bytes``: as the budget counts them)."""

    def row_count(self) -> int:
        return self.rows_held

    def held_bytes(self) -> int:
        return self.bytes_held

    def _update_group(
        self, key: Key, changes: list[tuple[Row, int]], time: int, out: list[Update]
    ) -> None:
        self.work.key_lookups += 1
        groups = self.groups
        bucket = groups.bucket(key)
        entries = bucket.entries
        assert entries is not None
        partition = entries.get(key)
        fresh = partition is None
        if partition is None:
            partition = WindowPartition()
        size_before = 0 if fresh else _partition_bytes(key, partition)
        sort_key = self.spec.sort_key
        rows = partition.rows
        rows_before = len(rows.counts)
        for row, diff in changes:
            rows.update(row, diff, sort_key)
        self.rows_held += len(rows.counts) - rows_before
        copies = list(rows.copies())
        self.work.rows_visited += len(copies)
        output = evaluate_partition(copies, self.spec.peer_key, self.spec.functions)
        previous = partition.output
        for row, count in output.items():
            change = count - previous.get(row, 0)
            if change:
                out.append((row, time, change))
        for row, count in previous.items():
            if row not in output:
                out.append((row, time, -count))
        partition.output = output
        if not rows:
            self.bytes_held -= size_before
            if not fresh:
                groups.discard(bucket, key, size_before)
        else:
            size_after = _partition_bytes(key, partition)
            self.bytes_held += size_after - size_before
            if fresh:
                groups.add(bucket, key, partition, size_after)
            elif size_after != size_before:
                groups.resize(bucket, size_after - size_before)
        groups.settle()


def evaluate_partition(
    copies: list[Row], peer_key: SortKey, functions: Sequence[WindowFunctionSpec]
) -> dict[Row, int]:
    """The output of one partition whose rows, one entry per copy, are in window order."""
    if not copies:
        return {}
    peers = _LazyPeers(copies, peer_key)
    columns = [_values(function, copies, peers) for function in functions]
    output: dict[Row, int] = {}
    for index, row in enumerate(copies):
        extended = (*row, *[column[index] for column in columns])
        output[extended] = output.get(extended, 0) + 1
    return output


class _PeerGroups:
    """Per position (0-based): where its peer group starts and ends (exclusive), and how many
    peer groups come before it."""

    def __init__(self, copies: list[Row], peer_key: SortKey) -> None:
        n = len(copies)
        self.start = [0] * n
        self.end = [0] * n
        self.number = [0] * n
        keys = [peer_key(row) for row in copies]
        group_start, number = 0, 0
        for index in range(1, n + 1):
            if index < n and keys[index] == keys[index - 1]:
                continue
            for member in range(group_start, index):
                self.start[member] = group_start
                self.end[member] = index
                self.number[member] = number
            group_start, number = index, number + 1


class _LazyPeers:
    """The partition's peer groups, found on first use: only ranks and RANGE frames need
    them, and finding them costs a sort key per row."""

    __slots__ = ("_copies", "_groups", "_peer_key")

    def __init__(self, copies: list[Row], peer_key: SortKey) -> None:
        self._copies = copies
        self._peer_key = peer_key
        self._groups: _PeerGroups | None = None

    def get(self) -> _PeerGroups:
        if self._groups is None:
            self._groups = _PeerGroups(self._copies, self._peer_key)
        return self._groups


def _values(function: WindowFunctionSpec, copies: list[Row], lazy: _LazyPeers) -> list[Any]:
    n = len(copies)
    kind = function.kind
    if kind == _Kind.KIND_ROW_NUMBER:
        return list(range(1, n + 1))
    if kind == _Kind.KIND_RANK:
        return [start + 1 for start in lazy.get().start]
    if kind == _Kind.KIND_DENSE_RANK:
        return [number + 1 for number in lazy.get().number]
    argument = function.argument
    if kind in (_Kind.KIND_LAG, _Kind.KIND_LEAD):
        assert argument is not None
        shift = -function.offset if kind == _Kind.KIND_LAG else function.offset
        default = function.default
        values = []
        for index in range(n):
            source = index + shift
            if 0 <= source < n:
                values.append(argument(copies[source]))
            else:
                values.append(None if default is None else default(copies[index]))
        return values
    starts, ends = _frame_bounds(function.frame, n, lazy)
    if kind in (_Kind.KIND_FIRST_VALUE, _Kind.KIND_LAST_VALUE):
        assert argument is not None
        first = kind == _Kind.KIND_FIRST_VALUE
        return [
            None if start >= end else argument(copies[start if first else end - 1])
            for start, end in zip(starts, ends, strict=True)
        ]
    return _sliding_aggregate(function, copies, starts, ends)


def _frame_bounds(
    frame: plan_pb2.WindowFrame, n: int, lazy: _LazyPeers
) -> tuple[list[int], list[int]]:
    """Each position's frame as [start, end) over 0-based positions, clipped to the partition,
    with end >= start. Both lists never decrease, which is what lets aggregates slide."""
    rows = frame.mode == _ROWS
    if rows:
        fast = _rows_frame_bounds(frame, n)
        if fast is not None:
            return fast
    peers = lazy.get() if not rows else None

    def bound(b: plan_pb2.WindowFrameBound, index: int, is_start: bool) -> int:
        # As an exclusive end, a bound at position j is j + 1.
        after = 0 if is_start else 1
        kind = b.kind
        if kind == _Bound.KIND_UNBOUNDED_PRECEDING:
            return 0
        if kind == _Bound.KIND_UNBOUNDED_FOLLOWING:
            return n
        if kind == _Bound.KIND_PRECEDING:
            return min(n, max(0, index - b.offset + after))
        if kind == _Bound.KIND_FOLLOWING:
            return min(n, index + b.offset + after)
        if peers is None:
            return index + after
        return peers.start[index] if is_start else peers.end[index]

    starts = [bound(frame.start, index, True) for index in range(n)]
    ends = [max(start, bound(frame.end, index, False)) for index, start in enumerate(starts)]
    return starts, ends


def _rows_frame_bounds(frame: plan_pb2.WindowFrame, n: int) -> tuple[list[int], list[int]] | None:
    """``_frame_bounds`` of a ROWS frame whose bounds are each N PRECEDING, CURRENT ROW or
    N FOLLOWING, by list arithmetic rather than a call per position (None: another shape)."""
    shifts = []
    for bound, after in ((frame.start, 0), (frame.end, 1)):
        if bound.kind == _Bound.KIND_PRECEDING:
            shifts.append(after - bound.offset)
        elif bound.kind == _Bound.KIND_FOLLOWING:
            shifts.append(after + bound.offset)
        elif bound.kind == _Bound.KIND_CURRENT_ROW:
            shifts.append(after)
        else:
            return None
    low, high = shifts
    starts = [min(n, max(0, index + low)) for index in range(n)]
    ends = [max(start, min(n, max(0, index + high))) for index, start in enumerate(starts)]
    return starts, ends


def _sliding_aggregate(
    function: WindowFunctionSpec, copies: list[Row], starts: list[int], ends: list[int]
) -> list[Any]:
    """An aggregate over each position's frame with one state: rows enter as the frame's end
    passes them and leave as its start does."""
    assert function.new_aggregate is not None
    state = function.new_aggregate()
    read = function.argument
    inputs = [read(row) if read is not None else None for row in copies]
    low = high = 0
    values = []
    for start, end in zip(starts, ends, strict=True):
        while high < end:
            state.add(inputs[high], 1)
            high += 1
        while low < start:
            state.add(inputs[low], -1)
            low += 1
        values.append(state.result(end - start))
    return values
