"""Runaway queries against real processes: a statement_timeout or a cancelled call stops the
work in the compute process (its CPU goes back to idle), a query over its memory budget fails
with SQLSTATE 53200, and point queries of other sessions keep answering meanwhile."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient
from tidemark.clients.compute import ComputeClient

ROWS = 3000
WIDE_ROWS = 2000
RUNAWAY = "SELECT count(*) FROM a CROSS JOIN b"  # 9M pairs, far more than the budget allows
# Each pair has 16 columns: the budget (512 MiB, below) is reached after well under 1M pairs.
WIDE_RUNAWAY = "SELECT count(*) FROM w AS x CROSS JOIN w AS y"
BUDGET_MB = 512
DATAFLOW_BUDGET_MB = 64
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(
        tmp_path_factory.mktemp("runaway"),
        adapters=1,
        engine="local",
        compute_extra={
            "default": (
                *("--statement-memory-mb", str(BUDGET_MB)),
                *("--dataflow-memory-mb", str(DATAFLOW_BUDGET_MB)),
            )
        },
    ) as running:
        yield running


@pytest.fixture(scope="module")
def loaded(stack: SqlStack) -> SqlStack:
    async def load() -> None:
        async with AdapterClient(stack.adapter(0)) as client:
            numbers = ", ".join(f"({i})" for i in range(ROWS))
            wide = ", ".join(
                "(" + ", ".join(f"'{c}{i}'" for c in "abcdefgh") + ")" for i in range(WIDE_ROWS)
            )
            columns = ", ".join(f"{c} text" for c in "abcdefgh")
            kv = ", ".join(f"({i}, 'v{i}')" for i in range(100))
            result = await client.execute(
                f"CREATE TABLE a (x bigint); CREATE TABLE b (y bigint);"
                f"INSERT INTO a VALUES {numbers}; INSERT INTO b VALUES {numbers};"
                f"CREATE TABLE w ({columns}); INSERT INTO w VALUES {wide};"
                f"CREATE TABLE kv (k bigint, v text); INSERT INTO kv VALUES {kv};"
                f"CREATE INDEX kv_k ON kv (k); SELECT v FROM kv WHERE k = 7"
            )
            assert result.error is None, result.error
            assert result.results[-1].rows == [("v7",)]

    asyncio.run(load())
    return stack


@pytest.fixture
async def client(loaded: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(loaded.adapter(0), timeout=120.0) as session:
        yield session


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def wait_until_idle(pid: int, within: float = 5.0, window: float = 0.5) -> float:
    """Waits until the process used under 20% of a core over ``window`` seconds; returns how
    long that took (fails after ``within`` seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        before = cpu_seconds(pid)
        await asyncio.sleep(window)
        if cpu_seconds(pid) - before < 0.2 * window:
            return time.monotonic() - started
    raise AssertionError(f"compute process {pid} still busy {within} s after the cancel")


async def wait_until_busy(pid: int, within: float = 30.0) -> None:
    """Waits until the process uses most of a core (it works on the runaway query)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        before = cpu_seconds(pid)
        await asyncio.sleep(0.3)
        if cpu_seconds(pid) - before > 0.2:
            return
    raise AssertionError("the compute process never got busy with the query")


def stopped_after_cancel(stack: SqlStack, seen: int) -> dict[str, object]:
    """The log record of the evaluation thread ending after a cancel (the ``seen``-th or
    later); it must have stopped at a check (Cancelled) within a second of the cancel."""
    compute = stack.compute.compute()
    compute.wait_for_record(lambda r: stopped_count(stack) > seen)
    record = [r for r in compute.records() if r.get("event") == "one_shot_stopped"][seen]
    assert record["outcome"] == "Cancelled", record
    assert isinstance(record["seconds_after_cancel"], float)
    assert record["seconds_after_cancel"] < 1.0, record
    return record


def stopped_count(stack: SqlStack) -> int:
    return len(
        [r for r in stack.compute.compute().records() if r.get("event") == "one_shot_stopped"]
    )


async def test_statement_timeout_stops_a_runaway_cross_join(
    loaded: SqlStack, client: AdapterClient
) -> None:
    pid = loaded.compute.compute().process.pid
    seen = stopped_count(loaded)
    cpu_before = cpu_seconds(pid)
    # Well before the join reaches its memory budget (about a second in, on a quiet machine).
    result = await client.execute(f"SET statement_timeout = 400; {RUNAWAY}")
    assert result.error is not None
    assert result.error.code == "57014", result.error
    assert "statement timeout" in result.error.message
    # The compute process worked on it (the join was running), and stopped.
    assert cpu_seconds(pid) - cpu_before > 0.1
    await wait_until_idle(pid)
    record = stopped_after_cancel(loaded, seen)
    # It was well into the join when it stopped.
    assert isinstance(record["peak_bytes"], int) and record["peak_bytes"] > 1 << 20
    await client.execute("SET statement_timeout = 0")


async def test_a_cancelled_execute_stops_the_work(loaded: SqlStack, client: AdapterClient) -> None:
    pid = loaded.compute.compute().process.pid
    seen = stopped_count(loaded)
    running = asyncio.create_task(client.execute(RUNAWAY))
    # Wait until compute is busy with it, then cancel the gRPC call.
    await wait_until_busy(pid)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await wait_until_idle(pid)
    stopped_after_cancel(loaded, seen)


async def test_a_dropped_connection_stops_the_work(loaded: SqlStack) -> None:
    """The client process dies mid-query (kill -9): its connection drops, and the adapter's
    call and compute's evaluation end with it."""
    pid = loaded.compute.compute().process.pid
    seen = stopped_count(loaded)
    client = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tidemark.cli", "sql", "--address", loaded.adapter(0)),
        *("-c", f"{RUNAWAY};"),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until_busy(pid)
    finally:
        client.kill()
        await client.wait()
    await wait_until_idle(pid)
    stopped_after_cancel(loaded, seen)


async def test_a_query_over_its_memory_budget_fails_with_53200(client: AdapterClient) -> None:
    result = await client.execute(WIDE_RUNAWAY)
    assert result.error is not None
    assert result.error.code == "53200", result.error
    assert f"memory budget of {BUDGET_MB} MiB" in result.error.message
    # The session and the cluster go on.
    answer = await client.execute("SELECT count(*) FROM a")
    assert answer.error is None and answer.results[-1].rows == [(ROWS,)]


async def test_a_session_can_lower_its_memory_budget_but_not_raise_it(
    loaded: SqlStack,
) -> None:
    async with AdapterClient(loaded.adapter(0), timeout=120.0) as session:
        lowered = await session.execute(f"SET statement_memory_limit = 16; {RUNAWAY}")
        assert lowered.error is not None and lowered.error.code == "53200", lowered.error
        assert "memory budget of 16 MiB" in lowered.error.message
        raised = await session.execute(f"SET statement_memory_limit = 100000; {WIDE_RUNAWAY}")
        assert raised.error is not None and raised.error.code == "53200", raised.error
        assert f"memory budget of {BUDGET_MB} MiB" in raised.error.message
        # Small queries are not affected.
        small = await session.execute("SET statement_memory_limit = 16; SELECT count(*) FROM b")
        assert small.error is None and small.results[-1].rows == [(ROWS,)]


async def test_point_queries_answer_while_a_runaway_query_runs(
    loaded: SqlStack, client: AdapterClient
) -> None:
    pid = loaded.compute.compute().process.pid

    async def runaway() -> None:
        async with AdapterClient(loaded.adapter(0), timeout=120.0) as other:
            while True:  # each one runs until its timeout, then the next starts
                await other.execute(f"SET statement_timeout = 3000; {RUNAWAY}")

    background = asyncio.create_task(runaway())
    try:
        busy_since = time.monotonic()
        await asyncio.sleep(1.0)
        probes = []
        for _ in range(5):
            cpu_before = cpu_seconds(pid)
            started = time.monotonic()
            result = await client.execute("SELECT v FROM kv WHERE k = 42")
            probes.append(time.monotonic() - started)
            assert result.error is None and result.results[-1].rows == [("v42",)]
            await asyncio.sleep(0.2)
            # The runaway query kept compute busy around the probe.
            assert cpu_seconds(pid) - cpu_before > 0.05
        assert time.monotonic() - busy_since > 1.0
        median = statistics.median(probes)
        print(f"point query under a runaway query: median {median * 1000:.0f} ms, {probes}")
        assert median < 1.0, probes
    finally:
        background.cancel()
        with pytest.raises(asyncio.CancelledError):
            await background
    await wait_until_idle(pid)


async def test_a_dataflow_over_its_budget_fails_alone(
    loaded: SqlStack, client: AdapterClient
) -> None:
    """A materialized view whose hydration needs more than the dataflow budget reports failed
    (Status, log), while the other dataflows (the index kv_k) go on answering."""
    created = await client.execute(
        "CREATE MATERIALIZED VIEW pairs AS SELECT count(*) AS n FROM a CROSS JOIN b"
    )
    assert created.error is None, created.error
    budget = f"memory budget of {DATAFLOW_BUDGET_MB} MiB"
    try:
        async with ComputeClient(loaded.compute.compute().address) as compute:
            deadline = time.monotonic() + 60
            while True:
                status = await compute.status()
                reported = [
                    d for d in status.dataflows if budget in d.error or budget in d.last_failure
                ]
                if reported:
                    break
                assert time.monotonic() < deadline, status.dataflows
                await asyncio.sleep(0.5)
            (pairs,) = reported
            assert pairs.output_collection_ids and not pairs.has_index
            others = [d for d in status.dataflows if d.dataflow_id != pairs.dataflow_id]
            assert others and all(d.state == "running" for d in others), others
        record = loaded.compute.compute().wait_for_record(
            lambda r: r.get("event") == "dataflow_failed" and budget in str(r.get("error"))
        )
        assert record["dataflow"] == pairs.dataflow_id
        point = await client.execute("SELECT v FROM kv WHERE k = 3")
        assert point.error is None and point.results[-1].rows == [("v3",)]
    finally:
        dropped = await client.execute("DROP MATERIALIZED VIEW pairs")
        assert dropped.error is None, dropped.error
