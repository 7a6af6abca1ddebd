"""One-shot queries as Spark jobs, through the public API: a runaway cross join under a
statement_timeout is cancelled in Spark (the compute process and its JVM go back to idle),
and the next query answers within seconds, correctly."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient

pytestmark = pytest.mark.spark

ROWS = 100_000
# 10^10 pairs: minutes of work for two cores, so only a cancel ends it in time.
RUNAWAY = "SELECT count(*) FROM a, b WHERE a.x + b.y = -1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    # Every one-shot runs on Spark, however small.
    spark_always = {"default": ("--spark-one-shot-rows", "0")}
    with sql_stack(
        tmp_path_factory.mktemp("spark-oneshots"), adapters=1, compute_extra=spark_always
    ) as running:
        asyncio.run(_load(running))
        yield running


async def _load(stack: SqlStack) -> None:
    async with AdapterClient(stack.adapter(0)) as client:
        created = await client.execute("CREATE TABLE a (x bigint); CREATE TABLE b (y bigint)")
        assert created.error is None, created.error
        data = "".join(f"{i}\n" for i in range(ROWS)).encode()
        for table in ("a", "b"):
            copied = await client.copy_in(f"COPY {table} FROM STDIN", [data])
            assert copied.error is None, copied.error


def _tree_cpu_seconds(pid: int) -> float:
    """CPU time of the process and every process below it (the Spark JVM, its workers)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or _descends_from(int(entry.name), pid):
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return total


def _descends_from(child: int, ancestor: int) -> bool:
    current = child
    for _ in range(16):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        current = int(fields[1])
        if current == ancestor:
            return True
        if current <= 1:
            return False
    return False


async def test_a_runaway_spark_query_is_cancelled_and_the_next_answers(stack: SqlStack) -> None:
    compute = stack.compute.compute()
    async with AdapterClient(stack.adapter(0), timeout=120) as client:
        # Warm: the first Spark job of a session pays for starting its Python workers.
        answered = await client.execute("SELECT count(*) FROM a")
        assert answered.error is None and answered.results[-1].rows == [(ROWS,)]
        started = time.monotonic()
        result = await client.execute(f"SET statement_timeout = 3000; {RUNAWAY}")
        assert result.error is not None and result.error.code == "57014", result.error
        assert time.monotonic() - started < 30
        compute.wait_for_record(lambda r: r.get("event") == "spark_job_group_cancelled", 30)
        # The work stops: the compute process and its Spark JVM go back to idle.
        deadline = time.monotonic() + 60
        while True:
            before = _tree_cpu_seconds(compute.process.pid)
            await asyncio.sleep(1.0)
            if _tree_cpu_seconds(compute.process.pid) - before < 0.5:
                break
            assert time.monotonic() < deadline, "Spark kept working on the cancelled query"
        await client.execute("SET statement_timeout = 0")
        started = time.monotonic()
        joined = await client.execute("SELECT count(*) FROM a, b WHERE a.x = b.y AND a.x < 10")
        assert joined.error is None and joined.results[-1].rows == [(10,)]
        assert time.monotonic() - started < 30
