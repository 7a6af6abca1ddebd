"""Concurrent random oracle calls whose outcomes are recorded for the history checker."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.support.oracle_history import Call
from tidemark.clients.oracle import OracleClient
from tidemark.errors import TidemarkError


@dataclass
class LoadResult:
    history: list[Call] = field(default_factory=list)
    failures: int = 0


async def random_calls(
    clients: Sequence[OracleClient],
    timeline: str,
    *,
    concurrency: int,
    stop: asyncio.Event,
    max_calls_each: int = 10**9,
    seed: int = 0,
) -> LoadResult:
    """``concurrency`` tasks, each issuing random ReadTs/WriteTs/ApplyWrite calls (applying
    timestamps it was handed by WriteTs) against a random client, until ``stop`` is set or
    it made ``max_calls_each`` calls. Failed calls are counted, not recorded."""
    result = LoadResult()

    async def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        written: list[int] = []
        for _ in range(max_calls_each):
            if stop.is_set():
                return
            client = rng.choice(clients)
            roll = rng.random()
            invoked = time.monotonic()
            try:
                if roll < 0.45:
                    value = await client.read_ts(timeline)
                    kind = "read"
                elif roll < 0.8 or not written:
                    value = await client.write_ts(timeline)
                    written.append(value)
                    kind = "write"
                else:
                    value = written.pop(rng.randrange(len(written)))
                    await client.apply_write(timeline, value)
                    kind = "apply"
            except TidemarkError:
                result.failures += 1
                await asyncio.sleep(0.05)
                continue
            result.history.append(Call(kind, timeline, invoked, time.monotonic(), value))  # type: ignore[arg-type]

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return result
