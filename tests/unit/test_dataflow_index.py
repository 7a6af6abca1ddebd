"""The Index: a dataflow's output arranged by key, readable at any time in [since, upper)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Index
from services.compute.dataflow.batch import accumulate
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.spill import StateBudget
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.plan import builders as pb

NUMS = RelationSchema.of(("g", T.TEXT), ("n", T.INT64))


def filled_index() -> Index:
    index = Index([0], since=10)
    index.apply([(("a", 1), 10, 1), (("b", 2), 10, 2)], 11)
    index.apply([(("a", 1), 12, -1), (("a", 5), 12, 1), (("c", 3), 13, 1)], 14)
    index.apply([(("b", 2), 15, -2)], 17)
    return index


def test_contents_at_each_time() -> None:
    index = filled_index()
    assert index.contents_at(10) == {("a", 1): 1, ("b", 2): 2}
    assert index.contents_at(11) == {("a", 1): 1, ("b", 2): 2}
    assert index.contents_at(12) == {("a", 5): 1, ("b", 2): 2}
    assert index.contents_at(13) == {("a", 5): 1, ("b", 2): 2, ("c", 3): 1}
    assert index.contents_at(16) == {("a", 5): 1, ("c", 3): 1}


def test_lookup_by_key() -> None:
    index = filled_index()
    assert index.lookup(("a",), 11) == {("a", 1): 1}
    assert index.lookup(("a",), 16) == {("a", 5): 1}
    assert index.lookup(("b",), 14) == {("b", 2): 2}
    assert index.lookup(("b",), 15) == {}
    assert index.lookup(("zz",), 15) == {}


def test_lookup_reads_float_keys_as_the_contract_does() -> None:
    schema = RelationSchema.of(("f", T.FLOAT64), ("n", T.INT64))
    dataflow = Dataflow(pb.get("t", schema), as_of=0)
    index = Index([0], since=0)
    index.apply(*dataflow.hydrate({"t": [((float("nan"), 1), 0, 1), ((-0.0, 2), 0, 1)]}))
    assert index.lookup((float("nan"),), 0) == {(math.nan, 1): 1}
    assert index.lookup((0.0,), 0) == {(0.0, 2): 1}


def test_reads_outside_since_and_upper_are_refused() -> None:
    index = filled_index()
    with pytest.raises(FailedPrecondition, match="before the index's since 10"):
        index.contents_at(9)
    with pytest.raises(FailedPrecondition, match="upper is 17"):
        index.lookup(("a",), 17)


def test_compaction_folds_history_and_keeps_later_reads_exact() -> None:
    index = filled_index()
    later = {time: index.contents_at(time) for time in range(13, 17)}
    assert index.history_size() == 4
    index.compact(13)
    assert index.since == 13
    assert index.history_size() == 1  # only the change at 15 is left
    for time, contents in later.items():
        assert index.contents_at(time) == contents
    with pytest.raises(FailedPrecondition, match="compacted"):
        index.contents_at(12)
    index.compact(20)  # past the upper: later updates at or before since go to the base
    assert index.history_size() == 0
    index.apply([(("d", 4), 18, 1)], 21)
    assert index.contents_at(20) == {("a", 5): 1, ("c", 3): 1, ("d", 4): 1}
    with pytest.raises(FailedPrecondition, match="cannot move back"):
        index.compact(19)


def test_updates_must_fall_between_the_uppers() -> None:
    index = filled_index()
    with pytest.raises(InvalidArgument, match="not all in"):
        index.apply([(("a", 1), 16, 1)], 20)
    with pytest.raises(InvalidArgument, match="not all in"):
        index.apply([(("a", 1), 20, 1)], 20)
    with pytest.raises(InvalidArgument, match="cannot move back"):
        index.apply([], 16)
    assert index.upper == 17


def test_an_index_over_a_dataflow_answers_every_time_in_range() -> None:
    plan = pb.reduce(pb.get("t", NUMS), [0], [pb.aggregate("sum", 1)])
    dataflow = Dataflow(plan, as_of=5)
    index = Index([0], since=5)
    out, upper = dataflow.hydrate({"t": [(("a", 1), 2, 1), (("b", 2), 5, 1)]})
    index.apply(out, upper)
    history = list(out)
    steps = [
        ([(("a", 3), 6, 1), (("b", 2), 8, -1)], 9),
        ([], 12),
        ([(("a", 1), 12, -1), (("c", 7), 13, 1)], 14),
    ]
    for batch, step_upper in steps:
        out, upper = dataflow.step({"t": batch}, step_upper)
        index.apply(out, upper)
        history.extend(out)
    assert index.upper == 14
    for time in range(5, 14):
        assert index.contents_at(time) == accumulate(history, time)
    assert list(index.lookup(("a",), 13)) == [("a", 3)]


# An index over a budget of a few rows: its keys spill a bucket at a time, and every read at
# every readable time, through every compaction, is what the history says.
_rows = st.tuples(st.integers(0, 12), st.sampled_from(["x", "y", None]), st.integers(-2, 2))
_batches = st.lists(
    st.tuples(
        st.lists(st.tuples(_rows, st.integers(0, 2), st.sampled_from([-1, 1, 2])), max_size=25),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=_batches, budget_rows=st.integers(1, 6))
def test_an_index_over_a_tiny_budget_reads_what_its_history_says(
    batches: list[tuple[list[tuple[tuple[int, str | None, int], int, int]], int]],
    budget_rows: int,
) -> None:
    budget = StateBudget(budget_rows * row_bytes(3))
    index = Index([0, 1], since=0)
    index.attach(budget)
    history: list[tuple[tuple[int, str | None, int], int, int]] = []
    upper = 0
    try:
        for changes, lag in batches:
            updates = [(row, upper + offset, diff) for row, offset, diff in changes]
            upper += 3
            index.apply(updates, upper)
            history += updates
            index.compact(max(index.since, upper - lag - 1))
            assert budget.held_bytes <= budget.budget_bytes
            assert 0 <= index.spilled_bytes() <= index.held_bytes()
            # The base's sizes as told to its map add up: in memory plus on disk.
            base_rows = index.row_count() - index.history_size()
            assert budget.held_bytes + index.spilled_bytes() == base_rows * row_bytes(3)
            later = [u for u in history if u[1] > index.since]
            assert _by_time(index.changes_between(index.since + 1, upper)) == _by_time(later)
            for time in range(index.since, upper):
                want = accumulate(history, time)
                assert index.contents_at(time) == want, time
                for key in {(row[0], row[1]) for row in want} | {(99, "x")}:
                    got = index.lookup(key, time)
                    assert got == {r: c for r, c in want.items() if (r[0], r[1]) == key}
        assert index.history_size() == sum(1 for _, at, _ in history if at > index.since)
    finally:
        index.release()
        budget.close()


def _by_time(updates: list[tuple[object, int, int]]) -> dict[tuple[object, int], int]:
    totals: dict[tuple[object, int], int] = {}
    for row, time, diff in updates:
        totals[row, time] = totals.get((row, time), 0) + diff
    return {key: total for key, total in totals.items() if total}


def test_a_spilled_index_counts_its_rows_on_disk_and_lets_them_go_when_released() -> None:
    budget = StateBudget(20 * row_bytes(2))
    index = Index([0], since=0)
    index.attach(budget)
    try:
        index.apply([((key, key * 10), 0, 1) for key in range(500)], 1)
        assert index.row_count() == 500 and index.key_count() == 500
        assert index.held_bytes() == 500 * row_bytes(2)
        assert index.held_bytes() / 2 < index.spilled_bytes() < index.held_bytes()
        assert budget.held_bytes <= budget.budget_bytes and budget.bytes_on_disk > 0
        assert index.lookup((7,), 0) == {(7, 70): 1}
        assert index.contents_at(0) == {(key, key * 10): 1 for key in range(500)}
        # A whole read does not bring the spilled keys back.
        assert index.spilled_bytes() > index.held_bytes() / 2
    finally:
        index.release()
    assert budget.held_bytes == 0
    budget.close()


def test_changes_between_are_the_history_in_the_range() -> None:
    index = filled_index()
    assert sorted(index.changes_between(11, 17)) == sorted(
        [(("a", 1), 12, -1), (("a", 5), 12, 1), (("c", 3), 13, 1), (("b", 2), 15, -2)]
    )
    assert sorted(index.changes_between(13, 15)) == [(("c", 3), 13, 1)]
    assert index.changes_between(16, 17) == []
    index.compact(12)
    with pytest.raises(FailedPrecondition, match="since is 12"):
        index.changes_between(12, 17)
    assert sorted(index.changes_between(13, 16)) == [(("b", 2), 15, -2), (("c", 3), 13, 1)]
    with pytest.raises(FailedPrecondition, match="upper is 17"):
        index.changes_between(13, 18)
