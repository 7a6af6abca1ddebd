"""Ordered-state benchmark: ``.venv/bin/python bench/ordered_state.py``.

The per-update cost of the state behind MIN/MAX and top-k as one group grows to 10^3, 10^4,
10^5 and 10^6 rows, before and after the state moved from one sorted Python list (an insert or
a removal shifts the list's tail, O(n)) to ``SortedWeights`` (O(log n)):

- **MIN/MAX**: an ``Extreme`` aggregate state (``operators/aggregates.py``) holding n distinct
  integers; one update retracts a random present value and adds a new one, then reads MIN.
- **top-k**: a group of n distinct rows (``operators/ordered.py``) with ``LIMIT 10``; one
  update retracts a random present row and adds a new one, then reads the window at positions
  [0, 10) (with ``OFFSET 1000``, the window at [1000, 1010): the list walked there from the
  front). Also the whole ``TopKState`` (``operators/topk.py``) with ``LIMIT 10``, one update
  per step, output included.

"Before" is the list structure as it was, copied here (``_ListExtreme``, ``_ListRows``), so
the two run side by side on the same data in one process. A state is filled by sorting once
(filling a list by insertion would take O(n^2)); each cell times many updates and reports the
CPU microseconds per row change (a retraction and an insertion are two), the median of
five rounds. Writes ``bench/results/ordered_state.json`` with the load average: the machine
is shared.
"""

from __future__ import annotations

import bisect
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO_ROOT, load_average
from services.compute.dataflow.operators.aggregates import Extreme
from services.compute.dataflow.operators.ordered import OrderedRows
from services.compute.dataflow.operators.topk import TopKOperator
from services.compute.dataflow.ordering import compile_sort_key
from services.compute.dataflow.types import ScalarType
from tidemark.columnar import ColumnType

SIZES = (1_000, 10_000, 100_000, 1_000_000)
LIMIT = 10
ROUNDS = 5
RESULTS = REPO_ROOT / "bench" / "results" / "ordered_state.json"
_TYPES = [ScalarType(ColumnType.INT64), ScalarType(ColumnType.INT64)]
SORT_KEY = compile_sort_key([(1, False, False)], _TYPES)


class _ListExtreme:
    """MIN/MAX as it was: present values in one sorted list."""

    def __init__(self, values: list[int]) -> None:
        self.counts = dict.fromkeys(values, 1)
        self.present = sorted(values)

    def add(self, value: int, diff: int) -> None:
        before = self.counts.get(value, 0)
        after = before + diff
        if after:
            self.counts[value] = after
        else:
            self.counts.pop(value, None)
        if before <= 0 < after:
            bisect.insort(self.present, value)
        elif after <= 0 < before:
            del self.present[bisect.bisect_left(self.present, value)]

    def result(self) -> int:
        return self.present[0]


class _ListRows:
    """Top-k's group as it was: present rows in one sorted list, the window walked from the
    front."""

    def __init__(self, rows: list[tuple[int, int]]) -> None:
        self.counts = dict.fromkeys(rows, 1)
        self.ordered = sorted((SORT_KEY(row), row) for row in rows)

    def update(self, row: tuple[int, int], diff: int) -> None:
        before = self.counts.get(row, 0)
        after = before + diff
        if after:
            self.counts[row] = after
        else:
            del self.counts[row]
        if before <= 0 < after:
            bisect.insort(self.ordered, (SORT_KEY(row), row))
        elif after <= 0 < before:
            del self.ordered[bisect.bisect_left(self.ordered, (SORT_KEY(row), row))]

    def window(self, low: int, high: int) -> dict[tuple[int, int], int]:
        window: dict[tuple[int, int], int] = {}
        position = 0
        for _, row in self.ordered:
            if position >= high:
                break
            end = position + self.counts[row]
            kept = min(end, high) - max(position, low)
            if kept > 0:
                window[row] = kept
            position = end
        return window


def _ordered_rows(rows: list[tuple[int, int]]) -> OrderedRows:
    state = OrderedRows()
    for row in rows:
        state.update(row, 1, SORT_KEY)
    return state


