"""Prometheus metrics of every call a server handles: how many, how long, how they ended.

``tidemark_rpc_requests_total{service, method, code}`` counts finished calls by their status
(its rate is the request rate; codes other than OK are the errors),
``tidemark_rpc_duration_seconds{service, method}`` times them (for a streaming call, the whole
stream), and ``tidemark_rpc_in_flight{service, method}`` counts the calls running now. The
status is the one the client sees, as the access log reports it (``access_log.call_status``).

A long-lived stream that carries calls of its own (``streamed_calls``, storage's
``AppendStream``) counts once above, for its whole life; each call on it also counts in
``tidemark_rpc_streamed_calls_total{service, method, kind, code}`` (``kind``: what the
request asks, such as ``append`` or ``append_parts``; ``code``: the status its answer
carries) and is timed in ``tidemark_rpc_streamed_call_duration_seconds{service, method,
kind}``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import grpc.aio
from prometheus_client import Counter, Gauge, Histogram

from tidemark.rpc.access_log import call_status
from tidemark.rpc.interceptor import CallInterceptor, Context

DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)

RPC_REQUESTS = Counter(
    "tidemark_rpc_requests",
    "gRPC calls handled, by service, method and status code",
    ["service", "method", "code"],
)
RPC_DURATION = Histogram(
    "tidemark_rpc_duration_seconds",
    "time from a call's start to its end (a stream's whole life)",
    ["service", "method"],
    buckets=DURATION_BUCKETS,
)
RPC_IN_FLIGHT = Gauge("tidemark_rpc_in_flight", "gRPC calls running now", ["service", "method"])
STREAMED_CALLS = Counter(
    "tidemark_rpc_streamed_calls",
    "calls answered on a long-lived stream, by the stream's service and method, the call's "
    "kind and the status code of its answer",
    ["service", "method", "kind", "code"],
)
STREAMED_CALL_DURATION = Histogram(
    "tidemark_rpc_streamed_call_duration_seconds",
    "time from a call's arrival on a long-lived stream to its answer being ready",
    ["service", "method", "kind"],
    buckets=DURATION_BUCKETS,
)


def split_method(full_method: str) -> tuple[str, str]:
    """``/package.Service/Method`` as ``("package.Service", "Method")``."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


class RpcMetricsInterceptor(CallInterceptor):
    """Moves the RPC metrics above around every call."""

    @asynccontextmanager
    async def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        service, method = split_method(details.method)
        in_flight = RPC_IN_FLIGHT.labels(service, method)
        in_flight.inc()
        started = time.perf_counter()
        status: grpc.StatusCode | None = None
        try:
            yield
        except BaseException as exc:
            status = call_status(context, exc)
            raise
        finally:
            in_flight.dec()
            RPC_DURATION.labels(service, method).observe(time.perf_counter() - started)
            code = status or context.code() or grpc.StatusCode.OK
            RPC_REQUESTS.labels(service, method, code.name).inc()

    def unknown_method(self, details: grpc.HandlerCallDetails) -> None:
        service, method = split_method(details.method)
        RPC_REQUESTS.labels(service, method, grpc.StatusCode.UNIMPLEMENTED.name).inc()
