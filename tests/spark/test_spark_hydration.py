"""Hydration by Spark (``services/compute/spark/hydration.py``): a dataflow's operator state
and initial output built by Spark jobs from storage's parts, on a directory and on S3.

- Random plans over random histories: each input is stored up to ``as_of`` as real appends
  of a real storage process; the dataflow is hydrated from the parts storage lists, then
  stepped through the rest of the history. Its index (on the resident tasks) equals the
  reference evaluator's answer at every time, which only holds if every operator's state
  was built right: later steps retract what hydration put there.
- The output written by the executors, once committed with ``AppendParts``, is the view's
  contents; a restart whose output already holds data writes only the difference.
- Only keys pass through the driver, and the staging objects are gone afterwards.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from services.compute.dataflow import Dataflow
from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark.hydration import OutputTarget, early_loads, stage
from services.compute.spark.staging import PREFIX, delete_prefix, run_prefix
from tests.support import random_plans, reference_eval
from tests.support.service_process import ServiceProcess
from tests.support.storage import (
    FAST_SETTINGS,
    Backends,
    embedded_backends,
    production_backends,
    start_storage,
)
from tidemark.blob import open_blob
from tidemark.clients.storage import PartsListing, StorageClient
from tidemark.columnar import Column, ColumnType, RelationSchema, version_from_table
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

RowUpdate = tuple[tuple[Any, ...], int, int]


@pytest.fixture(scope="module", params=["file", "s3"])
def backends(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backends:
    if request.param == "file":
        return embedded_backends(tmp_path_factory.mktemp("hydration"))
    return production_backends(request)


@pytest.fixture(scope="module")
def storage(backends: Backends) -> Iterator[ServiceProcess]:
    extra = (*FAST_SETTINGS, "--orphan-grace", "120", "--retired-blob-grace", "60")
    process = start_storage(backends, extra=extra)
    yield process
    process.kill()


@pytest.fixture(scope="module")
def file_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A storage on a local directory: the random plans run there only (each example costs
    Spark jobs; S3 is covered by the tests after them)."""
    extra = (*FAST_SETTINGS, "--orphan-grace", "120", "--retired-blob-grace", "60")
    process = start_storage(embedded_backends(tmp_path_factory.mktemp("random")), extra=extra)
    yield process
    process.kill()


def _renamed(plan: plan_pb2.Plan, ids: Mapping[str, str]) -> plan_pb2.Plan:
    """``plan`` reading collection ``ids[name]`` wherever it read ``name``."""
    copy = plan_pb2.Plan()
    copy.CopyFrom(plan)

    def visit(message: Any) -> None:
        if isinstance(message, plan_pb2.Get) and message.collection_id in ids:
            message.collection_id = ids[message.collection_id]
        for descriptor, value in message.ListFields():
            if descriptor.message_type is None:
                continue
            if descriptor.is_repeated:
                for item in value:
                    visit(item)
            else:
                visit(value)

    visit(copy)
    return copy


async def _store(
    address: str,
    schemas: Mapping[str, RelationSchema],
    updates: Mapping[str, list[RowUpdate]],
    as_of: int,
) -> dict[str, PartsListing]:
    """Each collection's updates at times ``<= as_of`` appended time by time (one batch, so
    one part, per time), and its parts listed at ``as_of``."""
    client = StorageClient(address, timeout=20.0)
    try:
        listings = {}
        for cid, schema in schemas.items():
            pair = await client.create(cid, schema, holder="test")
            for time in range(as_of + 1):
                batch = [u for u in updates.get(cid, []) if u[1] == time]
                await client.append(pair.write, batch, time + 1, expected_upper=time)
            listings[cid] = await client.list_parts(pair.read, as_of)
        return listings
    finally:
        await client.close()


async def _staged_keys(blob_url: str) -> list[str]:
    async with await open_blob(blob_url) as blob:
        return await blob.list(PREFIX)


