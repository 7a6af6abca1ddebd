"""Resident tasks over a tiny state budget: the join's arrangements spill to the executors'
local disk, the view stays exact at every time, and state that cannot fit even on disk is
refused with a clear error while the tasks keep serving. Hydrated by Spark, the join's
columnar batches go to disk as Arrow files and the state stays exact. A GROUP BY's and a
top-k's groups, a DISTINCT's rows and a window's partitions spill too."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.compute.dataflow import Dataflow, Index, Update
from services.compute.dataflow.spill import TaskStateBudget
from services.compute.spark import ResidentCluster, SparkDataflow
from tests.spark.test_spark_hydration import CUSTOMERS as TOTALS_CUSTOMERS
from tests.spark.test_spark_hydration import ORDERS as TOTALS_ORDERS
from tests.spark.test_spark_hydration import (
    _customers,
    _hydrate,
    _orders,
    _store,
    _totals_plan,
)
from tests.support import grouped_views, reference_eval
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import ResourceExhausted
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

ORDERS = RelationSchema.of(
    ("o_id", ColumnType.INT64), ("cust", ColumnType.INT64), ("amount", ColumnType.INT64)
)
CUSTOMERS = RelationSchema.of(("cust", ColumnType.INT64), ("region", ColumnType.TEXT))


def view() -> plan_pb2.Plan:
    joined = pb.join(pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0])
    root = pb.reduce(joined, [4], [pb.aggregate("count"), pb.aggregate("sum", 2)])
    return pb.plan(root, derive_schema(root))


@pytest.fixture(scope="module")
def spill_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spill")


@pytest.fixture(scope="module")
def tight(spark: SparkSession, spill_directory: Path) -> Iterator[ResidentCluster]:
    budget = TaskStateBudget(memory_bytes=4_000, disk_bytes=100_000, directory=str(spill_directory))
    with ResidentCluster(spark, 2, state_budget=budget) as resident:
        yield resident
    # Each task deletes its spill file as it ends.
    assert list(spill_directory.iterdir()) == []


def test_a_view_over_the_budget_spills_and_stays_exact(
    tight: ResidentCluster, spill_directory: Path
) -> None:
    rng = random.Random(3)
    customers = {cust: f"r{cust % 4}" for cust in range(200)}
    orders = {o_id: (rng.randrange(200), rng.randint(1, 99)) for o_id in range(600)}
    history: dict[str, list[Update]] = {
        "customers": [((c, r), 0, 1) for c, r in customers.items()],
        "orders": [((o, c, a), 0, 1) for o, (c, a) in orders.items()],
    }
    dataflow = SparkDataflow(view(), as_of=0, cluster=tight)
    try:
        index = Index([0], since=0)
        out, upper = dataflow.hydrate(history)
        index.apply(out, upper)
        spilled = [path.stat().st_size for path in spill_directory.iterdir()]
        assert len(spilled) == 2 and min(spilled) > 0, "4,000 bytes cannot hold the state"
        size = dataflow.state_size()
        assert size.rows == 600 + 200 + 4  # both join inputs, and the four regions' groups
        assert 0 < size.spilled_bytes < size.bytes
        for step in range(1, 8):
            changes: list[Update] = []
            for o_id in rng.sample(sorted(orders), 40):
                cust, amount = orders[o_id]
                changes.append(((o_id, cust, amount), step, -1))
                orders[o_id] = (rng.randrange(200), rng.randint(1, 99))
                changes.append(((o_id, *orders[o_id]), step, 1))
            history["orders"].extend(changes)
            out, upper = dataflow.step({"orders": changes}, step + 1)
            index.apply(out, upper)
        for time in range(upper):
            inputs: dict[str, dict[Any, int]] = {}
            for name, updates in history.items():
                contents = inputs.setdefault(name, {})
                for row, at, diff in updates:
                    if at <= time:
                        contents[row] = contents.get(row, 0) + diff
            expected = reference_eval.evaluate(view(), inputs)
            assert reference_eval.canonical(index.contents_at(time)) == expected, time
    finally:
        dataflow.drop()


def test_state_that_cannot_fit_on_disk_is_refused_and_the_tasks_go_on(
    tight: ResidentCluster,
) -> None:
    wide = "x" * 200
    history: dict[str, list[Update]] = {
        "customers": [((c, wide), 0, 1) for c in range(2_000)],
        "orders": [((o, o % 2_000, 1), 0, 1) for o in range(4_000)],
    }
    doomed = SparkDataflow(view(), as_of=0, cluster=tight)
    try:
        with pytest.raises(ResourceExhausted, match="does not fit"):
            doomed.hydrate(history)
    finally:
        doomed.drop()
    assert tight.failure is None
    # The tasks still serve, and what the refused dataflow spilled was let go.
    small = SparkDataflow(view(), as_of=0, cluster=tight)
    try:
        out, _ = small.hydrate({"customers": [((1, "r"), 0, 1)], "orders": [((1, 1, 5), 0, 1)]})
        assert [(row, diff) for row, _, diff in out] == [(("r", 1, 5), 1)]
    finally:
        small.drop()


def test_a_join_hydrated_by_spark_moves_its_batches_to_disk_and_stays_exact(
    spark: SparkSession, tight: ResidentCluster, spill_directory: Path, tmp_path: Path
) -> None:
    storage = start_storage(embedded_backends(tmp_path / "storage"), extra=FAST_SETTINGS)
    rng = random.Random(5)
    base = secrets.randbelow(10**12) * 10
    orders, customers = f"u{base}", f"u{base + 1}"
    updates = {orders: _orders(rng, 400, 0), customers: _customers(0)}
    plan = _totals_plan(orders, customers)
    local = Dataflow(plan, as_of=0)
    local.hydrate(updates)
    dataflow = SparkDataflow(plan, as_of=0, cluster=tight)
    try:
        listings = asyncio.run(
            _store(
                storage.address, {orders: TOTALS_ORDERS, customers: TOTALS_CUSTOMERS}, updates, 0
            )
        )
        _hydrate(spark, dataflow, listings)
        assert [p for p in spill_directory.iterdir() if p.suffix == ".arrow"]
        size = dataflow.state_size()
        assert size.rows == local.state_size().rows
        assert 0 < size.spilled_bytes <= size.bytes
        # Retract and insert orders under hydrated keys: the batches on disk are read back.
        current = {row[0]: (row, diff) for row, _, diff in updates[orders]}
        for step in range(1, 4):
            changes: list[Update] = []
            for o_id in rng.sample(sorted(current), 30):
                row, diff = current[o_id]
                moved = (o_id, rng.randrange(40), row[2])
                changes += [(row, step, -diff), (moved, step, diff)]
                current[o_id] = (moved, diff)
            want, _ = local.step({orders: changes}, step + 1)
            got, _ = dataflow.step({orders: changes}, step + 1)
            assert sorted(got, key=repr) == sorted(want, key=repr), step
            assert dataflow.state_size().rows == local.state_size().rows
    finally:
        dataflow.drop()
        storage.kill()
    assert not [p for p in spill_directory.iterdir() if p.suffix == ".arrow"]


@pytest.mark.parametrize(
    ("plan", "rows", "groups"),
    [
        (grouped_views.group_view(), 60, 25),
        (grouped_views.distinct_view(), 130, 60),
        (grouped_views.top_view(), 90, 30),
        (grouped_views.window_view(), 40, 15),
    ],
)
def test_a_grouped_view_of_three_times_the_budget_spills_and_stays_exact(
    tight: ResidentCluster, spill_directory: Path, plan: plan_pb2.Plan, rows: int, groups: int
) -> None:
    """A GROUP BY (MIN/MAX, COUNT DISTINCT), a DISTINCT, a top-k and a window whose state is all
    Reduce, Distinct, TopK or Window state, about three times the two tasks' budgets: their
    groups, rows and partitions spill."""
    events = grouped_views.Events(rows, groups, seed=13)
    dataflow = SparkDataflow(plan, as_of=0, cluster=tight)
    try:
        index = Index([0], since=0)
        out, upper = dataflow.hydrate({"events": list(events.history)})
        index.apply(out, upper)
        budgets = 2 * 4_000
        for _ in range(6):
            changes = events.step(upper, 3, 30)
            out, upper = dataflow.step({"events": changes}, upper + 3)
            index.apply(out, upper)
            size = dataflow.state_size()
            assert 0 < size.spilled_bytes <= size.bytes
            assert 2 * budgets < size.bytes < 5 * budgets
        assert any(path.stat().st_size > 0 for path in spill_directory.iterdir())
        grouped_views.assert_exact_at_every_time(plan, events.history, index, upper)
    finally:
        dataflow.drop()


def test_grouped_state_that_cannot_fit_on_disk_is_refused(tight: ResidentCluster) -> None:
    events = grouped_views.Events(3_000, 2_500, seed=17)
    doomed = SparkDataflow(grouped_views.group_view(), as_of=0, cluster=tight)
    try:
        with pytest.raises(ResourceExhausted, match="does not fit"):
            doomed.hydrate({"events": list(events.history)})
    finally:
        doomed.drop()
    assert tight.failure is None


def test_an_index_on_the_tasks_spills_with_the_state_and_answers_peeks_exactly(
    tight: ResidentCluster,
) -> None:
    """A DISTINCT kept in an index on the tasks: the index's keys spill beside the operator
    state, count in the state's size, and peeks at every time read them back exactly."""
    plan = grouped_views.distinct_view()
    events = grouped_views.Events(130, 60, seed=19)
    local = Dataflow(plan, as_of=0)
    dataflow = SparkDataflow(plan, as_of=0, cluster=tight, index_key_columns=[0, 1])
    try:
        _, upper = dataflow.hydrate({"events": list(events.history)})
        local.hydrate({"events": list(events.history)})
        for _ in range(6):
            changes = events.step(upper, 3, 30)
            _, upper = dataflow.step({"events": changes}, upper + 3)
            local.step({"events": changes}, upper)
            size = dataflow.state_size()
            operators = local.state_size()
            # The index holds about as much as the Distinct does, and it is counted.
            assert size.rows == operators.rows
            assert size.bytes > 1.5 * operators.bytes
            assert size.spilled_bytes > operators.bytes
        for time in range(upper):
            contents: dict[Any, int] = {}
            for row, at, diff in events.history:
                if at <= time:
                    contents[row] = contents.get(row, 0) + diff
            expected = reference_eval.evaluate(plan, {"events": contents})
            assert reference_eval.canonical(dataflow.peek(time)) == expected, time
    finally:
        dataflow.drop()
