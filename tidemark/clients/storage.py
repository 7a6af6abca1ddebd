"""Client of the storage service (``tidemark.v1.Storage``).

Updates go in and come out as Arrow tables (the collection's columns, ``time``, ``diff``);
for small amounts, ``(row, time, diff)`` triples of Python tuples work too. Frontiers are
``Antichain[int]`` (``CLOSED`` is ``{}``); wherever one is expected an ``int`` ``t`` means
``{t}``.

Appends carry an idempotency token (a fresh one unless given) and are retried with it while
the outcome is unknown, so each append takes effect exactly once.

Subscriptions: :meth:`StorageClient.subscribe` yields CDCv2 messages with rows as tuples, ready
for :class:`tidemark.cdc.CdcReader`; :meth:`StorageClient.subscribe_arrow` yields Arrow tables
and progress statements; :meth:`StorageClient.subscribe_raw` the protobuf messages. A reader
that has the history through ``{r}`` resumes with ``as_of=r - 1, snapshot=False`` (and may
downgrade its read capability to ``r - 1``, not further, while it still needs the stream).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeAlias, TypeVar

import grpc.aio
import pyarrow as pa

from tidemark.cdc import Message, Progress, Updates
from tidemark.cdc.proto import from_proto as cdc_from_proto
from tidemark.cdc.proto import frontier_from_proto, frontier_to_proto
from tidemark.cdc.proto import to_proto as cdc_to_proto
from tidemark.columnar import (
    RelationSchema,
    Row,
    RowUpdate,
    from_ipc,
    frontier_bound,
    slices,
    table_from_updates,
    to_ipc,
    updates_from_table,
    version_from_table,
)
from tidemark.errors import (
    DeadlineExceeded,
    Indeterminate,
    InvalidArgument,
    TidemarkError,
    Unavailable,
)
from tidemark.frontier import Antichain, u64_frontier
from tidemark.logging import get_logger
from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, GrpcClient, error_from_rpc, stream
from tidemark.rpc.streamed_calls import StreamedCalls
from tidemark.rpc.tls import TlsSettings
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import common_pb2, storage_pb2, storage_pb2_grpc

log = get_logger("tidemark.clients.storage")

CLOSED: Antichain[int] = u64_frontier()
"""The empty frontier ``{}``."""

FrontierLike: TypeAlias = int | Antichain[int]
UpdatesLike: TypeAlias = pa.Table | Iterable[RowUpdate] | None

# Update batches this large go as one chunked append of compressed pieces (a bulk COPY, a
# source's snapshot): one message could not carry them, and compressed they are several times
# smaller on the wire.
CHUNKED_FROM_BYTES = 8 << 20
CHUNK_BYTES = 16 << 20

READ = "read"
WRITE = "write"
_KIND_NAMES = {
    storage_pb2.CAPABILITY_KIND_READ: READ,
    storage_pb2.CAPABILITY_KIND_WRITE: WRITE,
}


def frontier(value: FrontierLike) -> Antichain[int]:
    """``{t}`` for an ``int``; an antichain as it is."""
    return u64_frontier(value) if isinstance(value, int) else value


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    collection_id: str
    id: str
    kind: str
    """``"read"`` or ``"write"``."""
    frontier: Antichain[int]
    lease_expires_ms: int
    holder: str = ""
    critical: bool = False
    """A critical read capability: no lease, held until dropped."""

    @property
    def ref(self) -> storage_pb2.CapabilityRef:
        return storage_pb2.CapabilityRef(collection_id=self.collection_id, id=self.id)

    @property
    def usable(self) -> bool:
        """False for the empty-id capability AcquireCapabilities returns for a frontier that
        is already ``{}``."""
        return bool(self.id)

    @classmethod
    def from_proto(cls, proto: storage_pb2.Capability) -> Capability:
        return cls(
            proto.collection_id,
            proto.id,
            _KIND_NAMES.get(proto.kind, "unknown"),
            frontier_from_proto(proto.frontier),
            proto.lease_expires_ms,
            proto.holder,
            proto.critical,
        )


@dataclass(frozen=True)
class CapabilityPair:
    read: Capability
    write: Capability

    @classmethod
    def from_proto(cls, proto: storage_pb2.CapabilityPair) -> CapabilityPair:
        return cls(Capability.from_proto(proto.read), Capability.from_proto(proto.write))


@dataclass(frozen=True)
class AppendResult:
    upper: Antichain[int]
    already_committed: bool
    """The append had taken effect on an earlier attempt (the server recognised its token)."""


@dataclass(frozen=True)
class SnapshotResult:
    table: pa.Table
    """The rows, ``time`` (= ``as_of``) and ``diff`` (the multiplicity)."""
    as_of: int
    since: Antichain[int]
    upper: Antichain[int]

    def version(self) -> dict[Row, int]:
        """``{row: multiplicity}``."""
        return version_from_table(self.table)


@dataclass(frozen=True)
class RenewResult:
    renewed: list[Capability]
    missing: list[tuple[str, str]]
    """``(collection_id, capability_id)`` of capabilities that no longer exist."""
    lease_ms: int = 0
    """The length of the service's leases (0: it did not say)."""