def _hydrate(
    spark: SparkSession,
    dataflow: SparkDataflow,
    listings: Mapping[str, PartsListing],
    output: OutputTarget | None = None,
    *,
    early: bool = False,
) -> tuple[Any, int, int]:
    """Stages and loads ``dataflow``'s state; ``early``: as compute does, the nodes the tasks
    read from parts alone load first (before the staging job here), the rest after."""
    url = next(iter(listings.values())).blob_url
    prefix = run_prefix(dataflow.dataflow_id)
    preloaded: frozenset[int] = frozenset()
    loaded_early = 0
    if early:
        loads, preloaded = early_loads(
            dataflow.graph,
            listings,
            dataflow_id=dataflow.dataflow_id,
            as_of=dataflow.as_of,
            shards=dataflow.shards,
        )
        assert preloaded, "no node reads its inputs from the parts alone"
        loaded_early, index_rows = dataflow.load_staged(loads)
        # Not hydrated yet: the index waits for the rest of the state.
        assert dataflow.upper is None and index_rows == 0
    try:
        staged = stage(
            spark,
            dataflow.plan,
            dataflow.graph,
            dataflow_id=dataflow.dataflow_id,
            as_of=dataflow.as_of,
            shards=dataflow.shards,
            index_key_columns=dataflow.index_key_columns,
            listings=listings,
            staging_url=url,
            prefix=prefix,
            output=output,
            count_output=True,
            preloaded=preloaded,
        )
        assert not any(node in load.shares for load in staged.loads for node in preloaded)
        named = {
            key
            for load in staged.loads
            for inputs in load.nodes.values()
            for keys in inputs
            for key in keys
        }
        named |= {key for load in staged.loads for key in load.index}
        # Every object a task is told to load is there, and nothing else was staged.
        assert set(asyncio.run(_staged_keys(url))) == named
        assert bool(named) == (staged.staged_rows > 0)
        loaded, index_rows = dataflow.load_staged(staged.loads)
    finally:
        asyncio.run(delete_prefix(url, prefix))
    assert asyncio.run(_staged_keys(url)) == []
    return staged, loaded + loaded_early, index_rows


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(scenario=random_plans.scenarios(), as_of=st.integers(0, 3))
def test_random_plans_hydrated_by_spark_match_the_reference(
    spark: SparkSession,
    cluster: ResidentCluster,
    file_storage: ServiceProcess,
    scenario: random_plans.Scenario,
    as_of: int,
) -> None:
    history = scenario.history
    try:
        expected = {
            time: reference_eval.evaluate(scenario.plan, random_plans.inputs_at(history, time))
            for time in range(as_of, history.max_time + 1)
        }
    except reference_eval.UndefinedResult:
        assume(False)
        raise
    base = secrets.randbelow(10**12) * 10
    ids = {name: f"u{base + i}" for i, name in enumerate(scenario.schemas)}
    plan = _renamed(scenario.plan, ids)
    read = Dataflow(plan, as_of=as_of).input_ids
    schemas = {ids[name]: s for name, s in scenario.schemas.items() if ids[name] in read}
    updates = {ids[name]: u for name, u in history.updates.items()}
    assume(schemas)  # a plan of constants has no parts to hydrate from
    listings = asyncio.run(_store(file_storage.address, schemas, updates, as_of))

    width = len(derive_schema(plan.root).columns)
    dataflow = SparkDataflow(
        plan, as_of=as_of, cluster=cluster, index_key_columns=[0] if width else []
    )
    try:
        staged, _, index_rows = _hydrate(spark, dataflow, listings)
        assert staged.output_rows == sum(expected[as_of].values())
        assert index_rows == sum(expected[as_of].values())
        upper = as_of + 1
        assert dataflow.upper == upper
        for _, batch_upper, chosen in random_plans.batches(history):
            if batch_upper <= upper:
                continue
            lower = upper
            batch = {
                ids[name]: [u for u in changes if u[1] >= lower]
                for name, changes in chosen.items()
                if ids[name] in read
            }
            _, upper = dataflow.step(batch, batch_upper)
        for time in range(as_of, upper):
            found = reference_eval.canonical(dataflow.peek(time))
            assert found == expected[time], time
    finally:
        dataflow.drop()


