"""Reduce, Distinct, top-k and window state past the task's memory budget: their groups and rows
spill to local disk a bucket at a time, keys and all, come back when a step touches them, and
the views stay exactly what they are in memory."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Index, spill, spilling_map
from services.compute.dataflow.operators.distinct import DistinctState
from services.compute.dataflow.operators.reduce import ReduceState
from services.compute.dataflow.operators.topk import TopKState
from services.compute.dataflow.operators.window import WindowState
from services.compute.dataflow.ordering import NAN
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.spilling_map import SpillingMap
from tests.support.grouped_views import (
    EVENTS,
    Events,
    assert_exact_at_every_time,
    distinct_view,
    group_view,
    top_view,
    window_view,
)
from tidemark.errors import ResourceExhausted
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

ENTRY = 100

keys = st.tuples(st.integers(-40, 40), st.sampled_from(["a", "b", NAN, None]))
operations = st.lists(st.tuples(keys, st.integers(-3, 3)), max_size=150)


def _size(key: Any, value: list[int]) -> int:
    return ENTRY * len(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=operations, budget_entries=st.integers(1, 12))
def test_a_map_over_its_budget_holds_what_a_dict_holds(
    operations: list[tuple[Any, int]], budget_entries: int
) -> None:
    """Values are lists whose size is their length: entries grow and shrink in place."""
    budget = StateBudget(budget_entries * ENTRY)
    spilling: SpillingMap[list[int]] = SpillingMap(_size, bucket_bytes=3 * ENTRY)
    spilling.attach(budget)
    model: dict[Any, list[int]] = {}
    try:
        for key, change in operations:
            bucket = spilling.bucket(key)
            entries = bucket.entries
            assert entries is not None
            assert entries.get(key) == model.get(key)
            value = entries.get(key)
            if value is None:
                if change > 0:
                    spilling.add(bucket, key, [change] * change, ENTRY * change)
                    model[key] = [change] * change
            elif change > 0:
                value.extend([change] * change)
                spilling.resize(bucket, ENTRY * change)
                model[key] = value.copy()
            else:
                spilling.discard(bucket, key, ENTRY * len(value))
                del model[key]
            spilling.settle()
            assert budget.held_bytes == spilling.held_in_memory()
            assert budget.held_bytes <= budget.budget_bytes
            total = sum(ENTRY * len(v) for v in model.values())
            assert spilling.held_in_memory() + spilling.spilled_bytes == total
            assert len(spilling) == len(model)
        assert dict(spilling.items()) == model
        for key, value in model.items():
            assert spilling.get(key) == value
    finally:
        spilling.release()
        budget.close()


def _run(
    plan: Any, events: Events, budget: StateBudget | None, steps: int
) -> tuple[Dataflow, Index, int]:
    dataflow = Dataflow(plan, as_of=0, budget=budget)
    index = Index([0], since=0)
    out, upper = dataflow.hydrate({"events": list(events.history)})
    index.apply(out, upper)
    for _ in range(steps):
        changes = events.step(upper, 3, 60)
        out, upper = dataflow.step({"events": changes}, upper + 3)
        index.apply(out, upper)
    return dataflow, index, upper


@pytest.mark.parametrize("compacting", [False, True])
@pytest.mark.parametrize(
    ("plan", "state_type"),
    [
        (group_view(), ReduceState),
        (distinct_view(), DistinctState),
        (top_view(), TopKState),
        (window_view(), WindowState),
    ],
)
def test_a_view_of_three_times_the_budget_stays_exact_at_every_time(
    plan: Any, state_type: type, compacting: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``compacting``, the spill file is compacted whenever half of it is garbage (the
    buckets' locations move and every one stays readable), and batches of 16 keys or more are
    visited bucket after bucket."""
    if compacting:
        monkeypatch.setattr(spill, "COMPACT_MIN_BYTES", 1)
        monkeypatch.setattr(spilling_map, "BULK_KEYS", 16)
    in_memory, _, _ = _run(plan, Events(900, 400, seed=11), None, 0)
    state_bytes = in_memory.state_size().bytes
    (state,) = in_memory.workers[0].states.values()
    assert isinstance(state, state_type)
    budget = StateBudget(state_bytes // 3)
    try:
        events = Events(900, 400, seed=11)
        dataflow, index, upper = _run(plan, events, budget, 8)
        size = dataflow.state_size()
        assert 0 < size.spilled_bytes < size.bytes
        assert size.bytes > 2.5 * budget.budget_bytes
        assert budget.held_bytes <= budget.budget_bytes
        # What the map was told of each entry's size adds up: in memory plus on disk.
        assert budget.held_bytes + size.spilled_bytes == size.bytes
        assert budget.spilled_keys > 0 and budget.bytes_on_disk > 0
        assert_exact_at_every_time(plan, events.history, index, upper)
        # The same steps in memory give the same state, bucket for bucket of the reference.
        (spilled_state,) = dataflow.workers[0].states.values()
        fresh, _, _ = _run(plan, Events(900, 400, seed=11), None, 8)
        assert fresh.state_size().bytes == size.bytes
        (fresh_state,) = fresh.workers[0].states.values()
        assert _contents(spilled_state) == _contents(fresh_state)
    finally:
        budget.close()


def _contents(state: Any) -> dict[Any, Any]:
    if isinstance(state, DistinctState):
        return dict(state.counts.items())
    if isinstance(state, TopKState | WindowState):
        return {key: (group.rows.counts, group.output) for key, group in state.groups.items()}
    return {key: group.output for key, group in state.groups.items()}


def test_spilled_groups_keep_nan_as_the_engine_nan() -> None:
    """NaN in group keys, outputs and MIN/MAX's kept values comes back as the one NaN, so a
    group read back from disk retracts exactly the row it emitted."""
    plan = group_view()
    budget = StateBudget(2_000)
    try:
        dataflow = Dataflow(plan, as_of=0, budget=budget)
        rows = [((n, n % 50, 5, NAN if n % 2 else 1.0), 0, 1) for n in range(200)]
        out, _ = dataflow.hydrate({"events": rows})
        assert budget.spilled_keys > 0
        # Retract every row: every group must retract exactly what it emitted.
        out2, _ = dataflow.step({"events": [(row, 1, -1) for row, _, _ in rows]}, 2)
        emitted: dict[Any, int] = {}
        for row, _, diff in out + out2:
            emitted[row] = emitted.get(row, 0) + diff
        assert {row: n for row, n in emitted.items() if n} == {}
        assert dataflow.state_size().bytes == 0
        assert any(math.isnan(row[4]) and row[4] is NAN for row, _, _ in out)
    finally:
        budget.close()


def test_grouped_state_past_the_disk_limit_is_refused_clearly() -> None:
    events = Events(2_000, 1_500, seed=3)
    for plan in (group_view(), distinct_view()):
        budget = StateBudget(2_000, disk_limit_bytes=5_000)
        try:
            dataflow = Dataflow(plan, as_of=0, budget=budget)
            with pytest.raises(ResourceExhausted, match=r"does not fit.*memory budget.*disk"):
                dataflow.hydrate({"events": list(events.history)})
        finally:
            budget.close()


def test_dropping_a_spilled_reduce_lets_its_disk_go() -> None:
    budget = StateBudget(3_000)
    try:
        events = Events(600, 300, seed=5)
        kept = Dataflow(distinct_view(), as_of=0, budget=budget)
        kept.hydrate({"events": list(events.history)})
        dropped = Dataflow(group_view(), as_of=0, budget=budget)
        dropped.hydrate({"events": list(events.history)})
        on_disk = budget.bytes_on_disk
        for worker in dropped.workers:
            worker.release()
        assert 0 < budget.bytes_on_disk < on_disk
        assert budget.held_bytes == kept.state_size().bytes - kept.state_size().spilled_bytes
    finally:
        budget.close()


def test_a_global_aggregate_and_a_distinct_share_one_budget() -> None:
    """Two operators of one view both spill: DISTINCT under a COUNT(*)."""
    events = Events(800, 300, seed=9)
    distinct = pb.distinct(pb.project(pb.get("events", EVENTS), 1, 2))
    root = pb.reduce(pb.project(distinct, 0), [0], [pb.aggregate("count")])
    plan = pb.plan(root, derive_schema(root))
    budget = StateBudget(4_000)
    try:
        dataflow, index, upper = _run(plan, events, budget, 5)
        spilled = [s.spilled_bytes() for s in dataflow.workers[0].states.values()]
        assert len(spilled) == 2 and min(spilled) > 0
        assert_exact_at_every_time(plan, events.history, index, upper)
    finally:
        budget.close()


def test_a_map_filled_before_its_budget_splits_and_spills_when_attached() -> None:
    spilling: SpillingMap[list[int]] = SpillingMap(_size, bucket_bytes=4 * ENTRY)
    model = {(number,): [number] for number in range(500)}
    bucket = spilling.bucket((0,))
    for key, value in model.items():
        spilling.add(bucket, key, value, ENTRY)  # one bucket: no budget, no splits
    budget = StateBudget(50 * ENTRY)
    try:
        spilling.attach(budget)
        assert budget.held_bytes == 500 * ENTRY
        spilling.settle()
        assert budget.held_bytes <= budget.budget_bytes
        assert spilling.spilled_bytes == 500 * ENTRY - budget.held_bytes
        assert dict(spilling.items()) == model
        assert all(spilling.get(key) == value for key, value in model.items())
    finally:
        spilling.release()
        budget.close()


@contextlib.contextmanager
def _two_entries_each(keys: list[Any]) -> Iterator[SpillingMap[list[int]]]:
    """A map over a budget of 12 entries, buckets of 3, holding ``[2, 2]`` under each key."""
    budget = StateBudget(12 * ENTRY)
    spilling: SpillingMap[list[int]] = SpillingMap(_size, bucket_bytes=3 * ENTRY)
    spilling.attach(budget)
    try:
        for key in keys:
            bucket = spilling.bucket(key)
            spilling.add(bucket, key, [2, 2], 2 * ENTRY)
            spilling.settle()
        assert dict(spilling.items()) == {key: [2, 2] for key in keys}
        yield spilling
    finally:
        spilling.release()
        budget.close()


@pytest.mark.parametrize(
    "keys",
    [
        # Python hashes -1 and -2 alike, and so tuples of them: no split can part these.
        [(-1, "a"), (-2, "a")],
        [-1, -2],
        # Hashes sharing their low 30 bits: parted only past the bits a split may use.
        [5, 5 + (1 << 30), 5 + (2 << 30)],
    ],
)
def test_keys_no_split_can_part_share_a_growing_bucket(keys: list[Any]) -> None:
    """Big entries under keys whose hashes agree on every bit a split may use: the bucket just
    grows, instead of the directory doubling once per shared bit until memory runs out."""
    with _two_entries_each(keys) as spilling:
        assert len(spilling._directory) <= 1 << spilling_map.MAX_DEPTH
        assert len({id(spilling.bucket(key)) for key in keys}) == 1


def test_keys_parted_by_a_high_bit_split_as_far_as_it() -> None:
    """Keys whose hashes first differ at bit 12 still split apart, the directory growing to
    that depth only."""
    keys = [7, 7 + (1 << 12)]
    with _two_entries_each(keys) as spilling:
        assert spilling.bucket(keys[0]) is not spilling.bucket(keys[1])
        assert len(spilling._directory) == 1 << 13