@dataclass(frozen=True)
class IngestResult:
    upper: Antichain[int]
    intervals: int
    updates: int


@dataclass(frozen=True)
class CapabilityInfo:
    id_prefix: str
    kind: str
    frontier: Antichain[int]
    lease_expires_ms: int
    holder: str
    critical: bool = False


@dataclass(frozen=True)
class BatchInfo:
    key: str
    lower: Antichain[int]
    upper: Antichain[int]
    since: Antichain[int]
    rows: int
    bytes: int

    @classmethod
    def from_proto(cls, proto: storage_pb2.BatchSummary) -> BatchInfo:
        return cls(
            proto.key,
            frontier_from_proto(proto.lower),
            frontier_from_proto(proto.upper),
            frontier_from_proto(proto.since),
            proto.rows,
            proto.bytes,
        )


@dataclass(frozen=True)
class WrittenPart:
    """A Parquet part written to the blob store by a caller, for :meth:`StorageClient.
    append_parts`."""

    key: str
    rows: int
    bytes: int


def _interval_bounds(
    lower: common_pb2.Frontier, upper: common_pb2.Frontier
) -> tuple[int, int | None]:
    """An interval's bounds: ``lower`` is a time; ``upper`` ``None`` is no end (closed)."""
    start = frontier_bound(frontier_from_proto(lower))
    assert start is not None
    return start, frontier_bound(frontier_from_proto(upper))


@dataclass(frozen=True)
class PartsInterval:
    """One interval of ``Storage.SubscribeParts``: the parts in the blob store at
    ``blob_url`` holding the updates at times in ``[lower, upper)`` (``upper`` ``None``: the
    collection is closed), readable for at least ``retired_grace_ms`` after it came."""

    lower: int
    upper: int | None
    blob_url: str
    parts: list[BatchInfo]
    retired_grace_ms: int

    @classmethod
    def from_proto(cls, proto: storage_pb2.PartsInterval) -> PartsInterval:
        return cls(
            *_interval_bounds(proto.lower, proto.upper),
            proto.blob_url,
            [BatchInfo.from_proto(b) for b in proto.parts],
            proto.retired_grace_ms,
        )


@dataclass(frozen=True)
class JointPartsInterval:
    """One message of ``Storage.SubscribePartsJointly``: the inputs' meet moved from
    ``lower`` to ``upper`` (``None``: every input is closed); ``inputs[i]`` holds the ``i``-th
    input's intervals within it, in order."""

    lower: int
    upper: int | None
    inputs: list[list[PartsInterval]]

    @classmethod
    def from_proto(cls, proto: storage_pb2.JointPartsInterval) -> JointPartsInterval:
        return cls(
            *_interval_bounds(proto.lower, proto.upper),
            [[PartsInterval.from_proto(i) for i in item.intervals] for item in proto.inputs],
        )


@dataclass(frozen=True)
class PartsListing:
    """The Parquet parts holding a collection's updates at times ``<= as_of`` (see
    ``Storage.ListParts``): keys in the blob store at ``blob_url``, readable for at least
    ``retired_grace_ms`` after the listing even if compaction replaces them."""

    as_of: int
    schema: RelationSchema
    blob_url: str
    parts: list[BatchInfo]
    retired_grace_ms: int
    since: Antichain[int]
    upper: Antichain[int]

    @classmethod
    def from_proto(cls, proto: storage_pb2.ListPartsResponse) -> PartsListing:
        return cls(
            proto.as_of,
            RelationSchema.from_proto(proto.schema),
            proto.blob_url,
            [BatchInfo.from_proto(b) for b in proto.parts],
            proto.retired_grace_ms,
            frontier_from_proto(proto.since),
            frontier_from_proto(proto.upper),
        )


