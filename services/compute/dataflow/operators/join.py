"""Equi-join (inner and outer) over two arrangements keyed by the join key.

At each time ``t`` the change of ``L ⋈ R`` is ``ΔL ⋈ R_before + L_after ⋈ ΔR``: the left
changes meet the right side as it was before ``t``, then are applied, then the right changes
meet the updated left side. The output at ``t`` thus depends on inputs at times ``<= t`` only,
and each key costs work in proportion to its matches.

Outer joins add the preserved side's unmatched rows, NULL-padded. Whether a left row is
unmatched depends only on whether the right side has any row under its key. Per touched key
and time: while the right side stays empty the left changes are padded through; when it
becomes non-empty the padded rows of the key are retracted (all of them, as they were before
``t``); when it becomes empty they are inserted (as they are after ``t``). Rows with a NULL in
the key never match: inner joins drop them and outer joins pad them straight away.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from services.compute.dataflow.batch import Key, KeyFunction, Row, Update, keyed_by_time
from services.compute.dataflow.columnar import build_keyed, float_columns_of, python_rows
from services.compute.dataflow.guard import CHECK_EVERY, row_bytes
from services.compute.dataflow.operators.arrangement import Arrangement
from services.compute.dataflow.operators.base import OperatorState, StatefulOperator
from services.compute.dataflow.spill import StateBudget

Changes = dict[Key, list[tuple[Row, int]]]
KeyColumns = tuple[int, ...] | None


class JoinOperator(StatefulOperator):
    def __init__(
        self,
        left_key: KeyFunction,
        right_key: KeyFunction,
        left_width: int,
        right_width: int,
        keep_left: bool,
        keep_right: bool,
        key_columns: tuple[KeyColumns, KeyColumns] = (None, None),
    ) -> None:
        self.left_key = left_key
        self.right_key = right_key
        self.left_width = left_width
        self.right_width = right_width
        self.keep_left = keep_left
        self.keep_right = keep_right
        self.routes = (left_key, right_key)
        self.key_columns = key_columns
        """Per side, the columns the key is (as they are), or None for a computed key."""

    def new_state(self) -> JoinState:
        return JoinState(self)


class JoinState(OperatorState):
    def __init__(self, spec: JoinOperator) -> None:
        super().__init__()
        self.spec = spec
        self.left = Arrangement(spec.left_width)
        self.right = Arrangement(spec.right_width)
        # Appended to an unmatched left row, prepended to an unmatched right row.
        self.left_padding: Row = (None,) * spec.right_width
        self.right_padding: Row = (None,) * spec.left_width

    def key_count(self) -> int:
        return len(self.left) + len(self.right)

    def attach(self, budget: StateBudget) -> None:
        self.left.attach(budget)
        self.right.attach(budget)

    def release(self) -> None:
        self.left.release()
        self.right.release()

    def row_count(self) -> int:
        return self.left.row_count + self.right.row_count

    def spilled_bytes(self) -> int:
        spec = self.spec
        return self.left.spilled_rows * row_bytes(
            spec.left_width
        ) + self.right.spilled_rows * row_bytes(spec.right_width)

    def held_bytes(self) -> int:
        spec = self.spec
        return self.left.row_count * row_bytes(spec.left_width) + self.right.row_count * row_bytes(
            spec.right_width
        )

    def process(self, inputs: Sequence[list[Update]]) -> list[Update]:
        left_updates, right_updates = inputs
        spec = self.spec
        if not (spec.keep_left or spec.keep_right):
            if not right_updates:
                return self._one_side_changed(left_updates, spec.left_key, self.left, True)
            if not left_updates:
                return self._one_side_changed(right_updates, spec.right_key, self.right, False)
        out: list[Update] = []
        left_by_time = keyed_by_time(left_updates, spec.left_key)
        right_by_time = keyed_by_time(right_updates, spec.right_key)
        for time in sorted(left_by_time.keys() | right_by_time.keys()):
            left_changes = left_by_time.get(time, {})
            right_changes = right_by_time.get(time, {})
            self._pad_null_keys(left_changes, right_changes, time, out)
            self._step(time, left_changes, right_changes, out)
        return out

    def _one_side_changed(
        self, updates: list[Update], key_of: KeyFunction, changed: Arrangement, left_side: bool
    ) -> list[Update]:
        """An inner join's step in which only one side changed (orders changing against
        customers that did not): every change meets the other side as it stands, whatever
        its time, so the step needs no grouping by time, and each key is looked up and
        applied once. Rows whose key holds a NULL never match and are not kept."""
        by_key: dict[Key, list[Update]] = {}
        for update in updates:
            key = key_of(update[0])
            changes = by_key.get(key)
            if changes is None:
                by_key[key] = [update]
            else:
                changes.append(update)
        other = self.right if left_side else self.left
        work = self.work
        guard = self.guard
        out_bytes = row_bytes(self.spec.left_width + self.spec.right_width)
        next_check = 0
        out: list[Update] = []
        append = out.append
        for key, changes in by_key.items():
            if None in key:
                continue
            work.key_lookups += 1
            matches = other.get(key)
            if matches:
                work.rows_visited += len(matches)
                if len(out) >= next_check:
                    guard.check(len(out) * out_bytes)
                    next_check = len(out) + CHECK_EVERY
                for match, multiplicity in matches.items():
                    if left_side:
                        for row, time, diff in changes:
                            append(((*row, *match), time, diff * multiplicity))
                    else:
                        for row, time, diff in changes:
                            append(((*match, *row), time, multiplicity * diff))
            # After the matching: ``matches`` is a live view that an apply may spill.
            changed.apply(key, [(row, diff) for row, _, diff in changes])
        return out

    def load(self, inputs: Sequence[list[Update]]) -> None:
        """Only the arrangements: a join's state is its two inputs, arranged by key (rows
        whose key holds a NULL never match, and are not kept)."""
        spec = self.spec
        for updates, key_of, arrangement in (
            (inputs[0], spec.left_key, self.left),
            (inputs[1], spec.right_key, self.right),
        ):
            for changes_by_key in keyed_by_time(updates, key_of).values():
                for key, changes in changes_by_key.items():
                    if None not in key:
                        arrangement.apply(key, changes)

    def load_columnar(self, inputs: Sequence[pa.Table | None], time: int) -> None:
        """``load`` from Arrow tables (each input's rows, then a last column of
        multiplicities): each side's rows become a columnar batch of its arrangement, built
        with vectorised work rather than a Python dict entry per row."""
        spec = self.spec
        for table, key_of, columns, arrangement in (
            (inputs[0], spec.left_key, spec.key_columns[0], self.left),
            (inputs[1], spec.right_key, spec.key_columns[1], self.right),
        ):
            if table is None or table.num_rows == 0:
                continue
            width = table.num_columns - 1
            diffs = table.column(width).to_numpy().astype(np.int64, copy=False)
            rows = table.select(list(range(width)))
            if len(arrangement):
                # Not a fresh state: the batch must not hold a key the dict holds too.
                for key, changes in _grouped(rows, diffs, key_of).items():
                    if None not in key:
                        arrangement.apply(key, changes)
                continue
            batch = build_keyed(rows, diffs, key_of, columns, drop_null_keys=True)
            if batch is not None:
                arrangement.add_batch(batch)

    def _pad_null_keys(self, left: Changes, right: Changes, time: int, out: list[Update]) -> None:
        """Takes the rows whose key holds a NULL out of the changes; outer joins pad them."""
        for changes, keep, pad_left in (
            (left, self.spec.keep_left, True),
            (right, self.spec.keep_right, False),
        ):
            null_keys = [key for key in changes if None in key]
            for key in null_keys:
                rows = changes.pop(key)
                if keep:
                    out.extend(self._padded(rows, pad_left, time))

    def _padded(
        self, rows: Sequence[tuple[Row, int]], left_side: bool, time: int, sign: int = 1
    ) -> list[Update]:
        if left_side:
            padding = self.left_padding
            return [((*row, *padding), time, sign * diff) for row, diff in rows]
        padding = self.right_padding
        return [((*padding, *row), time, sign * diff) for row, diff in rows]

    def _step(
        self,
        time: int,
        left_changes: Changes,
        right_changes: Changes,
        out: list[Update],
    ) -> None:
        spec = self.spec
        work = self.work
        left, right = self.left, self.right
        # A key with many matches on both sides is where a join's output explodes (a cross
        # join has one key): the guard is checked as that output grows, not only per key.
        guard = self.guard
        out_bytes = row_bytes(spec.left_width + spec.right_width)
        next_check = len(out)
        outer = spec.keep_left or spec.keep_right
        touched = left_changes.keys() | right_changes.keys() if outer else ()
        # Which keys had rows on each side before this time (for the outer transitions).
        left_before = {key: key in left for key in touched}
        right_before = {key: key in right for key in touched}

        for key, changes in left_changes.items():
            work.key_lookups += 1
            matches = right.get(key)
            if matches:
                work.rows_visited += len(matches)
                for r, r_mult in matches.items():
                    if len(out) >= next_check:
                        guard.check(len(out) * out_bytes)
                        next_check = len(out) + CHECK_EVERY
                    for left_row, diff in changes:
                        out.append(((*left_row, *r), time, diff * r_mult))
        # Applied after the matching: the left side's changes meet the right as it was.
        for key, changes in left_changes.items():
            left.apply(key, changes)

        for key, changes in right_changes.items():
            work.key_lookups += 1
            matches = left.get(key)
            if matches:
                work.rows_visited += len(matches)
                for left_row, l_mult in matches.items():
                    if len(out) >= next_check:
                        guard.check(len(out) * out_bytes)
                        next_check = len(out) + CHECK_EVERY
                    for r, diff in changes:
                        out.append(((*left_row, *r), time, l_mult * diff))
        for key, changes in right_changes.items():
            right.apply(key, changes)

        if spec.keep_left:
            self._outer(time, touched, left, left_changes, right_before, right, True, out)
        if spec.keep_right:
            self._outer(time, touched, right, right_changes, left_before, left, False, out)

    def _outer(
        self,
        time: int,
        touched: Sequence[Key] | set[Key],
        kept: Arrangement,
        kept_changes: Changes,
        other_before: dict[Key, bool],
        other: Arrangement,
        left_side: bool,
        out: list[Update],
    ) -> None:
        """The padded rows of the preserved side ``kept`` for the keys touched at ``time``."""
        for key in touched:
            was_matched = other_before[key]
            is_matched = key in other
            changes = kept_changes.get(key)
            if not was_matched and not is_matched:
                if changes:
                    out.extend(self._padded(changes, left_side, time))
            elif not was_matched:
                # Newly matched: retract the padded rows as they were before this time, which
                # is the current rows minus this time's changes.
                current = kept.get(key)
                if current:
                    self.work.rows_visited += len(current)
                    out.extend(self._padded(list(current.items()), left_side, time, -1))
                if changes:
                    out.extend(self._padded(changes, left_side, time))
            elif not is_matched:
                current = kept.get(key)
                if current:
                    self.work.rows_visited += len(current)
                    out.extend(self._padded(list(current.items()), left_side, time))


def _grouped(table: pa.Table, diffs: np.ndarray, key_of: KeyFunction) -> Changes:
    grouped: Changes = {}
    rows = python_rows(table, float_columns_of(table.schema))
    for row, diff in zip(rows, diffs.tolist(), strict=True):
        grouped.setdefault(key_of(row), []).append((row, diff))
    return grouped
