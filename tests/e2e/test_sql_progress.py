"""Progress through the public API: ``tidemark sql`` running a long one-shot on Spark shows
a progress line with the parts and rows of the query's inputs while it runs, and the compute
process logs the query's progress meanwhile."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient

pytestmark = pytest.mark.spark

ROWS = 100_000
# 10^10 pairs: minutes of work for two cores, so only the statement timeout ends it.
RUNAWAY = "SELECT count(*) FROM a, b WHERE a.x + b.y = -1"
REPO_ROOT = Path(__file__).resolve().parents[2]
PROGRESS_LINE = re.compile(
    r"^… (?P<done>\d+)/(?P<total>\d+) parts, [\d.]+[kM]?/(?P<rows>[\d.]+[kM]?) rows \(\d+ s\)$"
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    flags = {"default": ("--spark-one-shot-rows", "0", "--progress-log-interval", "1")}
    with sql_stack(tmp_path_factory.mktemp("progress"), adapters=1, compute_extra=flags) as running:
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
        # The first Spark job of a session pays for starting its Python workers.
        warmed = await client.execute("SELECT count(*) FROM a")
        assert warmed.error is None and warmed.results[-1].rows == [(ROWS,)]


def test_a_long_statement_shows_a_progress_line(stack: SqlStack) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    # The line shows from the first poll on, not after 2 s: the test need not wait for it.
    env["TIDEMARK_PROGRESS_AFTER"] = "0"
    finished = subprocess.run(
        [
            *(sys.executable, "-m", "tidemark.cli", "sql", "--address", stack.adapter(0)),
            *("-c", "SET statement_timeout = 6000"),
            *("-c", RUNAWAY),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert finished.returncode == 1, finished
    assert "canceling statement due to statement timeout" in finished.stderr, finished.stderr
    lines = finished.stderr.splitlines()
    shown = [match for line in lines if (match := PROGRESS_LINE.match(line))]
    assert shown, f"no progress line in:\n{finished.stderr}"
    # The inputs: both tables' parts, and their 200,000 rows.
    assert {match["rows"] for match in shown} == {"200k"}
    totals = {int(match["total"]) for match in shown}
    assert len(totals) == 1 and totals.pop() >= 2
    done = [int(match["done"]) for match in shown]
    # The cross join never gets through its input: never all parts done.
    assert done == sorted(done) and done[-1] < int(shown[-1]["total"]), finished.stderr
    # The compute process logged the query's progress as it ran.
    record = stack.compute.compute().wait_for_record(
        lambda r: r.get("event") == "peek_progress" and r.get("rows_total") == 2 * ROWS, 30
    )
    assert record["state"] == "running" and record["spark_job_group"].startswith("one-shot-")
    assert record["query"].startswith("stmt-")
