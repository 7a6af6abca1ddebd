"""The pTVC model: append and compact keep every readable version, frontiers never regress,
and the update-set form reads like the time-function form. For u64 and pair times."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.timelines import (
    DATA,
    DIFFS,
    TIMELINE_IDS,
    TIMELINES,
    Timeline,
    UpdateT,
    brute_read,
)
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.frontier import Antichain, u64_frontier
from tidemark.lattice import U64, U64_PAIRS
from tidemark.ptvc import (
    PartialTVC,
    read_updates,
    time_function_from_updates,
    updates_from_time_function,
)
from tidemark.updates import consolidate

per_timeline = pytest.mark.parametrize("tl", TIMELINES, ids=TIMELINE_IDS)


@dataclass
class Model:
    """A pTVC next to the complete history of its collection (every update ever appended,
    never compacted), which any readable time must agree with."""

    tl: Timeline
    ptvc: PartialTVC[str, Any]
    history: list[UpdateT] = field(default_factory=list)

    def readable(self) -> list[Any]:
        since, upper = self.ptvc.since, self.ptvc.upper
        return [t for t in self.tl.grid if since.less_equal(t) and not upper.less_equal(t)]

    def reads(self) -> dict[Any, dict[str, int]]:
        return {t: self.ptvc.read(t) for t in self.readable()}

    def state(self) -> tuple[Antichain[Any], Antichain[Any], tuple[UpdateT, ...]]:
        return (self.ptvc.since, self.ptvc.upper, self.ptvc.updates)

    def check_reads(self) -> None:
        for t in self.tl.grid:
            if self.ptvc.is_readable(t):
                assert self.ptvc.read(t) == brute_read(self.tl.lattice, self.history, t)
            else:
                with pytest.raises(FailedPrecondition):
                    self.ptvc.read(t)


def new_model(tl: Timeline) -> Model:
    return Model(tl, PartialTVC(tl.lattice))


def draw_append(data: st.DataObject, m: Model) -> tuple[Antichain[Any], list[UpdateT]]:
    """A valid append: a new upper at or beyond the upper (its join with a few times; ``{}``
    now and then) and updates at times in ``[upper, new_upper)``."""
    upper = m.ptvc.upper
    new_upper = upper.join(data.draw(m.tl.frontiers(max_size=2)))
    window = [t for t in m.tl.grid if upper.less_equal(t) and not new_upper.less_equal(t)]
    if not window:
        return new_upper, []
    updates = data.draw(st.lists(st.tuples(DATA, st.sampled_from(window), DIFFS), max_size=8))
    return new_upper, updates


def draw_since(data: st.DataObject, m: Model) -> Antichain[Any]:
    """A valid new since: the since joined with a few times (``{}`` now and then)."""
    return m.ptvc.since.join(data.draw(m.tl.frontiers(max_size=2)))


def evolve(data: st.DataObject, m: Model, steps: int) -> None:
    for _ in range(steps):
        if data.draw(st.booleans()):
            new_upper, updates = draw_append(data, m)
            m.ptvc.append(new_upper, updates)
            m.history.extend(updates)
        else:
            m.ptvc.compact(draw_since(data, m))


# -- the empty pTVC and reads ------------------------------------------------------------------
@per_timeline
def test_a_new_ptvc_is_empty_and_reads_nothing(tl: Timeline) -> None:
    ptvc: PartialTVC[str, Any] = PartialTVC(tl.lattice)
    assert ptvc.since == ptvc.upper == Antichain.minimum(tl.lattice)
    assert ptvc.updates == ()
    for t in tl.grid:
        assert not ptvc.is_readable(t)
        with pytest.raises(FailedPrecondition):
            ptvc.read(t)


def test_reads_outside_since_and_upper_fail_with_the_reason() -> None:
    ptvc: PartialTVC[str, int] = PartialTVC(U64)
    ptvc.append(u64_frontier(5), [("a", 1, 1), ("b", 3, 2)])
    ptvc.compact(u64_frontier(2))
    assert ptvc.read(2) == {"a": 1} and ptvc.read(4) == {"a": 1, "b": 2}
    with pytest.raises(FailedPrecondition, match="since"):
        ptvc.read(1)
    with pytest.raises(FailedPrecondition, match="upper"):
        ptvc.read(5)
    assert ptvc.updates == (("a", 2, 1), ("b", 3, 2))


@per_timeline
@given(data=st.data())
def test_every_history_reads_like_the_full_collection(tl: Timeline, data: st.DataObject) -> None:
    m = new_model(tl)
    for _ in range(6):
        since, upper = m.ptvc.since, m.ptvc.upper
        evolve(data, m, 1)
        assert since.frontier_less_equal(m.ptvc.since)
        assert upper.frontier_less_equal(m.ptvc.upper)
        m.check_reads()


# -- append -----------------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_append_keeps_old_reads_and_reads_the_new_window(tl: Timeline, data: st.DataObject) -> None:
    m = new_model(tl)
    evolve(data, m, data.draw(st.integers(0, 4)))
    before, old_upper = m.reads(), m.ptvc.upper
    new_upper, updates = draw_append(data, m)
    m.ptvc.append(new_upper, updates)
    m.history.extend(updates)
    assert m.ptvc.upper == new_upper
    for t, version in before.items():
        assert m.ptvc.read(t) == version
    newly_readable = [t for t in m.readable() if old_upper.less_equal(t)]
    for t in newly_readable:
        assert m.ptvc.read(t) == brute_read(tl.lattice, m.history, t)


@per_timeline
@given(data=st.data())
def test_append_with_an_earlier_or_incomparable_upper_changes_nothing(
    tl: Timeline, data: st.DataObject
) -> None:
    m = new_model(tl)
    evolve(data, m, data.draw(st.integers(0, 4)))
    candidate = data.draw(tl.frontiers())
    before = m.state()
    if m.ptvc.upper.frontier_less_equal(candidate):
        m.ptvc.append(candidate, [])
        assert m.ptvc.upper == candidate
    else:
        with pytest.raises(FailedPrecondition):
            m.ptvc.append(candidate, [])
        assert m.state() == before


@per_timeline
@given(data=st.data())
def test_append_with_an_update_outside_the_window_changes_nothing(
    tl: Timeline, data: st.DataObject
) -> None:
    m = new_model(tl)
    evolve(data, m, data.draw(st.integers(0, 4)))
    new_upper, updates = draw_append(data, m)
    upper = m.ptvc.upper
    outside = [t for t in tl.grid if not upper.less_equal(t) or new_upper.less_equal(t)]
    if not outside:  # only when upper is {t0} and new_upper is {}: every time is inside
        assert upper == Antichain.minimum(tl.lattice) and new_upper.is_empty()
        return
    stray = (data.draw(DATA), data.draw(st.sampled_from(outside)), 1)
    position = data.draw(st.integers(0, len(updates)))
    before = m.state()
    with pytest.raises(InvalidArgument):
        m.ptvc.append(new_upper, [*updates[:position], stray, *updates[position:]])
    assert m.state() == before


def test_append_rejects_non_integer_diffs_and_other_lattices() -> None:
    ptvc: PartialTVC[str, int] = PartialTVC(U64)
    with pytest.raises(InvalidArgument):
        ptvc.append(u64_frontier(3), [("a", 1, 1.5)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument):
        ptvc.append(Antichain(U64_PAIRS, [(3, 3)]), [])  # type: ignore[arg-type,list-item]
    assert ptvc.upper == u64_frontier(0) and ptvc.updates == ()


def test_append_to_a_sealed_collection_fails() -> None:
    ptvc: PartialTVC[str, int] = PartialTVC(U64)
    ptvc.append(u64_frontier(), [("a", 4, 1)])
    assert ptvc.read(100) == {"a": 1}
    ptvc.append(u64_frontier(), [])
    with pytest.raises(FailedPrecondition):
        ptvc.append(u64_frontier(9), [])
    with pytest.raises(InvalidArgument):
        ptvc.append(u64_frontier(), [("a", 5, 1)])


# -- compact ----------------------------------------------------------------------------------
@per_timeline
@given(data=st.data())
def test_compact_keeps_reads_at_or_beyond_the_new_since_and_never_grows(
    tl: Timeline, data: st.DataObject
) -> None:
    m = new_model(tl)
    evolve(data, m, data.draw(st.integers(0, 5)))
    before, count = m.reads(), len(m.ptvc.updates)
    new_since = draw_since(data, m)
    m.ptvc.compact(new_since)
    assert m.ptvc.since == new_since
    assert len(m.ptvc.updates) <= count
    still_readable = [t for t in before if new_since.less_equal(t)]
    assert sorted(still_readable) == sorted(m.readable())
    for t in still_readable:
        assert m.ptvc.read(t) == before[t]


@per_timeline
@given(data=st.data())
def test_compact_to_an_earlier_or_incomparable_since_changes_nothing(
    tl: Timeline, data: st.DataObject
) -> None:
    m = new_model(tl)
    evolve(data, m, data.draw(st.integers(1, 5)))
    candidate = data.draw(tl.frontiers())
    before = m.state()
    if m.ptvc.since.frontier_less_equal(candidate):
        m.ptvc.compact(candidate)
        assert m.ptvc.since == candidate
    else:
        with pytest.raises(FailedPrecondition):
            m.ptvc.compact(candidate)
        assert m.state() == before


def test_compact_merges_the_past_on_pairs() -> None:
    ptvc: PartialTVC[str, tuple[int, int]] = PartialTVC(U64_PAIRS)
    ptvc.append(
        Antichain(U64_PAIRS, [(4, 0), (0, 4)]),
        [("a", (0, 0), 1), ("a", (1, 0), 1), ("a", (1, 2), -1), ("b", (0, 1), 1)],
    )
    ptvc.compact(Antichain(U64_PAIRS, [(2, 2)]))
    assert ptvc.updates == (("a", (2, 2), 1), ("b", (2, 2), 1))
    with pytest.raises(FailedPrecondition):
        ptvc.compact(Antichain(U64_PAIRS, [(3, 0)]))
    assert ptvc.since == Antichain(U64_PAIRS, [(2, 2)])


# -- update-set and time-function forms -------------------------------------------------------
def draw_time_function(
    data: st.DataObject, tl: Timeline
) -> tuple[list[Any], dict[Any, dict[str, int]]]:
    """A random time function over a downward-closed set of grid times (every time at or
    below a few drawn bounds), with zero multiplicities now and then."""
    bounds = data.draw(tl.time_lists(min_size=1, max_size=3))
    domain = [t for t in tl.grid if any(tl.lattice.less_equal(t, b) for b in bounds)]
    versions = {t: data.draw(st.dictionaries(DATA, st.integers(-2, 2), max_size=3)) for t in domain}
    return domain, versions


def nonzero(version: dict[str, int]) -> dict[str, int]:
    return {d: n for d, n in version.items() if n != 0}


@per_timeline
@given(data=st.data())
def test_updates_of_a_time_function_read_back_its_versions(
    tl: Timeline, data: st.DataObject
) -> None:
    domain, versions = draw_time_function(data, tl)
    updates = updates_from_time_function(tl.lattice, versions)
    assert consolidate(updates) == updates
    assert {time for _, time, _ in updates} <= set(domain)
    for t in domain:
        assert read_updates(tl.lattice, updates, t) == nonzero(versions[t])
    # Through a pTVC whose upper is exactly the times outside the domain.
    ptvc: PartialTVC[str, Any] = PartialTVC(tl.lattice)
    outside = [t for t in tl.grid if t not in domain]
    ptvc.append(Antichain(tl.lattice, [*outside, *tl.beyond_grid]), updates)
    assert [t for t in tl.grid if ptvc.is_readable(t)] == domain
    for t in domain:
        assert ptvc.read(t) == nonzero(versions[t])


@per_timeline
@given(data=st.data())
def test_the_two_forms_convert_back_and_forth(tl: Timeline, data: st.DataObject) -> None:
    domain, _ = draw_time_function(data, tl)
    updates = data.draw(st.lists(st.tuples(DATA, st.sampled_from(domain), DIFFS), max_size=16))
    versions = time_function_from_updates(tl.lattice, updates, domain)
    assert list(versions) == domain
    assert updates_from_time_function(tl.lattice, versions) == consolidate(updates)


def test_incomparable_times_need_a_correction_where_they_meet() -> None:
    versions = {(0, 0): {}, (1, 0): {"a": 1}, (0, 1): {"a": 1}, (1, 1): {"a": 1}}
    updates = updates_from_time_function(U64_PAIRS, versions)
    assert updates == [("a", (0, 1), 1), ("a", (1, 0), 1), ("a", (1, 1), -1)]


def test_on_u64_the_updates_are_successive_differences() -> None:
    versions = {0: {"a": 1}, 1: {"a": 1, "b": 2}, 2: {"b": 1}, 3: {"b": 1}}
    assert updates_from_time_function(U64, versions) == [
        ("a", 0, 1),
        ("a", 2, -1),
        ("b", 1, 2),
        ("b", 2, -1),
    ]
