"""The ordered state behind MIN/MAX, top-k and window functions against naive models: a sorted
multiset recomputed from scratch after every change.

Blocks are made tiny (``LOAD`` 4) so that a few dozen keys already split, merge and drop
blocks and rebuild the Fenwick tree, the paths a real group reaches only at thousands of rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow.batch import Row, Update, consolidate
from services.compute.dataflow.operators import sorted_weights
from services.compute.dataflow.operators.aggregates import Distinct, Extreme
from services.compute.dataflow.operators.ordered import OrderedRows
from services.compute.dataflow.operators.sorted_weights import SortedWeights
from services.compute.dataflow.operators.topk import TopKOperator
from services.compute.dataflow.ordering import NAN, canonical_float, compile_sort_key, value_key
from services.compute.dataflow.types import ScalarType
from tidemark.columnar import ColumnType as T


@contextmanager
def small_blocks() -> Iterator[None]:
    with mock.patch.object(sorted_weights, "LOAD", 4):
        yield


def _changes(keys: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[Any, int]]]:
    return st.lists(st.tuples(keys, st.integers(-4, 4)), max_size=120)


# -- SortedWeights ---------------------------------------------------------------------------


def _check_weights(weights: SortedWeights, counts: dict[int, int]) -> None:
    present = sorted((key, count) for key, count in counts.items() if count > 0)
    assert list(weights) == present
    assert len(weights) == len(present)
    assert weights.total == sum(count for _, count in present)
    if present:
        assert weights.first() == present[0][0] and weights.last() == present[-1][0]
    units = [key for key, count in present for _ in range(count)]
    for low in range(len(units) + 1):
        for high in (None, low, low + 1, low + 3, len(units) + 1):
            expected: dict[int, int] = {}
            for key in units[low:high]:
                expected[key] = expected.get(key, 0) + 1
            assert weights.between(low, high) == list(expected.items())


@settings(max_examples=300, deadline=None)
@given(changes=_changes(st.integers(0, 40)))
def test_sorted_weights_match_a_sorted_multiset(changes: list[tuple[int, int]]) -> None:
    counts: dict[int, int] = {}
    weights = SortedWeights()
    with small_blocks():
        for key, diff in changes:
            before = counts.get(key, 0)
            after = counts[key] = before + diff
            if after > 0:
                if before > 0:
                    weights.reweight(key, after)
                else:
                    weights.insert(key, after)
            elif before > 0:
                assert weights.remove(key) == before
            _check_weights(weights, counts)


def test_sorted_weights_stay_exact_through_many_splits_and_merges() -> None:
    order = random.Random(14)
    keys = list(range(300))
    order.shuffle(keys)
    weights = SortedWeights()
    counts: dict[int, int] = {}
    with small_blocks():
        for key in keys:
            weights.insert(key, key % 5 + 1)
            counts[key] = key % 5 + 1
        assert len(weights._keys) > 30  # many blocks, so the tree has depth
        _check_weights(weights, counts)
        order.shuffle(keys)
        for key in keys:
            assert weights.remove(key) == counts.pop(key)
            present = sorted(counts.items())
            assert list(weights) == present
            if present:
                middle = sum(count for _, count in present) // 2
                key, _ = weights.between(middle, middle + 1)[0]
                before = sum(count for k, count in present if k < key)
                assert before <= middle < before + counts[key]
        assert not weights and weights.total == 0


# -- OrderedRows -----------------------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.sampled_from([NAN, 0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf")]),
)
_rows = st.tuples(_values, st.none() | st.integers(0, 3))
_orders = st.lists(
    st.tuples(st.sampled_from([0, 1]), st.booleans(), st.booleans()), min_size=1, max_size=2
)
_TYPES = [ScalarType(T.FLOAT64), ScalarType(T.INT64)]


def _canonical(row: Row) -> Row:
    first = row[0]
    return (first if first is None else canonical_float(first), row[1])


@settings(max_examples=300, deadline=None)
@given(
    changes=_changes(_rows),
    order=_orders,
    low=st.integers(0, 6),
    length=st.none() | st.integers(0, 6),
)
def test_ordered_rows_match_a_sorted_multiset(
    changes: list[tuple[Row, int]],
    order: list[tuple[int, bool, bool]],
    low: int,
    length: int | None,
) -> None:
    sort_key = compile_sort_key(order, _TYPES)
    rows = OrderedRows()
    counts: dict[Row, int] = {}
    high = None if length is None else low + length
    with small_blocks():
        for raw, diff in changes:
            row = _canonical(raw)
            rows.update(row, diff, sort_key)
            counts[row] = counts.get(row, 0) + diff
            copies = sorted((r for r, c in counts.items() for _ in range(max(c, 0))), key=sort_key)
            assert list(rows.copies()) == copies
            expected: dict[Row, int] = {}
            for r in copies[low:high]:
                expected[r] = expected.get(r, 0) + 1
            assert list(rows.window(low, high)) == list(expected.items())
            assert {r: c for r, c in counts.items() if c} == rows.counts
            assert rows.values == 2 * len(rows.counts)


# -- MIN/MAX ---------------------------------------------------------------------------------


def _naive_extreme(counts: dict[Any, int], maximum: bool) -> Any:
    present = [value for value, count in counts.items() if count > 0]
    if not present:
        return None
    pick = max if maximum else min
    return pick(present, key=value_key)


@settings(max_examples=300, deadline=None)
@given(
    changes=_changes(st.none() | st.sampled_from([NAN, 0.0, -1.0, 2.5, float("inf")])),
    maximum=st.booleans(),
)
def test_float_extremes_match_a_rescan(changes: list[tuple[Any, int]], maximum: bool) -> None:
    state = Extreme(maximum, is_float=True)
    counts: dict[Any, int] = {}
    with small_blocks():
        for value, diff in changes:
            state.add(value, diff)
            if value is not None:
                counts[value] = counts.get(value, 0) + diff
            got, want = state.result(0), _naive_extreme(counts, maximum)
            assert got is want or got == want  # NaN is the one NAN object
            assert state.values_held() == sum(1 for c in counts.values() if c)
            assert state.is_empty() == (not any(counts.values()))


@settings(max_examples=200, deadline=None)
@given(changes=_changes(st.integers(-20, 20) | st.text(max_size=2)), maximum=st.booleans())
def test_distinct_extremes_match_a_rescan(changes: list[tuple[Any, int]], maximum: bool) -> None:
    # One column holds one type: split the drawn values by type into two states.
    states = {
        int: Distinct(Extreme(maximum, is_float=False)),
        str: Distinct(Extreme(maximum, False)),
    }
    counts: dict[type, dict[Any, int]] = {int: {}, str: {}}
    with small_blocks():
        for value, diff in changes:
            kind = type(value)
            states[kind].add(value, diff)
            counts[kind][value] = counts[kind].get(value, 0) + diff
            for kind_, state in states.items():
                assert state.result(0) == _naive_extreme(counts[kind_], maximum)


# -- TopK ------------------------------------------------------------------------------------


def _naive_window(
    counts: dict[Row, int], sort_key: Callable[[Row], Any], offset: int, limit: int | None
) -> dict[Row, int]:
    """Per group: the sorted multiset from scratch, sliced."""
    window: dict[Row, int] = {}
    for group in {row[1] for row in counts}:
        copies = sorted(
            (r for r, c in counts.items() if r[1] == group for _ in range(max(c, 0))),
            key=sort_key,
        )
        end = None if limit is None else offset + limit
        for row in copies[offset:end]:
            window[row] = window.get(row, 0) + 1
    return window


def _difference(new: dict[Row, int], old: dict[Row, int], time: int) -> list[Update]:
    return consolidate(
        [(row, time, count) for row, count in new.items()]
        + [(row, time, -count) for row, count in old.items()]
    )


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(_changes(st.tuples(st.integers(0, 30), st.integers(0, 1))), max_size=8),
    offset=st.integers(0, 4),
    limit=st.none() | st.integers(1, 5),
    descending=st.booleans(),
)
def test_topk_emits_exactly_the_change_of_its_window(
    steps: list[list[tuple[Row, int]]], offset: int, limit: int | None, descending: bool
) -> None:
    types = [ScalarType(T.INT64), ScalarType(T.INT64)]
    sort_key = compile_sort_key([(0, descending, False)], types)
    state = TopKOperator(lambda row: (row[1],), sort_key, offset, limit).new_state()
    counts: dict[Row, int] = {}
    window: dict[Row, int] = {}
    with small_blocks():
        for time, changes in enumerate(steps):
            # Consolidated per time, as the engine delivers it: a row's count never goes
            # negative in the collection.
            merged: dict[Row, int] = {}
            for row, diff in changes:
                merged[row] = merged.get(row, 0) + diff
            updates = [(row, time, max(diff, -counts.get(row, 0))) for row, diff in merged.items()]
            for row, _, diff in updates:
                counts[row] = counts.get(row, 0) + diff
            out = state.process([updates])
            new_window = _naive_window(counts, sort_key, offset, limit)
            # Nothing re-emitted: the output is the window's change and no more.
            assert len(consolidate(out)) == len(out)
            assert consolidate(out) == _difference(new_window, window, time)
            window = new_window
    assert state.row_count() == sum(1 for c in counts.values() if c)


@pytest.mark.parametrize("limit", [None, 3])
def test_a_topk_update_visits_the_window_not_the_group(limit: int | None) -> None:
    types = [ScalarType(T.INT64), ScalarType(T.INT64)]
    sort_key = compile_sort_key([(0, False, False)], types)
    state = TopKOperator(lambda row: (row[1],), sort_key, 2, limit).new_state()
    state.process([[((value, 0), 0, 1) for value in range(5000)]])
    state.work.reset()
    # A new first row: two rows move across the window's edges (one at the offset, one at
    # the end when there is a limit), whatever the group's size.
    out = state.process([[((-1, 0), 1, 1)]])
    expected = [((1, 0), 1, 1)] + ([((4, 0), 1, -1)] if limit else [])
    assert consolidate(out) == expected
    assert state.work.rows_visited <= 2 + (limit or 0)