# -- a join and aggregate, with its output written as parts -----------------------------------

ORDERS = RelationSchema(
    [
        Column("id", ColumnType.INT64, nullable=False),
        Column("customer", ColumnType.INT64, nullable=False),
        Column("amount", ColumnType.DECIMAL, precision=12, scale=2),
    ]
)
CUSTOMERS = RelationSchema(
    [
        Column("id", ColumnType.INT64, nullable=False),
        Column("region", ColumnType.TEXT),
    ]
)
TOTALS = RelationSchema(
    [
        Column("region", ColumnType.TEXT),
        Column("orders", ColumnType.INT64, nullable=False),
        Column("total", ColumnType.DECIMAL, precision=38, scale=2),
    ]
)


def _totals_plan(orders: str, customers: str) -> plan_pb2.Plan:
    """``SELECT region, count(*), sum(amount) FROM orders JOIN customers ON customer = id
    GROUP BY region``."""
    joined = pb.join(pb.get(orders, ORDERS), pb.get(customers, CUSTOMERS), [1], [0])
    root = pb.reduce(joined, [4], [pb.aggregate("count"), pb.aggregate("sum", 2)])
    return pb.plan(root, derive_schema(root))


def _orders(rng: random.Random, count: int, time: int) -> list[RowUpdate]:
    return [
        (
            (
                i,
                rng.randrange(40),
                None if i % 17 == 0 else Decimal(rng.randrange(-9999, 99999)) / 100,
            ),
            time,
            rng.choice([1, 1, 1, 2]),
        )
        for i in range(count)
    ]


def _customers(time: int) -> list[RowUpdate]:
    return [((c, None if c % 13 == 0 else f"region {c % 7}"), time, 1) for c in range(40)]


async def _commit_and_read(
    address: str,
    collection: str,
    schema: RelationSchema,
    parts: Any,
    as_of: int,
    existing: list[RowUpdate],
) -> tuple[dict[tuple[Any, ...], int], PartsListing | None]:
    """Commits ``parts`` at ``as_of`` to a new collection that first holds ``existing``
    (at time 0); its contents at ``as_of`` afterwards."""
    client = StorageClient(address, timeout=20.0)
    try:
        pair = await client.create(collection, schema, holder="test")
        await client.append(pair.write, existing, as_of)
        await client.append_parts(
            pair.write, parts, as_of + 1, times=(as_of, as_of), expected_upper=as_of
        )
        return (await client.snapshot(pair.read, as_of)).version(), None
    finally:
        await client.close()


async def _existing_listing(
    address: str, collection: str, schema: RelationSchema, existing: list[RowUpdate], as_of: int
) -> PartsListing:
    client = StorageClient(address, timeout=20.0)
    try:
        pair = await client.create(collection, schema, holder="test")
        await client.append(pair.write, existing, as_of)
        return await client.list_parts(pair.read, as_of - 1)
    finally:
        await client.close()