def _time_updates(
    present: list[Any], fresh: Callable[[], Any], apply: Callable[[Any, Any], None], updates: int
) -> float:
    """CPU microseconds per row change over ``updates`` (retraction, insertion) pairs: the
    median of ``ROUNDS`` rounds' means. CPU time, not wall time, and a median, because the
    machine is shared: another process taking the core does not count against the update."""
    chooser = random.Random(7)
    per_round = max(1, updates // ROUNDS)
    means = []
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(per_round):
            slot = chooser.randrange(len(present))
            new = fresh()
            apply(present[slot], new)
            present[slot] = new
        means.append((time.process_time() - start) / (2 * per_round) * 1e6)
    return statistics.median(means)


def _initial(size: int) -> list[int]:
    """``size`` distinct even numbers below ``20 * size``."""
    return [2 * value for value in random.Random(size).sample(range(size * 10), size)]


def _fresh(size: int) -> Callable[[], int]:
    """New values: odd, so never one already there, and anywhere in the range (an insertion
    lands at a random position of the order, as a removal does)."""
    chooser = random.Random(-size)
    return lambda: 2 * chooser.randrange(size * 10) + 1


def _updates_for(size: int, before: bool) -> int:
    # The list's shift at 10^6 costs about a millisecond: fewer updates keep the run short.
    return max(200, min(5000, 50_000_000 // size)) if before else 5000


def measure_extreme(size: int, before: bool) -> float:
    values = _initial(size)
    fresh = _fresh(size)
    if before:
        old = _ListExtreme(values)

        def apply_old(out: int, into: int) -> None:
            old.add(out, -1)
            old.add(into, 1)
            old.result()

        return _time_updates(list(values), fresh, apply_old, _updates_for(size, True))
    new = Extreme(maximum=False, is_float=False)
    for value in values:
        new.add(value, 1)

    def apply_new(out: int, into: int) -> None:
        new.add(out, -1)
        new.add(into, 1)
        new.result(0)

    return _time_updates(list(values), fresh, apply_new, _updates_for(size, False))


def measure_topk(size: int, before: bool, offset: int) -> float:
    rows = [(0, value) for value in _initial(size)]
    value = _fresh(size)

    def fresh() -> tuple[int, int]:
        return (0, value())

    if before:
        old = _ListRows(rows)

        def apply_old(out: tuple[int, int], into: tuple[int, int]) -> None:
            old.update(out, -1)
            old.update(into, 1)
            old.window(offset, offset + LIMIT)

        return _time_updates(list(rows), fresh, apply_old, _updates_for(size, True))
    new = _ordered_rows(rows)

    def apply_new(out: tuple[int, int], into: tuple[int, int]) -> None:
        new.update(out, -1, SORT_KEY)
        new.update(into, 1, SORT_KEY)
        dict(new.window(offset, offset + LIMIT))

    return _time_updates(list(rows), fresh, apply_new, _updates_for(size, False))


def measure_topk_operator(size: int) -> float:
    """The whole operator, one update (a retraction and an insertion) per step."""
    rows = [(0, value) for value in _initial(size)]
    state = TopKOperator(lambda row: (row[0],), SORT_KEY, 0, LIMIT).new_state()
    state.process([[(row, 0, 1) for row in rows]])
    value = _fresh(size)
    steps = iter(range(1, 10**9))

    def apply(out: tuple[int, int], into: tuple[int, int]) -> None:
        step = next(steps)
        state.process([[(out, step, -1), (into, step, 1)]])

    return _time_updates(list(rows), lambda: (0, value()), apply, 5000)


def main() -> None:
    cells: list[dict[str, Any]] = []
    print(f"{'rows in group':>14} {'case':<24} {'before µs':>10} {'after µs':>10} {'ratio':>8}")
    for size in SIZES:
        cases: list[tuple[str, Callable[[bool], float]]] = [
            ("min", lambda before, size=size: measure_extreme(size, before)),
            ("topk_limit10", lambda before, size=size: measure_topk(size, before, 0)),
            (
                "topk_offset1000_limit10",
                lambda before, size=size: measure_topk(size, before, 1000),
            ),
        ]
        for name, measure in cases:
            load = load_average()
            before_us = measure(True)
            after_us = measure(False)
            ratio = before_us / after_us
            print(f"{size:>14,} {name:<24} {before_us:>10.2f} {after_us:>10.2f} {ratio:>7.1f}x")
            cells.append(
                {
                    "rows_in_group": size,
                    "case": name,
                    "before_us_per_row_change": round(before_us, 3),
                    "after_us_per_row_change": round(after_us, 3),
                    "before_over_after": round(ratio, 2),
                    "load_average": round(load, 2),
                }
            )
        operator_us = measure_topk_operator(size)
        print(f"{size:>14,} {'TopKState step':<24} {'':>10} {operator_us:>10.2f}")
        cells.append(
            {
                "rows_in_group": size,
                "case": "topk_operator_step_limit10",
                "after_us_per_row_change": round(operator_us, 3),
                "load_average": round(load_average(), 2),
            }
        )
    RESULTS.write_text(json.dumps({"limit": LIMIT, "cells": cells}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    main()
