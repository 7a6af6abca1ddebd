"""A reduce whose aggregates are sums (COUNT, SUM, AVG) combines before the exchange: each
shard sums its share of a step into one partial row per group and time, and the shard owning
the group folds the partial rows in. The output must be what the reference evaluator says at
every time, for the values that make sums hard (NULL, NaN, infinities, -0.0, 1e308, integers
past 64 bits) and for group keys that hold them; and a partial row must find its group after a
trip over the wire, which makes a new NaN object of the one the group is keyed by."""

from __future__ import annotations

import inspect
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow
from services.compute.dataflow.lower import lower
from services.compute.dataflow.operators import aggregates
from services.compute.dataflow.operators.reduce import ReduceOperator, ReduceState
from services.compute.spark.requests import Exchange
from services.compute.spark.wire import CODEC
from tests.support import random_plans
from tests.unit.test_dataflow_invariant import check_against_the_reference
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.columnar.schema import Column
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

NAN = float("nan")
INF = float("inf")

SCHEMA = RelationSchema(
    [
        Column("k", T.FLOAT64, True),
        Column("g", T.TEXT, False),
        Column("i", T.INT64, True),
        Column("f", T.FLOAT64, True),
        Column("d", T.DECIMAL, True, 10, 2),
    ]
)
KEYS = [0.0, -0.0, NAN, 1.5, None]
INTS = [1, -3, 7, 2**62, None]
FLOATS = [0.5, -2.25, 1e308, INF, -INF, NAN, -0.0, None]
DECIMALS = [Decimal("1.50"), Decimal("1.5"), Decimal("-2.25"), Decimal("0.01"), None]


def summing_plan(group_key: list[int]) -> Any:
    """Every aggregate that combines, over ``u1`` grouped by ``group_key``."""
    root = pb.reduce(
        pb.get("u1", SCHEMA),
        group_key,
        [
            pb.aggregate("count"),
            pb.aggregate("count", 3),
            pb.aggregate("sum", 2),
            pb.aggregate("sum", 3),
            pb.aggregate("avg", 2),
            pb.aggregate("avg", 3),
            pb.aggregate("sum", 4),
            pb.aggregate("avg", 4),
        ],
    )
    return pb.plan(root, derive_schema(root))


@st.composite
def summing_scenarios(draw: st.DrawFn) -> random_plans.Scenario:
    rows = st.tuples(
        st.sampled_from(KEYS),
        st.sampled_from(["a", "b"]),
        st.sampled_from(INTS),
        st.sampled_from(FLOATS),
        st.sampled_from(DECIMALS),
    )
    max_time = 5
    current: dict[Any, int] = {}
    updates = []
    for time in range(max_time + 1):
        for _ in range(draw(st.integers(0, 4))):
            present = sorted(current, key=repr)
            if present and draw(st.booleans()):
                row = draw(st.sampled_from(present))
                diff = -draw(st.integers(1, current[row]))
            else:
                row, diff = draw(rows), draw(st.sampled_from([1, 1, 2]))
            updates.append((row, time, diff))
            current[row] = current.get(row, 0) + diff
            if not current[row]:
                del current[row]
    uppers = sorted(draw(st.sets(st.integers(1, max_time), max_size=max_time)) | {max_time + 1})
    group_key = draw(st.sampled_from([[0], [1], [0, 1], [4], []]))
    return random_plans.Scenario(
        {"u1": SCHEMA},
        summing_plan(group_key),
        random_plans.History({"u1": updates}, max_time, uppers),
    )


def test_count_sum_and_avg_combine_and_min_max_and_distinct_do_not() -> None:
    graph = lower(summing_plan([0]))
    reduce = graph.nodes[graph.root].operator
    assert isinstance(reduce, ReduceOperator) and reduce.combines
    for kept_values in (
        pb.aggregate("min", 2),
        pb.aggregate("max", 3),
        pb.aggregate("count", 3, distinct=True),
        pb.aggregate("sum", 2, distinct=True),
    ):
        root = pb.reduce(pb.get("u1", SCHEMA), [0], [pb.aggregate("count"), kept_values])
        graph = lower(pb.plan(root, derive_schema(root)))
        operator = graph.nodes[graph.root].operator
        assert isinstance(operator, ReduceOperator) and not operator.combines


COMBINABLE = {
    aggregates.CountRows: aggregates.CountRows,
    aggregates.CountValues: aggregates.CountValues,
    aggregates.SumExact: lambda: aggregates.SumExact(2),
    aggregates.AvgExact: lambda: aggregates.AvgExact(2, 8),
    aggregates.SumFloat: aggregates.SumFloat,
    aggregates.AvgFloat: aggregates.AvgFloat,
}
VALUES: dict[type, list[Any]] = {
    aggregates.CountRows: [None],
    aggregates.CountValues: [1, None, "x"],
    aggregates.SumExact: [Decimal("1.50"), Decimal("-0.25"), 7, None],
    aggregates.AvgExact: [Decimal("1.50"), Decimal("-0.25"), 7, None],
    aggregates.SumFloat: FLOATS,
    aggregates.AvgFloat: FLOATS,
}


