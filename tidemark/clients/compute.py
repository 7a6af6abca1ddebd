"""Client of a compute process (``tidemark.v1.Compute``).

Installing a materialized view and an index, then reading them::

    compute = ComputeClient("127.0.0.1:6879")
    await compute.maintain_view("mv1", plan, [read_cap_a, read_cap_b], output=write_cap)
    await compute.maintain_view("idx1", plan, [read_cap_a], index_key_columns=[0])
    result = await compute.peek("idx1", timestamp=t)       # rows as (row, diff)
    result = await compute.peek(one_shot(plan, [read_cap_a]), timestamp=t)
    async for message in compute.subscribe("mv1"):          # CDCv2, rows as tuples
        ...

Capabilities handed to ``maintain_view`` become the dataflow's: it renews, downgrades and
finally drops them. A one-shot peek only uses its read capabilities for the call.

Peeks wait on the server (bounded by ``wait_ms``, default 30 s) for the catalog and the
dataflow's frontier; the call's own deadline is that wait plus the client timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

import pyarrow as pa

from tidemark.cdc import Message
from tidemark.cdc.proto import from_proto as cdc_from_proto
from tidemark.cdc.proto import frontier_from_proto
from tidemark.columnar import RelationSchema, Row, RowUpdate, from_ipc, updates_from_table
from tidemark.frontier import Antichain
from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, GrpcClient, stream
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import common_pb2, compute_pb2, compute_pb2_grpc, plan_pb2, storage_pb2

DEFAULT_PEEK_WAIT_MS = 30_000
"""The server's wait when a peek asks for none (compute.proto)."""

CapabilityLike: TypeAlias = Any
"""A ``tidemark.clients.storage.Capability`` or a ``storage_pb2.CapabilityRef``."""

PeekTarget: TypeAlias = str | compute_pb2.OneShotPlan
"""An index's dataflow id, or a one-shot plan (see :func:`one_shot`)."""


def capability_ref(capability: CapabilityLike) -> storage_pb2.CapabilityRef:
    """The wire reference to a capability (a ``Capability`` or already a ``CapabilityRef``)."""
    if isinstance(capability, storage_pb2.CapabilityRef):
        return capability
    return storage_pb2.CapabilityRef(collection_id=capability.collection_id, id=capability.id)


def dataflow_inputs(capabilities: Iterable[CapabilityLike]) -> list[compute_pb2.DataflowInput]:
    """One input per read capability, named by the capability's collection."""
    inputs = []
    for capability in capabilities:
        ref = capability_ref(capability)
        inputs.append(
            compute_pb2.DataflowInput(collection_id=ref.collection_id, read_capability=ref)
        )
    return inputs


def one_shot(plan: plan_pb2.Plan, inputs: Iterable[CapabilityLike]) -> compute_pb2.OneShotPlan:
    """A peek target evaluating ``plan`` once over the inputs these read capabilities name."""
    return compute_pb2.OneShotPlan(plan=plan, inputs=dataflow_inputs(inputs))


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaintainViewResult:
    as_of: int
    output_schema: RelationSchema


class PeekResult(NamedTuple):
    """``rows, schema, timestamp = await compute.peek(...)`` also works."""

    rows: list[tuple[Row, int]]
    """``(row, multiplicity)``, multiplicities never zero."""
    schema: RelationSchema
    timestamp: int


class PeekArrowResult(NamedTuple):
    table: pa.Table
    """The result's columns, ``time`` (= ``timestamp``) and ``diff``."""
    schema: RelationSchema
    timestamp: int


@dataclass(frozen=True)
class DataflowInfo:
    """One dataflow as ``Status`` reports it."""

    dataflow_id: str
    state: str
    """``"hydrating"``, ``"running"`` or ``"failed"``."""
    as_of: int
    upper: Antichain[int]
    since: Antichain[int]
    input_collection_ids: list[str]
    output_collection_ids: list[str]
    has_index: bool
    hydrated_rows: int
    hydration_rows_total: int
    lag_ms: int
    arrangement_keys: int
    index_rows: int
    from_catalog: bool
    error: str
    restarts: int = 0
    """Times the process restarted it after a failure; ``last_failure`` says why, the last
    time."""
    last_failure: str = ""
    hydration_parts_done: int = 0
    hydration_parts_total: int = 0
    state_rows: int = 0
    """Entries the operator state holds under ``arrangement_keys``, over all shards."""
    state_bytes: int = 0
    """The operator state's estimated bytes, over all shards."""
    state_spilled_bytes: int = 0
    """Of ``state_bytes``, the rows the resident tasks moved to their local disk."""
    shard_restores: int = 0
    """Times a lost task's shard of it was rebuilt on a new task (not a restart)."""

    @classmethod
    def from_proto(cls, proto: compute_pb2.DataflowStatus) -> DataflowInfo:
        return cls(
            dataflow_id=proto.dataflow_id,
            state=proto.state,
            as_of=proto.as_of,
            upper=frontier_from_proto(proto.upper),
            since=frontier_from_proto(proto.since),
            input_collection_ids=list(proto.input_collection_ids),
            output_collection_ids=list(proto.output_collection_ids),
            has_index=proto.has_index,
            hydrated_rows=proto.hydrated_rows,
            hydration_rows_total=proto.hydration_rows_total,
            lag_ms=proto.lag_ms,
            arrangement_keys=proto.arrangement_keys,
            index_rows=proto.index_rows,
            from_catalog=proto.from_catalog,
            error=proto.error,
            restarts=proto.restarts,
            last_failure=proto.last_failure,
            shard_restores=proto.shard_restores,
            hydration_parts_done=proto.hydration_parts_done,
            hydration_parts_total=proto.hydration_parts_total,
            state_rows=proto.state_rows,
            state_bytes=proto.state_bytes,
            state_spilled_bytes=proto.state_spilled_bytes,
        )


