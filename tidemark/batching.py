"""Group commit: many concurrent callers, one backend round trip.

Callers submit requests; a single flusher takes everything that has arrived, runs one
backend operation for the whole group and hands each caller its own answer. A request that
arrives while a flush is running waits for the next one, never joining a flush that has
already started: that keeps each answer linearizable, because the backend operation that
serves a request always begins after the request was made.

Under load a committer may *linger*: when requests queued up while a flush ran, it waits a
little before flushing them, so that more requests share that flush. On a busy process each
backend operation costs CPU as well as time, and requests reach the committer a few at a time;
waiting for more of them trades a bounded delay for fewer backend operations per request.
Lingering only delays a flush, so the rule above still holds. A request that finds the
committer idle is never delayed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from tidemark.tasks import cancel_and_wait

Req = TypeVar("Req")
Resp = TypeVar("Resp")

# A lingering committer stops waiting as soon as one of these steps brought no new request.
_LINGER_STEPS = 4

FlushFn = Callable[[Sequence[Req]], Awaitable[Sequence[Resp]]]


class GroupCommit(Generic[Req, Resp]):
    """Runs ``flush`` over batches of requests, at most one flush at a time.

    ``flush`` receives the requests in arrival order and returns one response per request in
    the same order; if it raises, every request of that batch fails with the exception.
    """

    def __init__(
        self, flush: FlushFn[Req, Resp], max_batch: int = 4096, linger_s: float = 0.0
    ) -> None:
        """``linger_s``: how long requests queued behind a flush wait for company before the
        next flush (see the module docs); 0 flushes them as soon as the previous one ended."""
        if linger_s < 0:
            raise ValueError(f"linger_s must not be negative, got {linger_s}")
        self._flush = flush
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._pending: list[tuple[Req, asyncio.Future[Resp]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, request: Req) -> Resp:
        future: asyncio.Future[Resp] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        # Yield once so that callers arriving in the same event-loop tick share the flush.
        await asyncio.sleep(0)
        first = True
        while self._pending:
            if not first and self._linger_s:
                await self._linger()
            first = False
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            live = [(req, fut) for req, fut in batch if not fut.cancelled()]
            if not live:
                continue
            try:
                responses = await self._flush([req for req, _ in live])
            except asyncio.CancelledError:
                for _, fut in live:
                    if not fut.done():
                        fut.cancel()
                raise
            except BaseException as exc:
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            if len(responses) != len(live):
                error = RuntimeError(
                    f"batch flush returned {len(responses)} responses for {len(live)} requests"
                )
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(error)
                continue
            for (_, fut), resp in zip(live, responses, strict=True):
                if not fut.done():
                    fut.set_result(resp)

    async def _linger(self) -> None:
        """Wait while requests keep arriving, at most ``linger_s`` in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._linger_s
        step = self._linger_s / _LINGER_STEPS
        while True:
            seen = len(self._pending)
            await asyncio.sleep(step)
            if len(self._pending) in (seen, self._max_batch) or loop.time() >= deadline:
                return

    async def close(self) -> None:
        if self._runner is not None and not self._runner.done():
            await cancel_and_wait(self._runner)
        for _, fut in self._pending:
            if not fut.done():
                fut.cancel()
        self._pending.clear()
