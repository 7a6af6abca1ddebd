"""The body of a resident task: one shard of every installed dataflow, serving requests.

It runs in a Spark executor's Python worker, but depends only on a connected socket, so it
can be exercised without Spark.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from services.compute.dataflow.batch import Update
from services.compute.dataflow.graph import Graph
from services.compute.dataflow.index import Index
from services.compute.dataflow.lower import lower
from services.compute.dataflow.worker import ShardWorker
from services.compute.spark.requests import (
    ApplyIndex,
    CompactIndex,
    Drop,
    Install,
    Peek,
    Process,
    Reply,
    Request,
    Stats,
    Stop,
)
from services.compute.spark.transport import normalizer
from services.compute.spark.wire import receive_message, send_message
from tidemark.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from tidemark.v1 import plan_pb2


@dataclass
class HostedDataflow:
    graph: Graph
    worker: ShardWorker
    index: Index | None


class ShardHost:
    def __init__(self, shard: int, shards: int) -> None:
        self.shard = shard
        self.shards = shards
        self.dataflows: dict[str, HostedDataflow] = {}

    def serve(self, sock: socket.socket) -> None:
        """Answers requests until ``Stop`` (or until the connection breaks, which raises)."""
        while True:
            request = receive_message(sock)
            if isinstance(request, Stop):
                send_message(sock, Reply())
                return
            try:
                reply = Reply(self.handle(request))
            except Exception as error:  # reported to the driver; the task keeps serving
                reply = Reply(error_class=type(error).__name__, error_message=str(error))
            send_message(sock, reply)

    def handle(self, request: Request) -> object:
        if isinstance(request, Install):
            self._install(request)
            return None
        if isinstance(request, Drop):
            self._hosted(request.dataflow_id)
            del self.dataflows[request.dataflow_id]
            return None
        if isinstance(request, Process):
            return self._process(request)
        if isinstance(request, ApplyIndex):
            self._index(request.dataflow_id).apply(request.updates, request.upper)
            return None
        if isinstance(request, CompactIndex):
            self._index(request.dataflow_id).compact(request.since)
            return None
        if isinstance(request, Peek):
            return self._index(request.dataflow_id).contents_at(request.time)
        if isinstance(request, Stats):
            hosted = self._hosted(request.dataflow_id)
            return hosted.worker.key_count(), hosted.worker.work()
        raise InvalidArgument(f"unknown request {type(request).__name__}")

    def _install(self, request: Install) -> None:
        if request.dataflow_id in self.dataflows:
            raise AlreadyExists(f"dataflow {request.dataflow_id!r} is already installed")
        plan: plan_pb2.Plan | plan_pb2.Relation = (
            plan_pb2.Relation() if request.is_relation else plan_pb2.Plan()
        )
        plan.ParseFromString(request.plan)
        graph = lower(plan)
        index = None
        if request.index_key_columns is not None:
            index = Index(request.index_key_columns, since=request.index_since)
        self.dataflows[request.dataflow_id] = HostedDataflow(
            graph, ShardWorker(graph, self.shard), index
        )

    def _process(self, request: Process) -> list[Update]:
        hosted = self._hosted(request.dataflow_id)
        node = hosted.graph.nodes[request.node_id]
        if not node.is_stateful or len(request.inputs) != len(node.inputs):
            raise InvalidArgument(f"{node.label} cannot process {len(request.inputs)} inputs")
        # Pickling loses the identity of the one canonical NaN the operators rely on.
        inputs = [
            normalizer(hosted.graph.nodes[input_id].types).apply([updates])
            for input_id, updates in zip(node.inputs, request.inputs, strict=True)
        ]
        return hosted.worker.process(node.id, inputs)

    def _hosted(self, dataflow_id: str) -> HostedDataflow:
        hosted = self.dataflows.get(dataflow_id)
        if hosted is None:
            raise NotFound(f"dataflow {dataflow_id!r} is not installed on shard {self.shard}")
        return hosted

    def _index(self, dataflow_id: str) -> Index:
        index = self._hosted(dataflow_id).index
        if index is None:
            raise FailedPrecondition(f"dataflow {dataflow_id!r} was installed without an index")
        return index