@dataclass(frozen=True)
class QueryInfo:
    """One running peek as ``Status`` reports it (compute.proto ``QueryStatus``)."""

    query_id: str
    state: str
    """``"waiting"`` (for ``waiting_for`` to hydrate, or a frontier) or ``"running"``."""
    waiting_for: list[str]
    parts_done: int
    parts_total: int
    rows_done: int
    rows_total: int
    elapsed_ms: int
    spark_job_group: str

    @classmethod
    def from_proto(cls, proto: compute_pb2.QueryStatus) -> QueryInfo:
        return cls(
            query_id=proto.query_id,
            state=proto.state,
            waiting_for=list(proto.waiting_for),
            parts_done=proto.parts_done,
            parts_total=proto.parts_total,
            rows_done=proto.rows_done,
            rows_total=proto.rows_total,
            elapsed_ms=proto.elapsed_ms,
            spark_job_group=proto.spark_job_group,
        )


@dataclass(frozen=True)
class ComputeStatus:
    cluster: str
    cluster_id: str
    dataflows: list[DataflowInfo]
    catalog_applied_upper: int
    spark_master: str
    spark_application_id: str
    queries: list[QueryInfo] = field(default_factory=list)
    """The peeks running when it was asked."""

    def dataflow(self, dataflow_id: str) -> DataflowInfo | None:
        return next((d for d in self.dataflows if d.dataflow_id == dataflow_id), None)


# -- the client -------------------------------------------------------------------------------


