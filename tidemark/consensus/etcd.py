"""Consensus on etcd v3 through ``aetcd``: the production backend.

A version is the key's ``mod_revision``. Compare-and-set is one transaction: compare the
``mod_revision`` (or ``create_revision == 0`` for "absent"), put on success, read the key on
failure, so a mismatch reports the state it lost to.

Failures: every call has a deadline. A call that never reached a server (connection refused)
is :class:`Unavailable` and is retried on the next endpoint; a write that may have reached one
(deadline passed, connection lost mid-call) is :class:`Indeterminate`. A client whose
connection failed is retired and the next endpoint in the list is used from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
import grpc

from tidemark.consensus.base import (
    DEFAULT_MAX_VALUE_BYTES,
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    check_expected_version,
    check_write,
    encode_key,
    encode_prefix,
)
from tidemark.consensus.etcd_tls import EtcdTls
from tidemark.consensus.etcd_tls import client as etcd_client
from tidemark.errors import (
    Indeterminate,
    Internal,
    InvalidArgument,
    TidemarkError,
    Unavailable,
    ValueTooLarge,
)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
ETCD_MAX_VALUE_BYTES = DEFAULT_MAX_VALUE_BYTES

# Our own deadline sits just behind gRPC's, to bound anything aetcd does outside an RPC.
_DEADLINE_GRACE_S = 1.0
_WATCH_BACKOFF_INITIAL_S = 0.05
_WATCH_BACKOFF_MAX_S = 1.0

_CHANNEL_OPTIONS: dict[str, Any] = {
    # Scans of many large values can exceed gRPC's default 4 MiB receive limit.
    "grpc.max_receive_message_length": 256 * 1024 * 1024,
    # gRPC's default reconnect backoff grows to two minutes; a restarted etcd should be
    # picked up within about a second.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Detect a silently dead server under an idle watch stream. etcd refuses pings more
    # often than every 5 s (--grpc-keepalive-min-time).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
}

# Details of a failed TLS handshake or a certificate the other side refused.
_TLS_MARKERS = ("handshake failed", "tsi_", "certificate")

# UNAVAILABLE with these details means the request never left this process.
_NOT_SENT_MARKERS = ("failed to connect", "connection refused", "dns resolution failed")


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class _Failure:
    """How an etcd call failed: the error to raise, whether nothing was sent (so another
    endpoint may be tried), and whether the client's connection should be abandoned."""

    error: TidemarkError
    not_sent: bool
    broken: bool


def _classify(exc: BaseException, what: str, endpoint: Endpoint, *, writes: bool) -> _Failure:
    cause = exc.__cause__ if isinstance(exc.__cause__, grpc.aio.AioRpcError) else exc
    if isinstance(cause, grpc.aio.AioRpcError):
        code, details = cause.code(), cause.details() or ""
    elif isinstance(exc, TimeoutError | aetcd.ConnectionTimeoutError | aetcd.WatchTimeoutError):
        code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "no answer before the deadline"
    else:
        code, details = grpc.StatusCode.UNKNOWN, str(exc) or type(exc).__name__
    message = f"etcd {endpoint}: {what} failed: {code.name}: {details}"
    if any(marker in details.lower() for marker in _TLS_MARKERS):
        message += " (a TLS failure: check the consensus URL's ca, cert and key)"

    if code == grpc.StatusCode.INVALID_ARGUMENT:
        error_type = ValueTooLarge if "too large" in details else InvalidArgument
        return _Failure(error_type(message), not_sent=False, broken=False)
    if code == grpc.StatusCode.UNAVAILABLE and any(
        marker in details.lower() for marker in _NOT_SENT_MARKERS
    ):
        return _Failure(Unavailable(message), not_sent=True, broken=True)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Refused outright (message size, or etcd's space quota): nothing was applied.
        return _Failure(Unavailable(message), not_sent=False, broken=False)
    broken = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    if writes:
        return _Failure(
            Indeterminate(message + " (the write may have been applied)"), False, broken
        )
    return _Failure(Unavailable(message), not_sent=False, broken=broken)


class _ClientSlot:
    """The aetcd client for the endpoint in use. A client whose connection failed is retired
    (closed after in-flight calls have had their deadline) and the next endpoint is tried."""

    def __init__(
        self, endpoints: Sequence[Endpoint], timeout_s: float, tls: EtcdTls | None = None
    ) -> None:
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self.tls = tls
        self._index = 0
        self._client: aetcd.Client | None = None
        self._endpoint = self.endpoints[0]
        self._retiring: set[asyncio.Task[None]] = set()

    def get(self) -> tuple[aetcd.Client, Endpoint]:
        if self._client is None:
            self._endpoint = self.endpoints[self._index]
            self._client = etcd_client(
                self._endpoint.host,
                self._endpoint.port,
                self.tls,
                timeout=self.timeout_s,
                options=_CHANNEL_OPTIONS,
            )
        return self._client, self._endpoint

    def retire(self, client: aetcd.Client) -> None:
        if client is not self._client:
            return  # another caller already moved on
        self._client = None
        self._index = (self._index + 1) % len(self.endpoints)
        task = asyncio.get_running_loop().create_task(self._close_later(client))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_later(self, client: aetcd.Client) -> None:
        await asyncio.sleep(self.timeout_s)
        await _close_quietly(client, self.timeout_s)

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client, self.timeout_s)


