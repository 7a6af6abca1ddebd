"""Consolidating update batches: sums per (row, time), no zeros, in the canonical order that
``ordering.row_key`` defines, whichever way the sort gets there."""

from __future__ import annotations

import datetime
import random
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.compute.dataflow.batch import Update, consolidate
from services.compute.dataflow.ordering import NAN, canonical_float, row_key

# Rows decoded from Arrow may hold -0.0 beside 0.0, and equal decimals spelled apart.
_FLOATS = st.floats(allow_nan=True).map(canonical_float) | st.sampled_from(
    [NAN, 0.0, -0.0, -1.5, float("inf")]
)
_DECIMALS = st.decimals(
    allow_nan=False, allow_infinity=False, places=2, min_value=-5, max_value=5
) | st.sampled_from([Decimal("1.5"), Decimal("1.50"), Decimal("0"), Decimal("-0.00")])
_VALUES: list[st.SearchStrategy[Any]] = [
    st.integers(-3, 3),
    _FLOATS,
    st.text(max_size=2),
    _DECIMALS,
    st.booleans(),
    st.binary(max_size=2),
    st.dates(min_value=datetime.date(2020, 1, 1), max_value=datetime.date(2020, 1, 9)),
    st.datetimes(
        min_value=datetime.datetime(2020, 1, 1), max_value=datetime.datetime(2020, 1, 1, 0, 0, 3)
    ),
]


@st.composite
def _batches(draw: st.DrawFn) -> list[Update]:
    """Updates of rows of one schema (one class per column, NULLs where asked), with
    repeated rows and times so that some cancel."""
    columns = draw(st.lists(st.integers(0, len(_VALUES) - 1), min_size=1, max_size=3))
    nullable = draw(st.booleans())
    cells = [st.none() | _VALUES[c] if nullable else _VALUES[c] for c in columns]
    rows = draw(st.lists(st.tuples(*cells), min_size=1, max_size=8))
    return draw(
        st.lists(
            st.tuples(st.sampled_from(rows), st.integers(1, 3), st.integers(-2, 2)), max_size=30
        )
    )


def _reference(updates: list[Update]) -> list[Update]:
    sums: dict[tuple[Any, int], int] = {}
    for row, time, diff in updates:
        sums[(row, time)] = sums.get((row, time), 0) + diff
    return sorted(
        ((row, time, diff) for (row, time), diff in sums.items() if diff),
        key=lambda update: (row_key(update[0]), update[1]),
    )


@given(_batches(), st.randoms(use_true_random=False))
def test_consolidate_sums_and_sorts_canonically_however_batched(
    updates: list[Update], shuffler: random.Random
) -> None:
    want = _reference(updates)
    assert consolidate(updates) == want
    shuffled = list(updates)
    shuffler.shuffle(shuffled)
    halves = consolidate(shuffled[: len(shuffled) // 2]) + shuffled[len(shuffled) // 2 :]
    assert consolidate(halves) == want


def test_rows_with_nulls_or_nan_sort_nulls_last_and_nan_above_every_float() -> None:
    updates: list[Update] = [
        ((None, 1.0), 1, 1),
        ((NAN, 1.0), 1, 1),
        ((2.0, None), 1, 1),
        ((2.0, 1.0), 2, 1),
        ((2.0, 1.0), 1, 1),
        ((float("inf"), NAN), 1, 1),
        ((-1.0, 3.0), 1, 1),
        ((-1.0, 3.0), 1, -1),
    ]
    assert consolidate(updates) == [
        ((2.0, 1.0), 1, 1),
        ((2.0, 1.0), 2, 1),
        ((2.0, None), 1, 1),
        ((float("inf"), NAN), 1, 1),
        ((NAN, 1.0), 1, 1),
        ((None, 1.0), 1, 1),
    ]


def test_rows_without_nulls_or_nan_sort_by_their_values_then_time() -> None:
    updates: list[Update] = [
        (("b", Decimal("1.50"), 2), 3, 1),
        (("a", Decimal("2"), 1), 1, 2),
        (("b", Decimal("1.5"), 2), 1, -1),
        (("a", Decimal("-1"), 9), 2, 1),
        (("a", Decimal("-1"), 9), 2, -1),
    ]
    # 1.5 and 1.50 are one value: the rows differ only in time.
    assert consolidate(updates) == [
        (("a", Decimal("2"), 1), 1, 2),
        (("b", Decimal("1.5"), 2), 1, -1),
        (("b", Decimal("1.5"), 2), 3, 1),
    ]