@dataclass(frozen=True)
class CollectionInfo:
    collection_id: str
    schema: RelationSchema
    since: Antichain[int]
    upper: Antichain[int]
    batch_count: int
    rows: int
    bytes: int
    capabilities: list[CapabilityInfo]
    batches: list[BatchInfo]
    state_version: int
    state_bytes: int
    created_ms: int
    tenant: str = ""
    writer: str = ""

    @classmethod
    def from_proto(cls, proto: storage_pb2.CollectionDescription) -> CollectionInfo:
        return cls(
            proto.collection_id,
            RelationSchema.from_proto(proto.schema),
            frontier_from_proto(proto.since),
            frontier_from_proto(proto.upper),
            proto.batch_count,
            proto.rows,
            proto.bytes,
            [
                CapabilityInfo(
                    c.id_prefix,
                    _KIND_NAMES.get(c.kind, "unknown"),
                    frontier_from_proto(c.frontier),
                    c.lease_expires_ms,
                    c.holder,
                    c.critical,
                )
                for c in proto.capabilities
            ],
            [BatchInfo.from_proto(b) for b in proto.batches],
            proto.state_version,
            proto.state_bytes,
            proto.created_ms,
            proto.tenant,
            proto.writer,
        )


# -- row filters ------------------------------------------------------------------------------

_OPS = {
    "=": storage_pb2.FILTER_OP_EQ,
    "!=": storage_pb2.FILTER_OP_NE,
    "<": storage_pb2.FILTER_OP_LT,
    "<=": storage_pb2.FILTER_OP_LE,
    ">": storage_pb2.FILTER_OP_GT,
    ">=": storage_pb2.FILTER_OP_GE,
    "is null": storage_pb2.FILTER_OP_IS_NULL,
    "is not null": storage_pb2.FILTER_OP_IS_NOT_NULL,
    "in": storage_pb2.FILTER_OP_IN,
}
_EPOCH = datetime.datetime(1970, 1, 1)


def filter_value(value: object) -> storage_pb2.FilterValue:
    """A Python constant as a filter operand."""
    if isinstance(value, bool):
        return storage_pb2.FilterValue(bool_value=value)
    if isinstance(value, int):
        return storage_pb2.FilterValue(int_value=value)
    if isinstance(value, float):
        return storage_pb2.FilterValue(float_value=value)
    if isinstance(value, str):
        return storage_pb2.FilterValue(text_value=value)
    if isinstance(value, bytes):
        return storage_pb2.FilterValue(bytes_value=value)
    if isinstance(value, decimal.Decimal):
        return storage_pb2.FilterValue(decimal_value=str(value))
    if isinstance(value, datetime.datetime):
        micros = (value - _EPOCH) // datetime.timedelta(microseconds=1)
        return storage_pb2.FilterValue(timestamp_value=micros)
    if isinstance(value, datetime.date):
        return storage_pb2.FilterValue(date_value=(value - _EPOCH.date()).days)
    raise InvalidArgument(f"no filter constant for {type(value).__name__} values")


def where(column: str, op: str, value: object = None) -> storage_pb2.ColumnPredicate:
    """One predicate, e.g. ``where("id", ">=", 10)``, ``where("name", "is null")``,
    ``where("kind", "in", ["a", "b"])``."""
    code = _OPS.get(op.lower())
    if code is None:
        raise InvalidArgument(f"unknown filter operator {op!r}; one of {sorted(_OPS)}")
    predicate = storage_pb2.ColumnPredicate(column=column, op=code)
    if code == storage_pb2.FILTER_OP_IN:
        predicate.values.extend(filter_value(v) for v in value)  # type: ignore[attr-defined]
    elif code not in (storage_pb2.FILTER_OP_IS_NULL, storage_pb2.FILTER_OP_IS_NOT_NULL):
        predicate.value.CopyFrom(filter_value(value))
    return predicate


def row_filter(*predicates: storage_pb2.ColumnPredicate) -> storage_pb2.RowFilter:
    """Rows for which every predicate holds."""
    return storage_pb2.RowFilter(predicates=predicates)


# -- the client -------------------------------------------------------------------------------


