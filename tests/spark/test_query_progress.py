"""A running peek's Spark job, as compute's Status reports it: parts and rows done move while
the job's tasks finish, never back, and the peek leaves Status when it ends."""

from __future__ import annotations

import asyncio
import time

from pyspark.sql import SparkSession

from services.compute.engines import LocalEngine
from services.compute.host import DataflowManager, HostSettings
from services.compute.service import ComputeServicer
from services.compute.spark.jobs import SparkJobs
from tidemark.clients.storage import StorageClient
from tidemark.v1 import compute_pb2

TASKS = 40
ROWS = 4_000_000


def _slow_scan(spark: SparkSession) -> int:
    # One task per "part", each a fraction of a second of JVM time (no Python workers).
    frame = spark.range(0, TASKS, 1, TASKS).selectExpr(
        "reflect('java.lang.Thread', 'sleep', cast(150 as bigint)) AS slept"
    )
    return len(frame.collect())


async def test_a_running_spark_peek_moves_in_compute_status(spark: SparkSession) -> None:
    # Nothing here calls storage: the peek is tracked as the host tracks one on Spark.
    storage = StorageClient("127.0.0.1:1")
    host = DataflowManager(storage, LocalEngine(), HostSettings(cluster="progress"))
    servicer = ComputeServicer(host, LocalEngine(), "progress")
    jobs = SparkJobs(spark, prefix="test-progress")

    async def status(*query_ids: str) -> compute_pb2.StatusResponse:
        request = compute_pb2.StatusRequest(query_ids=query_ids)
        return await servicer.Status(request, None)  # type: ignore[arg-type]

    async def peek() -> int:
        with host.queries.track("stmt-1") as watch:
            watch.evaluating(parts_total=TASKS, rows_total=ROWS)
            return await jobs.run(lambda: _slow_scan(spark), "one-shot over 40 parts")

    running = asyncio.create_task(peek())
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 120
    while not running.done():
        assert time.monotonic() < deadline, "the job never finished"
        answer = await status("stmt-1")
        assert list(answer.dataflows) == []
        if answer.queries:
            (query,) = answer.queries
            assert query.query_id == "stmt-1" and query.state == "running"
            assert (query.parts_total, query.rows_total) == (TASKS, ROWS)
            if query.spark_job_group:
                assert query.spark_job_group.startswith("test-progress-")
                # Parts and rows move together: rows are the listed rows, scaled alike.
                assert abs(query.rows_done - ROWS * query.parts_done // TASKS) <= 1
                seen.append((query.parts_done, query.rows_done))
        await asyncio.sleep(0.05)
    assert await running == TASKS
    parts_seen = [parts for parts, _ in seen]
    assert parts_seen == sorted(parts_seen), "progress went back"
    assert len(set(parts_seen)) >= 2, f"progress never moved: {seen}"
    assert any(0 < parts < TASKS for parts in parts_seen), seen
    # Over: the peek is gone from Status, asked for by name or not.
    assert list((await status("stmt-1")).queries) == []
    assert list((await status()).queries) == []
    await storage.close()
