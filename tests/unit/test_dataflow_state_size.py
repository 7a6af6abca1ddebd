"""The state size every operator keeps as changes apply (what Status reports and budgets
check) equals a recount of its state from scratch, after every step of random plans over
random histories."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.operators.base import OperatorState
from services.compute.dataflow.operators.distinct import DistinctState
from services.compute.dataflow.operators.join import JoinState
from services.compute.dataflow.operators.reduce import ReduceState
from services.compute.dataflow.operators.topk import TopKState
from services.compute.dataflow.operators.window import WindowState
from services.compute.dataflow.work import StateSize
from tests.support import random_plans


def recount(state: OperatorState) -> tuple[int, int]:
    """Entries and estimated bytes of ``state``, walking all of it."""
    if isinstance(state, ReduceState):
        groups = list(state.groups.values())
        values = sum(aggregate.values_held() for g in groups for aggregate in g.aggregates)
        width = state.key_width + len(state.spec.aggregates)
        return len(groups) + values, len(groups) * row_bytes(width) + values * row_bytes(1)
    if isinstance(state, TopKState | WindowState):
        partitions = state.groups
        rows = [row for p in partitions.values() for row in p.rows.counts]
        rows_bytes = sum(row_bytes(len(row)) for row in rows)
        if isinstance(state, WindowState):
            # Each copy's output row: the row extended by one value per function.
            outputs = [row for p in state.groups.values() for row in p.output]
            rows_bytes += sum(row_bytes(len(row)) for row in outputs)
        return len(rows), rows_bytes
    if isinstance(state, DistinctState):
        rows = [row for row, _ in state.counts.items()]
        return len(rows), sum(row_bytes(len(row)) for row in rows)
    assert isinstance(state, JoinState)
    left = sum(len(rows) for rows in state.left.rows.values())
    right = sum(len(rows) for rows in state.right.rows.values())
    spec = state.spec
    return left + right, left * row_bytes(spec.left_width) + right * row_bytes(spec.right_width)


def check(dataflow: Dataflow) -> None:
    for worker in dataflow.workers:
        for state in worker.states.values():
            assert (state.row_count(), state.held_bytes()) == recount(state), type(state)
    keys = dataflow.key_count()
    assert dataflow.state_size() == StateSize(
        keys,
        sum(w.row_count() for w in dataflow.workers),
        sum(w.held_bytes() for w in dataflow.workers),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=random_plans.scenarios(), shards=st.sampled_from([1, 2]))
def test_kept_sizes_equal_a_recount(scenario: random_plans.Scenario, shards: int) -> None:
    history = scenario.history
    dataflow = Dataflow(scenario.plan, as_of=0, shards=shards)
    inputs = set(dataflow.input_ids)
    snapshot = {
        name: [u for u in updates if u[1] == 0]
        for name, updates in history.updates.items()
        if name in inputs
    }
    _, upper = dataflow.hydrate(snapshot)
    check(dataflow)
    for _, batch_upper, chosen in random_plans.batches(history):
        if batch_upper <= upper:
            continue
        batch = {
            name: [u for u in updates if u[1] >= upper]
            for name, updates in chosen.items()
            if name in inputs
        }
        _, upper = dataflow.step(batch, batch_upper)
        check(dataflow)
