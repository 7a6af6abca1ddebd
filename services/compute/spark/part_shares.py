"""A hydrating task's share of a join's input, read by the task straight from the parts.

A join's input that is a stored collection, or a projection of one, needs no Spark job to
reach the tasks: nothing is computed on its rows before the join. Staging it anyway costs
Spark turning every row into Arrow for a Python worker, a shuffle and a write and a read of
the staged objects. Instead each task reads the collection's parts at ``as_of`` itself
(``file://`` in place, S3 through the blob store's API), keeps the columns the join reads,
hashes each part's key columns with the tasks' own hash (``keys.shards_of``) and keeps the
rows its shard owns. Every task reads every part once: for the few tasks of a compute
cluster, far cheaper than the staging job (see ``services/compute/spark/README.md``).

The rows are read from the same parts, under the same listing and read hold, as the Spark
jobs that compute the other inputs and the output, so all of them see one ``as_of``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from services.compute.dataflow.graph import GetSource, Graph, Node
from services.compute.dataflow.keys import shards_of
from services.compute.dataflow.operators.distinct import DistinctOperator
from services.compute.dataflow.operators.join import JoinOperator
from services.compute.dataflow.operators.linear import Filter, Map, Negate, Normalize, Project
from services.compute.dataflow.operators.reduce import ReduceOperator
from services.compute.dataflow.operators.topk import TopKOperator
from services.compute.dataflow.operators.window import WindowOperator
from services.compute.spark.parts_source import all_at_or_before, at_time, iter_parts
from services.compute.spark.requests import PartsShare
from tidemark.clients.storage import PartsListing
from tidemark.columnar.schema import DIFF_COLUMN, TIME_COLUMN
from tidemark.v1 import plan_pb2


def route_columns(graph: Graph, node_id: int, position: int) -> tuple[int, ...] | None:
    """The columns the route of input ``position`` of stateful node ``node_id`` projects, in
    order, when it is a plain projection of the row (a join on plain columns, a reduce's,
    top-k's or window's groups, a distinct's whole row): their Arrow columns are then hashed
    whole (``keys.shards_of``), which gives each row the shard ``keys.shard_of`` gives its
    key. ``None``: a computed key (a join on expressions), hashed row by row."""
    node = graph.nodes[node_id]
    operator = node.operator
    if isinstance(operator, JoinOperator):
        return operator.key_columns[position]
    if not isinstance(operator, DistinctOperator | ReduceOperator | TopKOperator | WindowOperator):
        return None
    # These routes are column projections (``lower.columns_key`` or the whole row): applied
    # to the row of column numbers, one gives back the numbers it projects.
    width = len(graph.nodes[node.inputs[position]].types)
    probe = tuple(range(width))
    projected = tuple(operator.routes[position](probe))
    if all(isinstance(c, int) and 0 <= c < width for c in projected):
        return projected
    return None


def keyed_sources(graph: Graph) -> dict[int, tuple[int, ...]]:
    """The source nodes whose step rows a task can keep by key as it reads them, each with
    its key's columns (in the source's rows): a source whose rows reach one stateful node
    only, at one of its inputs, through a chain of operators that keep every row's values
    (filters, projections, maps, negations: ``_carried_columns``), and whose route there
    is plain columns (``route_columns``) that the chain carries from the source. Every task
    then keeps the rows of the key partition it owns (``owned_rows``), and the exchange
    before that node moves none of them: it would have sent each row to the task owning its
    key, the same one."""
    uses: dict[int, list[tuple[int, int]]] = {}
    for node in graph.nodes:
        for position, input_id in enumerate(node.inputs):
            uses.setdefault(input_id, []).append((node.id, position))
    keyed = {}
    for source in graph.nodes:
        if not isinstance(source.operator, GetSource):
            continue
        # Per operator along the chain, where each of its columns comes from in its input.
        chain: list[list[int | None]] = []
        current = source.id
        while len(uses.get(current, ())) == 1 and current != graph.root:
            ((consumer_id, position),) = uses[current]
            consumer = graph.nodes[consumer_id]
            if consumer.is_stateful:
                columns = route_columns(graph, consumer_id, position)
                # No key (a global aggregate): one task owns every row, and would decode
                # and carry them all alone while the others wait.
                if columns:
                    traced = _traced(columns, chain)
                    if traced is not None:
                        keyed[source.id] = traced
                break
            carried = _carried_columns(consumer, len(graph.nodes[current].types))
            if carried is None:
                break
            chain.append(carried)
            current = consumer_id
    return keyed


def _carried_columns(node: Node, input_width: int) -> list[int | None] | None:
    """For a linear operator that keeps its one input's values, the input column each of its
    output columns holds (``None``: computed); ``None`` for any other operator."""
    operator = node.operator
    if isinstance(operator, Filter | Negate | Normalize):
        return list(range(input_width))
    if isinstance(operator, Project):
        return list(operator.columns)
    if isinstance(operator, Map):
        return [*range(input_width), *([None] * len(operator.expressions))]
    return None


def _traced(
    columns: Sequence[int], chain: Sequence[Sequence[int | None]]
) -> tuple[int, ...] | None:
    """``columns`` of the chain's last rows as columns of its first (``None`` if one is
    computed on the way)."""
    traced: list[int | None] = list(columns)
    for carried in reversed(chain):
        traced = [None if column is None else carried[column] for column in traced]
    if any(column is None for column in traced):
        return None
    return tuple(column for column in traced if column is not None)


def owned_rows(table: pa.Table, key_columns: Sequence[int], shard: int, shards: int) -> pa.Table:
    """The rows of ``table`` whose key (its ``key_columns``) shard ``shard`` owns."""
    if shards == 1 or table.num_rows == 0:
        return table
    owners = shards_of([table.column(c) for c in key_columns], table.num_rows, shards)
    return table.filter(pa.array(owners == shard))


def projected_collection(relation: plan_pb2.Relation) -> tuple[str, tuple[int, ...]] | None:
    """``(collection id, its columns in order)`` when ``relation`` is a collection or a
    projection of one (of a projection...); ``None`` for anything that computes."""
    kind = relation.WhichOneof("kind")
    if kind == "get":
        return relation.get.collection_id, tuple(range(len(relation.get.schema.columns)))
    if kind == "project":
        inner = projected_collection(relation.project.input)
        if inner is None:
            return None
        collection_id, columns = inner
        return collection_id, tuple(columns[c] for c in relation.project.columns)
    return None


def share_for(
    graph: Graph, node_id: int, position: int, listings: Mapping[str, PartsListing]
) -> PartsShare | None:
    """The parts input ``position`` of stateful node ``node_id`` is read from by the tasks
    themselves, or ``None`` when Spark must stage it: it is not a join's input keyed by
    plain columns, or not a (projected) collection listed in ``listings``."""
    node = graph.nodes[node_id]
    operator = node.operator
    if not isinstance(operator, JoinOperator) or operator.key_columns[position] is None:
        return None
    relation = graph.nodes[node.inputs[position]].relation
    found = None if relation is None else projected_collection(relation)
    if found is None or found[0] not in listings:
        return None
    listing = listings[found[0]]
    names = tuple(listing.schema.columns[c].name for c in found[1])
    keys = tuple(part.key for part in listing.parts)
    return PartsShare(listing.blob_url, keys, names, not all_at_or_before(listing))


def plan_shares(
    graph: Graph, listings: Mapping[str, PartsListing]
) -> dict[int, tuple[PartsShare | None, ...]]:
    """Per stateful node with an input the tasks read from parts, that input's
    :func:`share_for` at its position (``None`` at the others)."""
    shares: dict[int, tuple[PartsShare | None, ...]] = {}
    for node in graph.stateful_nodes():
        slots = tuple(share_for(graph, node.id, p, listings) for p in range(len(node.inputs)))
        if any(share is not None for share in slots):
            shares[node.id] = slots
    return shares


def read_share(
    share: PartsShare,
    as_of: int,
    environment: Mapping[str, str],
    key_columns: Sequence[int],
    shard: int,
    shards: int,
) -> pa.Table | None:
    """This shard's rows of ``share`` at ``as_of``: its columns, then a last column of
    multiplicities (as a staged table has them); ``None`` when it has none. A part gone
    from the blob store raises ``MissingPart`` (the caller lists again)."""
    unique = list(dict.fromkeys(share.columns))
    # Read (and at_time) keep the data columns in the order asked, then the multiplicities.
    positions = [unique.index(name) for name in share.columns]
    names = [f"c{i}" for i in range(len(positions))] + [DIFF_COLUMN]
    read = [*unique, TIME_COLUMN, DIFF_COLUMN] if share.later_times else [*unique, DIFF_COLUMN]
    kept: list[pa.Table] = []
    for part in iter_parts(share.blob_url, share.keys, read, environment):
        # Without later times nothing is dropped, and equal rows need not be summed here:
        # the state sums what it loads.
        current = at_time(part, as_of) if share.later_times else part
        if current.num_rows == 0:
            continue
        rows = owned_rows(
            current.select([*positions, len(unique)]).rename_columns(names),
            key_columns,
            shard,
            shards,
        )
        if rows.num_rows:
            kept.append(rows)
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    # A part summed over several times comes back with its columns' nullability changed.
    return pa.concat_tables(kept, promote_options="permissive")
