"""Client helpers: channels, and calls with deadlines, retries and Tidemark exceptions.

Every call made through :func:`call` or :func:`stream` has a deadline, carries a request id
(the one of the request being handled, if any, so a request keeps its id across services), and
raises a :class:`~tidemark.errors.TidemarkError` instead of ``grpc.aio.AioRpcError``.

Unary calls are retried with jittered exponential backoff when, and only when, the server or
the connection reports UNAVAILABLE meaning "nothing happened"; every other outcome, including an
:class:`~tidemark.errors.Indeterminate` one, is returned to the caller at once. Calls that must
not run twice should carry an idempotency token (as storage appends do) or pass ``NO_RETRY``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Self, TypeVar

import grpc
import grpc.aio

from tidemark.errors import Unavailable
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy
from tidemark.rpc.errors import error_from_rpc
from tidemark.rpc.request_id import REQUEST_ID_KEY, current_request_id, new_request_id
from tidemark.rpc.server import MAX_MESSAGE_BYTES
from tidemark.rpc.tls import TlsSettings

Request = TypeVar("Request")
Response = TypeVar("Response")

DEFAULT_TIMEOUT = 10.0
# Long enough to ride out a server restart, short enough that callers see a dead peer.
CLIENT_RETRY = RetryPolicy(total_seconds=10.0, initial_backoff=0.05, max_backoff=1.0)
NO_RETRY = RetryPolicy(total_seconds=0.0)

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Notice a silently dead connection (a crashed node, a dropped NAT entry) within ~40 s
    # instead of at the next call's deadline; the server permits pings this frequent.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a restart; gRPC's default first backoff is a whole second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

log = get_logger("tidemark.rpc")


def open_channel(
    address: str, *, options: Sequence[tuple[str, Any]] = (), tls: TlsSettings | None = None
) -> grpc.aio.Channel:
    """A channel to ``address`` (``host:port`` or any gRPC target). Connects lazily. With
    ``tls``, over TLS: the server is verified against its CA, and the channel presents its
    certificate (the caller's identity, for servers that require one)."""
    if tls is not None:
        return grpc.aio.secure_channel(
            address, tls.channel_credentials(), options=[*CHANNEL_OPTIONS, *options]
        )
    return grpc.aio.insecure_channel(address, options=[*CHANNEL_OPTIONS, *options])


def call_metadata(
    request_id: str | None = None, metadata: Sequence[tuple[str, str]] = ()
) -> tuple[tuple[str, str], ...]:
    """Outgoing metadata: ``metadata`` plus the request id to send."""
    chosen = request_id or current_request_id() or new_request_id()
    return ((REQUEST_ID_KEY, chosen), *metadata)


async def call(
    method: grpc.aio.UnaryUnaryMultiCallable[Request, Response],
    request: Request,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (the gRPC deadline, passed through)
    retry: RetryPolicy = CLIENT_RETRY,
    request_id: str | None = None,
    metadata: Sequence[tuple[str, str]] = (),
    repeatable: bool = False,
) -> Response:
    """``await call(stub.ReadTs, request)``: one unary call, finished within ``timeout`` seconds
    in total (retries included), retried on UNAVAILABLE as ``retry`` allows. A
    ``repeatable`` call (a read, or a write whose repetition changes nothing) is retried on
    an indeterminate outcome too, e.g. after the connection broke with the call in flight."""
    deadline = time.monotonic() + timeout
    outgoing = call_metadata(request_id, metadata)
    backoff = replace(retry, total_seconds=min(retry.total_seconds, timeout)).backoffs()
    attempts = 0
    while True:
        attempts += 1
        try:
            return await method(
                request, timeout=max(0.0, deadline - time.monotonic()), metadata=outgoing
            )
        except grpc.aio.AioRpcError as exc:
            error = error_from_rpc(exc)
            # Exactly Unavailable: its subclass Indeterminate may have taken effect, which only
            # a repeatable call may risk.
            retriable = type(error) is Unavailable or (
                repeatable and isinstance(error, Unavailable)
            )
            if not retriable or backoff.expired():
                if attempts > 1:
                    error = type(error)(f"{error.message} (after {attempts} attempts)")
                raise error from exc
            log.debug("rpc_retry", attempt=attempts, details=exc.details())
        await backoff.sleep()
        if backoff.expired():
            raise Unavailable(f"{error.message} (after {attempts} attempts)")


async def stream(
    method: grpc.aio.UnaryStreamMultiCallable[Request, Response],
    request: Request,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline, passed through)
    request_id: str | None = None,
    metadata: Sequence[tuple[str, str]] = (),
) -> AsyncIterator[Response]:
    """The responses of a server-streaming call. Not retried: resuming a stream is the
    caller's business (e.g. subscribing again from the last frontier it saw). ``timeout``
    bounds the whole stream; the default is none, as subscriptions are meant to last."""
    responses = method(request, timeout=timeout, metadata=call_metadata(request_id, metadata))
    try:
        async for response in responses:
            yield response
    except grpc.aio.AioRpcError as exc:
        raise error_from_rpc(exc) from exc
    finally:
        # The consumer may stop early; tell the server instead of leaving the stream open.
        responses.cancel()


class GrpcClient:
    """What every service client shares: a channel to ``address``, unary calls within
    ``timeout`` seconds retried as ``retry`` allows, and closing (also as ``async with``);
    over TLS with ``tls`` (see :func:`open_channel`)."""

    def __init__(
        self, address: str, *, timeout: float, retry: RetryPolicy, tls: TlsSettings | None = None
    ) -> None:
        self.address = address
        self.channel: grpc.aio.Channel = open_channel(address, tls=tls)
        self.timeout = timeout
        self.retry = retry

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[Request, Response],
        request: Request,
        seconds: float | None = None,
        *,
        repeatable: bool = False,
    ) -> Response:
        """One unary call, within ``seconds`` (default: the client's timeout); ``repeatable``
        as for :func:`call`."""
        return await call(
            method,
            request,
            timeout=seconds or self.timeout,
            retry=self.retry,
            repeatable=repeatable,
        )

    async def close(self) -> None:
        await self.channel.close(None)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
