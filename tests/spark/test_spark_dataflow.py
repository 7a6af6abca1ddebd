"""Dataflows maintained on resident Spark tasks (P = 2) give exactly the in-process engine's
output, step by step."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.compute.dataflow import Dataflow, Update
from services.compute.spark import ResidentCluster, SparkDataflow
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import FailedPrecondition, NotFound
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
ORDERS = RelationSchema.of(("o", T.INT64), ("cust", T.INT64), ("amount", T.FLOAT64))
CUSTOMERS = RelationSchema.of(("cust", T.INT64), ("region", T.TEXT))


def orders_by_region() -> plan_pb2.Relation:
    """Join then aggregate, plus a top-k and a distinct over the join: every stateful
    operator kind, some fed by another."""
    joined = pb.join(pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0])
    per_region = pb.reduce(
        joined,
        [4],
        [pb.aggregate("count"), pb.aggregate("sum", 2), pb.aggregate("max", 2)],
    )
    best = pb.top_k(joined, [4], [pb.sort_key(2, descending=True)], limit=2)
    return pb.union(
        pb.project(per_region, 0, 1),
        pb.project(pb.map(best, pb.cast(0, T.INT64)), 4, 5),
        pb.project(pb.map(pb.distinct(pb.project(joined, 4)), pb.literal(-1, T.INT64)), 0, 1),
    )


def history(seed: int, times: int) -> dict[str, list[Update]]:
    rng = random.Random(seed)
    orders: dict[int, Row] = {}
    customers: dict[int, Row] = {}
    updates: dict[str, list[Update]] = {"orders": [], "customers": []}
    amounts = [0.5, 1.0, 2.25, float("nan"), -0.0, 7.0, 1e300]
    for time in range(times):
        for _ in range(rng.randint(0, 15)):
            if rng.random() < 0.25:
                cust = rng.randrange(12)
                old = customers.pop(cust, None)
                if old is not None:
                    updates["customers"].append((old, time, -1))
                if rng.random() < 0.8:
                    customers[cust] = (cust, rng.choice(["n", "s", "e", "w", None]))
                    updates["customers"].append((customers[cust], time, 1))
            else:
                o = rng.randrange(60)
                old = orders.pop(o, None)
                if old is not None:
                    updates["orders"].append((old, time, -1))
                if rng.random() < 0.85:
                    orders[o] = (o, rng.choice([*range(14), None]), rng.choice(amounts))
                    updates["orders"].append((orders[o], time, 1))
    return updates


def drive(
    dataflow: Dataflow, updates: dict[str, list[Update]], as_of: int, uppers: list[int]
) -> list[list[Update]]:
    snapshot = {name: [u for u in batch if u[1] <= as_of] for name, batch in updates.items()}
    outputs = [dataflow.hydrate(snapshot)[0]]
    for upper in uppers:
        lower = dataflow.upper
        assert lower is not None
        step = {
            name: [u for u in batch if lower <= u[1] < upper] for name, batch in updates.items()
        }
        out, new_upper = dataflow.step(step, upper)
        assert new_upper == upper
        outputs.append(out)
    return outputs


def test_join_and_aggregate_match_the_in_process_dataflow_at_every_step(
    cluster: ResidentCluster,
) -> None:
    updates = history(seed=7, times=30)
    uppers = [5, 6, 9, 10, 18, 19, 25, 30]
    expected = drive(Dataflow(orders_by_region(), as_of=4), updates, 4, uppers)
    on_spark = SparkDataflow(orders_by_region(), as_of=4, cluster=cluster)
    try:
        got = drive(on_spark, updates, 4, uppers)
        assert got == expected  # step by step, row by row (NaN included, via repr below)
        assert repr(got) == repr(expected)
        assert sum(len(step) for step in expected) > 40
        # The state is split between the two tasks and is the whole state of one shard.
        single = Dataflow(orders_by_region(), as_of=4)
        drive(single, updates, 4, uppers)
        assert on_spark.key_count() == single.key_count()
        assert on_spark.work().key_lookups == single.work().key_lookups
        # The size Status reports is the tasks' shares summed: that of the one shard.
        size = on_spark.state_size()
        assert size == single.state_size() and size.rows >= size.keys > 0
        assert size.bytes == single.held_bytes() > 0
    finally:
        on_spark.drop()


def ranked_orders() -> plan_pb2.Relation:
    """Window functions per region over the join, partitions sharded across the tasks."""
    joined = pb.join(pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0])
    return pb.window(
        joined,
        [4],
        [pb.sort_key(2, descending=True)],
        [
            pb.window_function("row_number"),
            pb.window_function("rank"),
            pb.window_function("lag", 2),
            pb.window_function("sum", 2, frame=pb.frame("rows", ("preceding", 1), "current_row")),
            pb.window_function("count"),
        ],
    )


def test_window_matches_the_in_process_dataflow_at_every_step(cluster: ResidentCluster) -> None:
    updates = history(seed=11, times=20)
    uppers = [4, 7, 8, 13, 20]
    expected = drive(Dataflow(ranked_orders(), as_of=3), updates, 3, uppers)
    on_spark = SparkDataflow(ranked_orders(), as_of=3, cluster=cluster)
    try:
        got = drive(on_spark, updates, 3, uppers)
        assert repr(got) == repr(expected)
        assert sum(len(step) for step in expected) > 40
    finally:
        on_spark.drop()


def test_index_on_the_tasks_answers_peeks_at_past_times(cluster: ResidentCluster) -> None:
    updates = history(seed=3, times=12)
    reference = Dataflow(orders_by_region(), as_of=2)
    expected = drive(reference, updates, 2, [6, 12])
    on_spark = SparkDataflow(orders_by_region(), as_of=2, cluster=cluster, index_key_columns=[0])
    try:
        drive(on_spark, updates, 2, [6, 12])
        contents = {}
        for time in range(2, 12):
            want: dict[Row, int] = {}
            for step in expected:
                for row, at, diff in step:
                    if at <= time:
                        want[row] = want.get(row, 0) + diff
            contents[time] = {row: n for row, n in want.items() if n}
            assert on_spark.peek(time) == contents[time]
        # Compacting every shard's index: later times read the same, earlier ones are gone.
        on_spark.compact_index(8)
        for time in range(8, 12):
            assert on_spark.peek(time) == contents[time]
        with pytest.raises(FailedPrecondition, match="since 8"):
            on_spark.peek(7)
    finally:
        on_spark.drop()


def test_requests_for_a_dropped_dataflow_fail_clearly(cluster: ResidentCluster) -> None:
    on_spark = SparkDataflow(orders_by_region(), as_of=0, cluster=cluster, dataflow_id="gone")
    on_spark.drop()
    with pytest.raises(NotFound, match="'gone' is not installed"):
        cluster.stats("gone")
    with pytest.raises(FailedPrecondition, match="dropped"):
        on_spark.hydrate({})


async def test_asyncio_callers_drive_it_without_blocking_the_loop(
    cluster: ResidentCluster,
) -> None:
    updates = history(seed=11, times=8)
    reference = Dataflow(orders_by_region(), as_of=1)
    expected = drive(reference, updates, 1, [8])
    on_spark = SparkDataflow(orders_by_region(), as_of=1, cluster=cluster, index_key_columns=[0])
    try:
        snapshot = {name: [u for u in batch if u[1] <= 1] for name, batch in updates.items()}
        hydrated, upper = await on_spark.ahydrate(snapshot)
        step = {name: [u for u in batch if u[1] > 1] for name, batch in updates.items()}
        stepped, upper = await on_spark.astep(step, 8)
        assert [hydrated, stepped] == expected and upper == 8
        final: dict[Row, int] = {}
        for row, _, diff in hydrated + stepped:
            final[row] = final.get(row, 0) + diff
        assert await cluster.apeek(on_spark.dataflow_id, 7) == {r: n for r, n in final.items() if n}
    finally:
        await cluster.adrop(on_spark.dataflow_id)
