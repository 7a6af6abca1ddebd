"""Group commit: who shares a flush, with and without lingering under load, and the oracle's laws
when its batches linger."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import pytest

from services.oracle.oracle import TimestampOracle
from tests.support.oracle_history import Call, check_history
from tidemark.batching import GroupCommit
from tidemark.consensus.memory import MemoryConsensus


class GatedFlush:
    """A flush that records each batch and, while ``gate`` is clear, blocks inside the backend
    operation, so a test can submit requests while a flush is in progress."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()

    async def __call__(self, requests: Sequence[int]) -> list[int]:
        self.batches.append(list(requests))
        self.started.set()
        await self.gate.wait()
        return [r * 10 for r in requests]


async def _queue_two_behind_a_flush(
    committer: GroupCommit[int, int], flush: GatedFlush
) -> list[asyncio.Task[int]]:
    """Request 0 in a flush held open, requests 1 and 2 queued behind it."""
    flush.gate.clear()
    tasks = [asyncio.create_task(committer.submit(0))]
    await flush.started.wait()
    tasks += [asyncio.create_task(committer.submit(r)) for r in (1, 2)]
    await asyncio.sleep(0)  # both are queued
    flush.gate.set()
    for _ in range(3):  # the first flush ends and the committer moves on
        await asyncio.sleep(0)
    return tasks


async def test_without_linger_the_queued_requests_are_flushed_at_once() -> None:
    flush = GatedFlush()
    committer: GroupCommit[int, int] = GroupCommit(flush)
    tasks = await _queue_two_behind_a_flush(committer, flush)
    tasks.append(asyncio.create_task(committer.submit(3)))
    assert await asyncio.gather(*tasks) == [0, 10, 20, 30]
    assert flush.batches == [[0], [1, 2], [3]]


async def test_a_lingering_committer_lets_late_requests_share_the_next_flush() -> None:
    flush = GatedFlush()
    committer: GroupCommit[int, int] = GroupCommit(flush, linger_s=1.0)
    tasks = await _queue_two_behind_a_flush(committer, flush)
    tasks.append(asyncio.create_task(committer.submit(3)))
    assert await asyncio.gather(*tasks) == [0, 10, 20, 30]
    # Never a request in a flush that started before it arrived; 3 joined 1 and 2.
    assert flush.batches == [[0], [1, 2, 3]]


async def test_an_idle_committer_flushes_a_lone_request_without_lingering() -> None:
    flush = GatedFlush()
    committer: GroupCommit[int, int] = GroupCommit(flush, linger_s=3600.0)
    # Waiting the linger would take an hour; the bound only catches that.
    assert await asyncio.wait_for(committer.submit(7), timeout=30) == 70
    assert await asyncio.wait_for(committer.submit(8), timeout=30) == 80
    assert flush.batches == [[7], [8]]


async def test_linger_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="linger"):
        GroupCommit(GatedFlush(), linger_s=-0.1)


async def test_a_failing_flush_after_lingering_fails_only_its_own_batch() -> None:
    outcomes = iter([None, RuntimeError("backend down"), None])

    async def flaky(requests: Sequence[int]) -> list[int]:
        error = next(outcomes)
        await asyncio.sleep(0.01)
        if error is not None:
            raise error
        return list(requests)

    committer: GroupCommit[int, int] = GroupCommit(flaky, linger_s=0.01)
    first = asyncio.create_task(committer.submit(1))
    await asyncio.sleep(0.001)
    second = asyncio.create_task(committer.submit(2))
    assert await first == 1
    with pytest.raises(RuntimeError, match="backend down"):
        await second
    assert await committer.submit(3) == 3


async def test_oracles_with_lingering_batches_stay_linearizable() -> None:
    store = MemoryConsensus()
    oracles = [TimestampOracle(store, batch_linger_s=0.002) for _ in range(2)]
    history: list[Call] = []

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(40):
            oracle = rng.choice(oracles)
            kind = rng.choice(["read", "write", "apply"])
            invoked = time.monotonic()
            if kind == "read":
                value = await oracle.read_ts("t")
            elif kind == "write":
                value = await oracle.write_ts("t")
            else:
                value = await oracle.peek_write_ts("t") + rng.randrange(3)
                await oracle.apply_write("t", value)
            history.append(Call(kind, "t", invoked, time.monotonic(), value))  # type: ignore[arg-type]

    await asyncio.gather(*(client(i) for i in range(32)))
    assert len(history) == 32 * 40
    assert check_history(history) == []
    for oracle in oracles:
        await oracle.close()
