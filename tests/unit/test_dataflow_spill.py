"""Operator state past its memory budget: arrangements spill their oldest keys to local disk
and read them back, and the output stays exactly what it would be in memory."""

from __future__ import annotations

import math
import os
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow import spill
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.operators.arrangement import Arrangement
from services.compute.dataflow.ordering import NAN
from services.compute.dataflow.spill import StateBudget
from tests.support import random_plans
from tests.unit.test_dataflow_invariant import check_against_the_reference
from tidemark.errors import ResourceExhausted

ROW = row_bytes(2)

# Keys that are equal but hash or pickle differently, NULLs, and the engine's one NaN.
values = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([Decimal("1.5"), Decimal("1.50"), Decimal("-0"), None, NAN, 0.0, "a", b"a"]),
)
keys = st.tuples(values)
rows = st.tuples(st.integers(0, 3), values)
operations = st.lists(
    st.tuples(keys, st.lists(st.tuples(rows, st.integers(-2, 2)), max_size=4)), max_size=60
)


def model_apply(model: dict[Any, dict[Any, int]], key: Any, changes: Any) -> None:
    contents = model.setdefault(key, {})
    for row, diff in changes:
        contents[row] = contents.get(row, 0) + diff
        if not contents[row]:
            del contents[row]
    if not contents:
        del model[key]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=operations, budget_rows=st.integers(1, 6))
def test_an_arrangement_over_its_budget_holds_what_one_in_memory_holds(
    operations: list[Any], budget_rows: int
) -> None:
    budget = StateBudget(budget_rows * ROW)
    arrangement = Arrangement(width=2)
    arrangement.attach(budget)
    model: dict[Any, dict[Any, int]] = {}
    try:
        for key, changes in operations:
            assert arrangement.get(key) == model.get(key)
            arrangement.apply(key, changes)
            model_apply(model, key, changes)
            assert budget.held_bytes == arrangement.held_in_memory()
            assert budget.held_bytes <= budget.budget_bytes
            assert len(arrangement) == len(model)
            assert arrangement.row_count == sum(len(c) for c in model.values())
        assert dict(arrangement.items()) == model
        for key, contents in model.items():
            assert key in arrangement
            assert arrangement.get(key) == contents
    finally:
        budget.close()


def test_a_spilled_nan_comes_back_as_the_engine_nan() -> None:
    budget = StateBudget(ROW)
    arrangement = Arrangement(width=2)
    arrangement.attach(budget)
    arrangement.apply((NAN,), [((1, NAN), 1)])
    arrangement.apply(("other",), [((2, 0.5), 1), ((3, 0.5), 1)])  # spills the NaN key
    assert budget.spilled_keys >= 1 and budget.bytes_on_disk > 0
    found = arrangement.get((NAN,))
    assert found is not None
    ((row, count),) = found.items()
    assert count == 1 and row[1] is NAN and math.isnan(row[1])
    # The restored row is equal to the engine's rows again: its retraction empties the key.
    arrangement.apply((NAN,), [((1, NAN), -1)])
    assert (NAN,) not in arrangement
    budget.close()


def test_releasing_deletes_what_was_spilled_and_closing_deletes_the_file() -> None:
    budget = StateBudget(ROW)
    kept, dropped = Arrangement(width=2), Arrangement(width=2)
    kept.attach(budget)
    dropped.attach(budget)
    for number in range(20):
        dropped.apply((number,), [((number, "x"), 1)])
    kept.apply(("k",), [((0, "y"), 1)])
    assert budget.bytes_on_disk > 0
    dropped.release()
    assert budget.held_bytes == kept.held_in_memory()
    assert budget.bytes_on_disk == sum(length for _, length in kept.spilled.values())
    path = budget.file.path
    assert os.path.exists(path)
    budget.close()
    assert not os.path.exists(path)


def test_compaction_keeps_every_spilled_key_readable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "COMPACT_MIN_BYTES", 1)
    compactions = []
    compact = spill.SpillFile.compact

    def counted(self: spill.SpillFile, spilled: Any) -> None:
        compactions.append(self.end)
        compact(self, spilled)

    monkeypatch.setattr(spill.SpillFile, "compact", counted)
    budget = StateBudget(3 * ROW)
    first, second = Arrangement(width=2), Arrangement(width=2)
    first.attach(budget)
    second.attach(budget)
    model: dict[Any, dict[Any, int]] = {}
    for number in range(300):
        # Read back (making garbage) and spill again, over and over, on both arrangements.
        target = first if number % 2 else second
        key = (number % 37, target is first)
        changes = [((number, "v"), 1)]
        target.apply(key, changes)
        model_apply(model, key, changes)
    assert len(compactions) >= 2
    for arrangement, side in ((first, True), (second, False)):
        assert {k: v for k, v in model.items() if k[1] is side} == dict(arrangement.items())
    budget.close()


def test_state_past_the_disk_limit_is_refused_clearly() -> None:
    budget = StateBudget(ROW, disk_limit_bytes=2_000)
    arrangement = Arrangement(width=2)
    arrangement.attach(budget)
    with pytest.raises(ResourceExhausted, match=r"does not fit.*memory budget.*disk limit"):
        for number in range(1_000):
            arrangement.apply((number,), [((number, "x" * 20), 1)])
    budget.close()


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    scenario=random_plans.scenarios(),
    as_of=st.integers(0, 5),
    shards=st.sampled_from([1, 3]),
    budget_rows=st.integers(1, 8),
)
def test_random_plans_over_a_tiny_budget_equal_the_reference(
    scenario: random_plans.Scenario, as_of: int, shards: int, budget_rows: int
) -> None:
    budget = StateBudget(budget_rows * ROW)
    try:
        check_against_the_reference(scenario, as_of, shards, as_of, budget)
    finally:
        budget.close()
