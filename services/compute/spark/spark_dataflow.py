"""A ``Dataflow`` whose operator state lives in resident Spark tasks.

Same lifecycle and outputs as the in-process ``Dataflow`` (``hydrate``, then ``step``), so
the service can use either. The driver walks the graph node by node: sources and linear
operators run on the driver over the step's (small) update lists; before each stateful node
the driver splits every input by the shard owning each row's key and sends shard ``p`` its
part, and the P tasks apply it to their state in parallel. One request round per stateful
node per step.

Optionally the tasks also keep the output in a sharded ``Index`` (``index_key_columns``),
which ``peek`` reads at past times from its since on; ``compact_index`` moves that since.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping, Sequence

from services.compute.dataflow.batch import Row, Update, consolidate
from services.compute.dataflow.dataflow import Batches, Dataflow
from services.compute.dataflow.exchange import partition
from services.compute.dataflow.graph import ConstantSource, GetSource
from services.compute.dataflow.guard import UNGUARDED, Guard, row_bytes
from services.compute.dataflow.keys import shard_of
from services.compute.dataflow.operators.base import LinearOperator, StatefulOperator
from services.compute.dataflow.work import StateSize, Work
from services.compute.spark.requests import Hydrate
from services.compute.spark.resident import ResidentCluster
from services.compute.spark.transport import normalizer
from tidemark.errors import FailedPrecondition
from tidemark.v1 import plan_pb2


class SparkDataflow(Dataflow):
    def __init__(
        self,
        plan: plan_pb2.Plan | plan_pb2.Relation,
        *,
        as_of: int,
        cluster: ResidentCluster,
        dataflow_id: str | None = None,
        index_key_columns: Sequence[int] | None = None,
        guard: Guard = UNGUARDED,
    ) -> None:
        super().__init__(plan, as_of=as_of, shards=cluster.shards, guard=guard)
        self.plan = plan
        self.workers = []  # the shards' state is in the cluster's tasks
        self.cluster = cluster
        self.dataflow_id = dataflow_id or f"dataflow-{secrets.token_hex(8)}"
        self.index_key_columns = None if index_key_columns is None else tuple(index_key_columns)
        cluster.install(
            self.dataflow_id, plan, index_key_columns=self.index_key_columns, index_since=as_of
        )
        self._dropped = False

    def work(self) -> Work:
        return self.cluster.stats(self.dataflow_id)[1]

    def key_count(self) -> int:
        return self.cluster.stats(self.dataflow_id)[0]

    def state_size(self) -> StateSize:
        return self.cluster.stats(self.dataflow_id)[2]

    def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        output, upper = super().hydrate(snapshots)
        self._index(output, upper)
        return output, upper

    def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        output, upper = super().step(batches, input_upper)
        self._index(output, upper)
        return output, upper

    def load_staged(self, loads: Sequence[Hydrate]) -> tuple[int, int]:
        """Ends a hydration by Spark (``hydration.py``): every task loads its shard's staged
        inputs (``loads[p]`` is shard ``p``'s request), and the dataflow is hydrated at
        ``as_of`` from then on. Returns the updates loaded and the index's rows."""
        if self.upper is not None:
            raise FailedPrecondition("the dataflow is already hydrated")
        if self._dropped:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} was dropped")
        results = self.cluster.call(loads)
        self._upper = self.as_of + 1
        loaded = index_rows = 0
        for result in results:
            assert isinstance(result, tuple)
            loaded += result[0]
            index_rows += result[1]
        return loaded, index_rows

    async def ahydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        return await asyncio.to_thread(self.hydrate, snapshots)

    async def astep(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        return await asyncio.to_thread(self.step, batches, input_upper)

    def peek(self, time: int) -> dict[Row, int]:
        """The output's contents at ``time`` (within the index's readable range)."""
        if self.index_key_columns is None:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        return self.cluster.peek(self.dataflow_id, time)

    def compact_index(self, since: int) -> None:
        """Refuses peeks before ``since`` from now on, and lets the tasks fold the index's
        history up to it into one consolidated version (the index no longer grows with
        every step's updates)."""
        if self.index_key_columns is None:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        self.cluster.compact_index(self.dataflow_id, since)

    def drop(self) -> None:
        """Frees the dataflow's state in the tasks (the cluster keeps running)."""
        if not self._dropped:
            self._dropped = True
            self.cluster.drop(self.dataflow_id)

    def _index(self, output: list[Update], upper: int) -> None:
        columns = self.index_key_columns
        if columns is None:
            return
        parts: list[list[Update]] = [[] for _ in range(self.shards)]
        for update in output:
            parts[shard_of(tuple(update[0][c] for c in columns), self.shards)].append(update)
        self.cluster.apply_index(self.dataflow_id, parts, upper)

    def _run(self, sources: Mapping[int, list[Update]], constants_at: int | None) -> list[Update]:
        if self._dropped:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} was dropped")
        held: dict[int, list[Update]] = {}
        pending = {node.id: node.consumers for node in self.graph.nodes}
        nodes = self.graph.nodes
        guard = self.guard
        source_bytes = sum(
            len(updates) * row_bytes(len(nodes[i].types)) for i, updates in sources.items()
        )
        for node in nodes:
            op = node.operator
            # The driver's share of the budget: the batches it holds between nodes (the
            # tasks' arrangements are theirs).
            guard.held_bytes = source_bytes + sum(
                len(updates) * row_bytes(len(nodes[i].types)) for i, updates in held.items()
            )
            guard.check()
            if isinstance(op, GetSource):
                output = op.normalize.apply([sources.get(node.id, [])])
            elif isinstance(op, ConstantSource):
                output = (
                    [(row, constants_at, diff) for row, diff in op.rows]
                    if constants_at is not None
                    else []
                )
            elif isinstance(op, LinearOperator):
                output = op.apply([held[i] for i in node.inputs])
            else:
                assert isinstance(op, StatefulOperator)
                routed = [
                    partition(held[i], route, self.shards)
                    for i, route in zip(node.inputs, op.routes, strict=True)
                ]
                per_shard = [
                    tuple(inputs[shard] for inputs in routed) for shard in range(self.shards)
                ]
                results = self.cluster.process(self.dataflow_id, node.id, per_shard)
                output = normalizer(node.types).apply(
                    [[update for result in results for update in result]]
                )
            held[node.id] = output
            for i in node.inputs:
                pending[i] -= 1
                if pending[i] == 0 and i != self.graph.root:
                    del held[i]
        return consolidate(held[self.graph.root])