def _subclasses(kind: type) -> list[type]:
    found = []
    for sub in kind.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


@pytest.mark.parametrize("kind", _subclasses(aggregates.Aggregate), ids=lambda k: k.__name__)
@given(data=st.data())
def test_an_aggregates_parts_are_its_whole_state(kind: type, data: st.DataObject) -> None:
    """A state rebuilt from its parts answers as the state does, and keeps adding up alike:
    a subclass holding more than its parts say (which would then combine and lose it) fails
    here, as does one that combines without being listed."""
    if inspect.isabstract(kind) or kind.parts_width is None:
        assert kind not in COMBINABLE
        return
    assert kind in COMBINABLE, f"{kind.__name__} combines: list it with values to test"
    new = COMBINABLE[kind]
    changes = st.tuples(st.sampled_from(VALUES[kind]), st.integers(-3, 3))
    state, rebuilt = new(), new()
    for value, diff in data.draw(st.lists(changes, max_size=8)):
        state.add(value, diff)
    parts = state.parts()
    assert len(parts) == kind.parts_width
    rebuilt.add_parts(parts, 1)
    more = data.draw(st.lists(changes, max_size=4))
    for target in (state, rebuilt):
        for value, diff in more:
            target.add(value, diff)
    assert rebuilt.parts() == state.parts() and rebuilt.is_empty() == state.is_empty()
    for rows in (1, 5):
        if state.result(rows) != state.result(rows):  # NaN
            assert rebuilt.result(rows) != rebuilt.result(rows)
        else:
            assert rebuilt.result(rows) == state.result(rows)
    twice = new()
    twice.add_parts(parts, 2)
    twice.add_parts(parts, -1)
    assert twice.parts() == parts


def test_shards_are_given_partial_rows_and_answer_as_when_given_the_updates() -> None:
    """``Dataflow(shards=P)`` runs the combined path (each shard's reduce gets partial rows),
    and its output at every step is what the same dataflow gives the updates themselves."""
    plan = summing_plan([1])
    combined = Dataflow(plan, as_of=0, shards=3)
    plain = Dataflow(plan, as_of=0, shards=3, combine=False)
    rows = [
        (KEYS[n % 5], "ab"[n % 2], INTS[n % 5], FLOATS[n % 8], DECIMALS[n % 5]) for n in range(40)
    ]
    with mock.patch.object(
        ReduceState, "process_combined", autospec=True, side_effect=ReduceState.process_combined
    ) as spy:
        assert combined.hydrate({"u1": [(row, 0, 1) for row in rows]}) == plain.hydrate(
            {"u1": [(row, 0, 1) for row in rows]}
        )
        for time in range(1, 4):
            batch = [(row, time, -1 if n % 3 else 2) for n, row in enumerate(rows[time::4])]
            assert combined.step({"u1": batch}, time + 1) == plain.step({"u1": batch}, time + 1)
    assert spy.call_count == 3 * 4  # every shard, every run
    partials = [call.args[1] for call in spy.call_args_list]
    assert sum(len(given) for given in partials) <= 3 * 2 * 4  # a partial per group per shard


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=summing_scenarios(), as_of=st.integers(0, 3), shards=st.sampled_from([2, 3]))
def test_combined_sums_equal_the_reference_at_every_time(
    scenario: random_plans.Scenario, as_of: int, shards: int
) -> None:
    check_against_the_reference(scenario, as_of, shards, compact_to=0)


def test_a_partial_row_finds_its_nan_keyed_group_after_the_wire() -> None:
    graph = lower(summing_plan([0]))
    reduce = graph.nodes[graph.root].operator
    assert isinstance(reduce, ReduceOperator)
    state = reduce.new_state()
    assert isinstance(state, ReduceState)

    def step(updates: list[Any]) -> list[Any]:
        partials = reduce.combine(updates)
        sent = CODEC.encode(Exchange(1, graph.root, (partials,)))
        received = CODEC.decode(sent)
        assert isinstance(received, Exchange)
        return state.process_combined(received.inputs[0])

    first = step([((NAN, "a", 2, 0.5, None), 1, 1), ((NAN, "b", 3, INF, None), 1, 1)])
    assert len(first) == 1
    ((row, time, diff),) = first
    assert row[0] != row[0] and row[1:5] == (2, 2, 5, INF) and (time, diff) == (1, 1)
    # The same group at a later time: its row is retracted, not joined by a second group.
    second = step([((NAN, "a", 2, 0.5, None), 2, -1)])
    assert len(second) == 2 and len(state.groups) == 1
    (old, _, minus), (new, _, plus) = sorted(second, key=lambda update: update[2])
    assert (minus, plus) == (-1, 1) and old[1:5] == (2, 2, 5, INF) and new[1:5] == (1, 1, 3, INF)
    # Changes that cancel within a step send nothing.
    assert (
        reduce.combine([((1.5, "a", 1, 0.5, None), 3, 1), ((1.5, "a", 1, 0.5, None), 3, -1)]) == []
    )
