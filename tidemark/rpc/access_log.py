"""One log line per call: method, status, duration and request id.

Lines are at info level, except for health probes, and for the successful calls of *hot*
methods, which come at debug: methods such as the oracle's are called thousands of times a
second, where a line per call would drown every other line and cost the server a good share of
its CPU. A hot method's failures are still logged at info (server faults at error).

The request id is the caller's ``x-request-id`` if it sent a usable one, otherwise a fresh one.
It is bound to the logging context for the whole call (so every line the handler logs carries
it) and returned to the caller in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import structlog

from tidemark.logging import get_logger
from tidemark.rpc.interceptor import CallInterceptor, Context
from tidemark.rpc.request_id import REQUEST_ID_KEY, new_request_id, request_id_from_metadata

# Probes call these every few seconds; at info level they would drown the real traffic.
QUIET_METHODS = frozenset(
    {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"},
)

# Statuses that mean the server is at fault, as opposed to the request or the caller.
SERVER_FAULTS = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
)

log = get_logger("tidemark.rpc")


def _cancellation_status(context: Context) -> grpc.StatusCode:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def call_status(context: Context, exc: BaseException) -> grpc.StatusCode | None:
    """The status of a call that ended with ``exc`` escaping to an interceptor outside the
    error-mapping one: ``None`` when the call chose its status (``context.code()`` has it),
    CANCELLED or DEADLINE_EXCEEDED when it was cut short, UNKNOWN for any other exception
    (gRPC's answer when nothing mapped it)."""
    if isinstance(exc, grpc.aio.AbortError):
        return None
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return _cancellation_status(context)
    if isinstance(exc, Exception):
        return grpc.StatusCode.UNKNOWN
    return None


class AccessLogInterceptor(CallInterceptor):
    """Logs every call once it finished (see the module docs). ``hot_methods``: full method
    names (``/package.Service/Method``) whose successful calls are logged at debug."""

    def __init__(self, hot_methods: Iterable[str] = ()) -> None:
        self.hot_methods = frozenset(hot_methods)

    @asynccontextmanager
    async def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        request_id = request_id_from_metadata(details.invocation_metadata) or new_request_id()
        # gRPC runs each call in its own task, so these bindings end with the call; nothing
        # needs unbinding (and unbinding from another task would fail).
        structlog.contextvars.bind_contextvars(request_id=request_id, method=details.method)
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        started = time.perf_counter()
        status: grpc.StatusCode | None = None
        try:
            yield
        except BaseException as exc:
            status = call_status(context, exc)
            raise
        finally:
            status = status or context.code() or grpc.StatusCode.OK
            self._log(details.method, status, started, request_id)

    def unknown_method(self, details: grpc.HandlerCallDetails) -> None:
        request_id = request_id_from_metadata(details.invocation_metadata) or new_request_id()
        self._log(details.method, grpc.StatusCode.UNIMPLEMENTED, time.perf_counter(), request_id)

    def _log(self, method: str, status: grpc.StatusCode, started: float, request_id: str) -> None:
        fields = {
            "method": method,
            "status": status.name,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "request_id": request_id,
        }
        if status in SERVER_FAULTS:
            log.error("rpc", **fields)
        elif method in QUIET_METHODS or (
            status == grpc.StatusCode.OK and method in self.hot_methods
        ):
            log.debug("rpc", **fields)
        else:
            log.info("rpc", **fields)