async def _close_quietly(client: aetcd.Client, timeout_s: float) -> None:
    # Closing a client whose connection is already broken can itself fail; either way the
    # channel is gone and nothing more can be done about it.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await client.close()


def _range_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with ``prefix``" (``\\0``: no upper end)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _state(kv: Any) -> VersionedData:
    return VersionedData(int(kv.mod_revision), bytes(kv.value))


class EtcdConsensus(Consensus):
    max_value_bytes = ETCD_MAX_VALUE_BYTES

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tls: EtcdTls | None = None,
    ) -> None:
        """``tls``: connect over TLS (see :mod:`tidemark.consensus.etcd_tls`); plaintext
        without."""
        if not endpoints:
            raise InvalidArgument("etcd consensus needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        # Watch streams get their own connection, so a failing stream never takes calls
        # in flight down with it.
        self._kv = _ClientSlot(self.endpoints, timeout_s, tls)
        self._watch = _ClientSlot(self.endpoints, timeout_s, tls)
        self._closed = False

    async def _call(
        self, what: str, op: Callable[[aetcd.Client], Awaitable[T]], *, writes: bool
    ) -> T:
        """Run ``op`` against the current endpoint within the deadline, trying the other
        endpoints only while nothing has been sent."""
        deadline = time.monotonic() + self.timeout_s + _DEADLINE_GRACE_S
        # One attempt more than there are endpoints: the first may fail on a stale channel
        # to a server that has since come back.
        attempts = len(self.endpoints) + 1
        for attempt in range(attempts):
            if self._closed:
                raise Unavailable("etcd consensus store is closed")
            client, endpoint = self._kv.get()
            try:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    return await op(client)
            except (aetcd.ClientError, TimeoutError) as exc:
                failure = _classify(exc, what, endpoint, writes=writes)
                if failure.broken:
                    self._kv.retire(client)
                if failure.not_sent and attempt + 1 < attempts and time.monotonic() < deadline:
                    continue
                raise failure.error from exc
        raise AssertionError("unreachable")

    async def head(self, key: str) -> VersionedData | None:
        encoded = encode_key(key)

        async def op(client: aetcd.Client) -> VersionedData | None:
            found = await client.get(encoded)
            return None if found is None else _state(found)

        return await self._call(f"head {key!r}", op, writes=False)

    async def _head_at(self, key: bytes) -> tuple[VersionedData | None, int]:
        """The key's state and the store revision it was read at."""

        async def op(client: aetcd.Client) -> tuple[VersionedData | None, int]:
            found = await client.get_range(key, key + b"\0")
            state = _state(found[0]) if len(found) else None
            return state, int(found.header.revision)

        return await self._call(f"head {key!r}", op, writes=False)

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        encoded = check_write(key, expected_version, data, self.max_value_bytes)

        async def op(client: aetcd.Client) -> CasResult:
            txn = client.transactions
            compare = (
                txn.create(encoded) == 0
                if expected_version is None
                else txn.mod(encoded) == expected_version
            )
            succeeded, responses = await client.transaction(
                compare=[compare],
                success=[txn.put(encoded, data)],
                failure=[txn.get(encoded)],
            )
            if succeeded:
                # The put's own header carries the revision it created: the new version.
                revision = int(responses[0].response_put.header.revision)
                if revision <= 0:
                    raise Internal(f"etcd returned no revision for the write to {key!r}")
                return Committed(revision)
            return Mismatch(_state(responses[0][0][1]) if responses[0] else None)

        return await self._call(f"compare_and_set {key!r}", op, writes=True)

    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        encoded = encode_prefix(prefix)

        async def op(client: aetcd.Client) -> list[tuple[str, VersionedData]]:
            found = await client.get_range(encoded or b"\0", _range_end(encoded))
            return [(bytes(kv.key).decode("utf-8"), _state(kv)) for kv in found]

        result = await self._call(f"scan {prefix!r}", op, writes=False)
        result.sort(key=lambda item: item[0].encode("utf-8"))
        return result

    async def delete(self, key: str, expected_version: int) -> CasResult:
        encoded = encode_key(key)
        check_expected_version(expected_version)

        async def op(client: aetcd.Client) -> CasResult:
            txn = client.transactions
            succeeded, responses = await client.transaction(
                compare=[txn.mod(encoded) == expected_version],
                success=[txn.delete(encoded)],
                failure=[txn.get(encoded)],
            )
            if succeeded:
                return Committed(expected_version)
            return Mismatch(_state(responses[0][0][1]) if responses[0] else None)

        return await self._call(f"delete {key!r}", op, writes=True)

    async def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        encoded = encode_key(key)
        state, revision = await self._head_at(encoded)
        yield state
        last_seen = state.version if state else None
        backoff = _WATCH_BACKOFF_INITIAL_S
        while not self._closed:
            # Events strictly after the read: nothing between the read and the watch is lost.
            try:
                async with contextlib.aclosing(self._events_after(encoded, revision)) as events:
                    async for event in events:
                        backoff = _WATCH_BACKOFF_INITIAL_S
                        revision = int(event.kv.mod_revision)
                        state = _state(event.kv) if event.kind == "PUT" else None
                        version = state.version if state else None
                        if version != last_seen:
                            last_seen = version
                            yield state
            except (aetcd.ClientError, TimeoutError):
                pass  # the stream failed (server gone, history compacted): re-read below
            if self._closed:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _WATCH_BACKOFF_MAX_S)
            try:
                state, revision = await self._head_at(encoded)
            except Unavailable:
                continue  # still down; watching from the old revision later is still correct
            version = state.version if state else None
            if version != last_seen:
                last_seen = version
                yield state

    async def _events_after(self, key: bytes, revision: int) -> AsyncGenerator[Any, None]:
        """The key's events from ``revision + 1`` until the stream ends or fails."""
        client, _ = self._watch.get()
        try:
            async with asyncio.timeout(self.timeout_s + _DEADLINE_GRACE_S):
                stream = await client.watch(key, start_revision=revision + 1)
        except (aetcd.ClientError, TimeoutError) as exc:
            if not isinstance(exc, aetcd.RevisionCompactedError):
                self._watch.retire(client)
            raise
        try:
            async for event in stream:
                yield event
        except aetcd.RevisionCompactedError:
            raise
        except aetcd.ClientError:
            self._watch.retire(client)
            raise
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timeout_s):
                    await stream.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._kv.close()
        await self._watch.close()


def _loop_time(monotonic_deadline: float) -> float:
    """Convert a ``time.monotonic`` deadline to the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_deadline - time.monotonic())
