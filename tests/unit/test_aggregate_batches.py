"""A group's changes folded in with ``add_all`` leave an aggregate exactly as the same
changes added one at a time (the reduce hands each group's changes at a time over at once)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow.operators.aggregates import (
    Aggregate,
    AvgExact,
    CountRows,
    CountValues,
    Distinct,
    Extreme,
    SumExact,
    SumFloat,
)

_INTS = st.none() | st.integers(-(10**12), 10**12)
_DECIMALS = st.none() | st.decimals(
    min_value=-(10**6), max_value=10**6, places=2, allow_nan=False, allow_infinity=False
)
_FLOATS = st.none() | st.floats(allow_nan=True, allow_infinity=True)

_KINDS: dict[str, tuple[Callable[[], Aggregate], st.SearchStrategy[Any]]] = {
    "count(*)": (CountRows, st.none()),
    "count": (CountValues, _INTS),
    "sum int": (lambda: SumExact(0), _INTS),
    "sum decimal": (lambda: SumExact(2), _DECIMALS),
    "avg decimal": (lambda: AvgExact(2, 8), _DECIMALS),
    "sum float": (SumFloat, _FLOATS),
    "max": (lambda: Extreme(True, False), _INTS),
    "sum distinct": (lambda: Distinct(SumExact(0)), _INTS),
}


@st.composite
def _batches(draw: st.DrawFn) -> tuple[str, list[list[tuple[Any, int]]]]:
    kind = draw(st.sampled_from(sorted(_KINDS)))
    values = _KINDS[kind][1]
    change = st.tuples(values, st.integers(-3, 3).filter(bool))
    return kind, draw(st.lists(st.lists(change, max_size=12), max_size=6))


def _state(aggregate: Aggregate) -> tuple[Any, ...]:
    fields = [
        getattr(aggregate, name, None)
        for name in ("count", "total", "counts", "nans", "positive_infinities")
    ]
    return (*fields, aggregate.is_empty(), aggregate.values_held())


@settings(max_examples=300, deadline=None)
@given(batches=_batches())
def test_add_all_is_add_one_at_a_time(batches: tuple[str, list[list[tuple[Any, int]]]]) -> None:
    kind, groups = batches
    new = _KINDS[kind][0]
    one_by_one, at_once = new(), new()
    rows = 0
    for changes in groups:
        for value, diff in changes:
            one_by_one.add(value, diff)
        at_once.add_all([value for value, _ in changes], [diff for _, diff in changes])
        rows += sum(diff for _, diff in changes)
        assert _state(at_once) == _state(one_by_one)
        if rows > 0:
            expected, got = one_by_one.result(rows), at_once.result(rows)
            assert repr(got) == repr(expected)


def test_add_all_sums_exactly() -> None:
    total = SumExact(2)
    total.add_all([Decimal("1.25"), None, Decimal("-0.05"), Decimal("3.00")], [2, 5, 1, -1])
    assert (total.count, total.total) == (2, 250 - 5 - 300)
    assert total.result(2) == Decimal("-0.55")
