"""The gRPC face of storage: protobuf messages in and out of :class:`StorageCore`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc.aio
import pyarrow as pa

from services.storage import access
from services.storage.core import StorageCore
from services.storage.joint_parts import subscribe_jointly
from services.storage.operations import short_id
from services.storage.shards import Versioned
from services.storage.state import CapabilityRecord, PartRef, StoredBatch
from services.storage.subscriptions import (
    MAX_MESSAGE_DATA_BYTES,
    Event,
    PartsEvent,
    SubscribeSpec,
)
from tidemark.cdc import Progress
from tidemark.cdc.proto import frontier_from_proto, frontier_to_proto
from tidemark.cdc.proto import to_proto as cdc_to_proto
from tidemark.columnar import RelationSchema, bound_frontier, from_ipc, slices, to_ipc
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain, u64_frontier
from tidemark.rpc import Service
from tidemark.rpc.authorization import CallerPolicy, kinds
from tidemark.rpc.identity import current_caller
from tidemark.rpc.streamed_calls import answer_streamed_calls
from tidemark.v1 import common_pb2, storage_pb2, storage_pb2_grpc

Context = grpc.aio.ServicerContext[object, object]


# With mTLS on: the services that keep data. Which collections each may touch is decided per
# collection (its tenant and writer, see services.storage.access).
STORAGE_CALLERS = CallerPolicy(
    default=kinds("adapter", "catalog", "compute", "sources"),
    methods={
        "Create": kinds("adapter", "catalog"),
        "ResetHistory": kinds("adapter", "catalog", "compute"),
    },
)


def capability_proto(collection_id: str, record: CapabilityRecord) -> storage_pb2.Capability:
    return storage_pb2.Capability(
        collection_id=collection_id,
        id=record.id,
        kind=record.kind.value,  # type: ignore[arg-type]
        frontier=frontier_to_proto(record.frontier),
        lease_expires_ms=record.lease_expires_ms,
        holder=record.holder,
        critical=record.critical,
    )


def pair_proto(
    collection_id: str, pair: tuple[CapabilityRecord, CapabilityRecord]
) -> storage_pb2.CapabilityPair:
    return storage_pb2.CapabilityPair(
        read=capability_proto(collection_id, pair[0]),
        write=capability_proto(collection_id, pair[1]),
    )


def batch_summary(batch: StoredBatch, part: PartRef | None = None) -> storage_pb2.BatchSummary:
    """The batch (named by its first part, with every part's rows and bytes), or one of its
    ``part``s with the batch's time range."""
    return storage_pb2.BatchSummary(
        key=part.key if part else batch.key,
        lower=frontier_to_proto(batch.lower),
        upper=frontier_to_proto(batch.upper),
        since=frontier_to_proto(batch.since),
        rows=part.rows if part else batch.rows,
        bytes=part.size if part else batch.size,
    )


def description_proto(versioned: Versioned) -> storage_pb2.CollectionDescription:
    state = versioned.state
    return storage_pb2.CollectionDescription(
        collection_id=state.collection_id,
        schema=state.schema.to_proto(),
        since=frontier_to_proto(state.since),
        upper=frontier_to_proto(state.upper),
        batch_count=len(state.batches),
        rows=state.total_rows,
        bytes=state.total_bytes,
        capabilities=[
            storage_pb2.CapabilitySummary(
                id_prefix=short_id(c.id).rstrip("…"),
                kind=c.kind.value,  # type: ignore[arg-type]
                frontier=frontier_to_proto(c.frontier),
                lease_expires_ms=c.lease_expires_ms,
                holder=c.holder,
                critical=c.critical,
            )
            for c in state.capabilities
        ],
        batches=[batch_summary(b) for b in state.batches],
        state_version=versioned.version,
        state_bytes=versioned.size,
        created_ms=state.created_ms,
        tenant=state.tenant,
        writer=state.writer,
    )


def _expected_upper(
    request: storage_pb2.AppendRequest | storage_pb2.AppendPartsRequest,
) -> Antichain[int] | None:
    """The upper an append requires (compare-and-append), if it names one."""
    if not request.HasField("expected_upper"):
        return None
    return frontier_from_proto(request.expected_upper)


def required_frontier(message: object, field: str) -> Antichain[int]:
    """A frontier field that must be present: an absent one would read as ``{}``, which
    closes a collection forever, so it is never assumed."""
    if not message.HasField(field):  # type: ignore[attr-defined]
        raise InvalidArgument(f"{field} is required (an empty frontier must be given explicitly)")
    proto: common_pb2.Frontier = getattr(message, field)
    return frontier_from_proto(proto)


def _concatenated(parts: list[pa.Table]) -> pa.Table | None:
    """The updates of several IPC streams as one table; InvalidArgument when their columns
    differ."""
    if not parts:
        return None
    try:
        return pa.concat_tables(parts)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgument(f"the chunks' columns differ: {exc}") from None


def _owner() -> str:
    """The identity new capabilities are recorded as acquired by (empty without mTLS)."""
    caller = current_caller()
    return caller.uri if caller is not None else ""


def _subscribe_spec(
    options: storage_pb2.SubscribeOptions, *, max_rows: int = 0, parts_only: bool = False
) -> SubscribeSpec:
    """What a SubscribeAt or SubscribeParts request asks for."""
    return SubscribeSpec(
        snapshot=not options.no_snapshot,
        columns=tuple(options.columns),
        row_filter=options.filter if options.HasField("filter") else None,
        stop_at=frontier_from_proto(options.stop_at) if options.HasField("stop_at") else None,
        as_of=options.as_of if options.HasField("as_of") else None,
        max_rows=max_rows,
        parts_only=parts_only,
    )


def _ref(request: object) -> storage_pb2.CapabilityRef:
    if not request.HasField("capability"):  # type: ignore[attr-defined]
        raise InvalidArgument("the request names no capability")
    ref: storage_pb2.CapabilityRef = request.capability  # type: ignore[attr-defined]
    return ref


class StorageServicer(storage_pb2_grpc.StorageServicer):
    def __init__(self, core: StorageCore) -> None:
        self.core = core
        # Set when the server starts stopping: open append streams then end (see AppendStream).
        self.stopping = asyncio.Event()

    async def _check(self, collection_id: str, check: access.Check) -> None:
        """Applies an access rule when the caller has an identity (mTLS on)."""
        caller = current_caller()
        if caller is not None:
            check(caller, await self.core.owned_state(collection_id))

    async def _check_capability(self, collection_id: str, capability_id: str) -> None:
        caller = current_caller()
        if caller is None or caller.kind in access.OWNERS:
            return
        # A capability's kind never changes: a state that already has it will do.
        state = await self.core.owned_state(collection_id)
        if state.capability(capability_id) is None:
            state = await self.core.current_state(collection_id)
        access.check_capability(caller, state, state.capability(capability_id))

    async def Create(
        self, request: storage_pb2.CreateRequest, context: Context
    ) -> storage_pb2.CapabilityPair:
        schema = RelationSchema.from_proto(request.schema)
        access.check_policy(request.tenant, request.writer)
        pair = await self.core.create(
            request.collection_id,
            schema,
            initial_frontier=request.initial_frontier,
            holder=request.holder,
            critical_holder=request.critical_holder,
            tenant=request.tenant,
            writer=request.writer,
            owner=_owner(),
        )
        return pair_proto(request.collection_id, pair)

    async def Append(
        self, request: storage_pb2.AppendRequest, context: Context
    ) -> storage_pb2.AppendResponse:
        return await self._append(request)

    # Writes its responses itself (gRPC's reader/writer style), which the generated stub's
    # signature, written for generators, does not describe.
    async def AppendStream(  # type: ignore[override]
        self, request_iterator: AsyncIterator[storage_pb2.AppendStreamRequest], context: Context
    ) -> None:
        async def answer(
            message: storage_pb2.AppendStreamRequest,
        ) -> storage_pb2.AppendStreamResponse:
            kind = message.WhichOneof("kind")
            if kind == "append":
                appended = await self._append(message.append)
            elif kind == "append_parts":
                appended = await self._append_parts(message.append_parts)
            else:
                raise InvalidArgument("an AppendStream message holds an append or append_parts")
            return storage_pb2.AppendStreamResponse(sequence=message.sequence, appended=appended)

        def failed(
            message: storage_pb2.AppendStreamRequest, status: common_pb2.CallStatus
        ) -> storage_pb2.AppendStreamResponse:
            return storage_pb2.AppendStreamResponse(sequence=message.sequence, error=status)

        await answer_streamed_calls(
            request_iterator,
            context.write,
            answer,
            failed,
            method="/tidemark.v1.Storage/AppendStream",
            kind_of=lambda message: message.WhichOneof("kind") or "none",
            stopping=self.stopping,
        )

    async def AppendChunked(
        self, request_iterator: AsyncIterator[storage_pb2.AppendChunk], context: Context
    ) -> storage_pb2.AppendResponse:
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("append"):
            raise InvalidArgument("AppendChunked starts with a message holding the AppendRequest")
        parts = [from_ipc(first.append.arrow_ipc)] if first.append.arrow_ipc else []
        async for chunk in request_iterator:
            if chunk.HasField("append"):
                raise InvalidArgument("AppendChunked takes one AppendRequest, in its first message")
            if chunk.arrow_ipc:
                parts.append(from_ipc(chunk.arrow_ipc))
        return await self._append(first.append, parts)

    async def _append(
        self, request: storage_pb2.AppendRequest, parts: list[pa.Table] | None = None
    ) -> storage_pb2.AppendResponse:
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_write)
        if parts is None:
            updates = from_ipc(request.arrow_ipc) if request.arrow_ipc else None
        else:
            updates = _concatenated(parts)
        expected = _expected_upper(request)
        outcome = await self.core.append(
            ref.collection_id,
            ref.id,
            updates,
            required_frontier(request, "new_upper"),
            token=request.idempotency_token,
            expected_upper=expected,
        )
        return storage_pb2.AppendResponse(
            upper=frontier_to_proto(outcome.upper), already_committed=outcome.already_committed
        )

    async def AppendParts(
        self, request: storage_pb2.AppendPartsRequest, context: Context
    ) -> storage_pb2.AppendResponse:
        return await self._append_parts(request)

    async def _append_parts(
        self, request: storage_pb2.AppendPartsRequest
    ) -> storage_pb2.AppendResponse:
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_write)
        expected = _expected_upper(request)
        outcome = await self.core.append_parts(
            ref.collection_id,
            ref.id,
            [PartRef(p.key, p.rows, p.bytes) for p in request.parts],
            required_frontier(request, "new_upper"),
            times=(request.least_time, request.greatest_time),
            token=request.idempotency_token,
            expected_upper=expected,
        )
        return storage_pb2.AppendResponse(
            upper=frontier_to_proto(outcome.upper), already_committed=outcome.already_committed
        )

    async def SubscribeAt(
        self, request: storage_pb2.SubscribeRequest, context: Context
    ) -> AsyncIterator[common_pb2.CdcMessage]:
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_read)
        spec = _subscribe_spec(
            request.options,
            max_rows=request.options.max_rows_per_message
            or self.core.settings.max_rows_per_message,
        )
        async for event in self.core.subscribe(ref.collection_id, ref.id, spec):
            if isinstance(event, Progress):
                yield cdc_to_proto(event)
            else:
                yield common_pb2.CdcMessage(updates=common_pb2.Updates(arrow_ipc=to_ipc(event)))

    async def SubscribeParts(
        self, request: storage_pb2.SubscribeRequest, context: Context
    ) -> AsyncIterator[storage_pb2.PartsInterval]:
        async for event in await self._subscribe_parts(request):
            assert isinstance(event, PartsEvent)
            yield self._parts_interval(event)

    async def SubscribePartsJointly(
        self, request: storage_pb2.SubscribePartsJointlyRequest, context: Context
    ) -> AsyncIterator[storage_pb2.JointPartsInterval]:
        if not request.inputs:
            raise InvalidArgument("a joint subscription names at least one input")
        for item in request.inputs:
            if item.options.HasField("stop_at"):
                raise InvalidArgument("a joint subscription's inputs take no stop_at")
        streams = [await self._subscribe_parts(item) for item in request.inputs]
        # Closed here, when the call ends, rather than by the garbage collector later.
        async with contextlib.aclosing(subscribe_jointly(streams)) as events:
            async for event in events:
                yield storage_pb2.JointPartsInterval(
                    lower=frontier_to_proto(u64_frontier(event.lower)),
                    upper=frontier_to_proto(bound_frontier(event.upper)),
                    inputs=[
                        storage_pb2.InputPartsIntervals(
                            intervals=[self._parts_interval(interval) for interval in intervals]
                        )
                        for intervals in event.inputs
                    ],
                )

    async def _subscribe_parts(self, request: storage_pb2.SubscribeRequest) -> AsyncIterator[Event]:
        """A parts-only subscription, its access checked (it checks its request when first
        iterated)."""
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_read)
        spec = _subscribe_spec(request.options, parts_only=True)
        return self.core.subscribe(ref.collection_id, ref.id, spec)

    def _parts_interval(self, event: PartsEvent) -> storage_pb2.PartsInterval:
        return storage_pb2.PartsInterval(
            lower=frontier_to_proto(u64_frontier(event.lower)),
            upper=frontier_to_proto(bound_frontier(event.upper)),
            blob_url=self.core.blob_url,
            parts=[batch_summary(b, part) for b in event.batches for part in b.parts],
            retired_grace_ms=self.core.settings.retired_grace_ms,
        )

    async def Snapshot(
        self, request: storage_pb2.SnapshotRequest, context: Context
    ) -> AsyncIterator[storage_pb2.SnapshotResponse]:
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_read)
        result = await self.core.snapshot(
            ref.collection_id,
            ref.id,
            request.as_of if request.HasField("as_of") else None,
            columns=list(request.columns),
            row_filter=request.filter if request.HasField("filter") else None,
        )
        since = frontier_to_proto(result.since)
        upper = frontier_to_proto(result.upper)
        pieces = slices(
            result.table, self.core.settings.max_rows_per_message, MAX_MESSAGE_DATA_BYTES
        )
        for piece in pieces:
            yield storage_pb2.SnapshotResponse(
                arrow_ipc=to_ipc(piece), as_of=result.as_of, since=since, upper=upper
            )

    async def CloneCapability(
        self, request: storage_pb2.CloneCapabilityRequest, context: Context
    ) -> storage_pb2.Capability:
        ref = _ref(request)
        await self._check_capability(ref.collection_id, ref.id)
        record = await self.core.clone(ref.collection_id, ref.id, request.holder, owner=_owner())
        return capability_proto(ref.collection_id, record)

    async def DowngradeCapability(
        self, request: storage_pb2.DowngradeCapabilityRequest, context: Context
    ) -> storage_pb2.Capability:
        ref = _ref(request)
        await self._check_capability(ref.collection_id, ref.id)
        frontier = required_frontier(request, "frontier")
        record = await self.core.downgrade(ref.collection_id, ref.id, frontier)
        return capability_proto(ref.collection_id, record)

    async def DropCapability(
        self, request: storage_pb2.DropCapabilityRequest, context: Context
    ) -> storage_pb2.DropCapabilityResponse:
        ref = _ref(request)
        await self._check_capability(ref.collection_id, ref.id)
        await self.core.drop(ref.collection_id, ref.id)
        return storage_pb2.DropCapabilityResponse()

    async def AcquireCapabilities(
        self, request: storage_pb2.AcquireCapabilitiesRequest, context: Context
    ) -> storage_pb2.CapabilityPair:
        caller = current_caller()
        with_write = True
        if caller is not None:
            state = await self.core.owned_state(request.collection_id)
            if request.critical:
                access.check_owner(caller, state, "take a critical hold on")
            access.check_read(caller, state)
            # A reader that may not write gets no write capability (an empty one).
            with_write = access.may_write(caller, state)
        if request.critical:
            hold = await self.core.acquire_critical(request.collection_id, request.holder)
            return storage_pb2.CapabilityPair(read=capability_proto(request.collection_id, hold))
        pair = await self.core.acquire(
            request.collection_id, request.holder, with_write=with_write, owner=_owner()
        )
        return pair_proto(request.collection_id, pair)

    async def RenewLeases(
        self, request: storage_pb2.RenewLeasesRequest, context: Context
    ) -> storage_pb2.RenewLeasesResponse:
        for collection_id in {ref.collection_id for ref in request.capabilities}:
            await self._check(collection_id, access.check_read)
        renewed, missing = await self.core.renew(
            [(ref.collection_id, ref.id) for ref in request.capabilities]
        )
        return storage_pb2.RenewLeasesResponse(
            renewed=[capability_proto(c, record) for c, record in renewed],
            missing=[storage_pb2.CapabilityRef(collection_id=c, id=i) for c, i in missing],
            lease_ms=self.core.policy.lease_ms,
        )

    async def IngestCdc(
        self, request_iterator: AsyncIterator[storage_pb2.IngestCdcRequest], context: Context
    ) -> storage_pb2.IngestCdcResponse:
        requests = aiter(request_iterator)
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            raise InvalidArgument("IngestCdc needs at least one message") from None
        ref = _ref(first)
        await self._check(ref.collection_id, access.check_write)

        async def messages() -> AsyncIterator[common_pb2.CdcMessage]:
            if first.HasField("message"):
                yield first.message
            async for request in requests:
                if request.HasField("message"):
                    yield request.message

        result = await self.core.ingest(ref.collection_id, ref.id, messages())
        return storage_pb2.IngestCdcResponse(
            upper=frontier_to_proto(result.upper),
            intervals_appended=result.intervals,
            updates_appended=result.updates,
        )

    async def Describe(
        self, request: storage_pb2.DescribeRequest, context: Context
    ) -> storage_pb2.CollectionDescription:
        await self._check(request.collection_id, access.check_read)
        return description_proto(await self.core.describe(request.collection_id))

    async def List(
        self, request: storage_pb2.ListRequest, context: Context
    ) -> storage_pb2.ListResponse:
        caller = current_caller()
        described = [
            description_proto(v)
            for v in await self.core.list_collections()
            if access.may_read(caller, v.state)
        ]
        return storage_pb2.ListResponse(collections=described)

    async def ListParts(
        self, request: storage_pb2.ListPartsRequest, context: Context
    ) -> storage_pb2.ListPartsResponse:
        ref = _ref(request)
        await self._check(ref.collection_id, access.check_read)
        listing = await self.core.parts(
            ref.collection_id, ref.id, request.as_of if request.HasField("as_of") else None
        )
        state = listing.versioned.state
        return storage_pb2.ListPartsResponse(
            as_of=listing.as_of,
            schema=state.schema.to_proto(),
            blob_url=listing.blob_url,
            parts=[batch_summary(b, part) for b in listing.batches for part in b.parts],
            retired_grace_ms=self.core.settings.retired_grace_ms,
            since=frontier_to_proto(state.since),
            upper=frontier_to_proto(state.upper),
        )

    async def ResetHistory(
        self, request: storage_pb2.ResetHistoryRequest, context: Context
    ) -> storage_pb2.Capability:
        await self._check(request.collection_id, access.check_reset)
        record = await self.core.reset_history(request.collection_id, request.holder)
        return capability_proto(request.collection_id, record)


def storage_service(core: StorageCore) -> Service[StorageServicer]:
    # Hot: appends, snapshots and lease renewals come at high rates, so successful calls are
    # logged at debug (a line per call costs a good share of an append's CPU); failures and
    # the service's own events (collections created, ...) are still logged at info.
    servicer = StorageServicer(core)
    return Service(
        storage_pb2.DESCRIPTOR.services_by_name["Storage"],
        servicer,
        storage_pb2_grpc.add_StorageServicer_to_server,
        hot=True,
        on_stopping=servicer.stopping.set,
        callers=STORAGE_CALLERS,
    )
