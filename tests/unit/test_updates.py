"""Consolidation, time advancement and compaction of update sets, for u64 and pair times."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.timelines import (
    TIMELINE_IDS,
    TIMELINES,
    U64_TIMELINE,
    Timeline,
    brute_read,
    upset,
)
from tidemark.frontier import Antichain, u64_frontier
from tidemark.lattice import U64, U64_PAIRS
from tidemark.updates import (
    advance_by,
    advance_time,
    consolidate,
    diff_versions,
    read_updates,
)

per_timeline = pytest.mark.parametrize("tl", TIMELINES, ids=TIMELINE_IDS)


# -- consolidate ------------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_consolidate_is_canonical_and_reads_the_same(tl: Timeline, data: st.DataObject) -> None:
    updates = data.draw(tl.updates())
    out = consolidate(updates)
    assert all(diff != 0 for _, _, diff in out)
    keys = [(d, t) for d, t, _ in out]
    assert len(set(keys)) == len(keys)
    assert keys == sorted(keys)
    assert len(out) <= len(updates)
    assert consolidate(out) == out
    # The same updates in another order, or split differently, consolidate identically.
    assert consolidate(data.draw(st.permutations(updates))) == out
    for t in tl.grid:
        assert read_updates(tl.lattice, out, t) == brute_read(tl.lattice, updates, t)


def test_consolidate_sums_and_drops_cancelled_updates() -> None:
    out = consolidate([("b", 1, 2), ("a", 2, 1), ("b", 1, -2), ("a", 2, 4), ("a", 1, -1)])
    assert out == [("a", 1, -1), ("a", 2, 5)]
    assert consolidate([]) == []


def test_consolidate_keeps_first_appearance_order_for_unorderable_data() -> None:
    updates: list[tuple[Any, int, int]] = [(None, 1, 1), (3, 0, 2), (None, 1, 1), ("x", 0, 0)]
    assert consolidate(updates) == [(None, 1, 2), (3, 0, 2)]
    assert consolidate(updates) == consolidate(list(updates))


# -- advance_time -----------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_advanced_time_is_seen_by_exactly_the_same_readable_times(
    tl: Timeline, data: st.DataObject
) -> None:
    since = data.draw(tl.frontiers(min_size=1))
    t = data.draw(tl.times())
    lat = tl.lattice
    advanced = advance_time(lat, t, since)
    assert lat.less_equal(t, advanced)
    for r in upset(lat, since.elements, tl.grid):
        assert lat.less_equal(advanced, r) == lat.less_equal(t, r)
    if since.less_equal(t):
        assert advanced == t
    # It is the latest such time, which lets the most updates land on the same time: any
    # grid time at or after ``t`` that every readable time sees alike is at or before it.
    readable = upset(lat, since.elements, tl.grid)
    for c in tl.grid:
        if lat.less_equal(t, c) and all(
            lat.less_equal(c, r) == lat.less_equal(t, r) for r in readable
        ):
            assert lat.less_equal(c, advanced)


def test_advance_time_examples() -> None:
    assert advance_time(U64, 2, u64_frontier(5)) == 5
    assert advance_time(U64, 7, u64_frontier(5)) == 7
    since = Antichain(U64_PAIRS, [(2, 0), (0, 2)])
    assert advance_time(U64_PAIRS, (0, 0), since) == (0, 0)
    assert advance_time(U64_PAIRS, (1, 0), since) == (1, 0)
    assert advance_time(U64_PAIRS, (1, 1), Antichain(U64_PAIRS, [(3, 0), (0, 3)])) == (1, 1)
    assert advance_time(U64_PAIRS, (1, 4), Antichain(U64_PAIRS, [(3, 0), (2, 2)])) == (2, 4)


@per_timeline
@given(data=st.data())
def test_advance_time_to_the_empty_frontier_leaves_times_alone(
    tl: Timeline, data: st.DataObject
) -> None:
    t = data.draw(tl.times())
    assert advance_time(tl.lattice, t, Antichain.empty(tl.lattice)) == t


# -- advance_by -------------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_advance_by_keeps_reads_at_or_beyond_since(tl: Timeline, data: st.DataObject) -> None:
    updates = data.draw(tl.updates())
    since = data.draw(tl.frontiers())
    out = advance_by(updates, since)
    assert len(out) <= len(updates)
    assert consolidate(out) == out
    for t in tl.grid:
        if since.less_equal(t):
            assert read_updates(tl.lattice, out, t) == brute_read(tl.lattice, updates, t)
    if since.is_empty():
        assert out == consolidate(updates)


@given(updates=U64_TIMELINE.updates(), s=U64_TIMELINE.times())
def test_advance_by_on_u64_is_max_with_since(updates: list[Any], s: int) -> None:
    expected = consolidate((d, max(t, s), r) for d, t, r in updates)
    assert advance_by(updates, u64_frontier(s)) == expected


def test_advance_by_merges_updates_that_land_on_the_same_time() -> None:
    updates = [("a", 1, 1), ("a", 2, -1), ("b", 2, 1), ("b", 6, 1)]
    assert advance_by(updates, u64_frontier(4)) == [("b", 4, 1), ("b", 6, 1)]


# -- read_updates and diff_versions -----------------------------------------------------------
def test_read_updates_on_pairs_sees_only_times_at_or_before() -> None:
    updates = [("a", (1, 0), 1), ("a", (0, 1), 1), ("a", (1, 1), -1), ("b", (2, 2), 3)]
    assert read_updates(U64_PAIRS, updates, (0, 0)) == {}
    assert read_updates(U64_PAIRS, updates, (1, 0)) == {"a": 1}
    assert read_updates(U64_PAIRS, updates, (1, 1)) == {"a": 1}
    assert read_updates(U64_PAIRS, updates, (2, 2)) == {"a": 1, "b": 3}


def test_diff_versions_is_the_fewest_updates_between_versions() -> None:
    before = {"a": 1, "b": 2, "z": 0}
    after = {"b": 2, "c": -1}
    assert sorted(diff_versions(7, before, after)) == [("a", 7, -1), ("c", 7, -1)]
    assert diff_versions(7, after, after) == []
