"""``bench/task_step.py`` at a tiny size: its columnar state really is in batches, and the two
states step to the same output (the run stops otherwise), or its figures mean nothing."""

from __future__ import annotations

from bench.compute_view import Workload
from bench.task_step import TimedHost, run


def test_the_columnar_state_is_in_batches_and_the_dicts_state_is_not() -> None:
    workload = Workload(3_000, seed=3)
    for columnar in (True, False):
        host = TimedHost(workload, columnar)
        state = host.host.dataflows["view"].worker.states[host.join]
        assert state.left.batched is columnar  # type: ignore[attr-defined]


def test_both_states_step_alike() -> None:
    result = run(orders=3_000, steps=4, warmup=1)
    assert result["updates_per_step"] == 1_000
    for name in ("columnar", "dicts"):
        assert result[name]["join_ms_per_step"] > 0
        assert result[name]["reduce_ms_per_step"] > 0
