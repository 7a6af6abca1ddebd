"""The oracle as real processes on real etcd (and SQLite), driven over gRPC."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.etcd import EtcdServer
from tests.support.oracle_history import check_history
from tests.support.oracle_load import random_calls
from tests.support.ports import free_port
from tests.support.service_process import REPO_ROOT, ServiceProcess
from tidemark.clients.oracle import OracleClient
from tidemark.errors import InvalidArgument, Unavailable
from tidemark.retry import RetryPolicy
from tidemark.rpc import NO_RETRY

QUICK_RETRY = RetryPolicy(total_seconds=2.0, initial_backoff=0.05, max_backoff=0.3)


def start_oracle(consensus_url: str, port: int = 0) -> ServiceProcess:
    return ServiceProcess(
        "services.oracle",
        [
            "--listen",
            f"127.0.0.1:{port}",
            "--consensus-url",
            consensus_url,
            "--backend-retry-seconds",
            "1",
        ],
    )


@pytest.fixture
def timeline() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def two_oracles(etcd_server: EtcdServer) -> Iterator[list[ServiceProcess]]:
    oracles = [start_oracle(etcd_server.url), start_oracle(etcd_server.url)]
    yield oracles
    for process in oracles:
        process.kill()


@pytest.fixture
async def clients(two_oracles: list[ServiceProcess]) -> AsyncIterator[list[OracleClient]]:
    made = [OracleClient(p.address, timeout=5.0, retry=QUICK_RETRY) for p in two_oracles]
    yield made
    for client in made:
        await client.close()


async def test_laws_on_single_calls_across_two_oracles(
    clients: list[OracleClient], timeline: str
) -> None:
    a, b = clients
    assert await a.read_ts(timeline) == 0
    w1 = await a.write_ts(timeline)
    # A write taken on one oracle is seen by the other: its next write is higher.
    w2 = await b.write_ts(timeline)
    assert w2 > w1
    assert await b.peek_write_ts(timeline) == w2
    assert await a.read_ts(timeline) < w1
    await b.apply_write(timeline, w1)
    assert await a.read_ts(timeline) == w1
    await a.apply_write(timeline, w2)
    assert await b.read_ts(timeline) == w2
    assert await a.write_ts(timeline) > w2


@pytest.mark.parametrize("name", ["", "x" * 500])
async def test_bad_timeline_is_invalid_argument_over_grpc(
    clients: list[OracleClient], name: str
) -> None:
    with pytest.raises(InvalidArgument, match="timeline"):
        await clients[0].write_ts(name)


async def test_linearizable_under_concurrency_on_etcd(
    clients: list[OracleClient], timeline: str
) -> None:
    stop = asyncio.Event()
    result = await random_calls(clients, timeline, concurrency=40, stop=stop, max_calls_each=40)
    assert result.failures == 0
    assert len(result.history) == 40 * 40
    assert check_history(result.history) == []
    assert {c.kind for c in result.history} == {"read", "write", "apply"}


async def test_linearizable_on_sqlite(tmp_path: Path, timeline: str) -> None:
    url = f"sqlite://{tmp_path / 'consensus.db'}"
    oracles = [start_oracle(url), start_oracle(url)]
    made = [OracleClient(p.address, timeout=5.0, retry=QUICK_RETRY) for p in oracles]
    try:
        stop = asyncio.Event()
        result = await random_calls(made, timeline, concurrency=32, stop=stop, max_calls_each=20)
        assert result.failures == 0
        assert check_history(result.history) == []
    finally:
        for client in made:
            await client.close()
        for process in oracles:
            process.kill()


@pytest.mark.slow
async def test_kill_oracle_and_restart_etcd_under_load(
    fresh_etcd_server: EtcdServer, timeline: str
) -> None:
    ports = [free_port(), free_port()]
    oracles = [start_oracle(fresh_etcd_server.url, port) for port in ports]
    made = [OracleClient(p.address, timeout=3.0, retry=QUICK_RETRY) for p in oracles]
    stop = asyncio.Event()
    load = asyncio.create_task(random_calls(made, timeline, concurrency=32, stop=stop))
    try:
        await asyncio.sleep(1.0)
        before_kill = await made[1].peek_write_ts(timeline)
        oracles[0].kill()  # SIGKILL, mid-load
        await asyncio.sleep(0.5)
        oracles[0] = start_oracle(fresh_etcd_server.url, ports[0])
        await asyncio.sleep(1.0)
        await asyncio.to_thread(fresh_etcd_server.stop)
        # While etcd is down, a call that is not retried by the client fails UNAVAILABLE
        # once the oracle's own bounded retries are spent, rather than hanging.
        probe = OracleClient(oracles[1].address, timeout=10.0, retry=NO_RETRY)
        began = time.monotonic()
        with pytest.raises(Unavailable, match="consensus"):
            await probe.write_ts(timeline)
        assert time.monotonic() - began < 8
        await probe.close()
        await asyncio.to_thread(fresh_etcd_server.start)
        restarted_at = time.monotonic()
        await asyncio.sleep(2.0)
        stop.set()
        result = await asyncio.wait_for(load, timeout=30)
        history = result.history
        assert check_history(history) == []
        # Calls succeeded again after etcd came back.
        recovered = [c for c in history if c.invoked > restarted_at]
        assert recovered, "no call succeeded after etcd came back"
        # Timestamps never went backwards across the restarts.
        after = await made[0].write_ts(timeline)
        assert after > before_kill
        assert after > max(c.value for c in history)
    finally:
        stop.set()
        if not load.done():
            load.cancel()
        for client in made:
            await client.close()
        for process in oracles:
            process.kill()


def test_help_documents_flags_and_environment() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.oracle", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for text in ("--listen", "TIDEMARK_LISTEN", "--consensus-url", "TIDEMARK_CONSENSUS_URL"):
        assert text in out
