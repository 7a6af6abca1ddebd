"""The correctness invariant: for random plans over random histories, fed to the dataflow in
random batches that each span several times, the output at every time t in [as_of, upper)
equals the reference evaluator's answer over the inputs at t.

The reference (tests/support/reference_eval.py) shares no evaluation code with the engine.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Index, Update
from services.compute.dataflow.batch import consolidate
from services.compute.dataflow.spill import StateBudget
from tests.support import random_plans, reference_eval


def check_batch(updates: list[Update], lower: int, upper: int) -> None:
    """A step's output: times within the step, consolidated, in canonical order."""
    assert all(lower <= time < upper for _, time, _ in updates)
    assert consolidate(updates) == updates


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    scenario=random_plans.scenarios(),
    as_of=st.integers(0, 5),
    shards=st.sampled_from([1, 1, 3]),
    compact_to=st.integers(0, 6),
)
def test_output_at_every_time_equals_the_reference(
    scenario: random_plans.Scenario, as_of: int, shards: int, compact_to: int
) -> None:
    check_against_the_reference(scenario, as_of, shards, compact_to)


def check_against_the_reference(
    scenario: random_plans.Scenario,
    as_of: int,
    shards: int,
    compact_to: int,
    budget: StateBudget | None = None,
) -> None:
    """Runs ``scenario`` through a dataflow in random batches and checks every time's output
    (and the index's, compacted to ``compact_to``) against the reference."""
    history = scenario.history
    try:
        expected = {
            time: reference_eval.evaluate(scenario.plan, random_plans.inputs_at(history, time))
            for time in range(as_of, history.max_time + 1)
        }
    except reference_eval.UndefinedResult:
        assume(False)
        raise

    dataflow = Dataflow(scenario.plan, as_of=as_of, shards=shards, budget=budget)
    inputs = set(dataflow.input_ids)
    index = Index([0], since=as_of)
    snapshot = {
        name: [u for u in updates if u[1] <= as_of]
        for name, updates in history.updates.items()
        if name in inputs
    }
    out, upper = dataflow.hydrate(snapshot)
    check_batch(out, as_of, as_of + 1)
    index.apply(out, upper)
    for _, batch_upper, chosen in random_plans.batches(history):
        if batch_upper <= upper:
            continue
        lower = upper
        batch = {
            name: [u for u in updates if u[1] >= lower]
            for name, updates in chosen.items()
            if name in inputs
        }
        out, upper = dataflow.step(batch, batch_upper)
        assert upper == batch_upper
        check_batch(out, lower, upper)
        index.apply(out, upper)
    assert upper == history.max_time + 1

    for time in range(as_of, upper):
        assert reference_eval.canonical(index.contents_at(time)) == expected[time], time
    since = max(as_of, min(compact_to, upper - 1))
    index.compact(since)
    for time in range(since, upper):
        assert reference_eval.canonical(index.contents_at(time)) == expected[time], time
