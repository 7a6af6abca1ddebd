"""Unary requests carried over one long-lived bidirectional stream.

A new gRPC call costs far more than a message on an open stream: the server matches the call,
starts a task for it and runs the interceptors, and each step is a wake-up of another thread
(on a machine that idles between requests, about 0.7 ms of a 1.6 ms round trip here, where a
stream message takes 0.9 ms). Writers that send many small requests therefore send them as
messages of one stream. Each request carries a ``sequence`` number chosen by the client and its
response carries it back, so requests proceed concurrently and finish in any order; a failed
request is answered with a :class:`~tidemark.v1.common_pb2.CallStatus` instead of ending the
stream, and the caller gets the same Tidemark error the unary call would have raised.

When a stream breaks, the requests still waiting may or may not have taken effect: they fail
with :class:`~tidemark.errors.Indeterminate`, the outcome a unary call has when its connection
drops mid-call, and the next request opens a new stream. Only requests that are exact on retry
(an append with an idempotency token) belong on such a stream. A stream the server ends
cleanly is not broken: the server does that when it stops, after answering every request it
took, so the requests left unanswered never ran and go again on a new stream.

:class:`StreamedCalls` is the client side, :func:`answer_streamed_calls` the server side.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc
import grpc.aio

from tidemark.errors import (
    DeadlineExceeded,
    Indeterminate,
    TidemarkError,
    Unavailable,
    error_for_status,
)
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy, retry_unavailable
from tidemark.rpc.client import call_metadata
from tidemark.rpc.errors import error_from_rpc, status_for_exception
from tidemark.rpc.metrics import STREAMED_CALL_DURATION, STREAMED_CALLS, split_method
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import common_pb2

log = get_logger("tidemark.rpc")

Request = TypeVar("Request")
Response = TypeVar("Response")
WireRequest = TypeVar("WireRequest")
WireResponse = TypeVar("WireResponse")

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def call_status(exc: BaseException, method: str) -> common_pb2.CallStatus:
    """The status of a request that raised ``exc``, as the error-mapping interceptor would
    have ended a unary call with it. Call it from the ``except`` block: a bug is logged with
    its traceback and reported as INTERNAL."""
    code, message = status_for_exception(exc, method)
    return common_pb2.CallStatus(
        code=code.value[0], message=message, indeterminate=isinstance(exc, Indeterminate)
    )


def error_from_status(status: common_pb2.CallStatus) -> TidemarkError:
    """The Tidemark exception for a request that failed with ``status``."""
    if status.indeterminate:
        return Indeterminate(status.message)
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return error_for_status(code, status.message or code.name)


# -- client -----------------------------------------------------------------------------------


class _Unsent(Exception):
    """The request never left: its stream ended before it was written. Safe to send again."""


@dataclass(eq=False)
class _Stream(Generic[WireRequest, WireResponse]):
    """One open stream: its call, the requests to write and the callers waiting."""

    call: grpc.aio.StreamStreamCall[WireRequest, WireResponse]
    outbox: asyncio.Queue[tuple[int, WireRequest]] = field(default_factory=asyncio.Queue)
    waiting: dict[int, asyncio.Future[WireResponse]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    broken: TidemarkError | None = None

    def fail(
        self, error: TidemarkError, unsent: int | None = None, *, none_ran: bool = False
    ) -> None:
        """End the stream: callers whose requests were written get ``error``; those whose
        requests were not (``unsent``, the one whose write failed, and the ones still queued),
        or all of them when ``none_ran`` (the server ran none of those left unanswered), are
        told so, and send them again."""
        if self.broken is None:
            self.broken = error
            self.call.cancel()
            current = asyncio.current_task()
            for task in self.tasks:
                if task is not current:
                    task.cancel()
        not_written = {unsent}
        while not self.outbox.empty():
            not_written.add(self.outbox.get_nowait()[0])
        waiting, self.waiting = self.waiting, {}
        for sequence, future in waiting.items():
            if not future.done():
                future.set_exception(_Unsent() if none_ran or sequence in not_written else error)


class StreamedCalls(Generic[Request, Response, WireRequest, WireResponse]):
    """Requests of one method over one stream (see the module docs), opened on first use
    and again after it breaks. ``wrap(sequence, request)`` makes the stream's request
    message; ``unwrap(message)`` reads a response message as its sequence and either the
    response or the :class:`CallStatus` of the failure."""

    def __init__(
        self,
        method: grpc.aio.StreamStreamMultiCallable[WireRequest, WireResponse],
        *,
        wrap: Callable[[int, Request], WireRequest],
        unwrap: Callable[[WireResponse], tuple[int, Response | common_pb2.CallStatus]],
        retry: RetryPolicy,
        name: str,
    ) -> None:
        self.method = method
        self.wrap = wrap
        self.unwrap = unwrap
        self.retry = retry
        self.name = name
        self._sequence = itertools.count(1)
        self._stream: _Stream[WireRequest, WireResponse] | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def call(self, request: Request, timeout: float) -> Response:  # noqa: ASYNC109
        """Send ``request`` and wait for its response, at most ``timeout`` seconds. Raises
        what the unary call would: the request's own error, ``Unavailable`` when no stream
        could be opened (nothing was sent), ``Indeterminate`` when the stream broke after the
        request was sent, ``DeadlineExceeded`` when no answer came in time (the request may
        still take effect)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        message = await self._send(request)
                        break
                    except _Unsent:
                        continue  # on a new stream
        except TimeoutError:
            raise DeadlineExceeded(
                f"{self.name}: no answer within {timeout:.3g} s; the request may still take effect"
            ) from None
        _, outcome = self.unwrap(message)
        if isinstance(outcome, common_pb2.CallStatus):
            raise error_from_status(outcome)
        return outcome

    async def _send(self, request: Request) -> WireResponse:
        stream = await self._open()
        sequence = next(self._sequence)
        future: asyncio.Future[WireResponse] = asyncio.get_running_loop().create_future()
        stream.waiting[sequence] = future
        stream.outbox.put_nowait((sequence, self.wrap(sequence, request)))
        try:
            return await future
        finally:
            stream.waiting.pop(sequence, None)

    async def _open(self) -> _Stream[WireRequest, WireResponse]:
        async with self._opening:
            if self._closed:
                raise Unavailable(f"{self.name}: the client is closed")
            if self._stream is not None and self._stream.broken is None:
                return self._stream
            call = await retry_unavailable(self._connect, self.retry, self.name)
            stream = _Stream[WireRequest, WireResponse](call)
            stream.tasks = [
                asyncio.create_task(self._write(stream), name=f"{self.name}-writer"),
                asyncio.create_task(self._read(stream), name=f"{self.name}-reader"),
            ]
            self._stream = stream
            return stream

    async def _connect(self) -> grpc.aio.StreamStreamCall[WireRequest, WireResponse]:
        call = self.method(None, metadata=call_metadata())
        try:
            # Returns once the call is established; a server that cannot be reached fails it
            # here, before any request was written (Unavailable: nothing happened).
            await call.wait_for_connection()
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        return call

    async def _write(self, stream: _Stream[WireRequest, WireResponse]) -> None:
        # One task writes, so that a caller cancelled mid-write cannot cancel the whole call
        # (grpc.aio cancels a call whose write is interrupted).
        while True:
            sequence, message = await stream.outbox.get()
            try:
                await stream.call.write(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                # The call had ended: this message never left.
                stream.fail(self._broken(exc), unsent=sequence)
                return

    async def _read(self, stream: _Stream[WireRequest, WireResponse]) -> None:
        try:
            async for message in stream.call:
                sequence, _ = self.unwrap(message)
                future = stream.waiting.pop(sequence, None)
                if future is not None and not future.done():
                    future.set_result(message)
        except grpc.aio.AioRpcError as exc:
            stream.fail(self._broken(exc))
            return
        # A server ends a stream cleanly only once it has answered every request it took
        # (``answer_streamed_calls``, when it stops): an unanswered one never ran, even if
        # it was written just before the end, and goes again on a new stream.
        stream.fail(Unavailable(f"{self.name}: the server ended the stream"), none_ran=True)

    def _broken(self, exc: grpc.aio.AioRpcError | asyncio.InvalidStateError) -> TidemarkError:
        if isinstance(exc, grpc.aio.AioRpcError):
            error = error_from_rpc(exc)
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return error  # refused as a whole: none of its requests ran
            return Indeterminate(f"{self.name}: the stream broke: {error.message}")
        return Indeterminate(f"{self.name}: the stream broke: {exc}")

    async def close(self) -> None:
        async with self._opening:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.fail(Unavailable(f"{self.name}: the client is closed"))
            await cancel_and_wait(*stream.tasks)


# -- server -----------------------------------------------------------------------------------


async def answer_streamed_calls(
    requests: AsyncIterator[WireRequest],
    write: Callable[[WireResponse], Awaitable[None]],
    answer: Callable[[WireRequest], Awaitable[WireResponse]],
    failed: Callable[[WireRequest, common_pb2.CallStatus], WireResponse],
    *,
    method: str,
    kind_of: Callable[[WireRequest], str] = lambda request: "call",
    stopping: asyncio.Event | None = None,
    max_in_flight: int = 256,
) -> None:
    """Answer a stream of requests, ``write``-ing each response (``context.write``) as soon as
    it is ready: each request is answered by ``answer`` in a task of its own (so they proceed
    concurrently), or, if that raises, by ``failed`` with the status the unary call would
    have ended with. At most ``max_in_flight`` requests run at once; further ones wait in the
    stream. Each answer counts in the streamed-call metrics (``tidemark.rpc.metrics``) under
    ``method``, the request's ``kind_of`` and the status it carries.

    Once ``stopping`` is set (the server is shutting down), the requests running are answered
    and the stream ends, so an idle stream does not hold up the shutdown; whatever the client
    sent after that is unanswered, and it sends that again. When the caller goes away,
    requests still running are cancelled."""
    room = asyncio.Semaphore(max_in_flight)
    writing = asyncio.Lock()  # one write at a time on a call
    running: set[asyncio.Task[None]] = set()
    answering = True

    service, short_method = split_method(method)

    kind_failed = False

    def _kind(request: WireRequest) -> str:
        # A label must never keep a request from its answer (or its slot from release).
        nonlocal kind_failed
        try:
            return kind_of(request)
        except Exception:
            if not kind_failed:  # once per stream: a busy stream would repeat it per call
                kind_failed = True
                log.warning("streamed_call_kind_failed", method=method, exc_info=True)
            return "unknown"

    async def run(request: WireRequest) -> None:
        started = time.perf_counter()
        kind = _kind(request)
        code = grpc.StatusCode.OK
        try:
            response = await answer(request)
        except Exception as exc:
            status = call_status(exc, method)
            code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
            response = failed(request, status)
        finally:
            room.release()
        # Counted once answered (a call cancelled with its stream has no answer).
        STREAMED_CALL_DURATION.labels(service, short_method, kind).observe(
            time.perf_counter() - started
        )
        STREAMED_CALLS.labels(service, short_method, kind, code.name).inc()
        async with writing:
            await write(response)

    async def take_requests() -> None:
        async for request in requests:
            if not answering:
                return  # the stream is ending: the client sends it again
            task = asyncio.create_task(run(request))
            running.add(task)
            task.add_done_callback(running.discard)
            await room.acquire()

    async def finish_running() -> None:
        while running:
            await asyncio.wait(set(running))

    reader = asyncio.create_task(take_requests())
    stop = asyncio.ensure_future((stopping or asyncio.Event()).wait())
    try:
        await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
        answering = reader.done()
        await finish_running()
        if reader.done():
            reader.result()  # the request stream's own failure ends this one the same way
    finally:
        answering = False
        await cancel_and_wait(stop, *running)
        if not reader.done():
            # Not cancelled: gRPC cannot end a call while a read of it was cancelled mid-way.
            # The read ends with the call; what it ends with concerns nobody.
            reader.add_done_callback(_discard_outcome)


def _discard_outcome(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