# The requests the append stream carries (``AppendStreamRequest.kind``).
AppendLike = TypeVar("AppendLike", storage_pb2.AppendRequest, storage_pb2.AppendPartsRequest)


def _append_message(
    sequence: int, request: storage_pb2.AppendRequest | storage_pb2.AppendPartsRequest
) -> storage_pb2.AppendStreamRequest:
    if isinstance(request, storage_pb2.AppendPartsRequest):
        return storage_pb2.AppendStreamRequest(sequence=sequence, append_parts=request)
    return storage_pb2.AppendStreamRequest(sequence=sequence, append=request)


def _append_outcome(
    message: storage_pb2.AppendStreamResponse,
) -> tuple[int, storage_pb2.AppendResponse | common_pb2.CallStatus]:
    if message.HasField("error"):
        return message.sequence, message.error
    return message.sequence, message.appended


class StorageClient(GrpcClient):
    """Calls retry while the service is unavailable (within ``retry``) and raise Tidemark
    errors otherwise; each unary call finishes within ``timeout`` seconds."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = CLIENT_RETRY,
        append_stream: bool = True,
        tls: TlsSettings | None = None,
    ) -> None:
        """``append_stream``: send appends (of updates or of parts) as messages of one
        long-lived ``AppendStream`` call (cheaper per append), rather than as ``Append`` and
        ``AppendParts`` calls."""
        super().__init__(address, timeout=timeout, retry=retry, tls=tls)
        self.stub = storage_pb2_grpc.StorageStub(self.channel)
        self._schemas: dict[str, RelationSchema] = {}
        self.append_stream = append_stream
        self._appends = StreamedCalls(
            self.stub.AppendStream,
            wrap=_append_message,
            unwrap=_append_outcome,
            retry=retry,
            name="storage append",
        )

    async def close(self) -> None:
        await self._appends.close()
        await super().close()

    # -- collections ------------------------------------------------------------------------

    async def create(
        self,
        collection_id: str,
        schema: RelationSchema,
        *,
        initial_frontier: int = 0,
        holder: str = "",
        critical_holder: str = "",
        tenant: str = "",
        writer: str = "",
    ) -> CapabilityPair:
        """A new collection and a read and write capability on it; with ``critical_holder``,
        also that holder's critical read capability (see :meth:`acquire_critical`).
        ``tenant`` (the database; empty: the system) and ``writer`` (the one identity that
        may write it) decide who may use it when storage checks identities (mTLS)."""
        request = storage_pb2.CreateRequest(
            collection_id=collection_id,
            schema=schema.to_proto(),
            initial_frontier=initial_frontier,
            holder=holder,
            critical_holder=critical_holder,
            tenant=tenant,
            writer=writer,
        )
        pair = CapabilityPair.from_proto(await self._call(self.stub.Create, request))
        self._schemas[collection_id] = schema
        return pair

    async def describe(self, collection_id: str) -> CollectionInfo:
        request = storage_pb2.DescribeRequest(collection_id=collection_id)
        info = CollectionInfo.from_proto(
            await self._call(self.stub.Describe, request, repeatable=True)
        )
        self._schemas[collection_id] = info.schema
        return info

    async def list(self) -> list[CollectionInfo]:
        response = await self._call(self.stub.List, storage_pb2.ListRequest(), repeatable=True)
        return [CollectionInfo.from_proto(d) for d in response.collections]

    async def schema(self, collection_id: str) -> RelationSchema:
        """The collection's schema (asked for once, then remembered)."""
        known = self._schemas.get(collection_id)
        if known is None:
            known = (await self.describe(collection_id)).schema
        return known

    # -- appends ----------------------------------------------------------------------------

    async def encode_updates(self, collection_id: str, updates: UpdatesLike) -> bytes:
        """The Arrow IPC form of ``updates`` (empty bytes for none)."""
        if updates is None:
            return b""
        if isinstance(updates, pa.Table):
            table = updates
        else:
            held = list(updates)
            if not held:
                return b""
            table = table_from_updates(await self.schema(collection_id), held)
        return to_ipc(table) if table.num_rows else b""

    async def append(
        self,
        capability: Capability,
        updates: UpdatesLike,
        new_upper: FrontierLike,
        *,
        token: str | None = None,
        expected_upper: FrontierLike | None = None,
    ) -> AppendResult:
        """Append ``updates`` (times in ``[capability's frontier, new_upper)``) and move the
        upper to ``new_upper``. The write capability's frontier is the upper it must meet;
        after a successful append the capability is at ``new_upper``."""
        data = await self.encode_updates(capability.collection_id, updates)
        return await self.append_ipc(
            capability, data, new_upper, token=token, expected_upper=expected_upper
        )

    async def append_ipc(
        self,
        capability: Capability,
        arrow_ipc: bytes,
        new_upper: FrontierLike,
        *,
        token: str | None = None,
        expected_upper: FrontierLike | None = None,
    ) -> AppendResult:
        """:meth:`append` with updates already encoded as an Arrow IPC stream."""
        request = storage_pb2.AppendRequest(
            capability=capability.ref,
            arrow_ipc=arrow_ipc,
            new_upper=frontier_to_proto(frontier(new_upper)),
            idempotency_token=token or uuid.uuid4().hex,
        )
        if expected_upper is not None:
            request.expected_upper.CopyFrom(frontier_to_proto(frontier(expected_upper)))
        return await self._append_until_known(request, self.stub.Append)

    async def _append_until_known(
        self,
        request: AppendLike,
        unary: grpc.aio.UnaryUnaryMultiCallable[AppendLike, storage_pb2.AppendResponse],
    ) -> AppendResult:
        """``request`` as a message on the append stream (as a ``unary`` call without
        ``append_stream``), sent again while its outcome is unknown (``_until_known``)."""

        async def send(seconds: float) -> storage_pb2.AppendResponse:
            if self.append_stream:
                return await self._appends.call(request, seconds)
            return await self._call(unary, request, seconds)

        return await self._until_known(send)

    async def _until_known(
        self,
        send: Callable[[float], Awaitable[storage_pb2.AppendResponse]],
        unknown: tuple[type[Exception], ...] = (Indeterminate, DeadlineExceeded),
    ) -> AppendResult:
        """``send(seconds)`` an append, again (under its same token) while its outcome is
        ``unknown``, within the client's timeout: a second attempt of a landed append is
        recognised, so it is safe."""
        deadline = time.monotonic() + self.timeout
        backoff = self.retry.backoffs()
        while True:
            try:
                response = await send(max(0.1, deadline - time.monotonic()))
                return AppendResult(frontier_from_proto(response.upper), response.already_committed)
            except unknown as exc:
                if backoff.expired() or time.monotonic() >= deadline:
                    raise
                log.debug("append_retry", error=str(exc))
            await backoff.sleep()

    async def append_parts(
        self,
        capability: Capability,
        parts: Sequence[WrittenPart],
        new_upper: FrontierLike,
        *,
        times: tuple[int, int] | None = None,
        token: str | None = None,
        expected_upper: FrontierLike | None = None,
    ) -> AppendResult:
        """Append the updates in Parquet ``parts`` written to the blob store elsewhere (see
        ``Storage.AppendParts``), as one batch; ``times``: their least and greatest update
        time (required with parts). Sent and retried like :meth:`append_ipc`, under one token."""
        request = storage_pb2.AppendPartsRequest(
            capability=capability.ref,
            parts=[storage_pb2.BatchSummary(key=p.key, rows=p.rows, bytes=p.bytes) for p in parts],
            new_upper=frontier_to_proto(frontier(new_upper)),
            idempotency_token=token or uuid.uuid4().hex,
        )
        if times is not None:
            request.least_time, request.greatest_time = times
        if expected_upper is not None:
            request.expected_upper.CopyFrom(frontier_to_proto(frontier(expected_upper)))
        return await self._append_until_known(request, self.stub.AppendParts)

    async def append_table(
        self,
        capability: Capability,
        updates: pa.Table,
        new_upper: FrontierLike,
        *,
        expected_upper: FrontierLike | None = None,
    ) -> AppendResult:
        """:meth:`append_ipc` of an update batch of any size: one message while it is small,
        else LZ4-compressed pieces of ``CHUNK_BYTES`` as one :meth:`append_chunked`."""
        if updates.nbytes < CHUNKED_FROM_BYTES:
            data = to_ipc(updates) if updates.num_rows else b""
            return await self.append_ipc(capability, data, new_upper, expected_upper=expected_upper)
        chunks = [to_ipc(part, compress=True) for part in slices(updates, 1 << 30, CHUNK_BYTES)]
        return await self.append_chunked(
            capability, chunks, new_upper, expected_upper=expected_upper
        )

    async def append_chunked(
        self,
        capability: Capability,
        chunks: Sequence[bytes],
        new_upper: FrontierLike,
        *,
        token: str | None = None,
        expected_upper: FrontierLike | None = None,
    ) -> AppendResult:
        """:meth:`append_ipc` for updates too large for one message: ``chunks`` are Arrow IPC
        streams, appended together as one append (retried with the same token when its
        outcome is unknown)."""
        request = storage_pb2.AppendRequest(
            capability=capability.ref,
            new_upper=frontier_to_proto(frontier(new_upper)),
            idempotency_token=token or uuid.uuid4().hex,
        )
        if expected_upper is not None:
            request.expected_upper.CopyFrom(frontier_to_proto(frontier(expected_upper)))

        async def messages() -> AsyncIterator[storage_pb2.AppendChunk]:
            yield storage_pb2.AppendChunk(append=request)
            for chunk in chunks:
                yield storage_pb2.AppendChunk(arrow_ipc=chunk)

        async def send(seconds: float) -> storage_pb2.AppendResponse:
            try:
                return await self.stub.AppendChunked(messages(), timeout=seconds)
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc) from exc

        # A streamed call gets no retries of its own: UNAVAILABLE is retried here too.
        return await self._until_known(send, (Indeterminate, DeadlineExceeded, Unavailable))

    # -- reads ------------------------------------------------------------------------------

    async def list_parts(
        self,
        capability: Capability,
        as_of: int | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline)
    ) -> PartsListing:
        """The parts to read the collection at ``as_of`` from (default: the capability's
        frontier); waits, within ``timeout``, until the upper has passed it."""
        request = storage_pb2.ListPartsRequest(capability=capability.ref)
        if as_of is not None:
            request.as_of = as_of
        response = await self._call(
            self.stub.ListParts, request, timeout or self.timeout, repeatable=True
        )
        return PartsListing.from_proto(response)

    async def snapshot(
        self,
        capability: Capability,
        as_of: int | None = None,
        *,
        columns: Sequence[str] = (),
        filter: storage_pb2.RowFilter | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline)
    ) -> SnapshotResult:
        """The collection at ``as_of`` (default: the capability's frontier); waits, within
        ``timeout``, until the upper has passed it."""
        request = storage_pb2.SnapshotRequest(capability=capability.ref, columns=columns)
        if as_of is not None:
            request.as_of = as_of
        if filter is not None:
            request.filter.CopyFrom(filter)
        tables: list[pa.Table] = []
        last: storage_pb2.SnapshotResponse | None = None
        async for response in stream(self.stub.Snapshot, request, timeout=timeout or self.timeout):
            tables.append(from_ipc(response.arrow_ipc))
            last = response
        if last is None:
            raise InvalidArgument("the snapshot stream was empty")
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        return SnapshotResult(
            table, last.as_of, frontier_from_proto(last.since), frontier_from_proto(last.upper)
        )

    def subscribe_raw(
        self,
        capability: Capability,
        *,
        snapshot: bool = True,
        columns: Sequence[str] = (),
        filter: storage_pb2.RowFilter | None = None,
        stop_at: FrontierLike | None = None,
        as_of: int | None = None,
        max_rows_per_message: int = 0,
        timeout: float | None = None,
    ) -> AsyncIterator[common_pb2.CdcMessage]:
        """The subscription's CDCv2 messages as sent. Stop iterating to cancel it."""
        options = storage_pb2.SubscribeOptions(
            no_snapshot=not snapshot, columns=columns, max_rows_per_message=max_rows_per_message
        )
        if filter is not None:
            options.filter.CopyFrom(filter)
        if stop_at is not None:
            options.stop_at.CopyFrom(frontier_to_proto(frontier(stop_at)))
        if as_of is not None:
            options.as_of = as_of
        request = storage_pb2.SubscribeRequest(capability=capability.ref, options=options)
        return stream(self.stub.SubscribeAt, request, timeout=timeout)

    async def subscribe_parts(
        self,
        capability: Capability,
        *,
        as_of: int | None = None,
        stop_at: FrontierLike | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline, passed through)
    ) -> AsyncIterator[PartsInterval]:
        """``Storage.SubscribeParts``: for every interval the upper moves by after ``as_of``,
        the parts holding its updates. Stop iterating to cancel it."""
        options = storage_pb2.SubscribeOptions(no_snapshot=True)
        if stop_at is not None:
            options.stop_at.CopyFrom(frontier_to_proto(frontier(stop_at)))
        if as_of is not None:
            options.as_of = as_of
        request = storage_pb2.SubscribeRequest(capability=capability.ref, options=options)
        async for message in stream(self.stub.SubscribeParts, request, timeout=timeout):
            yield PartsInterval.from_proto(message)

    async def subscribe_parts_jointly(
        self,
        inputs: Sequence[tuple[Capability, int | None]],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline, passed through)
    ) -> AsyncIterator[JointPartsInterval]:
        """``Storage.SubscribePartsJointly``: the parts of several inputs, each ``(capability,
        as_of)`` as for :meth:`subscribe_parts`, in one message each time the least of their
        uppers moves. Stop iterating to cancel it."""
        requests = []
        for capability, as_of in inputs:
            options = storage_pb2.SubscribeOptions(no_snapshot=True)
            if as_of is not None:
                options.as_of = as_of
            requests.append(
                storage_pb2.SubscribeRequest(capability=capability.ref, options=options)
            )
        request = storage_pb2.SubscribePartsJointlyRequest(inputs=requests)
        async for message in stream(self.stub.SubscribePartsJointly, request, timeout=timeout):
            yield JointPartsInterval.from_proto(message)

    async def subscribe_arrow(
        self, capability: Capability, **options: Any
    ) -> AsyncIterator[pa.Table | Progress[int]]:
        """Update batches as Arrow tables, and progress statements."""
        async for message in self.subscribe_raw(capability, **options):
            if message.WhichOneof("kind") == "updates" and message.updates.arrow_ipc:
                yield from_ipc(message.updates.arrow_ipc)
            else:
                decoded = cdc_from_proto(message)
                if isinstance(decoded, Progress):
                    yield decoded

    async def subscribe(
        self, capability: Capability, **options: Any
    ) -> AsyncIterator[Message[Row, int]]:
        """CDCv2 messages with rows as tuples (options as for :meth:`subscribe_raw`)."""
        async for message in self.subscribe_raw(capability, **options):
            yield cdc_from_proto(message, _decode_rows)  # type: ignore[misc]

    # -- capabilities -----------------------------------------------------------------------

    async def clone(self, capability: Capability, holder: str = "") -> Capability:
        request = storage_pb2.CloneCapabilityRequest(capability=capability.ref, holder=holder)
        return Capability.from_proto(await self._call(self.stub.CloneCapability, request))

    async def downgrade(self, capability: Capability, to: FrontierLike) -> Capability:
        """Move the capability forward to ``to`` (``CLOSED`` drops it)."""
        target = frontier(to)
        request = storage_pb2.DowngradeCapabilityRequest(
            capability=capability.ref, frontier=frontier_to_proto(target)
        )
        # Moving to the same frontier twice is harmless; dropping twice is not (NotFound).
        response = await self._call(
            self.stub.DowngradeCapability, request, repeatable=not target.is_empty()
        )
        return Capability.from_proto(response)

    async def drop(self, capability: Capability) -> None:
        request = storage_pb2.DropCapabilityRequest(capability=capability.ref)
        await self._call(self.stub.DropCapability, request)

    async def acquire(self, collection_id: str, holder: str = "") -> CapabilityPair:
        request = storage_pb2.AcquireCapabilitiesRequest(collection_id=collection_id, holder=holder)
        return CapabilityPair.from_proto(await self._call(self.stub.AcquireCapabilities, request))

    async def acquire_critical(self, collection_id: str, holder: str) -> Capability:
        """``holder``'s critical read capability: no lease, held until dropped; the same one
        on every call. ``FailedPrecondition`` when the since is already ``{}``."""
        request = storage_pb2.AcquireCapabilitiesRequest(
            collection_id=collection_id, holder=holder, critical=True
        )
        pair = await self._call(self.stub.AcquireCapabilities, request)
        return Capability.from_proto(pair.read)

    async def reset_history(self, collection_id: str, holder: str) -> Capability:
        """Start the collection's history afresh at its upper (storage.proto ResetHistory);
        ``holder``'s new critical read capability there."""
        request = storage_pb2.ResetHistoryRequest(collection_id=collection_id, holder=holder)
        return Capability.from_proto(await self._call(self.stub.ResetHistory, request))

    async def renew(self, capabilities: Iterable[Capability]) -> RenewResult:
        request = storage_pb2.RenewLeasesRequest(capabilities=[c.ref for c in capabilities])
        response = await self._call(self.stub.RenewLeases, request, repeatable=True)
        return RenewResult(
            [Capability.from_proto(c) for c in response.renewed],
            [(m.collection_id, m.id) for m in response.missing],
            response.lease_ms,
        )

    def keep_alive(self, capabilities: Iterable[Capability], every: float = 10.0) -> LeaseKeeper:
        """``async with client.keep_alive(caps):`` renews their leases every ``every``
        seconds, or three times per lease when the service's leases are shorter than that
        (``LeaseKeeper.next_wait``), until the block ends."""
        return LeaseKeeper(self, list(capabilities), every)

    # -- CDC ingestion ----------------------------------------------------------------------

    async def ingest_cdc(
        self,
        capability: Capability,
        messages: AsyncIterable[Message[Row, int] | common_pb2.CdcMessage]
        | Iterable[Message[Row, int] | common_pb2.CdcMessage],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline)
    ) -> IngestResult:
        """Send a CDCv2 stream (duplicates, reordering and re-batching allowed) through the
        write capability; the service appends each interval once it is complete."""
        schema = await self.schema(capability.collection_id)

        async def requests() -> AsyncIterator[storage_pb2.IngestCdcRequest]:
            yield storage_pb2.IngestCdcRequest(capability=capability.ref)
            if isinstance(messages, AsyncIterable):
                async for message in messages:
                    yield storage_pb2.IngestCdcRequest(message=_cdc_proto(schema, message))
            else:
                for message in messages:
                    yield storage_pb2.IngestCdcRequest(message=_cdc_proto(schema, message))

        try:
            response = await self.stub.IngestCdc(requests(), timeout=timeout or self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        return IngestResult(
            frontier_from_proto(response.upper),
            response.intervals_appended,
            response.updates_appended,
        )


def _decode_rows(data: bytes) -> list[RowUpdate]:
    return updates_from_table(from_ipc(data))


def _cdc_proto(
    schema: RelationSchema, message: Message[Row, int] | common_pb2.CdcMessage
) -> common_pb2.CdcMessage:
    if isinstance(message, common_pb2.CdcMessage):
        return message
    if isinstance(message, Updates):
        table = table_from_updates(schema, message.updates)
        return common_pb2.CdcMessage(updates=common_pb2.Updates(arrow_ipc=to_ipc(table)))
    return cdc_to_proto(message)


def renewal_wait(every: float, lease_ms: int) -> float:
    """Seconds until a holder's next renewal: ``every``, or a third of the service's lease
    (``lease_ms``, as its last renewal said; 0 until it has) when that is shorter. So a holder
    configured for longer leases than the service grants (two settings that must agree, and
    once did not) still renews in time, and a renewal held up twice in a row still lands
    before the lease ends. The length comes from the service, not from comparing its clock
    with this one. Never under 50 ms, whatever the service says."""
    if not lease_ms:
        return every
    return min(every, max(lease_ms / 3000, 0.05))


@dataclass
class LeaseKeeper:
    """Renews a set of capabilities in the background; see :meth:`StorageClient.keep_alive`."""

    client: StorageClient
    capabilities: list[Capability]
    every: float
    lost: set[tuple[str, str]] = field(default_factory=set)
    """Capabilities the service reported gone."""
    _task: asyncio.Task[None] | None = None

    lease_ms: int = 0
    """The service's lease length, as its last renewal said (0 until it says)."""

    async def _run(self) -> None:
        while True:
            live = [c for c in self.capabilities if (c.collection_id, c.id) not in self.lost]
            if live:
                try:
                    result = await self.client.renew(live)
                    self.lost.update(result.missing)
                    self.lease_ms = result.lease_ms or self.lease_ms
                except TidemarkError as exc:
                    log.warning("lease_renewal_failed", error=exc.message)
            await asyncio.sleep(self.next_wait())

    def next_wait(self) -> float:
        """Seconds until the next renewal (``renewal_wait``)."""
        return renewal_wait(self.every, self.lease_ms)

    async def __aenter__(self) -> LeaseKeeper:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
