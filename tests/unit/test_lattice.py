"""Lattice laws for the u64 timeline and for pairs of u64 times."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.timelines import PAIR_TIMELINE, TIMELINE_IDS, TIMELINES, Timeline
from tidemark.lattice import U64, U64_MAX, U64_PAIRS, ProductLattice, is_u64

per_timeline = pytest.mark.parametrize("tl", TIMELINES, ids=TIMELINE_IDS)


@per_timeline
@given(data=st.data())
def test_join_and_meet_are_associative_commutative_idempotent(
    tl: Timeline, data: st.DataObject
) -> None:
    a, b, c = (data.draw(tl.times()) for _ in range(3))
    lat = tl.lattice
    for op in (lat.join, lat.meet):
        assert op(a, op(b, c)) == op(op(a, b), c)
        assert op(a, b) == op(b, a)
        assert op(a, a) == a


@per_timeline
@given(data=st.data())
def test_absorption(tl: Timeline, data: st.DataObject) -> None:
    a, b = data.draw(tl.times()), data.draw(tl.times())
    lat = tl.lattice
    assert lat.join(a, lat.meet(a, b)) == a
    assert lat.meet(a, lat.join(a, b)) == a


@per_timeline
@given(data=st.data())
def test_less_equal_is_a_partial_order_that_agrees_with_join_and_meet(
    tl: Timeline, data: st.DataObject
) -> None:
    a, b, c = (data.draw(tl.times()) for _ in range(3))
    le = tl.lattice.less_equal
    assert le(a, a)
    if le(a, b) and le(b, a):
        assert a == b
    if le(a, b) and le(b, c):
        assert le(a, c)
    assert le(a, b) == (tl.lattice.join(a, b) == b)
    assert le(a, b) == (tl.lattice.meet(a, b) == a)
    assert tl.lattice.less_than(a, b) == (le(a, b) and a != b)


@per_timeline
@given(data=st.data())
def test_join_is_the_least_upper_bound_and_meet_the_greatest_lower_bound(
    tl: Timeline, data: st.DataObject
) -> None:
    a, b = data.draw(tl.times()), data.draw(tl.times())
    lat = tl.lattice
    upper_bounds = [c for c in tl.grid if lat.less_equal(a, c) and lat.less_equal(b, c)]
    lower_bounds = [c for c in tl.grid if lat.less_equal(c, a) and lat.less_equal(c, b)]
    joined, met = lat.join(a, b), lat.meet(a, b)
    assert joined in upper_bounds
    assert all(lat.less_equal(joined, c) for c in upper_bounds)
    assert met in lower_bounds
    assert all(lat.less_equal(c, met) for c in lower_bounds)


@per_timeline
def test_minimum_is_below_every_time(tl: Timeline) -> None:
    t0 = tl.lattice.minimum()
    assert t0 in tl.grid
    assert all(tl.lattice.less_equal(t0, t) for t in tl.grid)
    assert [t for t in tl.grid if tl.lattice.less_equal(t, t0)] == [t0]


@per_timeline
@given(data=st.data())
def test_join_all_and_meet_all_fold_the_binary_operations(
    tl: Timeline, data: st.DataObject
) -> None:
    first = data.draw(tl.times())
    rest = data.draw(tl.time_lists(max_size=5))
    lat = tl.lattice
    joined, met = first, first
    for t in rest:
        joined, met = lat.join(joined, t), lat.meet(met, t)
    assert lat.join_all(first, *rest) == joined
    assert lat.meet_all(first, *rest) == met


def test_u64_is_the_usual_order_of_integers() -> None:
    assert (U64.join(3, 9), U64.meet(3, 9), U64.minimum()) == (9, 3, 0)
    assert U64.less_equal(3, 3) and U64.less_than(3, 4) and not U64.less_than(4, 4)
    assert is_u64(0) and is_u64(U64_MAX)
    assert not is_u64(-1) and not is_u64(U64_MAX + 1)


def test_pairs_are_ordered_coordinate_wise() -> None:
    assert U64_PAIRS.join((1, 4), (3, 2)) == (3, 4)
    assert U64_PAIRS.meet((1, 4), (3, 2)) == (1, 2)
    assert not U64_PAIRS.less_equal((1, 4), (3, 2))
    assert not U64_PAIRS.less_equal((3, 2), (1, 4))
    assert U64_PAIRS.less_than((1, 2), (1, 3))
    assert U64_PAIRS.minimum() == (0, 0)
    assert U64_PAIRS == ProductLattice(U64, U64)  # type: ignore[arg-type]
    assert hash(U64_PAIRS) == hash(ProductLattice(U64, U64))  # type: ignore[arg-type]
    assert U64_PAIRS != U64
    assert PAIR_TIMELINE.lattice is U64_PAIRS
