"""A running peek's Spark job, as compute's Status reports it: the rows its scan has read and
the parts in proportion move while the job's tasks finish, never back, and the peek leaves
Status when it ends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from services.compute.engines import LocalEngine
from services.compute.host import DataflowManager, HostSettings
from services.compute.service import ComputeServicer
from services.compute.spark.jobs import SparkJobs
from tidemark.clients.storage import StorageClient
from tidemark.v1 import compute_pb2

PARTS = 40
ROWS_PER_PART = 100
ROWS = PARTS * ROWS_PER_PART


def _write_parts(directory: Path) -> None:
    for part in range(PARTS):
        first = part * ROWS_PER_PART
        rows = pa.table({"x": pa.array(range(first, first + ROWS_PER_PART), pa.int64())})
        pq.write_table(rows, directory / f"part-{part:02}.parquet")


OPEN_COST = "spark.sql.files.openCostInBytes"


def _slow_scan(spark: SparkSession, directory: Path) -> int:
    # Each file costs as much to open as a whole partition may hold: a task per file, so the
    # tasks finish one after the other. A millisecond of JVM time per row (no Python workers).
    before = spark.conf.get(OPEN_COST)
    spark.conf.set(OPEN_COST, spark.conf.get("spark.sql.files.maxPartitionBytes"))
    try:
        frame = spark.read.parquet(str(directory)).selectExpr(
            "x", "reflect('java.lang.Thread', 'sleep', cast(1 as bigint)) AS slept"
        )
        return len(frame.collect())
    finally:
        spark.conf.set(OPEN_COST, before)


async def test_a_running_spark_peek_moves_in_compute_status(
    spark: SparkSession, tmp_path: Path
) -> None:
    _write_parts(tmp_path)
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
            watch.evaluating(parts_total=PARTS, rows_total=ROWS)
            return await jobs.run(lambda: _slow_scan(spark, tmp_path), "one-shot over 40 parts")

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
            assert (query.parts_total, query.rows_total) == (PARTS, ROWS)
            if query.spark_job_group:
                assert query.spark_job_group.startswith("test-progress-")
                # The rows read, and the parts in proportion.
                assert query.parts_done == query.rows_done // ROWS_PER_PART
                seen.append((query.parts_done, query.rows_done))
        await asyncio.sleep(0.05)
    assert await running == ROWS
    rows_seen = [rows for _, rows in seen]
    assert rows_seen == sorted(rows_seen), "progress went back"
    assert len(set(rows_seen)) >= 2, f"progress never moved: {seen}"
    assert any(0 < rows < ROWS for rows in rows_seen), f"never part way: {seen}"
    # Over: the peek is gone from Status, asked for by name or not.
    assert list((await status("stmt-1")).queries) == []
    assert list((await status()).queries) == []
    await storage.close()
