"""The Index: a dataflow's output arranged by key, readable at any time in [since, upper)."""

from __future__ import annotations

import math

import pytest

from services.compute.dataflow import Dataflow, Index
from services.compute.dataflow.batch import accumulate
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
