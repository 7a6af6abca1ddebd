"""The Window operator: maintained window functions equal the reference evaluator at every
time, and a step recomputes only the partitions it changed.

The random plans of tests/support/random_plans.py include Window nodes anywhere in a plan
(covered by test_dataflow_invariant.py); here Window sits straight on an input with few
partitions, so partitions hold many rows and sliding frames both take rows in and drop them.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Index, Update
from services.compute.dataflow.batch import consolidate
from tests.support import random_plans, reference_eval
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar import ColumnType as T
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2


@st.composite
def window_scenarios(draw: st.DrawFn) -> random_plans.Scenario:
    schemas = draw(random_plans.input_schemas(max_inputs=1))
    plan = draw(random_plans.window_plans(schemas))
    history = draw(random_plans.histories(schemas, max_time=6))
    return random_plans.Scenario(schemas, plan, history)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=window_scenarios(), shards=st.sampled_from([1, 2]))
def test_maintained_windows_equal_the_reference_at_every_time(
    scenario: random_plans.Scenario, shards: int
) -> None:
    history = scenario.history
    dataflow = Dataflow(scenario.plan, as_of=0, shards=shards)
    index = Index([0], since=0)
    upper = 0
    for lower, batch_upper, chosen in random_plans.batches(history):
        if lower == 0:
            out, upper = dataflow.hydrate(
                {n: [u for u in b if u[1] == 0] for n, b in chosen.items()}
            )
            index.apply(out, upper)
            chosen = {n: [u for u in b if u[1] > 0] for n, b in chosen.items()}
            if batch_upper == upper:
                continue
        out, upper = dataflow.step(chosen, batch_upper)
        assert all(lower <= time < upper for _, time, _ in out)
        assert consolidate(out) == out
        index.apply(out, upper)
    for time, inputs in random_plans.versions(history):
        expected = reference_eval.evaluate(scenario.plan, inputs)
        assert reference_eval.canonical(index.contents_at(time)) == expected, time


SALES = RelationSchema(
    [
        Column("region", T.TEXT, False),
        Column("day", T.INT64, False),
        Column("amount", T.INT64, True),
    ]
)


def _sales_plan() -> plan_pb2.Plan:
    rows = pb.frame("rows", ("preceding", 1), "current_row")
    return pb.plan(
        pb.window(
            pb.get("sales", SALES),
            [0],
            [1],
            [
                pb.window_function("row_number"),
                pb.window_function("sum", 2, frame=rows),
                pb.window_function("lag", 2, default=pb.literal(0, T.INT64)),
            ],
        )
    )


def test_a_change_recomputes_only_its_partition() -> None:
    regions, days = 200, 50
    sales = [(f"r{r}", d, r * d) for r in range(regions) for d in range(days)]
    dataflow = Dataflow(_sales_plan(), as_of=0)
    out, upper = dataflow.hydrate({"sales": [(row, 0, 1) for row in sales]})
    assert len(out) == regions * days
    before = dataflow.work()
    # Day 10 of region r3 changes amount 30 -> 31: rows 10 and 11 of r3 change, nothing else.
    changes: list[Update] = [(("r3", 10, 30), upper, -1), (("r3", 10, 31), upper, 1)]
    out, upper = dataflow.step({"sales": changes}, upper + 1)
    after = dataflow.work()
    assert after.key_lookups - before.key_lookups == 1
    assert after.rows_visited - before.rows_visited == days
    t = upper - 1
    assert out == [
        (("r3", 10, 30, 11, Decimal(57), 27), t, -1),
        (("r3", 10, 31, 11, Decimal(58), 27), t, 1),
        (("r3", 11, 33, 12, Decimal(63), 30), t, -1),
        (("r3", 11, 33, 12, Decimal(64), 31), t, 1),
    ]


def test_copies_of_a_row_get_their_own_row_numbers() -> None:
    plan = pb.plan(pb.window(pb.get("sales", SALES), [], [1], [pb.window_function("row_number")]))
    dataflow = Dataflow(plan, as_of=0)
    out, upper = dataflow.hydrate({"sales": [(("a", 1, None), 0, 2), (("a", 0, 5), 0, 1)]})
    assert sorted((row, diff) for row, _, diff in out) == [
        (("a", 0, 5, 1), 1),
        (("a", 1, None, 2), 1),
        (("a", 1, None, 3), 1),
    ]
    out, _ = dataflow.step({"sales": [(("a", 1, None), upper, -1)]}, upper + 1)
    assert [(row, diff) for row, _, diff in out] == [(("a", 1, None, 3), -1)]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (pb.window_function("rank", 0), "no argument"),
        (pb.window_function("lag"), "needs an argument"),
        (pb.window_function("lag", 1, default=pb.literal("x", T.TEXT)), "default"),
        (pb.window_function("sum", 0), "numeric"),
        (pb.window_function("row_number", offset=2), "offset"),
        (
            pb.window_function("sum", 1, frame=pb.frame("range", ("preceding", 1), "current_row")),
            "RANGE frames with an offset",
        ),
        (
            pb.window_function(
                "count", frame=pb.frame("rows", "unbounded_following", "current_row")
            ),
            "UNBOUNDED FOLLOWING",
        ),
        (
            pb.window_function("count", frame=pb.frame("rows", "current_row", ("preceding", 1))),
            "cannot end before",
        ),
    ],
)
def test_ill_formed_window_functions_are_rejected_at_install(
    function: plan_pb2.WindowFunction, message: str
) -> None:
    plan = pb.plan(pb.window(pb.get("sales", SALES), [0], [1], [function]))
    with pytest.raises(InvalidArgument, match=message):
        Dataflow(plan, as_of=0)


def test_window_columns_out_of_range_are_rejected() -> None:
    plan = pb.plan(pb.window(pb.get("sales", SALES), [3], [], [pb.window_function("rank")]))
    with pytest.raises(InvalidArgument, match="partition key column #3 is out of range"):
        Dataflow(plan, as_of=0)