class ComputeClient(GrpcClient):
    """Calls retry while the process is unavailable (within ``retry``) and raise Tidemark
    errors otherwise; unary calls other than waits finish within ``timeout`` seconds."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy = CLIENT_RETRY,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, timeout=timeout, retry=retry, tls=tls)
        self.stub = compute_pb2_grpc.ComputeStub(self.channel)

    def _wait_deadline(self, wait_ms: int) -> float:
        return (wait_ms or DEFAULT_PEEK_WAIT_MS) / 1000 + self.timeout

    # -- dataflows --------------------------------------------------------------------------

    async def maintain_view(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan,
        inputs: Iterable[CapabilityLike],
        *,
        output: CapabilityLike | None = None,
        index_key_columns: Sequence[int] | None = None,
        as_of: int | None = None,
    ) -> MaintainViewResult:
        """Install a dataflow reading the collections of the read capabilities ``inputs``,
        appending to ``output``'s collection (a write capability) and/or keeping an index
        keyed by ``index_key_columns``. Hydration continues after the call returns."""
        request = compute_pb2.MaintainViewRequest(
            dataflow_id=dataflow_id, plan=plan, inputs=dataflow_inputs(inputs)
        )
        if output is not None:
            request.outputs.append(compute_pb2.DataflowOutput(collection=capability_ref(output)))
        if index_key_columns is not None:
            index = compute_pb2.IndexOutput(key_columns=list(index_key_columns))
            request.outputs.append(compute_pb2.DataflowOutput(index=index))
        if as_of is not None:
            request.as_of = as_of
        response = await self._call(self.stub.MaintainView, request)
        return MaintainViewResult(response.as_of, RelationSchema.from_proto(response.output_schema))

    async def drop_view(self, dataflow_id: str) -> None:
        await self._call(self.stub.DropView, compute_pb2.DropViewRequest(dataflow_id=dataflow_id))

    # -- reads ------------------------------------------------------------------------------

    async def peek_arrow(
        self,
        target: PeekTarget,
        timestamp: int,
        *,
        catalog_ts: int = 0,
        finishing: plan_pb2.Plan | None = None,
        wait_ms: int = 0,
        memory_budget_bytes: int = 0,
        query_id: str = "",
    ) -> PeekArrowResult:
        """The contents of an index (through ``finishing`` if given) or of a one-shot plan at
        ``timestamp``, as an Arrow table. ``memory_budget_bytes``: the evaluation's budget
        (0: the cluster's; never above it). ``query_id``: the peek's name while it runs, for
        :meth:`query_progress`."""
        request = compute_pb2.PeekRequest(
            timestamp=timestamp,
            catalog_ts=catalog_ts,
            wait_ms=wait_ms,
            memory_budget_bytes=memory_budget_bytes,
            query_id=query_id,
        )
        if isinstance(target, str):
            request.dataflow_id = target
        else:
            request.one_shot.CopyFrom(target)
        if finishing is not None:
            request.finishing.CopyFrom(finishing)
        response = await self._call(
            self.stub.Peek, request, self._wait_deadline(wait_ms), repeatable=True
        )
        return PeekArrowResult(
            from_ipc(response.arrow_ipc),
            RelationSchema.from_proto(response.schema),
            response.timestamp,
        )

    async def peek(
        self,
        target: PeekTarget,
        timestamp: int,
        *,
        catalog_ts: int = 0,
        finishing: plan_pb2.Plan | None = None,
        wait_ms: int = 0,
        memory_budget_bytes: int = 0,
        query_id: str = "",
    ) -> PeekResult:
        """:meth:`peek_arrow` with the rows as ``(row tuple, multiplicity)``."""
        result = await self.peek_arrow(
            target,
            timestamp,
            catalog_ts=catalog_ts,
            finishing=finishing,
            wait_ms=wait_ms,
            memory_budget_bytes=memory_budget_bytes,
            query_id=query_id,
        )
        rows = [(row, diff) for row, _, diff in updates_from_table(result.table)]
        return PeekResult(rows, result.schema, result.timestamp)

    def subscribe_raw(
        self,
        dataflow_id: str,
        *,
        as_of: int | None = None,
        snapshot: bool = True,
        timeout: float | None = None,
    ) -> AsyncIterator[common_pb2.CdcMessage]:
        """The dataflow's output as CDCv2 messages as sent. Stop iterating to cancel."""
        request = compute_pb2.ComputeSubscribeRequest(
            dataflow_id=dataflow_id, no_snapshot=not snapshot
        )
        if as_of is not None:
            request.as_of = as_of
        return stream(self.stub.Subscribe, request, timeout=timeout)

    async def subscribe(
        self,
        dataflow_id: str,
        *,
        as_of: int | None = None,
        snapshot: bool = True,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline of the stream)
    ) -> AsyncIterator[Message[Row, int]]:
        """The dataflow's contents as of ``as_of`` (default: its upper - 1; left out with
        ``snapshot=False``), then every later change: CDCv2 messages with rows as tuples,
        ready for :class:`tidemark.cdc.CdcReader`."""
        messages = self.subscribe_raw(dataflow_id, as_of=as_of, snapshot=snapshot, timeout=timeout)
        async for message in messages:
            yield cdc_from_proto(message, _decode_rows)  # type: ignore[misc]

    # -- the catalog and status -------------------------------------------------------------

    async def advance_catalog_frontier(self, catalog_ts: int, *, wait_ms: int = 0) -> int:
        """Wait until the process has applied every catalog change before ``catalog_ts``;
        the catalog frontier it has applied."""
        request = compute_pb2.AdvanceCatalogFrontierRequest(catalog_ts=catalog_ts, wait_ms=wait_ms)
        response = await self._call(
            self.stub.AdvanceCatalogFrontier, request, self._wait_deadline(wait_ms)
        )
        return int(response.applied_upper)

    async def status(self) -> ComputeStatus:
        response = await self._call(self.stub.Status, compute_pb2.StatusRequest(), repeatable=True)
        return ComputeStatus(
            response.cluster,
            response.cluster_id,
            [DataflowInfo.from_proto(d) for d in response.dataflows],
            response.catalog_applied_upper,
            response.spark_master,
            response.spark_application_id,
            [QueryInfo.from_proto(q) for q in response.queries],
        )

    async def query_progress(
        self,
        query_id: str,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109 (the gRPC deadline of the call)
    ) -> QueryInfo | None:
        """How far the peek named ``query_id`` has come, or ``None`` when it is not running
        (any more). A cheap call: Status of that peek alone."""
        request = compute_pb2.StatusRequest(query_ids=[query_id])
        response = await self._call(self.stub.Status, request, timeout, repeatable=True)
        for query in response.queries:
            if query.query_id == query_id:
                return QueryInfo.from_proto(query)
        return None


def _decode_rows(data: bytes) -> list[RowUpdate]:
    return updates_from_table(from_ipc(data))
