"""A step's big input part read by key partition (``part_shares.keyed_sources``,
``spark_dataflow._deal``, ``step_io.read_sources``).

Which sources qualify is decided from the graph alone: read by one stateful node only, at
one input, whose route is plain columns. Each task then keeps the rows its shard owns as it
decodes the part, and the rows it keeps must be exactly those the exchange before the node
would have sent it: checked row by row against ``keys.shard_of`` of the operator's own route
over the normalized rows, for keys with NULLs, NaN, -0.0, text and decimals, and the tasks'
shares together must be the part's window, each row once.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow.graph import GetSource
from services.compute.dataflow.keys import shard_of
from services.compute.dataflow.lower import lower
from services.compute.spark.part_shares import keyed_sources
from services.compute.spark.requests import StepIO
from services.compute.spark.spark_dataflow import PartWindow, _deal
from services.compute.spark.step_io import read_sources
from tidemark.columnar import (
    Column,
    ColumnType,
    RelationSchema,
    table_from_updates,
    to_parquet,
    updates_from_table,
)
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

ORDERS = RelationSchema.of(
    ("o_id", ColumnType.INT64), ("cust", ColumnType.INT64), ("amount", ColumnType.INT64)
)
CUSTOMERS = RelationSchema.of(("cust", ColumnType.INT64), ("region", ColumnType.TEXT))


def _sources(root: Any) -> dict[str, tuple[int, ...] | None]:
    """Per input collection, its key's columns when its step parts may be read by key."""
    graph = lower(pb.plan(root, derive_schema(root)))
    keyed = keyed_sources(graph)
    return {
        node.operator.collection_id: keyed.get(node.id)
        for node in graph.nodes
        if isinstance(node.operator, GetSource)
    }


def test_sources_read_straight_by_a_stateful_node_on_plain_columns_are_keyed() -> None:
    orders, customers = pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS)
    joined = pb.join(orders, customers, [1], [0])
    assert _sources(pb.reduce(joined, [4], [pb.aggregate("count")])) == {
        "orders": (1,),
        "customers": (0,),
    }
    # A reduce's groups, a distinct's whole row.
    assert _sources(pb.reduce(orders, [1, 0], [pb.aggregate("count")])) == {"orders": (1, 0)}
    assert _sources(pb.distinct(customers)) == {"customers": (0, 1)}


def test_sources_reach_their_key_through_operators_that_keep_its_values() -> None:
    orders, customers = pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS)
    # A filter, a projection that moves the key, a map that appends a column, a negation.
    filtered = pb.filter(orders, pb.call("is_null", 2))
    assert _sources(pb.join(filtered, customers, [1], [0]))["orders"] == (1,)
    projected = pb.project(orders, 2, 1)
    assert _sources(pb.join(projected, customers, [1], [0]))["orders"] == (1,)
    plus_one = pb.call("add", 1, pb.literal(1, ColumnType.INT64))
    mapped = pb.negate(pb.map(orders, plus_one))
    assert _sources(pb.reduce(mapped, [0, 1], [pb.aggregate("count")]))["orders"] == (0, 1)
    # ...but not a key the map computes.
    assert _sources(pb.reduce(mapped, [3], [pb.aggregate("count")]))["orders"] is None


def test_sources_with_a_computed_key_or_other_readers_are_not_keyed() -> None:
    orders, customers = pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS)
    # A join on an expression: its key is computed.
    plus_one = pb.call("add", 1, pb.literal(1, ColumnType.INT64))
    assert _sources(pb.join(orders, customers, [plus_one], [0]))["orders"] is None
    # One source read twice (a self-join on different keys): no single partition fits both.
    assert _sources(pb.join(orders, orders, [0], [1])) == {"orders": None}
    # A union on the way: its other input's rows are not keyed.
    both = pb.union(pb.project(orders, 1), pb.project(customers, 0))
    assert _sources(pb.reduce(both, [0], [pb.aggregate("count")])) == {
        "orders": None,
        "customers": None,
    }
    # A source that is the output itself has no exchange to skip.
    assert _sources(orders) == {"orders": None}
    # No key at all (a global aggregate): one task would own every row.
    assert _sources(pb.reduce(orders, [], [pb.aggregate("count")])) == {"orders": None}


