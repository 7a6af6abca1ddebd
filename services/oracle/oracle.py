"""The timestamp oracle over a consensus store.

Each timeline is one consensus record ``(read_ts, write_ts)`` with ``read_ts <= write_ts``.
Every call is linearized at a backend operation that starts after the call arrived: a fresh
read for ``ReadTs``/``PeekWriteTs``, a compare-and-set for ``WriteTs``/``ApplyWrite``. Nothing is
cached between calls except a guess of the record's version, which the compare-and-set itself
checks, so any number of oracle processes may serve one timeline.

Concurrent calls are batched: all ``ReadTs`` calls waiting when a read starts share it, and all
``WriteTs``/``ApplyWrite`` calls waiting when a compare-and-set starts share it (the writes get
consecutive timestamps above every applied write).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client import Histogram

from tidemark.batching import GroupCommit
from tidemark.consensus import Committed, Consensus, VersionedData
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.lattice import U64_MAX
from tidemark.retry import RetryPolicy, retry_unavailable

KEY_PREFIX = "oracle/timelines/"
MAX_TIMELINE_NAME = 128
# An applied write this far beyond both the clock and the last write timestamp is a bug in
# the caller; accepting it would push the timeline's clock into the far future for good.
MAX_APPLY_AHEAD_MS = 24 * 3600 * 1000

_RECORD = struct.Struct(">QQ")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TimelineState:
    read_ts: int
    write_ts: int

    def encode(self) -> bytes:
        return _RECORD.pack(self.read_ts, self.write_ts)

    @staticmethod
    def decode(data: bytes) -> TimelineState:
        read_ts, write_ts = _RECORD.unpack(data)
        return TimelineState(read_ts, write_ts)


INITIAL_STATE = TimelineState(0, 0)


def validate_timeline(name: str) -> str:
    if not name:
        raise InvalidArgument("timeline name must not be empty")
    if len(name) > MAX_TIMELINE_NAME:
        raise InvalidArgument(
            f"timeline name is {len(name)} characters long; the limit is {MAX_TIMELINE_NAME}"
        )
    if not name.isprintable() or any(c.isspace() for c in name):
        raise InvalidArgument(f"timeline name {name!r} must be printable and contain no spaces")
    return name


@dataclass(frozen=True)
class _WriteRequest:
    """``apply is None``: allocate a run of ``count`` write timestamps; otherwise apply a
    write at ``apply``."""

    apply: int | None
    count: int = 1


BATCH_SIZE = Histogram(
    "tidemark_oracle_batch_size",
    "calls answered by one consensus round trip: ReadTs calls (read), or WriteTs and "
    "ApplyWrite calls (write)",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)

# The most write timestamps one call may take at once (a client batching its callers).
MAX_WRITE_RUN = 1 << 20


class _Timeline:
    def __init__(self, oracle: TimestampOracle, name: str) -> None:
        self.oracle = oracle
        self.key = KEY_PREFIX + name
        self.version_hint: VersionedData | None = None
        linger = oracle.batch_linger_s
        self.reads: GroupCommit[None, TimelineState] = GroupCommit(
            self._flush_reads, linger_s=linger
        )
        self.writes: GroupCommit[_WriteRequest, int] = GroupCommit(
            self._flush_writes, linger_s=linger
        )

    async def _flush_reads(self, requests: Sequence[None]) -> list[TimelineState]:
        BATCH_SIZE.labels("read").observe(len(requests))
        current = await retry_unavailable(
            lambda: self.oracle.consensus.head(self.key), self.oracle.retry, "consensus"
        )
        self.version_hint = current
        state = TimelineState.decode(current.data) if current is not None else INITIAL_STATE
        return [state] * len(requests)

    async def _flush_writes(self, requests: Sequence[_WriteRequest]) -> list[int]:
        BATCH_SIZE.labels("write").observe(len(requests))
        applied = [r.apply for r in requests if r.apply is not None]
        allocations = sum(r.count for r in requests if r.apply is None)
        # The first attempt trusts the version hint (the compare-and-set checks it); a retry
        # after a failure re-reads, since an indeterminate write may have landed.
        use_hint = [True]

        async def attempt() -> tuple[TimelineState, int]:
            consensus = self.oracle.consensus
            current = self.version_hint if use_hint[0] else await consensus.head(self.key)
            use_hint[0] = False
            while True:
                state = TimelineState.decode(current.data) if current else INITIAL_STATE
                new_state, first = _advance(state, applied, allocations, self.oracle.clock())
                result = await consensus.compare_and_set(
                    self.key, current.version if current else None, new_state.encode()
                )
                if isinstance(result, Committed):
                    self.version_hint = VersionedData(result.version, new_state.encode())
                    return new_state, first
                # Lost a race with another oracle, or the hint was stale: go from the winner.
                current = result.current

        _, first = await retry_unavailable(attempt, self.oracle.retry, "consensus")
        responses: list[int] = []
        next_ts = first
        for r in requests:
            if r.apply is None:
                responses.append(next_ts)
                next_ts += r.count
            else:
                responses.append(r.apply)
        return responses


def _advance(
    state: TimelineState, applied: Sequence[int], allocations: int, now: int
) -> tuple[TimelineState, int]:
    """The record after applying ``applied`` writes and then allocating ``allocations``
    consecutive write timestamps; returns it with the first allocated timestamp."""
    read_ts, write_ts = state.read_ts, state.write_ts
    if applied:
        top = max(applied)
        read_ts = max(read_ts, top)
        write_ts = max(write_ts, top)
    first = write_ts + 1
    if allocations:
        first = max(write_ts + 1, now)
        last = first + allocations - 1
        if last > U64_MAX:
            raise FailedPrecondition("the timeline has run out of timestamps")
        write_ts = last
    return TimelineState(read_ts, write_ts), first


class TimestampOracle:
    """Linearizable ``ReadTs``/``WriteTs``/``ApplyWrite``/``PeekWriteTs`` per timeline."""

    def __init__(
        self,
        consensus: Consensus,
        clock: Callable[[], int] = now_ms,
        retry: RetryPolicy | None = None,
        batch_linger_s: float = 0.0,
    ) -> None:
        """``batch_linger_s``: under load, how long calls queued behind a backend operation wait
        for more calls to share the next one (see :mod:`tidemark.batching`)."""
        self.consensus = consensus
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.batch_linger_s = batch_linger_s
        self._timelines: dict[str, _Timeline] = {}

    def _timeline(self, name: str) -> _Timeline:
        timeline = self._timelines.get(name)
        if timeline is None:
            timeline = self._timelines[validate_timeline(name)] = _Timeline(self, name)
        return timeline

    async def read_ts(self, timeline: str) -> int:
        return (await self._timeline(timeline).reads.submit(None)).read_ts

    async def peek_write_ts(self, timeline: str) -> int:
        return (await self._timeline(timeline).reads.submit(None)).write_ts

    async def write_ts(self, timeline: str, count: int = 1) -> int:
        """The first of ``count`` consecutive write timestamps, all above every earlier
        ``ReadTs``/``WriteTs``; the caller owns ``[first, first + count)``."""
        if not 1 <= count <= MAX_WRITE_RUN:
            raise InvalidArgument(f"count {count} must be between 1 and {MAX_WRITE_RUN}")
        return await self._timeline(timeline).writes.submit(_WriteRequest(None, count))

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        if not 0 <= timestamp <= U64_MAX:
            raise InvalidArgument(f"timestamp {timestamp} is not an unsigned 64-bit integer")
        if timestamp > self.clock() + MAX_APPLY_AHEAD_MS:
            raise InvalidArgument(
                f"timestamp {timestamp} is more than a day ahead of the oracle's clock"
            )
        await self._timeline(timeline).writes.submit(_WriteRequest(timestamp))

    async def close(self) -> None:
        for timeline in self._timelines.values():
            await timeline.reads.close()
            await timeline.writes.close()
