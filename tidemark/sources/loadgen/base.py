"""What every load generator shares: ticks, offsets and the reader around a generator.

Tick ``k`` (``k >= 0``) is due at ``start_time_ms + k * tick_interval_ms`` of wall-clock time.
The offset after ticks ``0..n-1`` is ``n`` (8 bytes, big-endian), so the progress relation's
``offset`` counts the ticks recorded. Tick 0 carries a generator's initial data (AUCTION's
organizations, TPCH's tables); a COUNTER's tick ``k`` emits the value ``k + 1``. A reader that
fell behind (the process was down) makes the missed ticks at once, at most
``MAX_TICKS_PER_BATCH`` per batch.
"""

from __future__ import annotations

import abc
import asyncio
import datetime
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from tidemark.columnar import RelationSchema, Row
from tidemark.sources.reader import Changes, SourceBatch, SourceReader, decode_u64, encode_u64

MAX_TICKS_PER_BATCH = 1000
DEFAULT_TICK_INTERVAL_MS = 1000


@dataclass(frozen=True)
class LoadGeneratorSpec:
    generator: str
    tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS
    max_cardinality: int = 0
    scale_factor: float = 0.01
    start_time_ms: int = 0
    up_to: int = 0
    """No tick at or after this one (0: unbounded)."""

    def tick_time(self, tick: int) -> datetime.datetime:
        """The wall-clock time tick ``tick`` stands for (naive UTC, microseconds)."""
        millis = self.start_time_ms + tick * self.tick_interval_ms
        return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=millis)


class Generator(abc.ABC):
    """A deterministic upstream: its relations, and the changes of each tick."""

    def __init__(self, spec: LoadGeneratorSpec) -> None:
        self.spec = spec

    @abc.abstractmethod
    def schemas(self) -> Mapping[str, RelationSchema]:
        """The relations, by subsource name."""

    @abc.abstractmethod
    def tick(self, tick: int) -> dict[str, list[tuple[Row, int]]]:
        """The changes tick ``tick`` makes: a pure function of ``tick`` and the spec."""

    def ticks(self, first: int, end: int) -> dict[str, list[tuple[Row, int]]]:
        """The changes of ticks ``first .. end - 1``, together."""
        out: dict[str, list[tuple[Row, int]]] = {}
        for tick in range(first, end):
            for name, pairs in self.tick(tick).items():
                out.setdefault(name, []).extend(pairs)
        return out


Clock = Callable[[], float]
"""Wall-clock seconds."""


class LoadGeneratorReader(SourceReader):
    """A :class:`SourceReader` over a :class:`Generator` whose ticks follow the wall clock."""

    def __init__(self, generator: Generator, *, clock: Clock = time.time) -> None:
        self.generator = generator
        self.spec = generator.spec
        self.clock = clock
        self._next = 0

    def schemas(self) -> Mapping[str, RelationSchema]:
        return self.generator.schemas()

    async def start(self, resume_offset: bytes | None) -> None:
        self._next = 0 if resume_offset is None else decode_u64(resume_offset)

    def _due(self) -> int:
        """The ticks due by now: ``0 .. due - 1``."""
        elapsed_ms = self.clock() * 1000 - self.spec.start_time_ms
        due = int(elapsed_ms // max(1, self.spec.tick_interval_ms)) + 1 if elapsed_ms >= 0 else 0
        if self.spec.up_to:
            due = min(due, self.spec.up_to)
        return due

    async def batches(self) -> AsyncIterator[SourceBatch]:
        while True:
            due = self._due()
            if due > self._next:
                end = min(due, self._next + MAX_TICKS_PER_BATCH)
                changes = await self._make(self._next, end)
                self._next = end
                yield SourceBatch(encode_u64(end), changes)
                continue
            if self.spec.up_to and self._next >= self.spec.up_to:
                return
            wait_ms = (
                self.spec.start_time_ms
                + self._next * self.spec.tick_interval_ms
                - self.clock() * 1000
            )
            await asyncio.sleep(max(0.001, wait_ms / 1000))

    async def replay(self, from_offset: bytes | None, to_offset: bytes) -> Changes:
        first = 0 if from_offset is None else decode_u64(from_offset)
        return await self._make(first, decode_u64(to_offset))

    async def _make(self, first: int, end: int) -> Changes:
        # Large initial data (TPCH) takes a while to make: off the event loop.
        if first == 0 and end >= 1:
            return await asyncio.to_thread(self.generator.ticks, first, end)
        return self.generator.ticks(first, end)