def test_join_and_aggregate_output_written_by_executors_is_the_views_contents(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    rng = random.Random(11)
    base = secrets.randbelow(10**12) * 10
    orders, customers, view = f"u{base}", f"u{base + 1}", f"u{base + 2}"
    as_of = 2
    updates = {
        orders: _orders(rng, 3000, 0)
        + [(row, 1, -diff) for row, _, diff in _orders(rng, 3000, 0)[:500]],
        customers: _customers(1),
    }
    # Retract what the first batch inserted, for some orders: the parts hold several times.
    first = updates[orders][:3000]
    updates[orders] = first + [(row, 2, -diff) for row, _, diff in first[:700]]
    schemas = {orders: ORDERS, customers: CUSTOMERS}
    listings = asyncio.run(_store(storage.address, schemas, updates, as_of))
    plan = _totals_plan(orders, customers)

    local = Dataflow(plan, as_of=as_of)
    expected_output, _ = local.hydrate(updates)
    expected = {row: diff for row, _, diff in expected_output}

    blob_url = next(iter(listings.values())).blob_url
    dataflow = SparkDataflow(plan, as_of=as_of, cluster=cluster)
    try:
        target = OutputTarget(view, TOTALS, blob_url)
        staged, loaded, _ = _hydrate(spark, dataflow, listings, target)
        assert loaded > 0
        # Both of the join's inputs are collections: each task read them from the parts
        # itself, and Spark staged only the aggregate's state: its groups' COUNT and SUM.
        for load in staged.loads:
            (join_id,) = load.shares
            (reduce_id,) = load.states
            assert len(load.nodes[reduce_id]) == 1
            assert [share.columns for share in load.shares[join_id]] == [
                ("id", "customer", "amount"),
                ("id", "region"),
            ]
            assert load.nodes.get(join_id, ((), ())) == ((), ())
            assert all(share.keys for share in load.shares[join_id])
        assert staged.output_rows == sum(expected.values())
        assert staged.output_parts, "the executors wrote no part"
        contents, _ = asyncio.run(
            _commit_and_read(storage.address, view, TOTALS, staged.output_parts, as_of, [])
        )
        assert contents == expected
    finally:
        dataflow.drop()

    # As compute runs it: the join loads from the parts while the jobs stage the rest; the
    # index answers from the whole state, and later steps retract through it.
    dataflow = SparkDataflow(plan, as_of=as_of, cluster=cluster, index_key_columns=[0])
    try:
        staged, loaded, index_rows = _hydrate(spark, dataflow, listings, early=True)
        assert loaded > 0 and index_rows == sum(expected.values())
        assert all(not load.shares for load in staged.loads)
        assert reference_eval.canonical(dataflow.peek(as_of)) == reference_eval.canonical(expected)
        change = [
            (first[0][0], as_of + 1, -first[0][2]),
            ((90001, 3, Decimal("5.00")), as_of + 1, 1),
        ]
        want, _ = local.step({orders: change}, as_of + 2)
        got, _ = dataflow.step({orders: change}, as_of + 2)
        assert sorted(got, key=repr) == sorted(want, key=repr)
        assert want, "the step changed nothing: it tests nothing"
    finally:
        dataflow.drop()


def test_a_restart_over_existing_output_writes_only_the_difference(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    base = secrets.randbelow(10**12) * 10
    orders, customers, view = f"u{base}", f"u{base + 1}", f"u{base + 2}"
    as_of = 3
    rng = random.Random(5)
    updates = {orders: _orders(rng, 500, 0), customers: _customers(0)}
    listings = asyncio.run(
        _store(storage.address, {orders: ORDERS, customers: CUSTOMERS}, updates, as_of)
    )
    plan = _totals_plan(orders, customers)
    expected_output, _ = Dataflow(plan, as_of=as_of).hydrate(updates)
    expected = {row: diff for row, _, diff in expected_output}
    # The output holds an older answer: one row right, one wrong, one missing.
    rows = sorted(expected, key=repr)
    existing = [(rows[0], 0, 1), (("nowhere", 1, Decimal("1.00")), 0, 2)]
    previous = asyncio.run(_existing_listing(storage.address, view, TOTALS, existing, as_of))
    blob_url = next(iter(listings.values())).blob_url
    dataflow = SparkDataflow(plan, as_of=as_of, cluster=cluster)
    try:
        target = OutputTarget(view, TOTALS, blob_url, previous)
        staged, _, _ = _hydrate(spark, dataflow, listings, target)
        written = asyncio.run(_read_parts(blob_url, staged.output_parts))
        assert written.get(rows[0]) is None, "a row already there was written again"
        assert written[("nowhere", 1, Decimal("1.00"))] == -2
        assert {r: n for r, n in written.items() if r != ("nowhere", 1, Decimal("1.00"))} == {
            r: n for r, n in expected.items() if r != rows[0]
        }
    finally:
        dataflow.drop()


async def _read_parts(blob_url: str, parts: Any) -> dict[tuple[Any, ...], int]:
    """What ``parts`` hold, read straight from the blob store."""
    version: dict[tuple[Any, ...], int] = {}
    async with await open_blob(blob_url) as blob:
        for part in parts:
            table = pq.read_table(pa.BufferReader(await blob.get_existing(part.key)))
            for row, n in version_from_table(table).items():
                version[row] = version.get(row, 0) + n
    return version


# -- a Reduce hydrated from its groups' partial aggregates ------------------------------------

ITEMS = RelationSchema(
    [
        Column("g", ColumnType.INT64, nullable=True),
        Column("label", ColumnType.TEXT, nullable=True),
        Column("x", ColumnType.INT64, nullable=True),
        Column("d", ColumnType.DECIMAL, precision=12, scale=2),
    ]
)


def _items(rng: random.Random, count: int, time: int) -> list[RowUpdate]:
    return [
        (
            (
                None if i % 11 == 0 else rng.randrange(6),
                None if i % 7 == 0 else f"l{rng.randrange(3)}",
                None if i % 5 == 0 else rng.choice([rng.randrange(-50, 50), 2**62, -(2**63)]),
                None if i % 3 == 0 else Decimal(rng.randrange(-99999, 99999)) / 100,
            ),
            time,
            rng.choice([1, 1, 2]),
        )
        for i in range(count)
    ]


def test_a_reduce_of_sums_hydrates_from_its_groups_and_steps_exactly(
    spark: SparkSession, cluster: ResidentCluster, storage: ServiceProcess
) -> None:
    """COUNT, SUM and AVG of BIGINT and DECIMAL, grouped by a key with NULLs: Spark stages
    each group's partial aggregates (not the input rows), the tasks load them as the groups'
    state, and the index equals the reference evaluator at every time while later steps
    retract and insert rows of those groups."""
    rng = random.Random(5)
    collection = f"u{secrets.randbelow(10**12) * 10}"
    as_of = 1
    inserted = _items(rng, 400, 0) + _items(rng, 200, 1)
    later = [(row, time, diff) for time in (2, 3) for row, _, diff in _items(rng, 60, time)]
    retracted = [(row, 2 + i % 2, -diff) for i, (row, _, diff) in enumerate(inserted[:150])]
    updates = {collection: inserted + later + retracted}
    listings = asyncio.run(_store(storage.address, {collection: ITEMS}, updates, as_of))
    aggregates = [
        pb.aggregate("count"),
        pb.aggregate("count", 2),
        pb.aggregate("sum", 2),
        pb.aggregate("avg", 2),
        pb.aggregate("sum", 3),
        pb.aggregate("avg", 3),
    ]
    root = pb.reduce(pb.get(collection, ITEMS), [0, 1], aggregates)
    plan = pb.plan(root, derive_schema(root))
    history = {collection: updates[collection]}
    expected = {
        time: reference_eval.evaluate(plan, {collection: _contents_at(history[collection], time)})
        for time in range(as_of, 4)
    }
    dataflow = SparkDataflow(plan, as_of=as_of, cluster=cluster, index_key_columns=[0, 1])
    try:
        staged, loaded, index_rows = _hydrate(spark, dataflow, listings)
        groups = len(expected[as_of])
        assert all(load.states for load in staged.loads)
        # One row per group for the Reduce, and the output's rows for the index; not the
        # 600 input rows.
        assert staged.staged_rows == 2 * groups
        assert loaded >= groups and index_rows == groups
        for time in (2, 3):
            batch = [u for u in updates[collection] if u[1] == time]
            dataflow.step({collection: batch}, time + 1)
        for time in range(as_of, 4):
            assert reference_eval.canonical(dataflow.peek(time)) == expected[time], time
    finally:
        dataflow.drop()


def _contents_at(updates: list[RowUpdate], time: int) -> dict[tuple[Any, ...], int]:
    contents: dict[tuple[Any, ...], int] = {}
    for row, at, diff in updates:
        if at <= time:
            contents[row] = contents.get(row, 0) + diff
    return {row: diff for row, diff in contents.items() if diff}
