"""Bulk work in Spark job groups: a cancelled run cancels its Spark jobs (seen through Spark's
status tracker) and frees the slots for the next run; progress counts the tasks done."""

from __future__ import annotations

import asyncio
import time

import pytest
from pyspark.sql import SparkSession

from services.compute.spark.jobs import SparkJobs


def _runaway(spark: SparkSession) -> int:
    # A cross join of 10^12 pairs: minutes of work, whose tasks check for interruption.
    left = spark.range(1_000_000).toDF("a")
    right = spark.range(1_000_000).toDF("b")
    return int(left.crossJoin(right).where("a + b = -1").count())


async def test_cancelling_a_run_cancels_its_spark_jobs(spark: SparkSession) -> None:
    jobs = SparkJobs(spark, prefix="test-cancel")
    group = jobs.new_group()
    running = asyncio.create_task(jobs.run(lambda: _runaway(spark), "runaway", group=group))
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while not tracker.getJobIdsForGroup(group):
        assert time.monotonic() < deadline, "the job never started"
        await asyncio.sleep(0.05)
    progress = jobs.progress(group)
    assert progress is not None and progress.jobs >= 1 and progress.tasks_total >= 1
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    # Spark marks the group's jobs failed (cancelled) and runs none of them any longer.
    while any(
        (info := tracker.getJobInfo(job)) is not None and info.status == "RUNNING"
        for job in tracker.getJobIdsForGroup(group)
    ):
        assert time.monotonic() < deadline, "the cancelled job kept running"
        await asyncio.sleep(0.05)
    infos = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    statuses = {info.status for info in infos if info is not None}
    assert statuses == {"FAILED"}
    assert jobs.progress(group) is None
    # The slots are free again: the next run answers at once.
    started = time.monotonic()
    answer = await jobs.run(lambda: spark.range(10).count(), "small")
    assert answer == 10
    assert time.monotonic() - started < 30


async def test_a_finished_run_leaves_its_thread_out_of_the_group(spark: SparkSession) -> None:
    jobs = SparkJobs(spark, prefix="test-clear")
    group = jobs.new_group()
    assert await jobs.run(lambda: spark.range(5).count(), "first", group=group) == 5
    before = set(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    # Work later started on the same worker threads runs outside the finished group.
    await asyncio.gather(*(asyncio.to_thread(lambda: spark.range(3).count()) for _ in range(8)))
    after = set(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    assert before and after == before
