"""The oracle client shares calls among its concurrent callers, over a real socket."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from services.oracle.oracle import MAX_WRITE_RUN, TimestampOracle
from services.oracle.service import oracle_service
from tests.support.oracle_history import Call, check_history
from tidemark.clients.oracle import OracleClient
from tidemark.consensus.memory import MemoryConsensus
from tidemark.errors import InvalidArgument
from tidemark.rpc import Server, call
from tidemark.v1 import oracle_pb2


class CountingOracle(TimestampOracle):
    """Counts the calls that reach the server."""

    def __init__(self) -> None:
        super().__init__(MemoryConsensus())
        self.calls: Counter[str] = Counter()
        self.write_counts: list[int] = []

    async def read_ts(self, timeline: str) -> int:
        self.calls["ReadTs"] += 1
        return await super().read_ts(timeline)

    async def write_ts(self, timeline: str, count: int = 1) -> int:
        self.calls["WriteTs"] += 1
        self.write_counts.append(count)
        return await super().write_ts(timeline, count)

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        self.calls["ApplyWrite"] += 1
        await super().apply_write(timeline, timestamp)


@pytest.fixture
async def served() -> AsyncIterator[tuple[CountingOracle, OracleClient]]:
    oracle = CountingOracle()
    async with Server([oracle_service(oracle)], "127.0.0.1:0") as server:
        client = OracleClient(f"127.0.0.1:{server.port}")
        yield oracle, client
        await client.close()


async def test_concurrent_writes_share_one_call_and_get_distinct_timestamps(
    served: tuple[CountingOracle, OracleClient],
) -> None:
    servicer, client = served
    results = await asyncio.gather(*(client.write_ts("t") for _ in range(100)))
    assert len(set(results)) == 100
    assert max(results) - min(results) == 99  # one run of consecutive timestamps
    assert servicer.calls["WriteTs"] <= 3
    assert sum(servicer.write_counts) == 100


async def test_concurrent_reads_share_one_call(
    served: tuple[CountingOracle, OracleClient],
) -> None:
    servicer, client = served
    await client.apply_write("t", 77)
    results = await asyncio.gather(*(client.read_ts("t") for _ in range(100)))
    assert results == [77] * 100
    assert servicer.calls["ReadTs"] <= 3


async def test_concurrent_applies_send_their_maximum(
    served: tuple[CountingOracle, OracleClient],
) -> None:
    servicer, client = served
    await asyncio.gather(*(client.apply_write("t", ts) for ts in range(1, 51)))
    assert servicer.calls["ApplyWrite"] <= 3
    assert await client.read_ts("t") == 50


async def test_batched_callers_see_a_linearizable_oracle(
    served: tuple[CountingOracle, OracleClient],
) -> None:
    _, client = served
    history: list[Call] = []

    async def caller(i: int) -> None:
        for n in range(30):
            invoked = time.monotonic()
            if (i + n) % 3 == 0:
                ts = await client.read_ts("t")
                history.append(Call("read", "t", invoked, time.monotonic(), ts))
            elif (i + n) % 3 == 1:
                ts = await client.write_ts("t")
                history.append(Call("write", "t", invoked, time.monotonic(), ts))
            else:
                ts = await client.write_ts("t")
                await client.apply_write("t", ts)
                history.append(Call("apply", "t", invoked, time.monotonic(), ts))

    await asyncio.gather(*(caller(i) for i in range(32)))
    assert check_history(history) == []


async def test_write_run_bounds_are_checked(
    served: tuple[CountingOracle, OracleClient],
) -> None:
    _, client = served
    stub = client.stub
    first = await call(stub.WriteTs, oracle_pb2.WriteTsRequest(timeline="t", count=0))
    second = await call(stub.WriteTs, oracle_pb2.WriteTsRequest(timeline="t", count=5))
    third = await call(stub.WriteTs, oracle_pb2.WriteTsRequest(timeline="t"))
    # The clock may move on between calls, so runs start at or above the previous run's end.
    assert second.timestamp >= first.timestamp + 1  # count 0 took one timestamp
    assert third.timestamp >= second.timestamp + 5
    with pytest.raises(InvalidArgument, match="count"):
        await call(stub.WriteTs, oracle_pb2.WriteTsRequest(timeline="t", count=MAX_WRITE_RUN + 1))
