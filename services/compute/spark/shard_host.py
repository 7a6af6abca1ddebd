"""The body of a resident task: one shard of every installed dataflow, serving requests.

It runs in a Spark executor's Python worker, but depends only on a connected socket, so it
can be exercised without Spark.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa

from services.compute.dataflow.batch import Update, consolidate, whole_row
from services.compute.dataflow.exchange import partition
from services.compute.dataflow.graph import ConstantSource, GetSource, Graph, Node
from services.compute.dataflow.index import Index, with_index
from services.compute.dataflow.lower import columns_key, lower
from services.compute.dataflow.operators.base import LinearOperator, StatefulOperator
from services.compute.dataflow.operators.distinct import DistinctOperator
from services.compute.dataflow.operators.reduce import ReduceOperator
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.worker import ShardWorker
from services.compute.spark.liveness import Channel, Liveness, heartbeats
from services.compute.spark.mesh import MESH_LOST, PEER_FAILED, Mesh, MeshLost, PeerFailed
from services.compute.spark.part_shares import (
    keyed_sources,
    owned_rows,
    read_share,
    route_columns,
)
from services.compute.spark.requests import (
    ApplyIndex,
    CompactIndex,
    Drop,
    Hydrate,
    IndexChanges,
    Install,
    JoinMesh,
    LoadRows,
    MeshAddress,
    Peek,
    Ping,
    Reply,
    Request,
    Stats,
    Step,
    StepIO,
    StepWritten,
    Stop,
)
from services.compute.spark.staging import decode, get_all, rows_and_diffs
from services.compute.spark.step_io import kept_share, read_sources, write_share
from services.compute.spark.transport import normalizer
from services.compute.spark.wire import ConnectionLost
from tidemark.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
)
from tidemark.v1 import plan_pb2

FAULT_ENV = "TIDEMARK_TEST_FAULT_ONCE"
"""Test-only fault injection, ``<dataflow id>@<n>``: on each task, the n-th ``Step`` request
for that dataflow fails, once (every task gets every request round, so they all fail the same
round). The dataflow fails while its resident cluster stays healthy. Unset in
production."""

HOLD_ENV = "TIDEMARK_TEST_HOLD_STEP"
"""Test-only, ``<dataflow id>@<n>@<directory>``: each task, in the n-th ``Step`` of that
dataflow it gets, right after the step's first exchange, creates ``<directory>/held-<shard>``
and waits (beating) until ``<directory>/release`` exists, so that a test can kill a task while
a step is in flight, half exchanged. Unset in production."""


class _StepHold:
    def __init__(self, setting: str) -> None:
        self.dataflow_id, _, rest = setting.partition("@")
        count, _, self.directory = rest.partition("@")
        self.count = int(count) if count else 0
        self.seen = 0
        self.armed = False

    def arm(self, dataflow_id: str) -> None:
        if dataflow_id == self.dataflow_id:
            self.seen += 1
            self.armed = self.seen == self.count

    def wait(self, shard: int) -> None:
        if not self.armed:
            return
        self.armed = False
        open(os.path.join(self.directory, f"held-{shard}"), "w").close()
        release = os.path.join(self.directory, "release")
        give_up = time.monotonic() + 300.0
        while not os.path.exists(release) and time.monotonic() < give_up:
            time.sleep(0.05)


@dataclass
class HostedDataflow:
    graph: Graph
    worker: ShardWorker
    index: Index | None
    rows_owned: bool = False
    """Whether a task's output is disjoint by row from the others' as the graph leaves it
    (``_rows_owned``): it then writes it without exchanging it by row first."""
    keyed_sources: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """The sources whose parts a step may deal by key partition, with their key's columns
    (``part_shares.keyed_sources``)."""


INDEX_EXCHANGE = -2
"""The node id of a step's last exchange: the output, to the shards owning its index keys."""

OUTPUT_EXCHANGE = -3
"""Without an index, the exchange of a step's output by row before the tasks write it."""


