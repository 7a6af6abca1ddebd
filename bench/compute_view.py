"""The compute benchmark's view and workload, and its parts (a), (b) and (d), which run in one
process against one Spark session (``bench/compute.py`` drives them; the smoke test in
``tests/spark/test_bench_compute_smoke.py`` runs (a) and (b) at a tiny size).

The view: ``orders(o_id, cust, amount) ⋈ customers(cust, region)`` grouped by region, with
count and sum. 1,000 customers in 10 regions; orders get a random customer and an integer
amount, so the sum is exact on both sides (Spark's sum of a bigint and the engine's decimal
sum) and the maintained output can be compared with a recompute row for row. A delta is 1,000
changed rows: 500 orders updated (a retraction and an insertion each: a new customer and
amount), spread over 10 consecutive timestamps.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Latency, cpu_seconds, percentile
from services.compute.dataflow import Dataflow, Update
from services.compute.spark import ResidentCluster, SparkDataflow
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

ORDERS = RelationSchema.of(
    ("o_id", ColumnType.INT64), ("cust", ColumnType.INT64), ("amount", ColumnType.INT64)
)
CUSTOMERS = RelationSchema.of(("cust", ColumnType.INT64), ("region", ColumnType.TEXT))
CUSTOMER_COUNT = 1_000
REGION_COUNT = 10
MAX_AMOUNT = 10_000
DELTA_UPDATES = 500  # a retraction and an insertion each: 1,000 changed rows
DELTA_TIMES = 10
AS_OF = 0  # the snapshot's time; steps start at AS_OF + 1

ViewRow = tuple[str, int, int]
"""(region, count, sum): one output row of the view, in plain Python types."""


def view_plan(orders_id: str = "orders", customers_id: str = "customers") -> plan_pb2.Plan:
    joined = pb.join(pb.get(orders_id, ORDERS), pb.get(customers_id, CUSTOMERS), [1], [0])
    # joined: o_id, cust, amount, cust, region
    root = pb.reduce(joined, [4], [pb.aggregate("count"), pb.aggregate("sum", 2)])
    return pb.plan(root, derive_schema(root))


def region_of(cust: int) -> str:
    return f"region-{cust % REGION_COUNT}"


class Workload:
    """The inputs' current contents, and deltas that change them.

    Orders are kept as two machine-integer arrays (customer and amount by ``o_id``), not as
    Python tuples: the garbage collector of the process measuring a step would otherwise
    traverse this benchmark's own copy of the inputs (10^6 tuples in one list), a cost that
    grows with the input and that the compute service's driver, which keeps no such copy,
    never pays."""

    def __init__(self, orders: int, *, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        self.customers = [(cust, region_of(cust)) for cust in range(CUSTOMER_COUNT)]
        self.custs = array("q", (rng.randrange(CUSTOMER_COUNT) for _ in range(orders)))
        self.amounts = array("q", (rng.randint(1, MAX_AMOUNT) for _ in range(orders)))
        self.next_time = AS_OF + 1

    @property
    def order_count(self) -> int:
        return len(self.custs)

    def order(self, o_id: int) -> tuple[int, int, int]:
        return (o_id, self.custs[o_id], self.amounts[o_id])

    def orders(self) -> Iterator[tuple[int, int, int]]:
        """Every order row, by ``o_id``."""
        return zip(range(len(self.custs)), self.custs, self.amounts, strict=True)

    def snapshot(self) -> dict[str, list[Update]]:
        return {
            "orders": [(row, AS_OF, 1) for row in self.orders()],
            "customers": [(row, AS_OF, 1) for row in self.customers],
        }

    def snapshot_tables(self) -> dict[str, pa.Table]:
        """``snapshot`` as update batches of each input's schema, built from the arrays."""
        count = self.order_count
        orders = pa.table(
            [
                pa.array(range(count), pa.int64()),
                pa.array(self.custs, pa.int64()),
                pa.array(self.amounts, pa.int64()),
                pa.array(np.full(count, AS_OF, dtype=np.uint64)),
                pa.array(np.ones(count, dtype=np.int64)),
            ],
            schema=ORDERS.update_schema(),
        )
        customers = pa.table(
            [
                pa.array([cust for cust, _ in self.customers], pa.int64()),
                pa.array([region for _, region in self.customers], pa.string()),
                pa.array(np.full(CUSTOMER_COUNT, AS_OF, dtype=np.uint64)),
                pa.array(np.ones(CUSTOMER_COUNT, dtype=np.int64)),
            ],
            schema=CUSTOMERS.update_schema(),
        )
        return {"orders": orders, "customers": customers}

    def delta(
        self, updates: int = DELTA_UPDATES, times: int = DELTA_TIMES
    ) -> tuple[list[Update], int]:
        """``updates`` orders changed, over ``times`` timestamps from the last delta's end;
        returns the order updates and the upper after them."""
        rng = self.rng
        first = self.next_time
        changed: list[Update] = []
        for number, o_id in enumerate(rng.sample(range(self.order_count), updates)):
            at = first + number * times // updates
            old = self.order(o_id)
            self.custs[o_id] = rng.randrange(CUSTOMER_COUNT)
            self.amounts[o_id] = rng.randint(1, MAX_AMOUNT)
            changed.append((old, at, -1))
            changed.append((self.order(o_id), at, 1))
        self.next_time = first + times
        return changed, self.next_time

    def write_parquet(self, directory: Path) -> tuple[Path, Path]:
        """The current contents of both inputs as Parquet files (one each)."""
        directory.mkdir(parents=True, exist_ok=True)
        orders_path, customers_path = directory / "orders.parquet", directory / "customers.parquet"
        pq.write_table(
            pa.table(
                {
                    "o_id": pa.array(range(self.order_count), pa.int64()),
                    "cust": pa.array(self.custs, pa.int64()),
                    "amount": pa.array(self.amounts, pa.int64()),
                }
            ),
            orders_path,
        )
        pq.write_table(
            pa.table(
                {
                    "cust": pa.array([c for c, _ in self.customers], pa.int64()),
                    "region": pa.array([r for _, r in self.customers], pa.string()),
                }
            ),
            customers_path,
        )
        return orders_path, customers_path


