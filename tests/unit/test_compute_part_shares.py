"""A hydrating task's share of a join's input read straight from the parts
(``services/compute/spark/part_shares.py``), and which Reduce inputs hydration narrows once
for both its staging and its output (``hydration._narrowed_once``).

Parts are written to a directory as storage writes them (the collection's columns, ``time``,
``diff``), with updates at several times, some after ``as_of``, retractions, NULL keys and a
projection that repeats a column. Each shard's share must be the projection of the collection
at ``as_of``, restricted to the keys ``keys.shard_of`` gives that shard, and the shares
together the whole projection: computed here row by row in Python.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow.keys import shard_of
from services.compute.dataflow.lower import lower
from services.compute.spark.hydration import _narrowed_once
from services.compute.spark.part_shares import (
    owned_rows,
    plan_shares,
    projected_collection,
    read_share,
    route_columns,
    share_for,
)
from services.compute.spark.parts_source import MissingPart
from services.compute.spark.requests import PartsShare
from tidemark.clients.storage import BatchInfo, PartsListing
from tidemark.columnar import Column, ColumnType, RelationSchema, table_from_updates
from tidemark.frontier import u64_frontier
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

SCHEMA = RelationSchema(
    [
        Column("id", ColumnType.INT64, nullable=False),
        Column("customer", ColumnType.INT64),
        Column("note", ColumnType.TEXT),
    ]
)

Update = tuple[tuple[Any, ...], int, int]

updates_strategy = st.lists(
    st.tuples(
        st.tuples(
            st.integers(0, 30),
            st.one_of(st.none(), st.integers(-5, 5)),
            st.one_of(st.none(), st.sampled_from(["a", "b", "ç"])),
        ),
        st.integers(0, 6),
        st.integers(-2, 3).filter(bool),
    ),
    max_size=60,
)


def _write_parts(directory: Path, updates: list[Update], parts: int) -> list[str]:
    """``updates`` cut into ``parts`` Parquet files of the storage layout; their keys."""
    keys = []
    for index in range(parts):
        chosen = updates[index::parts]
        key = f"data/c/part-{index}.parquet"
        path = directory / key
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table_from_updates(SCHEMA, chosen), path)
        keys.append(key)
    return keys


def _expected(
    updates: list[Update], columns: tuple[int, ...], as_of: int
) -> Counter[tuple[Any, ...]]:
    summed: Counter[tuple[Any, ...]] = Counter()
    for row, time, diff in updates:
        if time <= as_of:
            summed[tuple(row[c] for c in columns)] += diff
    return Counter({row: n for row, n in summed.items() if n})


def _contents(table: Any) -> Counter[tuple[Any, ...]]:
    if table is None:
        return Counter()
    width = table.num_columns - 1
    columns = [table.column(i).to_pylist() for i in range(width)]
    summed: Counter[tuple[Any, ...]] = Counter()
    for row, diff in zip(zip(*columns, strict=True), table.column(width).to_pylist(), strict=True):
        summed[row] += diff
    return Counter({row: n for row, n in summed.items() if n})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    updates=updates_strategy,
    as_of=st.integers(0, 6),
    parts=st.integers(1, 3),
    shards=st.integers(1, 3),
    later_times=st.booleans(),
)
def test_each_shard_reads_its_keys_of_the_projection_at_as_of(
    tmp_path_factory: pytest.TempPathFactory,
    updates: list[Update],
    as_of: int,
    parts: int,
    shards: int,
    later_times: bool,
) -> None:
    directory = tmp_path_factory.mktemp("parts")
    keys = _write_parts(directory, updates, parts)
    # The join's input: (customer, id, customer), keyed by its first column.
    columns = (1, 0, 1)
    names = tuple(SCHEMA.columns[c].name for c in columns)
    # Parts with no update after as_of are read without their times, when the listing says so.
    later = any(time > as_of for _, time, _ in updates) or later_times
    share = PartsShare(f"file://{directory}", tuple(keys), names, later)
    expected = _expected(updates, columns, as_of)
    together: Counter[tuple[Any, ...]] = Counter()
    for shard in range(shards):
        table = read_share(share, as_of, {}, (0,), shard, shards)
        found = _contents(table)
        assert all(shard_of((row[0],), shards) == shard for row in found), shard
        together.update(found)
    assert Counter({row: n for row, n in together.items() if n}) == expected


def test_a_part_gone_from_the_directory_is_a_missing_part(tmp_path: Path) -> None:
    keys = _write_parts(tmp_path, [((1, 2, "a"), 0, 1)], 1)
    share = PartsShare(f"file://{tmp_path}", (*keys, "data/c/gone.parquet"), ("id", "customer"))
    with pytest.raises(MissingPart):
        read_share(share, 0, {}, (1,), 0, 2)


def test_only_a_join_on_plain_columns_over_a_projected_collection_is_read_by_the_tasks() -> None:
    customers = RelationSchema.of(("id", ColumnType.INT64), ("region", ColumnType.TEXT))
    projected = pb.project(pb.project(pb.get("orders", SCHEMA), 2, 1, 0), 1, 1)
    assert projected_collection(projected) == ("orders", (1, 1))
    filtered = pb.filter(pb.get("orders", SCHEMA), pb.call("is_null", 2))
    assert projected_collection(filtered) is None

    joined = pb.join(projected, filtered, [0], [1])
    root = pb.join(joined, pb.get("customers", customers), [0], [0])
    graph = lower(pb.plan(root, derive_schema(root)))

    def listing(schema: RelationSchema, key: str) -> PartsListing:
        part = BatchInfo(key, u64_frontier(0), u64_frontier(1), u64_frontier(0), 3, 100)
        return PartsListing(
            0, schema, "file:///blobs", [part], 60_000, u64_frontier(0), u64_frontier(1)
        )

    listings = {"orders": listing(SCHEMA, "o/p1"), "customers": listing(customers, "c/p1")}
    inputs = [(node.id, p) for node in graph.stateful_nodes() for p in range(len(node.inputs))]
    assert len(inputs) == 4
    found = {(n, p): share_for(graph, n, p, listings) for n, p in inputs}
    # The projection and the bare customers are read by the tasks; the filtered input and
    # the inner join's output are computed, so Spark stages them.
    shares = sorted((s.columns, s.keys) for s in found.values() if s is not None)
    assert shares == [(("customer", "customer"), ("o/p1",)), (("id", "region"), ("c/p1",))]
    # Without a collection's listing, Spark stages it too.
    alone = [share_for(graph, n, p, {"customers": listings["customers"]}) for n, p in inputs]
    assert [s.columns for s in alone if s is not None] == [("id", "region")]


def _wanted(graph: Any, listings: dict[str, PartsListing]) -> list[tuple[int, int, Any]]:
    """The stateful inputs Spark stages (as ``hydration.stage`` chooses them)."""
    shares = plan_shares(graph, listings)
    return [
        (node.id, position, graph.nodes[input_id].relation)
        for node in graph.stateful_nodes()
        for position, input_id in enumerate(node.inputs)
        if shares.get(node.id, (None,) * len(node.inputs))[position] is None
    ]


def test_a_reduce_input_is_narrowed_once_only_where_nothing_else_reads_it() -> None:
    customers = RelationSchema.of(("id", ColumnType.INT64), ("region", ColumnType.TEXT))
    joined = pb.join(pb.get("orders", SCHEMA), pb.get("customers", customers), [1], [0])
    totals = pb.reduce(joined, [4], [pb.aggregate("count")])
    once = pb.plan(totals, derive_schema(totals))
    graph = lower(once)
    wanted = _wanted(graph, {})
    replace = _narrowed_once(once, graph, wanted, [])
    # The join's inputs are not Reduce inputs; the join's output is, and occurs once.
    assert list(replace) == [joined.SerializeToString(deterministic=True)]

    # The same join read by a second Reduce (a union of both): each occurrence must see
    # whole rows for the other, so neither is replaced.
    counts = pb.reduce(joined, [4], [pb.aggregate("count")])
    both = pb.union(totals, counts)
    twice = pb.plan(both, derive_schema(both))
    graph = lower(twice)
    assert _narrowed_once(twice, graph, _wanted(graph, {}), []) == {}


def test_route_columns_are_what_each_route_projects_and_owned_rows_split_by_them() -> None:
    """Staged inputs keyed by plain columns go unrouted, each task keeping its rows
    (``owned_rows`` over ``route_columns``): that must give each row the shard its route's
    key gives it in the tasks. A join on an expression has a computed key: routed."""
    customers = RelationSchema.of(("id", ColumnType.INT64), ("region", ColumnType.TEXT))
    orders = pb.get("orders", SCHEMA)
    by_columns = pb.join(orders, pb.get("customers", customers), [1], [0])
    plus_one = pb.call("add", 1, pb.literal(1, ColumnType.INT64))
    by_expression = pb.join(orders, pb.get("customers", customers), [plus_one], [0])
    grouped = pb.reduce(by_columns, [4, 1], [pb.aggregate("count")])
    root = pb.union(pb.distinct(pb.project(by_expression, 2, 1)), pb.project(grouped, 0, 1))
    graph = lower(pb.plan(root, derive_schema(root)))
    # Rows of (id, customer, note, id, region), NULLs and repeats among them.
    rows = [(i, i % 4 - 1 if i % 5 else None, "abç"[i % 3], i % 3, "xy"[i % 2]) for i in range(40)]
    routes: dict[str, list[tuple[int, ...] | None]] = {}
    for node in graph.stateful_nodes():
        for position, input_id in enumerate(node.inputs):
            columns = route_columns(graph, node.id, position)
            routes.setdefault(type(node.operator).__name__, []).append(columns)
            if columns is None:
                continue
            width = len(graph.nodes[input_id].types)
            sample = [row[:width] for row in rows]
            table = pa.table(
                [*(pa.array([row[c] for row in sample]) for c in range(width)), [1] * len(sample)],
                names=[*(f"c{c}" for c in range(width)), "diff"],
            )
            route = node.operator.routes[position]  # type: ignore[union-attr]
            for shards in (1, 2, 3):
                together = []
                for shard in range(shards):
                    kept = owned_rows(table, columns, shard, shards)
                    mine = list(
                        zip(*(kept.column(c).to_pylist() for c in range(width)), strict=True)
                    )
                    assert all(shard_of(route(row), shards) == shard for row in mine)
                    together.extend(mine)
                assert sorted(together, key=repr) == sorted(sample, key=repr)
    assert routes["ReduceOperator"] == [(4, 1)]
    assert routes["DistinctOperator"] == [(0, 1)]
    # One join on plain columns, one whose left key is computed.
    assert sorted(routes["JoinOperator"], key=repr) == [(0,), (0,), (1,), None]
