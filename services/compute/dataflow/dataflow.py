"""A maintained plan: feed it input updates, get output updates at exact times.

Lifecycle:

* ``Dataflow(plan, as_of=T)`` lowers and checks the plan.
* ``hydrate(snapshots)`` loads every input's contents as of ``T`` (earlier times are advanced
  to ``T``) and returns the output's contents at ``T`` as updates at ``T``, with upper
  ``T + 1``. Constant relations appear at ``T``.
* ``step(batches, input_upper)`` takes each input's updates at times in ``[upper,
  input_upper)``, processes them, and returns the output's updates for exactly those times,
  with the new upper ``input_upper`` (never beyond). The updates of a step may span many
  times; every output update carries the time at which the output changed.

Outputs come consolidated and sorted (row, then time), so the same input gives the same bytes
whatever the batching or sharding.

Operator state keeps only current contents: times are processed in increasing order and the
frontier guarantees no update arrives below ``upper``, so history is never re-read and is folded
away as soon as it is applied (a since that follows the upper). Reads at past times are the
business of an ``Index`` over the output.

With ``shards = P > 1`` the stateful operators' state is split across P workers by a stable
hash of the key, and updates are exchanged between workers before each stateful operator,
exactly as the Spark runtime does across resident tasks. The output does not depend on P.

A ``guard`` (``guard.py``) stops an evaluation part-way: it is checked between operators,
between chunks of a linear operator's input and inside the loops of stateful operators, against
its cancellation flag and its memory budget. An evaluation it stopped leaves the dataflow
unusable (its state is half-updated); its owner drops it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from services.compute.dataflow.batch import Update, consolidate
from services.compute.dataflow.exchange import exchange
from services.compute.dataflow.graph import ConstantSource, GetSource, Graph, Node
from services.compute.dataflow.guard import UNGUARDED, Guard, row_bytes
from services.compute.dataflow.lower import lower
from services.compute.dataflow.operators.base import LinearOperator, StatefulOperator
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.work import StateSize, Work
from services.compute.dataflow.worker import ShardWorker
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

MAX_TIME = 2**64 - 1

LINEAR_CHUNK = 65_536
"""Updates a linear operator maps between two guard checks."""

Batches = Mapping[str, Iterable[Update]]


class Dataflow:
    def __init__(
        self,
        plan: plan_pb2.Plan | plan_pb2.Relation,
        *,
        as_of: int,
        shards: int = 1,
        guard: Guard = UNGUARDED,
        budget: StateBudget | None = None,
        combine: bool = True,
    ) -> None:
        """``budget``: a memory budget the operator state spills past (None: no bound).
        ``combine``: whether an operator that combines its input (``StatefulOperator.combine``)
        gets each shard's share as partial rows, as resident tasks exchange them; without
        it, every shard's nodes are given the updates themselves."""
        if not 0 <= as_of < MAX_TIME:
            raise InvalidArgument(f"as_of {as_of} is not a time before 2**64 - 1")
        if shards < 1:
            raise InvalidArgument(f"a dataflow needs at least one shard, not {shards}")
        self.graph: Graph = lower(plan)
        self.as_of = as_of
        self.shards = shards
        self.guard = guard
        self._combine = combine
        self.workers = [ShardWorker(self.graph, shard, guard, budget) for shard in range(shards)]
        self._upper: int | None = None

    # -- description -----------------------------------------------------------------------

    @property
    def input_ids(self) -> tuple[str, ...]:
        """The collections the plan reads, in the order it first reads them."""
        return tuple(self.graph.inputs)

    @property
    def output_types(self) -> tuple[ScalarType, ...]:
        return self.graph.output_types

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.graph.output_names

    @property
    def upper(self) -> int | None:
        """The output is complete for times before this (None until hydrated)."""
        return self._upper

    def work(self) -> Work:
        """The arrangement work done so far, over all shards."""
        total = Work()
        for worker in self.workers:
            total.add(worker.work())
        return total

    def key_count(self) -> int:
        """Keys held in all arrangements, over all shards."""
        return sum(worker.key_count() for worker in self.workers)

    def held_bytes(self) -> int:
        """The estimated memory of the operator state, over all shards (``guard.py``)."""
        return sum(worker.held_bytes() for worker in self.workers)

    def state_size(self) -> StateSize:
        """Keys, entries and estimated bytes of the operator state, over all shards."""
        return sum((worker.state_size() for worker in self.workers), StateSize())

    # -- driving ---------------------------------------------------------------------------

    def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        """Loads the inputs as of ``as_of`` and returns the output's contents at ``as_of``
        (as updates at ``as_of``) and the output upper ``as_of + 1``."""
        if self._upper is not None:
            raise FailedPrecondition("the dataflow is already hydrated")
        as_of = self.as_of
        batches: dict[int, list[Update]] = {}
        for collection_id, updates in snapshots.items():
            node = self._input_node(collection_id)
            advanced = []
            for row, time, diff in updates:
                if not 0 <= time <= as_of:
                    raise InvalidArgument(
                        f"snapshot of {collection_id!r} holds time {time}, beyond as_of {as_of}"
                    )
                advanced.append((self._checked_row(node, row), as_of, diff))
            batches[node.id] = advanced
        output = self._run(batches, constants_at=as_of)
        self._upper = as_of + 1
        return output, as_of + 1

    def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        """Processes every input update at times in ``[upper, input_upper)`` and returns the
        output updates for those times and the new output upper, ``input_upper``."""
        lower_bound = self._upper
        if lower_bound is None:
            raise FailedPrecondition("hydrate the dataflow before stepping it")
        if not lower_bound <= input_upper <= MAX_TIME:
            raise InvalidArgument(
                f"input upper {input_upper} is before the dataflow's upper {lower_bound}"
            )
        by_node = self._step_rows(batches, lower_bound, input_upper)
        output = self._run(by_node, constants_at=None) if by_node else []
        self._upper = input_upper
        return output, input_upper

    def _step_rows(self, batches: Batches, lower: int, input_upper: int) -> dict[int, list[Update]]:
        """A step's input updates by source node, each checked to lie in ``[lower,
        input_upper)`` and to fit its input's columns."""
        by_node: dict[int, list[Update]] = {}
        for collection_id, updates in batches.items():
            node = self._input_node(collection_id)
            held = by_node.setdefault(node.id, [])
            for row, time, diff in updates:
                if not lower <= time < input_upper:
                    raise InvalidArgument(
                        f"update of {collection_id!r} at time {time} is outside "
                        f"[{lower}, {input_upper})"
                    )
                held.append((self._checked_row(node, row), time, diff))
        return by_node

    def _input_node(self, collection_id: str) -> Node:
        node_id = self.graph.inputs.get(collection_id)
        if node_id is None:
            raise InvalidArgument(
                f"collection {collection_id!r} is not an input of this dataflow "
                f"(inputs: {sorted(self.graph.inputs)})"
            )
        return self.graph.nodes[node_id]

    @staticmethod
    def _checked_row(node: Node, row: tuple[object, ...]) -> tuple[object, ...]:
        if not isinstance(row, tuple) or len(row) != len(node.types):
            raise InvalidArgument(f"{node.label}: {row!r} is not a row of {len(node.types)} values")
        return row

    # -- execution -------------------------------------------------------------------------

    def _run(self, sources: Mapping[int, list[Update]], constants_at: int | None) -> list[Update]:
        """Pushes one step's input through the graph, node by node in topological order.
        Each node's output is held per shard until its last consumer has run."""
        shards = self.shards
        guard = self.guard
        held: dict[int, list[list[Update]]] = {}
        pending = {node.id: node.consumers for node in self.graph.nodes}
        nodes = self.graph.nodes
        source_bytes = sum(
            len(updates) * row_bytes(len(nodes[i].types)) for i, updates in sources.items()
        )
        for node in nodes:
            op = node.operator
            # What the step holds while this node runs: its input, its operators' state, and
            # the batches of the nodes whose consumers have not all run yet.
            guard.held_bytes = (
                source_bytes
                + self.held_bytes()
                + sum(
                    len(part) * row_bytes(len(nodes[i].types))
                    for i, parts in held.items()
                    for part in parts
                )
            )
            guard.check()
            if isinstance(op, GetSource):
                parts = _spread(
                    _apply_linear(op.normalize, [sources.get(node.id, [])], guard), shards
                )
            elif isinstance(op, ConstantSource):
                rows = (
                    [(row, constants_at, diff) for row, diff in op.rows]
                    if constants_at is not None
                    else []
                )
                parts = _spread(rows, shards)
            elif isinstance(op, LinearOperator):
                parts = [
                    _apply_linear(op, [held[i][shard] for i in node.inputs], guard)
                    for shard in range(shards)
                ]
            else:
                assert isinstance(op, StatefulOperator)
                if op.combines and shards > 1 and self._combine:
                    (i,) = node.inputs
                    partials = exchange(
                        [op.combine(part) for part in held[i]], op.combined_route, shards
                    )
                    parts = [
                        worker.process_combined(node.id, partials[shard])
                        for shard, worker in enumerate(self.workers)
                    ]
                else:
                    routed = [
                        exchange(held[i], route, shards)
                        for i, route in zip(node.inputs, op.routes, strict=True)
                    ]
                    parts = [
                        worker.process(node.id, [inputs[shard] for inputs in routed])
                        for shard, worker in enumerate(self.workers)
                    ]
            held[node.id] = parts
            for i in node.inputs:
                pending[i] -= 1
                if pending[i] == 0 and i != self.graph.root:
                    del held[i]
        root_parts = held[self.graph.root]
        return consolidate(update for part in root_parts for update in part)


def _apply_linear(op: LinearOperator, inputs: Sequence[list[Update]], guard: Guard) -> list[Update]:
    """``op.apply(inputs)``, a chunk at a time with a guard check before each: a linear
    operator's output for a batch is the sum of its outputs for any split of it."""
    if sum(len(updates) for updates in inputs) <= LINEAR_CHUNK:
        return op.apply(inputs)
    out: list[Update] = []
    for position, updates in enumerate(inputs):
        for start in range(0, len(updates), LINEAR_CHUNK):
            guard.check()
            chunk = [
                updates[start : start + LINEAR_CHUNK] if i == position else []
                for i in range(len(inputs))
            ]
            out.extend(op.apply(chunk))
    return out


def _spread(updates: Sequence[Update], shards: int) -> list[list[Update]]:
    """Source updates dealt out across shards: where input lands is arbitrary (the exchange
    before each stateful operator routes it), so in-process runs deal it round-robin to show
    that nothing depends on where it starts."""
    if shards == 1:
        return [list(updates)]
    return [list(updates[shard::shards]) for shard in range(shards)]
