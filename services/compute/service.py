"""The gRPC face of a compute process: protobuf messages in and out of the
``DataflowManager``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc.aio

from services.compute.engines import Engine
from services.compute.host import DataflowManager
from services.compute.spec import DataflowInputSpec, DataflowSpec
from tidemark.columnar import to_ipc
from tidemark.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from tidemark.rpc import Service
from tidemark.rpc.authorization import CallerPolicy, kinds
from tidemark.v1 import common_pb2, compute_pb2, compute_pb2_grpc, storage_pb2

Context = grpc.aio.ServicerContext[object, object]


def _reference(ref: storage_pb2.CapabilityRef) -> storage_pb2.CapabilityRef | None:
    """A capability the caller named, or ``None`` for "acquire one yourself"."""
    return ref if ref.id else None


def _inputs(inputs: list[compute_pb2.DataflowInput]) -> tuple[DataflowInputSpec, ...]:
    specs = []
    for item in inputs:
        ref = _reference(item.read_capability) if item.HasField("read_capability") else None
        specs.append(DataflowInputSpec(item.collection_id, ref))
    return tuple(specs)


def spec_from_request(request: compute_pb2.MaintainViewRequest) -> DataflowSpec:
    output_id: str | None = None
    write: storage_pb2.CapabilityRef | None = None
    index: tuple[int, ...] | None = None
    for output in request.outputs:
        kind = output.WhichOneof("kind")
        if kind == "collection":
            if output_id is not None:
                raise InvalidArgument("a dataflow writes at most one output collection")
            if not output.collection.collection_id:
                raise InvalidArgument("a collection output names no collection")
            output_id = output.collection.collection_id
            write = _reference(output.collection)
        elif kind == "index":
            if index is not None:
                raise InvalidArgument("a dataflow keeps at most one index")
            index = tuple(output.index.key_columns)
        else:
            raise InvalidArgument("an output is neither a collection nor an index")
    return DataflowSpec(
        dataflow_id=request.dataflow_id,
        plan=request.plan,
        inputs=_inputs(list(request.inputs)),
        output_collection_id=output_id,
        output_write_capability=write,
        index_key_columns=index,
        as_of=request.as_of if request.HasField("as_of") else None,
        from_catalog=False,
    )


# With mTLS on: a cluster takes its commands (views, peeks, subscriptions) from adapters only;
# tools may ask for its status.
COMPUTE_CALLERS = CallerPolicy(
    default=kinds("adapter"), methods={"Status": kinds("adapter", "client")}
)


class ComputeServicer(compute_pb2_grpc.ComputeServicer):
    def __init__(self, host: DataflowManager, engine: Engine, cluster: str) -> None:
        self.host = host
        self.engine = engine
        self.cluster = cluster

    async def MaintainView(
        self, request: compute_pb2.MaintainViewRequest, context: Context
    ) -> compute_pb2.MaintainViewResponse:
        as_of, schema = await self.host.install_view(spec_from_request(request))
        return compute_pb2.MaintainViewResponse(as_of=as_of, output_schema=schema.to_proto())

    async def DropView(
        self, request: compute_pb2.DropViewRequest, context: Context
    ) -> compute_pb2.DropViewResponse:
        await self.host.drop_view(request.dataflow_id)
        return compute_pb2.DropViewResponse()

    async def Peek(
        self, request: compute_pb2.PeekRequest, context: Context
    ) -> compute_pb2.PeekResponse:
        deadline = self.host.deadline(request.wait_ms, context.time_remaining())
        if request.catalog_ts:
            await self.host.wait_catalog(request.catalog_ts, deadline)
        target = request.WhichOneof("target")
        if target == "dataflow_id":
            finishing = request.finishing if request.HasField("finishing") else None
            answer = await self.host.peek_index(
                request.dataflow_id,
                request.timestamp,
                finishing,
                deadline,
                request.memory_budget_bytes,
                request.query_id,
            )
        elif target == "one_shot":
            if request.HasField("finishing"):
                raise InvalidArgument("a one-shot peek takes no finishing plan")
            answer = await self.host.peek_one_shot(
                request.one_shot.plan,
                _inputs(list(request.one_shot.inputs)),
                request.timestamp,
                deadline,
                request.memory_budget_bytes,
                request.query_id,
            )
        else:
            raise InvalidArgument("a peek names an index or a one-shot plan")
        return compute_pb2.PeekResponse(
            arrow_ipc=to_ipc(answer.table),
            schema=answer.schema.to_proto(),
            timestamp=answer.timestamp,
        )

    async def Subscribe(
        self, request: compute_pb2.ComputeSubscribeRequest, context: Context
    ) -> AsyncIterator[common_pb2.CdcMessage]:
        as_of = request.as_of if request.HasField("as_of") else None
        messages = self.host.subscribe(request.dataflow_id, as_of, snapshot=not request.no_snapshot)
        # Closed with the call: a subscriber gone releases its listener and holds at once.
        async with contextlib.aclosing(messages):
            async for message in messages:
                yield message

    async def AdvanceCatalogFrontier(
        self, request: compute_pb2.AdvanceCatalogFrontierRequest, context: Context
    ) -> compute_pb2.AdvanceCatalogFrontierResponse:
        if self.host.controller is None:
            raise FailedPrecondition(
                f"compute cluster {self.cluster!r} follows no catalog (started without --catalog)"
            )
        deadline = self.host.deadline(request.wait_ms, context.time_remaining())
        applied = await self.host.wait_catalog(request.catalog_ts, deadline)
        if applied <= request.catalog_ts:
            raise DeadlineExceeded(
                f"the catalog is applied before {applied}, not yet past {request.catalog_ts}"
            )
        return compute_pb2.AdvanceCatalogFrontierResponse(applied_upper=applied)

    async def Status(
        self, request: compute_pb2.StatusRequest, context: Context
    ) -> compute_pb2.StatusResponse:
        master, application = self.engine.describe()
        controller = self.host.controller
        queries = self.host.query_statuses(list(request.query_ids))
        return compute_pb2.StatusResponse(
            cluster=self.cluster,
            cluster_id=str(getattr(controller, "cluster_id", "") or ""),
            # A poll of some peeks' progress skips the dataflows (their arrangement sizes cost
            # a call to every resident task).
            dataflows=[] if request.query_ids else await self.host.status(),
            catalog_applied_upper=controller.applied_upper if controller is not None else 0,
            spark_master=master,
            spark_application_id=application,
            queries=queries,
        )


def compute_service(
    host: DataflowManager, engine: Engine, cluster: str
) -> Service[ComputeServicer]:
    return Service(
        compute_pb2.DESCRIPTOR.services_by_name["Compute"],
        ComputeServicer(host, engine, cluster),
        compute_pb2_grpc.add_ComputeServicer_to_server,
        callers=COMPUTE_CALLERS,
    )