class ShardHost:
    def __init__(
        self,
        shard: int,
        shards: int,
        budget: StateBudget | None = None,
        mesh: Mesh | None = None,
    ) -> None:
        """``budget``: the task's memory budget for the operator state of all its dataflows,
        which spills to local disk past it (None: no bound). ``mesh``: this task's
        connections to the other tasks (needed for steps when ``shards`` > 1)."""
        self.shard = shard
        self.shards = shards
        self.budget = budget
        self.mesh = mesh
        self._steps = 0
        self.dataflows: dict[str, HostedDataflow] = {}
        self._fault = _fault_from(os.environ.get(FAULT_ENV, ""))
        self._fault_count = 0
        hold = os.environ.get(HOLD_ENV, "")
        self._hold = _StepHold(hold) if hold else None

    def close(self) -> None:
        """Deletes the spilled state and ends the mesh (the task is ending)."""
        if self.mesh is not None:
            self.mesh.close()
        if self.budget is not None:
            self.budget.close()

    def serve(self, sock: socket.socket, liveness: Liveness | None = None) -> None:
        """Answers requests until ``Stop``; raises ``ConnectionLost`` when the connection
        breaks. With ``liveness``, beats while serving and gives the driver up (raising
        ``ConnectionLost``) after ``deadline_s`` without any frame from it."""
        if liveness is None:
            channel = Channel(sock)
            self._serve(channel, None)
        else:
            # Sends stay unbounded: the driver reads the shards' answers one after the
            # other, so a large answer may wait for another shard's to be read first.
            channel = Channel(sock, liveness.deadline_s, bound_sends=False)
            with heartbeats(channel, liveness.heartbeat_s):
                self._serve(channel, liveness.deadline_s)
        # Stopped: the last frame is the answer to Stop, after the heartbeats ended.
        channel.send(Reply())

    def _serve(self, channel: Channel, deadline_s: float | None) -> None:
        while True:
            waiting = time.monotonic()
            try:
                request = channel.receive()
            except ConnectionLost as error:
                # The socket's receive timeout: not even a ping came (``bound_stalls``).
                if deadline_s is not None and time.monotonic() - waiting >= deadline_s:
                    channel.shut()
                    raise ConnectionLost(f"no frame from the driver in {deadline_s} s") from error
                raise
            if isinstance(request, Ping):
                continue
            if isinstance(request, Stop):
                return
            try:
                reply = Reply(self.handle(cast(Request, request)))
            except MeshLost as error:  # the driver gives the cluster up
                reply = Reply(error_class=MESH_LOST, error_message=str(error))
            except PeerFailed as error:  # the peer reports the cause
                reply = Reply(error_class=PEER_FAILED, error_message=str(error))
            except Exception as error:  # reported to the driver; the task keeps serving
                reply = Reply(error_class=type(error).__name__, error_message=str(error))
            try:
                channel.send(reply)
            except TypeError as error:
                # An answer holding a value the typed wire cannot carry (nothing was sent
                # yet: a frame is encoded whole first): an error for this request, not the
                # end of the task and of every dataflow on it.
                channel.send(Reply(error_class="Internal", error_message=str(error)))

    def handle(self, request: Request) -> object:
        if isinstance(request, Install):
            self._install(request)
            return None
        if isinstance(request, Drop):
            hosted = self._hosted(request.dataflow_id)
            hosted.worker.release()
            if hosted.index is not None:
                hosted.index.release()
            del self.dataflows[request.dataflow_id]
            return None
        if isinstance(request, Step):
            return self._step(request)
        if isinstance(request, MeshAddress):
            return self._mesh().address
        if isinstance(request, JoinMesh):
            self._mesh().join(request.addresses, rejoin=request.rejoin)
            # A replacement numbers the steps on from where the lost task was.
            self._steps = request.steps
            return None
        if isinstance(request, Hydrate):
            return self._hydrate(request)
        if isinstance(request, LoadRows):
            return self._load_rows(request)
        if isinstance(request, ApplyIndex):
            self._index(request.dataflow_id).apply(request.updates, request.upper)
            return None
        if isinstance(request, CompactIndex):
            self._index(request.dataflow_id).compact(request.since)
            return None
        if isinstance(request, Peek):
            return self._index(request.dataflow_id).contents_at(request.time)
        if isinstance(request, IndexChanges):
            index = self._index(request.dataflow_id)
            return index.changes_between(request.lower, request.upper)
        if isinstance(request, Stats):
            hosted = self._hosted(request.dataflow_id)
            size = with_index(hosted.worker.state_size(), hosted.index)
            return size.keys, hosted.worker.work(), size.rows, size.bytes, size.spilled_bytes
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
            if self.budget is not None:
                index.attach(self.budget)
        self.dataflows[request.dataflow_id] = HostedDataflow(
            graph,
            ShardWorker(graph, self.shard, budget=self.budget),
            index,
            _rows_owned(graph),
            keyed_sources(graph),
        )

    def _step(self, request: Step) -> list[Update] | StepWritten:
        # Counted first, whatever happens next: every task numbers the same steps alike.
        self._steps += 1
        step = self._steps
        if self._hold is not None:
            self._hold.arm(request.dataflow_id)
        try:
            return self._run_step(step, request)
        except MeshLost:
            raise
        except Exception:
            if self.mesh is not None:
                self.mesh.fail_step(step)
            raise

    def _run_step(self, step: int, request: Step) -> list[Update] | StepWritten:
        """Pushes this task's share of a step through the graph in topological order, as
        ``Dataflow._run`` does for all shards: linear operators on what this task holds, and
        before each stateful node an exchange with every other task."""
        hosted = self._hosted(request.dataflow_id)
        if self._fault is not None and self._fault[0] == request.dataflow_id:
            self._fault_count += 1
            if self._fault_count == self._fault[1]:
                raise Internal(f"injected fault ({FAULT_ENV}) in Step {self._fault_count}")
        graph = hosted.graph
        nodes = graph.nodes
        sources, by_key = self._step_sources(request, hosted)
        held: dict[int, list[Update]] = {}
        # Per node from a keyed source to its stateful node, its updates already in this
        # task's key partition for that node: they skip the routing and stay here.
        kept: dict[int, list[Update]] = {}
        pending = {node.id: node.consumers for node in nodes}
        for node in nodes:
            op = node.operator
            if isinstance(op, GetSource):
                output = op.normalize.apply([sources.get(node.id, [])])
                if node.id in by_key:
                    kept[node.id] = op.normalize.apply([by_key[node.id]])
            elif isinstance(op, ConstantSource):
                at = request.constants_at
                output = (
                    [(row, at, diff) for row, diff in op.rows]
                    if at is not None and self.shard == 0
                    else []
                )
            elif isinstance(op, LinearOperator):
                output = op.apply([held[i] for i in node.inputs])
                if len(node.inputs) == 1 and node.inputs[0] in kept:
                    # On the way from a keyed source to its stateful node: the operator
                    # keeps the key's values, so the rows stay this task's.
                    kept[node.id] = op.apply([kept.pop(node.inputs[0])])
            else:
                output = self._run_stateful(step, hosted, node, held, kept)
            held[node.id] = output
            for i in node.inputs:
                pending[i] -= 1
                if pending[i] == 0 and i != graph.root:
                    del held[i]
        output = consolidate(held[graph.root])
        indexed: list[Update] | None = None
        if hosted.index is not None:
            shares = partition(output, columns_key(hosted.index.key_columns), self.shards)
            owned = self._exchange(step, INDEX_EXCHANGE, [(share,) for share in shares])
            # Consolidated: two tasks may have made the same row at the same time (a root
            # that is not keyed by row), and the index's history is read back as changes.
            indexed = consolidate(
                normalizer(graph.output_types).apply(
                    [[update for part in owned for update in part[0]]]
                )
            )
            hosted.index.apply(indexed, request.index_upper)
        if request.io is not None and request.io.output_collection:
            if indexed is None and hosted.rows_owned:
                indexed = output
            return self._write_output(step, request.io, graph, output, indexed)
        if request.io is not None and indexed is not None and not request.io.return_rows:
            # The output has nowhere to go but the index: the rows stay here.
            return kept_share(indexed)
        return output

    def _run_stateful(
        self,
        step: int,
        hosted: HostedDataflow,
        node: Node,
        held: dict[int, list[Update]],
        kept: dict[int, list[Update]],
    ) -> list[Update]:
        """Stateful ``node`` on this task's keys: its inputs' updates (``held``, and in
        ``kept`` those already in this task's key partition) exchanged with every other task
        first; an operator that combines sends one partial row per key and time instead."""
        op = node.operator
        assert isinstance(op, StatefulOperator)
        nodes = hosted.graph.nodes
        if op.combines and self.shards > 1:
            (i,) = node.inputs
            partials = op.combine([*held[i], *kept.pop(i, ())])
            shares = partition(partials, op.combined_route, self.shards)
            received = self._exchange(step, node.id, [(share,) for share in shares])
            return hosted.worker.process_combined(
                node.id, [update for part in received for update in part[0]]
            )
        routed = [
            partition(held[i], route, self.shards)
            for i, route in zip(node.inputs, op.routes, strict=True)
        ]
        for position, i in enumerate(node.inputs):
            if i in kept:
                routed[position][self.shard].extend(kept.pop(i))
        received = self._exchange(
            step, node.id, [tuple(parts[p] for parts in routed) for p in range(self.shards)]
        )
        # The wire loses the identity of the one canonical NaN the operators rely on.
        inputs = [
            normalizer(nodes[input_id].types).apply(
                [[update for part in received for update in part[position]]]
            )
            for position, input_id in enumerate(node.inputs)
        ]
        return hosted.worker.process(node.id, inputs)

    def _step_sources(
        self, request: Step, hosted: HostedDataflow
    ) -> tuple[dict[int, list[Update]], dict[int, list[Update]]]:
        """The step's source updates this task holds: those the driver sent, and those of
        the input parts it dealt this task (read first, so a part that is gone fails the
        step before any state changed); apart, those of parts read by key partition, which
        are this task's to keep (``step_io.read_sources``)."""
        sources = {node_id: list(updates) for node_id, updates in request.sources.items()}
        if request.io is None:
            return sources, {}
        read, owned = read_sources(request.io, hosted.keyed_sources, self.shard, self.shards)
        for node_id, updates in read.items():
            sources.setdefault(node_id, []).extend(updates)
        return sources, owned

    def _write_output(
        self,
        step: int,
        io: StepIO,
        graph: Graph,
        output: list[Update],
        indexed: list[Update] | None,
    ) -> StepWritten:
        """Writes this task's share of the output as a part: ``indexed``, consolidated and
        disjoint by row from the other tasks' already (the updates its index keys own, or
        the output of a root that keeps each row on one task); without it, those whose row
        it owns, after an exchange by the whole row."""
        if indexed is None:
            shares = partition(output, whole_row, self.shards)
            owned = self._exchange(step, OUTPUT_EXCHANGE, [(share,) for share in shares])
            # Two tasks may have made the same row at the same time.
            indexed = consolidate(
                normalizer(graph.output_types).apply(
                    [[update for part in owned for update in part[0]]]
                )
            )
        return write_share(io, indexed)

    def _exchange(
        self, step: int, node_id: int, parts: list[tuple[list[Update], ...]]
    ) -> list[tuple[list[Update], ...]]:
        if self.shards == 1:
            return parts
        received = self._mesh().exchange(step, node_id, parts)
        if self._hold is not None:
            self._hold.wait(self.shard)
        return received

    def _mesh(self) -> Mesh:
        if self.mesh is None:
            raise FailedPrecondition(f"shard {self.shard} of {self.shards} has no mesh")
        return self.mesh

    def _hydrate(self, request: Hydrate) -> tuple[int, int]:
        """Feeds each stateful node its staged input at ``as_of``, in topological order; the
        nodes' outputs are dropped (Spark staged what every later node reads)."""
        hosted = self._hosted(request.dataflow_id)
        keys = [key for inputs in request.nodes.values() for keys in inputs for key in keys]
        keys.extend(request.index)
        fetched = dict(zip(keys, get_all(request.blob_url, keys, request.environment), strict=True))
        graph, as_of = hosted.graph, request.as_of

        def staged(keys: Sequence[str], columns: Sequence[int] | None) -> pa.Table | None:
            """The rows of the objects ``keys`` this shard owns: with ``columns`` (a key of
            plain columns) the objects hold every shard's rows; otherwise only this one's."""
            if not keys:
                return None
            tables = [decode(fetched.pop(key)) for key in keys]
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if columns is not None:
                table = owned_rows(table, columns, self.shard, self.shards)
            return table if table.num_rows else None

        # Every input is read before any state changes: a part gone from the blob store
        # fails the load with this shard's state still empty.
        inputs: dict[int, list[pa.Table | None]] = {}
        group_states: dict[int, tuple[pa.Table, int]] = {}
        for node_id in sorted(request.nodes.keys() | request.shares.keys()):
            node = graph.nodes[node_id]
            if node_id in request.states:
                (objects,) = request.nodes[node_id]
                key_width = len(route_columns(graph, node_id, 0) or ())
                table = staged(objects, tuple(range(key_width)))
                if table is not None:
                    group_states[node_id] = (table, key_width)
                continue
            staged_keys = request.nodes.get(node_id) or ((),) * len(node.inputs)
            shares = request.shares.get(node_id) or (None,) * len(node.inputs)
            tables = inputs[node_id] = []
            for position, (objects, share) in enumerate(zip(staged_keys, shares, strict=True)):
                if share is None:
                    tables.append(staged(objects, route_columns(graph, node_id, position)))
                    continue
                key_columns = node.operator.key_columns[position]  # type: ignore[union-attr]
                tables.append(
                    read_share(
                        share, as_of, request.environment, key_columns, self.shard, self.shards
                    )
                )
        loaded = 0
        for node_id, tables in inputs.items():
            hosted.worker.load_columnar(node_id, tables, as_of)
            loaded += sum(table.num_rows for table in tables if table is not None)
        for node_id, (table, key_width) in group_states.items():
            hosted.worker.load_group_states(node_id, table, key_width)
            loaded += table.num_rows
        index_rows = 0
        if hosted.index is not None and request.complete:
            updates: list[Update] = []
            table = staged(request.index, hosted.index.key_columns)
            if table is not None:
                rows, diffs = rows_and_diffs(table, normalizer(graph.output_types))
                loaded += len(rows)
                index_rows = sum(diffs)
                updates = [(row, as_of, diff) for row, diff in zip(rows, diffs, strict=True)]
            hosted.index.apply(updates, as_of + 1)
        return loaded, index_rows

    def _load_rows(self, request: LoadRows) -> int:
        """Feeds each stateful node the rows the driver routed to this shard (their order
        does not matter: an operator's output is dropped, as in ``_hydrate``), and the
        index its part of the output."""
        hosted = self._hosted(request.dataflow_id)
        nodes = hosted.graph.nodes
        loaded = 0
        for node_id, received in sorted(request.nodes.items()):
            # The wire loses the identity of the one canonical NaN the operators rely on.
            inputs = [
                normalizer(nodes[input_id].types).apply([updates])
                for input_id, updates in zip(nodes[node_id].inputs, received, strict=True)
            ]
            hosted.worker.load(node_id, inputs)
            loaded += sum(len(updates) for updates in inputs)
        if hosted.index is not None:
            updates = normalizer(hosted.graph.output_types).apply([request.index])
            hosted.index.apply(updates, request.index_upper)
            loaded += len(updates)
        return loaded

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


def _rows_owned(graph: Graph) -> bool:
    """Whether every output row is made on one task only: the root is a reduce (its rows
    start with their group's key, which the exchange before it put on one task) or a
    distinct (exchanged by the whole row)."""
    return isinstance(graph.nodes[graph.root].operator, (ReduceOperator, DistinctOperator))


def _fault_from(setting: str) -> tuple[str, int] | None:
    if not setting:
        return None
    dataflow_id, _, count = setting.rpartition("@")
    return dataflow_id, int(count)