class Contents:
    """A collection rebuilt from its updates: row -> multiplicity."""

    def __init__(self) -> None:
        self.rows: dict[ViewRow, int] = {}

    def apply(self, updates: list[Update]) -> None:
        for row, _, diff in updates:
            key = view_row(row)
            total = self.rows.get(key, 0) + diff
            if total:
                self.rows[key] = total
            else:
                del self.rows[key]


def view_row(row: tuple[Any, ...]) -> ViewRow:
    region, count, total = row
    assert isinstance(total, int | Decimal)
    return (str(region), int(count), int(total))


def rss_megabytes(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# --- (a) maintained on resident Spark tasks --------------------------------------------------


@dataclass
class Maintained:
    rows: int
    hydrate_s: float
    steps: Latency
    step_p90_ms: float
    one_update_steps: Latency
    key_lookups_per_step: float
    rows_visited_per_step: float
    arrangement_keys: int
    task_rss_mb: list[float]
    driver_cpu_ms_per_step: float
    """This process's CPU per timed step (it also makes the delta and applies the output)."""
    task_cpu_ms_per_step: list[float]
    contents: dict[ViewRow, int] = field(repr=False)


def maintain(
    dataflow: Dataflow,
    workload: Workload,
    *,
    steps: int,
    warmup_steps: int,
    one_update_steps: int = 0,
    task_pids: Sequence[int] = (),
) -> Maintained:
    """Hydrates the view (a fresh ``dataflow`` of ``view_plan()``) over the workload's inputs,
    then times ``steps`` 1,000-row deltas (after ``warmup_steps`` untimed ones) and
    ``one_update_steps`` deltas of a single updated order (the fixed cost of a step). Returns
    the figures and the view's maintained contents at the end. ``task_pids``: processes whose
    memory is reported after hydration (the resident tasks)."""
    contents = Contents()
    per_step = max(1, steps)
    snapshot = workload.snapshot()
    started = time.perf_counter()
    output, _ = dataflow.hydrate(snapshot)
    hydrate_s = time.perf_counter() - started
    del snapshot
    contents.apply(output)
    rss = [rss_megabytes(pid) for pid in task_pids]

    def run(count: int, updates: int, times: int) -> list[float]:
        seconds = []
        for _ in range(count):
            delta, upper = workload.delta(updates, times)
            started = time.perf_counter()
            output, _ = dataflow.step({"orders": delta}, upper)
            seconds.append(time.perf_counter() - started)
            contents.apply(output)
        return seconds

    run(warmup_steps, DELTA_UPDATES, DELTA_TIMES)
    work_before = dataflow.work()
    cpu_before = [cpu_seconds(pid) for pid in (os.getpid(), *task_pids)]
    timed = run(steps, DELTA_UPDATES, DELTA_TIMES)
    cpu_after = [cpu_seconds(pid) for pid in (os.getpid(), *task_pids)]
    work_after = dataflow.work()
    cpu_ms = [
        round((b - a) * 1000 / per_step, 2) for a, b in zip(cpu_before, cpu_after, strict=True)
    ]
    single = run(one_update_steps, 1, 1)
    return Maintained(
        rows=workload.order_count,
        hydrate_s=round(hydrate_s, 3),
        steps=Latency.of(timed),
        step_p90_ms=round(percentile(sorted(timed), 0.90) * 1000, 3),
        one_update_steps=Latency.of(single),
        key_lookups_per_step=round(
            (work_after.key_lookups - work_before.key_lookups) / per_step, 1
        ),
        rows_visited_per_step=round(
            (work_after.rows_visited - work_before.rows_visited) / per_step, 1
        ),
        arrangement_keys=dataflow.key_count(),
        task_rss_mb=rss,
        driver_cpu_ms_per_step=cpu_ms[0],
        task_cpu_ms_per_step=cpu_ms[1:],
        contents=contents.rows,
    )


def maintain_on_spark(
    cluster: ResidentCluster,
    workload: Workload,
    *,
    steps: int,
    warmup_steps: int,
    one_update_steps: int = 0,
) -> Maintained:
    """(a): ``maintain`` with the view's state in the cluster's resident tasks."""
    dataflow = SparkDataflow(view_plan(), as_of=AS_OF, cluster=cluster)
    try:
        return maintain(
            dataflow,
            workload,
            steps=steps,
            warmup_steps=warmup_steps,
            one_update_steps=one_update_steps,
            task_pids=cluster.task_pids,
        )
    finally:
        dataflow.drop()


def maintain_in_process(
    workload: Workload, *, steps: int, warmup_steps: int, one_update_steps: int = 0
) -> Maintained:
    """The same engine and deltas in this process, one shard, no Spark: the operators' own
    cost, without transport to the tasks (a diagnostic for what limits (a))."""
    dataflow = Dataflow(view_plan(), as_of=AS_OF)
    return maintain(
        dataflow,
        workload,
        steps=steps,
        warmup_steps=warmup_steps,
        one_update_steps=one_update_steps,
    )


# --- (b) recomputed from scratch in Spark ----------------------------------------------------


def recompute(spark: SparkSession, orders_path: Path, customers_path: Path) -> dict[ViewRow, int]:
    """The view from the Parquet files, by a Spark DataFrame job, as row -> multiplicity."""
    orders = spark.read.parquet(str(orders_path))
    customers = spark.read.parquet(str(customers_path))
    result = (
        orders.join(customers, "cust")
        .groupBy("region")
        .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum"))
        .collect()
    )
    rows: dict[ViewRow, int] = {}
    for row in result:
        key = (str(row["region"]), int(row["count"]), int(row["sum"]))
        rows[key] = rows.get(key, 0) + 1
    return rows


@dataclass
class Recomputed:
    runs: int
    p50_ms: float
    min_ms: float
    contents: dict[ViewRow, int] = field(repr=False)


def time_recompute(
    spark: SparkSession, orders_path: Path, customers_path: Path, *, runs: int, warmup: int = 1
) -> Recomputed:
    for _ in range(warmup):
        recompute(spark, orders_path, customers_path)
    seconds = []
    contents: dict[ViewRow, int] = {}
    for _ in range(runs):
        started = time.perf_counter()
        contents = recompute(spark, orders_path, customers_path)
        seconds.append(time.perf_counter() - started)
    return Recomputed(
        runs=runs,
        p50_ms=round(statistics.median(seconds) * 1000, 1),
        min_ms=round(min(seconds) * 1000, 1),
        contents=contents,
    )


def mismatch(maintained: Mapping[ViewRow, int], recomputed: Mapping[ViewRow, int]) -> str | None:
    """None when the two agree, else a short description of how they differ."""
    if dict(maintained) == dict(recomputed):
        return None
    only_maintained = sorted(set(maintained.items()) - set(recomputed.items()))
    only_recomputed = sorted(set(recomputed.items()) - set(maintained.items()))
    return f"maintained only: {only_maintained[:5]}; recomputed only: {only_recomputed[:5]}"


# --- (d) the floor of a Spark job -------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    what: str
    runs: int
    p50_ms: float
    min_ms: float


def spark_floor(spark: SparkSession, *, runs: int, warmup: int = 3) -> list[Floor]:
    """A trivial job, and a 10-row groupBy that shuffles: Spark's cost for any job at all."""
    rows = [(i % 3, i) for i in range(10)]

    def count_range() -> object:
        return spark.range(10).count()

    def group_by() -> object:
        return spark.createDataFrame(rows, "k long, v long").groupBy("k").count().collect()

    floors = []
    for what, job in (
        ("spark.range(10).count()", count_range),
        ("10 rows, groupBy(k).count().collect() (a shuffle)", group_by),
    ):
        for _ in range(warmup):
            job()
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            job()
            seconds.append(time.perf_counter() - started)
        floors.append(
            Floor(
                what,
                runs,
                round(statistics.median(seconds) * 1000, 1),
                round(min(seconds) * 1000, 1),
            )
        )
    return floors
