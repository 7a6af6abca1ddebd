"""The compute benchmark's (a) and (b) at a tiny size: the view maintained on resident Spark
tasks must equal the Spark recompute from Parquet, or its figures mean nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench.compute_view import (
    DELTA_UPDATES,
    REGION_COUNT,
    Workload,
    maintain_on_spark,
    mismatch,
    region_of,
    time_recompute,
)
from services.compute.spark import ResidentCluster

pytestmark = pytest.mark.spark

ROWS = 1_000


def test_maintained_view_equals_the_recompute_and_follows_the_deltas(
    spark: SparkSession, cluster: ResidentCluster, tmp_path: Path
) -> None:
    workload = Workload(ROWS, seed=5)
    before = time_recompute(spark, *workload.write_parquet(tmp_path / "before"), runs=1)

    maintained = maintain_on_spark(cluster, workload, steps=4, warmup_steps=1, one_update_steps=2)
    after = time_recompute(spark, *workload.write_parquet(tmp_path / "after"), runs=1)

    assert mismatch(maintained.contents, after.contents) is None
    assert maintained.contents == after.contents
    # Checked independently of Spark too: one row per region, the inputs' totals.
    expected: dict[str, tuple[int, int]] = {}
    for _, cust, amount in workload.orders():
        count, total = expected.get(region_of(cust), (0, 0))
        expected[region_of(cust)] = (count + 1, total + amount)
    assert maintained.contents == {(r, c, s): 1 for r, (c, s) in expected.items()}
    assert len(maintained.contents) == REGION_COUNT
    # The deltas changed the output, so the comparison above had something to catch.
    assert mismatch(maintained.contents, before.contents) is not None
    assert maintained.steps.count == 4 and maintained.one_update_steps.count == 2
    # Each delta's 500 updates looked up a handful of keys each, not the whole state.
    assert DELTA_UPDATES <= maintained.key_lookups_per_step <= 4 * DELTA_UPDATES


def test_a_delta_is_500_updates_over_10_times_from_the_last_upper() -> None:
    workload = Workload(ROWS, seed=2)
    first, upper = workload.delta()
    second, next_upper = workload.delta()
    assert (upper, next_upper) == (11, 21)
    assert len(first) == 2 * DELTA_UPDATES
    assert sorted({time for _, time, _ in first}) == list(range(1, 11))
    assert {time for _, time, _ in second} == set(range(11, 21))
    retracted = {row for row, _, diff in first if diff == -1}
    inserted = {row for row, _, diff in first if diff == 1}
    assert len(retracted) == len(inserted) == DELTA_UPDATES
    assert {row[0] for row in retracted} == {row[0] for row in inserted}
    # The workload's contents follow its deltas.
    assert all(workload.order(row[0]) == row for row, _, diff in second if diff == 1)
