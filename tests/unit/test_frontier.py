"""Antichains and mutable antichains against brute force over small grids of times."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.timelines import TIMELINE_IDS, TIMELINES, Timeline, minimal, upset
from tidemark.frontier import Antichain, MutableAntichain, u64_frontier
from tidemark.lattice import U64

per_timeline = pytest.mark.parametrize("tl", TIMELINES, ids=TIMELINE_IDS)


def reach(tl: Timeline, frontier: Antichain[Any]) -> frozenset[Any]:
    return upset(tl.lattice, frontier.elements, tl.grid)


def minimal_in_grid(tl: Timeline, pred: Any) -> frozenset[Any]:
    return minimal(tl.lattice, (t for t in tl.grid if pred(t)))


# -- Antichain -------------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_inserts_keep_exactly_the_minimal_times(tl: Timeline, data: st.DataObject) -> None:
    inserted = data.draw(tl.time_lists(max_size=8))
    frontier: Antichain[Any] = Antichain(tl.lattice)
    for i, t in enumerate(inserted):
        before = frontier.elements
        changed = frontier.insert(t)
        # An insert changes the antichain exactly when no earlier time is at or before ``t``.
        assert changed == (not any(tl.lattice.less_equal(s, t) for s in inserted[:i]))
        assert changed == (frontier.elements != before)
    elements = frontier.elements
    assert len(set(elements)) == len(elements)
    for a in elements:
        for b in elements:
            if a != b:
                assert not tl.lattice.less_equal(a, b)
    assert set(elements) == minimal(tl.lattice, inserted)
    assert len(frontier) == len(elements) and list(frontier) == list(elements)
    assert frontier.is_empty() == (not inserted)


@per_timeline
@given(data=st.data())
def test_a_time_is_beyond_the_frontier_iff_beyond_some_inserted_time(
    tl: Timeline, data: st.DataObject
) -> None:
    inserted = data.draw(tl.time_lists(max_size=8))
    frontier = Antichain(tl.lattice, inserted)
    for t in tl.grid:
        assert frontier.less_equal(t) == any(tl.lattice.less_equal(s, t) for s in inserted)
        assert frontier.less_than(t) == any(tl.lattice.less_than(s, t) for s in inserted)


@per_timeline
@given(data=st.data())
def test_equality_ignores_insertion_order_and_duplicates(tl: Timeline, data: st.DataObject) -> None:
    inserted = data.draw(tl.time_lists(max_size=6))
    shuffled = data.draw(st.permutations(inserted + inserted))
    a, b = Antichain(tl.lattice, inserted), Antichain(tl.lattice, shuffled)
    assert a == b and hash(a) == hash(b)
    copied = a.copy()
    copied.insert(tl.lattice.minimum())
    assert a == b, "a copy must not share state with its original"


@per_timeline
@given(data=st.data())
def test_meet_and_join_of_frontiers_match_brute_force(tl: Timeline, data: st.DataObject) -> None:
    a, b = data.draw(tl.frontiers()), data.draw(tl.frontiers())
    in_a, in_b = reach(tl, a), reach(tl, b)
    met, joined = a.meet(b), a.join(b)
    # The meet reaches what either reaches; the join only what both reach.
    assert reach(tl, met) == in_a | in_b
    assert reach(tl, joined) == in_a & in_b
    assert set(met) == minimal_in_grid(tl, lambda t: t in in_a | in_b)
    assert set(joined) == minimal_in_grid(tl, lambda t: t in in_a & in_b)
    assert met == b.meet(a) and joined == b.join(a)
    assert met.frontier_less_equal(a) and met.frontier_less_equal(b)
    assert a.frontier_less_equal(joined) and b.frontier_less_equal(joined)


@per_timeline
@given(data=st.data())
def test_meet_is_greatest_below_and_join_least_above(tl: Timeline, data: st.DataObject) -> None:
    a, b, c = (data.draw(tl.frontiers()) for _ in range(3))
    if c.frontier_less_equal(a) and c.frontier_less_equal(b):
        assert c.frontier_less_equal(a.meet(b))
    if a.frontier_less_equal(c) and b.frontier_less_equal(c):
        assert a.join(b).frontier_less_equal(c)


@per_timeline
@given(data=st.data())
def test_frontier_order_is_a_partial_order_matching_reach(
    tl: Timeline, data: st.DataObject
) -> None:
    a, b, c = (data.draw(tl.frontiers()) for _ in range(3))
    # ``a <= b``: b is the same as or later than a, so a reaches everything b reaches.
    assert a.frontier_less_equal(b) == (reach(tl, b) <= reach(tl, a))
    assert a.frontier_less_equal(a)
    if a.frontier_less_equal(b) and b.frontier_less_equal(a):
        assert a == b
    if a.frontier_less_equal(b) and b.frontier_less_equal(c):
        assert a.frontier_less_equal(c)
    assert a.frontier_less_than(b) == (a.frontier_less_equal(b) and a != b)


@per_timeline
@given(data=st.data())
def test_empty_frontier_is_greatest_and_minimum_frontier_least(
    tl: Timeline, data: st.DataObject
) -> None:
    f = data.draw(tl.frontiers())
    empty, least = Antichain.empty(tl.lattice), Antichain.minimum(tl.lattice)
    assert f.frontier_less_equal(empty)
    assert empty.frontier_less_equal(f) == f.is_empty()
    assert least.frontier_less_equal(f)
    assert f.frontier_less_equal(least) == (f == least)
    assert not any(empty.less_equal(t) for t in tl.grid)
    assert all(least.less_equal(t) for t in tl.grid)
    assert f.meet(empty) == f and f.join(empty) == empty
    assert f.meet(least) == least and f.join(least) == f


def test_u64_frontiers() -> None:
    assert u64_frontier().is_empty()
    five = u64_frontier(5)
    assert five.elements == (5,) and u64_frontier(7, 5, 9) == five
    assert not five.less_equal(4) and five.less_equal(5) and not five.less_than(5)
    assert repr(u64_frontier()) == "{}" and repr(five) == "{5}"
    assert Antichain.minimum(U64) == u64_frontier(0)


def test_incomparable_pairs_both_stay_in_the_frontier() -> None:
    tl = TIMELINES[1]
    f = Antichain(tl.lattice, [(2, 0), (0, 2), (3, 3)])
    assert set(f) == {(2, 0), (0, 2)}
    assert f.less_equal((2, 1)) and f.less_equal((1, 2)) and not f.less_equal((1, 1))
    assert f.join(Antichain(tl.lattice, [(1, 1)])) == Antichain(tl.lattice, [(2, 1), (1, 2)])


# -- MutableAntichain ------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_mutable_antichain_frontier_is_the_minimal_positively_counted_times(
    tl: Timeline, data: st.DataObject
) -> None:
    changes = data.draw(st.lists(st.tuples(tl.times(), st.integers(-2, 2)), max_size=20))
    initial = data.draw(st.lists(st.tuples(tl.times(), st.integers(-2, 2)), max_size=4))
    counted: MutableAntichain[Any] = MutableAntichain(tl.lattice, initial)
    counts: dict[Any, int] = {}
    for t, delta in initial:
        counts[t] = counts.get(t, 0) + delta

    def agrees_with_brute_force() -> None:
        nonzero = {s: n for s, n in counts.items() if n != 0}
        positive = [s for s, n in nonzero.items() if n > 0]
        assert counted.counts() == nonzero
        assert set(counted.frontier()) == minimal(tl.lattice, positive)
        assert counted.is_empty() == (not nonzero)
        for s in tl.grid:
            assert counted.count(s) == nonzero.get(s, 0)
            assert counted.less_equal(s) == any(tl.lattice.less_equal(p, s) for p in positive)

    agrees_with_brute_force()
    # Check after every change, so a stale cached frontier shows up.
    for t, delta in changes:
        counted.update(t, delta)
        counts[t] = counts.get(t, 0) + delta
        agrees_with_brute_force()


def test_mutable_antichain_ignores_negative_counts_in_its_frontier() -> None:
    counted: MutableAntichain[int] = MutableAntichain(U64, [(3, 1), (1, -1)])
    assert counted.frontier() == u64_frontier(3)
    counted.update(1, 2)
    assert counted.frontier() == u64_frontier(1)
    counted.update_iter([(1, -1), (3, -1)])
    assert counted.frontier() == u64_frontier() and counted.is_empty()
