"""The timestamp oracle's laws, batching and retries, in-process over the memory backend."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest

from services.oracle.oracle import KEY_PREFIX, TimelineState, TimestampOracle
from tests.support.oracle_history import Call, check_history
from tidemark.consensus import CasResult, Consensus, VersionedData
from tidemark.consensus.memory import MemoryConsensus
from tidemark.errors import InvalidArgument, Unavailable
from tidemark.retry import RetryPolicy


class CountingConsensus(Consensus):
    """Counts backend round trips, and can be told to fail the next few of them."""

    def __init__(self, inner: Consensus) -> None:
        self.inner = inner
        self.max_value_bytes = inner.max_value_bytes
        self.heads = 0
        self.cas = 0
        self.failures_left = 0

    def _maybe_fail(self) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise Unavailable("injected outage")

    async def head(self, key: str) -> VersionedData | None:
        self._maybe_fail()
        self.heads += 1
        return await self.inner.head(key)

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        self._maybe_fail()
        self.cas += 1
        return await self.inner.compare_and_set(key, expected_version, data)

    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        return await self.inner.scan(prefix)

    async def delete(self, key: str, expected_version: int) -> CasResult:
        return await self.inner.delete(key, expected_version)

    def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        return self.inner.watch(key)

    async def close(self) -> None:
        await self.inner.close()


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def backend() -> CountingConsensus:
    return CountingConsensus(MemoryConsensus())


FAST_RETRY = RetryPolicy(total_seconds=0.3, initial_backoff=0.01, max_backoff=0.05)


async def test_fresh_timeline_reads_zero_and_writes_at_the_clock(
    backend: CountingConsensus,
) -> None:
    clock = FakeClock(1_000)
    oracle = TimestampOracle(backend, clock=clock)
    assert await oracle.read_ts("t") == 0
    assert await oracle.peek_write_ts("t") == 0
    assert await oracle.write_ts("t") == 1_000
    assert await oracle.peek_write_ts("t") == 1_000
    # The clock has not moved: the next write is one above the previous one.
    assert await oracle.write_ts("t") == 1_001
    clock.now = 5_000
    assert await oracle.write_ts("t") == 5_000


async def test_write_is_above_every_earlier_read_and_write(backend: CountingConsensus) -> None:
    clock = FakeClock(10)
    oracle = TimestampOracle(backend, clock=clock)
    seen = 0
    for _ in range(20):
        if random.random() < 0.5:
            r = await oracle.read_ts("t")
            assert r <= seen
        w = await oracle.write_ts("t")
        assert w > seen
        seen = w
        # The clock may stand still or even run backwards; timestamps never do.
        clock.now -= random.randint(0, 3)


async def test_applied_write_is_visible_to_every_later_read(backend: CountingConsensus) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    w = await oracle.write_ts("t")
    assert await oracle.read_ts("t") < w
    await oracle.apply_write("t", w)
    assert await oracle.read_ts("t") == w
    # An older apply does not move the read timestamp back.
    await oracle.apply_write("t", w - 50)
    assert await oracle.read_ts("t") == w
    # The next write is above the read timestamp.
    assert await oracle.write_ts("t") > w


async def test_apply_beyond_handed_out_writes_raises_later_writes(
    backend: CountingConsensus,
) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    await oracle.apply_write("t", 5_000)
    assert await oracle.read_ts("t") == 5_000
    assert await oracle.peek_write_ts("t") == 5_000
    assert await oracle.write_ts("t") == 5_001


async def test_timelines_are_independent(backend: CountingConsensus) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    await oracle.apply_write("a", 700)
    assert await oracle.read_ts("a") == 700
    assert await oracle.read_ts("b") == 0
    assert await oracle.write_ts("b") == 100


@pytest.mark.parametrize("name", ["", "x" * 129, "has space", "tab\there", "nl\n"])
async def test_bad_timeline_names_are_invalid_arguments(
    backend: CountingConsensus, name: str
) -> None:
    oracle = TimestampOracle(backend)
    with pytest.raises(InvalidArgument):
        await oracle.read_ts(name)
    with pytest.raises(InvalidArgument):
        await oracle.write_ts(name)
    assert await backend.scan(KEY_PREFIX) == []


async def test_apply_far_in_the_future_is_rejected_and_changes_nothing(
    backend: CountingConsensus,
) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(1_000))
    with pytest.raises(InvalidArgument, match="ahead"):
        await oracle.apply_write("t", 2**63)
    with pytest.raises(InvalidArgument):
        await oracle.apply_write("t", -1)
    assert await oracle.read_ts("t") == 0
    assert await oracle.write_ts("t") == 1_000


async def test_concurrent_writes_share_one_compare_and_set(backend: CountingConsensus) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    results = await asyncio.gather(*(oracle.write_ts("t") for _ in range(200)))
    assert sorted(results) == list(range(100, 300))
    assert backend.cas <= 2
    stored = await backend.head(KEY_PREFIX + "t")
    assert stored is not None
    assert TimelineState.decode(stored.data).write_ts == 299


async def test_concurrent_reads_share_one_backend_read(backend: CountingConsensus) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    await oracle.apply_write("t", 42)
    before = backend.heads
    results = await asyncio.gather(*(oracle.read_ts("t") for _ in range(200)))
    assert results == [42] * 200
    assert backend.heads - before <= 2


async def test_mixed_batch_allocates_above_the_applied_writes(
    backend: CountingConsensus,
) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100))
    calls = [oracle.write_ts("t") for _ in range(10)] + [oracle.apply_write("t", 900)]
    results = await asyncio.gather(*calls)
    writes = results[:10]
    assert all(isinstance(w, int) and w > 900 for w in writes)
    assert len(set(writes)) == 10
    assert await oracle.read_ts("t") == 900


async def test_two_oracles_on_one_store_stay_linearizable() -> None:
    store = MemoryConsensus()
    oracles = [TimestampOracle(store), TimestampOracle(store)]
    history: list[Call] = []

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            oracle = rng.choice(oracles)
            kind = rng.choice(["read", "write", "write", "apply"])
            invoked = time.monotonic()
            if kind == "read":
                value = await oracle.read_ts("t")
            elif kind == "write":
                value = await oracle.write_ts("t")
            else:
                value = await oracle.peek_write_ts("t")
                await oracle.apply_write("t", value)
            history.append(Call(kind, "t", invoked, time.monotonic(), value))  # type: ignore[arg-type]
            await asyncio.sleep(0)

    await asyncio.gather(*(client(i) for i in range(32)))
    assert len(history) == 32 * 60
    assert check_history(history) == []


async def test_unavailable_backend_is_retried_then_succeeds(backend: CountingConsensus) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100), retry=FAST_RETRY)
    backend.failures_left = 3
    assert await oracle.write_ts("t") == 100
    backend.failures_left = 3
    assert await oracle.read_ts("t") == 0


async def test_lasting_outage_fails_unavailable_in_bounded_time(
    backend: CountingConsensus,
) -> None:
    oracle = TimestampOracle(backend, clock=FakeClock(100), retry=FAST_RETRY)
    backend.failures_left = 10**9
    started = time.monotonic()
    with pytest.raises(Unavailable, match="consensus"):
        await oracle.write_ts("t")
    with pytest.raises(Unavailable):
        await oracle.read_ts("t")
    assert time.monotonic() - started < 5
    backend.failures_left = 0
    assert await oracle.write_ts("t") == 100


# -- the checker itself must be able to fail ------------------------------------------------


def test_checker_accepts_a_valid_sequential_history() -> None:
    history = [
        Call("write", "t", 0.0, 1.0, 10),
        Call("apply", "t", 1.5, 2.0, 10),
        Call("read", "t", 2.5, 3.0, 10),
        Call("write", "t", 3.5, 4.0, 11),
        Call("read", "t", 4.5, 5.0, 10),
    ]
    assert check_history(history) == []


def test_checker_accepts_overlapping_calls_in_either_order() -> None:
    # The read overlaps the apply, so it may or may not see it.
    history = [
        Call("apply", "t", 0.0, 2.0, 10),
        Call("read", "t", 1.0, 3.0, 0),
    ]
    assert check_history(history) == []


@pytest.mark.parametrize(
    "history, expected",
    [
        # A write that began after another completed returned a smaller timestamp.
        ([Call("write", "t", 0, 1, 10), Call("write", "t", 2, 3, 9)], "WriteTs -> 9"),
        # A write not above an earlier read.
        ([Call("read", "t", 0, 1, 10), Call("write", "t", 2, 3, 10)], "WriteTs -> 10"),
        # A read that misses a completed apply.
        ([Call("apply", "t", 0, 1, 10), Call("read", "t", 2, 3, 9)], "ReadTs -> 9"),
        # Reads going backwards.
        ([Call("read", "t", 0, 1, 10), Call("read", "t", 2, 3, 9)], "ReadTs -> 9"),
        # Two overlapping writes with the same timestamp.
        ([Call("write", "t", 0, 3, 10), Call("write", "t", 1, 2, 10)], "twice"),
        # A write not above an applied write.
        ([Call("apply", "t", 0, 1, 10), Call("write", "t", 2, 3, 10)], "WriteTs -> 10"),
    ],
)
def test_checker_rejects_broken_histories(history: list[Call], expected: str) -> None:
    violations = check_history(history)
    assert violations, "the checker accepted a history that breaks the laws"
    assert any(expected in v for v in violations)


def test_checker_keeps_timelines_apart() -> None:
    history = [Call("write", "a", 0, 1, 10), Call("write", "b", 2, 3, 5)]
    assert check_history(history) == []
