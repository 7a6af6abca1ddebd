"""One shard's share of a dataflow: the state of every stateful operator for the keys it owns.

In-process, a ``Dataflow`` keeps P workers side by side. On Spark, each resident task owns
one worker and runs the graph itself, exchanging updates with the other tasks before each
stateful node (``services/compute/spark/mesh.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from services.compute.dataflow.batch import Update
from services.compute.dataflow.graph import Graph
from services.compute.dataflow.guard import UNGUARDED, Guard
from services.compute.dataflow.operators.base import OperatorState, StatefulOperator
from services.compute.dataflow.operators.reduce import ReduceState
from services.compute.dataflow.spill import StateBudget
from services.compute.dataflow.work import StateSize, Work
from tidemark.errors import Internal


class ShardWorker:
    def __init__(
        self,
        graph: Graph,
        shard: int,
        guard: Guard = UNGUARDED,
        budget: StateBudget | None = None,
    ) -> None:
        """``budget``: the task's memory budget for operator state, which the state spills
        past (None: no bound)."""
        self.shard = shard
        self.states: dict[int, OperatorState] = {}
        for node in graph.stateful_nodes():
            assert isinstance(node.operator, StatefulOperator)
            state = node.operator.new_state()
            state.guard = guard
            if budget is not None:
                state.attach(budget)
            self.states[node.id] = state

    def release(self) -> None:
        """The shard is being dropped: its state stops counting against the budget, and
        what it spilled is deleted."""
        for state in self.states.values():
            state.release()

    def process(self, node_id: int, inputs: Sequence[list[Update]]) -> list[Update]:
        """Runs stateful node ``node_id`` on this shard's share of the step's input."""
        return self.states[node_id].process(inputs)

    def process_combined(self, node_id: int, partials: list[Update]) -> list[Update]:
        """``process`` of node ``node_id``'s input as the partial rows every shard summed its
        share into (``StatefulOperator.combine``), those of this shard's keys."""
        return self.states[node_id].process_combined(partials)

    def load(self, node_id: int, inputs: Sequence[list[Update]]) -> None:
        """``process`` into the empty state of ``node_id``, its output not wanted."""
        self.states[node_id].load(inputs)

    def load_columnar(self, node_id: int, inputs: Sequence[pa.Table | None], time: int) -> None:
        """``load`` of inputs given as Arrow tables (``OperatorState.load_columnar``)."""
        self.states[node_id].load_columnar(inputs, time)

    def load_group_states(self, node_id: int, table: pa.Table, key_width: int) -> None:
        """Loads Reduce ``node_id``'s groups as Spark aggregated them
        (``ReduceState.load_group_states``)."""
        state = self.states[node_id]
        if not isinstance(state, ReduceState):
            raise Internal(f"node {node_id} is not a reduce: it has no group states to load")
        state.load_group_states(table, key_width)

    def work(self) -> Work:
        total = Work()
        for state in self.states.values():
            total.add(state.work)
        return total

    def key_count(self) -> int:
        return sum(state.key_count() for state in self.states.values())

    def held_bytes(self) -> int:
        """The estimated memory of this shard's operator state (for budgets)."""
        return sum(state.held_bytes() for state in self.states.values())

    def row_count(self) -> int:
        """Entries held under the keys of this shard's operator state."""
        return sum(state.row_count() for state in self.states.values())

    def state_size(self) -> StateSize:
        spilled = sum(state.spilled_bytes() for state in self.states.values())
        return StateSize(self.key_count(), self.row_count(), self.held_bytes(), spilled)
