"""Random plans over random histories, maintained on resident tasks (P = 2): the output at
every time equals the reference evaluator's answer. Few examples: every stateful node of
every step is a socket round trip."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Index
from services.compute.dataflow.batch import consolidate
from services.compute.spark import ResidentCluster, SparkDataflow
from tests.support import random_plans, reference_eval

pytestmark = pytest.mark.spark


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(scenario=random_plans.scenarios(), as_of=st.integers(0, 3))
def test_random_plans_match_the_reference(
    cluster: ResidentCluster, scenario: random_plans.Scenario, as_of: int
) -> None:
    history = scenario.history
    try:
        expected = {
            time: reference_eval.evaluate(scenario.plan, random_plans.inputs_at(history, time))
            for time in range(as_of, history.max_time + 1)
        }
    except reference_eval.UndefinedResult:
        assume(False)
        raise

    dataflow = SparkDataflow(scenario.plan, as_of=as_of, cluster=cluster)
    try:
        inputs = set(dataflow.input_ids)
        index = Index([0], since=as_of)
        snapshot = {
            name: [u for u in updates if u[1] <= as_of]
            for name, updates in history.updates.items()
            if name in inputs
        }
        out, upper = dataflow.hydrate(snapshot)
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
            assert all(lower <= time < upper for _, time, _ in out)
            assert consolidate(out) == out
            index.apply(out, upper)
        for time in range(as_of, upper):
            assert reference_eval.canonical(index.contents_at(time)) == expected[time], time
    finally:
        dataflow.drop()