def test_a_big_part_of_a_keyed_source_is_dealt_to_every_task_by_key() -> None:
    windows = [(3, PartWindow("big", 4, 6, 500)), (5, PartWindow("other", 4, 6, 400))]
    # big (500 > 900 / 2) goes to both by key, other (400) whole to the first.
    assert _deal(windows, 2, keyed={3}) == [
        {3: [("big", 4, 6, 0, 0)], 5: [("other", 4, 6, 0, 1)]},
        {3: [("big", 4, 6, 0, 0)]},
    ]
    # Not keyed: sliced in runs of rows, as before.
    assert _deal(windows[:1], 2) == [{3: [("big", 4, 6, 0, 2)]}, {3: [("big", 4, 6, 1, 2)]}]
    # A small part stays whole on one task, to be routed as it is read.
    small = [(3, PartWindow("a", 4, 6, 300)), (3, PartWindow("b", 4, 6, 300))]
    assert _deal(small, 2, keyed={3}) == [{3: [("a", 4, 6, 0, 1)]}, {3: [("b", 4, 6, 0, 1)]}]


KEYED = RelationSchema(
    [
        Column("f", ColumnType.FLOAT64),
        Column("t", ColumnType.TEXT),
        Column("d", ColumnType.DECIMAL, precision=12, scale=2),
        Column("n", ColumnType.INT64),
    ]
)

keyed_updates = st.lists(
    st.tuples(
        st.tuples(
            st.one_of(
                st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.25, float("nan"), float("inf")])
            ),
            st.one_of(st.none(), st.sampled_from(["", "a", "b", "ç", "a b"])),
            st.one_of(st.none(), st.sampled_from([Decimal("1.00"), Decimal("-3.25"), Decimal(0)])),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        ),
        st.integers(1, 8),
        st.sampled_from([-2, -1, 1, 3]),
    ),
    max_size=60,
)


@pytest.mark.parametrize("shards", [2, 3])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(updates=keyed_updates, key=st.sampled_from([(0,), (1, 3), (2,), (3, 0, 1), (0, 1, 2, 3)]))
def test_each_task_keeps_exactly_the_rows_the_exchange_would_send_it(
    tmp_path: Path, shards: int, updates: list[Any], key: tuple[int, ...]
) -> None:
    root = pb.reduce(pb.get("c", KEYED), list(key), [pb.aggregate("count")])
    graph = lower(pb.plan(root, derive_schema(root)))
    source = next(node for node in graph.nodes if isinstance(node.operator, GetSource))
    assert isinstance(source.operator, GetSource)
    assert keyed_sources(graph) == {source.id: key}
    route = graph.nodes[graph.root].operator.routes[0]  # type: ignore[union-attr]
    part = tmp_path / f"part-{len(updates)}-{shards}"
    table = table_from_updates(KEYED, updates)
    part.write_bytes(to_parquet(table))
    lower_time, upper_time = 2, 7
    kept: list[Any] = []
    for shard in range(shards):
        io = StepIO(f"file://{tmp_path}", {}, {source.id: [(part.name, 2, 7, 0, 0)]}, "", b"", True)
        routed, owned = read_sources(io, keyed_sources(graph), shard, shards)
        assert routed == {}
        mine = source.operator.normalize.apply([owned.get(source.id, [])])
        for row, _, _ in mine:
            assert shard_of(route(row), shards) == shard, (row, shard)
        kept.extend(mine)
    # As the part holds them (a decimal at its column's scale).
    window = [u for u in updates_from_table(table) if lower_time <= u[1] < upper_time]
    assert _counted(kept) == _counted(source.operator.normalize.apply([window]))


def _counted(updates: list[Any]) -> Counter[Any]:
    # NaN != NaN: rows are compared by their repr, which tells every value apart.
    return Counter(repr(update) for update in updates)
