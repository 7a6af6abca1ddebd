"""The lowered form of a plan: a DAG of operator nodes in topological order."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.compute.dataflow.batch import Row
from services.compute.dataflow.operators.base import LinearOperator, StatefulOperator
from services.compute.dataflow.operators.linear import Normalize
from tidemark.columnar.schema import RelationSchema
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2


@dataclass(frozen=True)
class GetSource:
    """An input collection. ``normalize`` reads its rows the contract's way (floats)."""

    collection_id: str
    normalize: Normalize


@dataclass(frozen=True)
class ConstantSource:
    """Rows present from the dataflow's start: emitted once, at ``as_of``."""

    rows: tuple[tuple[Row, int], ...]


Operator = GetSource | ConstantSource | LinearOperator | StatefulOperator


@dataclass
class Node:
    id: int
    label: str
    inputs: tuple[int, ...]
    types: tuple[ScalarType, ...]
    operator: Operator
    consumers: int = 0
    relation: plan_pb2.Relation | None = None
    """The plan relation this node computes (what a bulk engine computes it from)."""

    @property
    def is_stateful(self) -> bool:
        return isinstance(self.operator, StatefulOperator)


@dataclass
class Graph:
    """Nodes in an order where every node comes after its inputs; ``root`` is the output.
    A node used several times (a Let's value, an input read twice) appears once."""

    nodes: list[Node] = field(default_factory=list)
    root: int = -1
    inputs: dict[str, int] = field(default_factory=dict)
    output_names: tuple[str, ...] = ()
    output_schema: RelationSchema | None = None

    @property
    def output_types(self) -> tuple[ScalarType, ...]:
        return self.nodes[self.root].types

    def add(
        self, kind: str, inputs: tuple[int, ...], types: list[ScalarType], operator: Operator
    ) -> Node:
        node = Node(
            len(self.nodes), f"{kind} (node {len(self.nodes)})", inputs, tuple(types), operator
        )
        for input_id in inputs:
            self.nodes[input_id].consumers += 1
        self.nodes.append(node)
        return node

    def stateful_nodes(self) -> list[Node]:
        return [node for node in self.nodes if node.is_stateful]
