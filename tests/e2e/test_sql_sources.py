"""Load generator sources through SQL, with every process real (the compute engine is the
in-process one, to stay fast): a counter that grows, AUCTION's subsources under a
materialized view that matches a recomputation at the same time, DROP SOURCE, and a kill -9
of the sources process after which no tick is missing or doubled."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.sql_results import fails, ok
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark import timelines
from tidemark.catalog_items import CATALOG_HOLDER, collection_of
from tidemark.clients.adapter import (
    AdapterClient,
    Change,
    Changes,
    SubscribeError,
)
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.sources.loadgen import LoadGeneratorSpec, generator_for


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(
        tmp_path_factory.mktemp("sources"), adapters=1, engine="local", sources=True
    ) as running:
        yield running


@pytest.fixture
async def a(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as client:
        yield client


async def counter_state(client: AdapterClient, source: str) -> tuple[int, int, int, int, int]:
    """At one read time: count, distinct count, min, max of the counter and the progress
    relation's offset."""
    (row,) = (
        await ok(
            client,
            f"SELECT (SELECT count(*) FROM {source}), (SELECT count(DISTINCT counter) FROM "
            f"{source}), (SELECT min(counter) FROM {source}), (SELECT max(counter) FROM "
            f'{source}), (SELECT max("offset") FROM {source}_progress)',
        )
    ).rows
    return tuple(int(v) if v is not None else 0 for v in row)  # type: ignore[return-value]


async def until_count(
    client: AdapterClient, source: str, at_least: int, seconds: float = 60
) -> tuple[int, int, int, int, int]:
    deadline = time.monotonic() + seconds
    while True:
        state = await counter_state(client, source)
        if state[0] >= at_least:
            return state
        assert time.monotonic() < deadline, f"{source} stuck at {state}"
        await asyncio.sleep(0.1)


async def test_a_counter_grows_with_its_progress_and_reads_do_not_stall(a: AdapterClient) -> None:
    await ok(a, "CREATE SOURCE tick FROM LOAD GENERATOR COUNTER (TICK INTERVAL '100ms')")
    listed = await ok(a, "SHOW SOURCES")
    assert ("tick", "load-generator") in listed.rows and (
        "tick_progress",
        "progress",
    ) in listed.rows
    assert (await ok(a, "SHOW COLUMNS FROM tick")).rows == [("counter", "false", "bigint")]
    first = await until_count(a, "tick", 3)
    second = await until_count(a, "tick", first[0] + 5)
    for count, distinct, low, high, offset in (first, second):
        # 1..n, nothing doubled, and the progress relation bound to exactly these ticks.
        assert (distinct, low, high, offset) == (count, 1, count, count)
    # A quiet source answers without waiting for its next tick.
    await ok(a, "CREATE SOURCE slow FROM LOAD GENERATOR COUNTER (TICK INTERVAL '1h')")
    await until_count(a, "slow", 1)
    await ok(a, "CREATE TABLE elsewhere (x bigint)")
    waits = []
    for number in range(5):
        # A write elsewhere moves the oracle's read time past the quiet source's upper; the
        # sources process notices and moves it on, well before its next advance (1 s).
        await ok(a, f"INSERT INTO elsewhere VALUES ({number})")
        started = time.monotonic()
        assert (await counter_state(a, "slow"))[:2] == (1, 1)
        waits.append(time.monotonic() - started)
    assert sorted(waits)[2] < 0.5, waits
    assert (await fails(a, "INSERT INTO tick VALUES (0)")).code == "42809"
    assert (await fails(a, "DROP SOURCE tick_progress")).code == "2BP01"


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("CREATE SOURCE x FROM LOAD GENERATOR AUCTION", "0A000"),
        ("CREATE SOURCE x FROM LOAD GENERATOR COUNTER FOR ALL TABLES", "22023"),
        ("CREATE SOURCE x FROM LOAD GENERATOR AUCTION (MAX CARDINALITY 3) FOR ALL TABLES", "22023"),
        ("CREATE SOURCE x FROM LOAD GENERATOR COUNTER (SCALE FACTOR 1)", "22023"),
        ("CREATE SOURCE x FROM LOAD GENERATOR TPCH (SCALE FACTOR 0.5) FOR ALL TABLES", "22023"),
    ],
)
async def test_options_a_generator_does_not_take_are_refused(
    a: AdapterClient, sql: str, code: str
) -> None:
    assert (await fails(a, sql)).code == code


async def test_subscribe_to_a_counter_sees_each_tick_once_in_time_order(a: AdapterClient) -> None:
    await ok(a, "CREATE SOURCE sub FROM LOAD GENERATOR COUNTER (TICK INTERVAL '50ms')")
    await until_count(a, "sub", 1)
    seen: list[Change] = []
    async with asyncio.timeout(60):
        async for event in a.subscribe("SUBSCRIBE sub"):
            assert not isinstance(event, SubscribeError), event
            if isinstance(event, Changes):
                seen.extend(event.changes)
            if len(seen) >= 10:
                break
    values = [c.row[0] for c in sorted(seen, key=lambda c: (c.timestamp, c.row))]
    assert all(c.diff == 1 for c in seen)
    # The snapshot then one value per tick (or a few, bound together): 1, 2, 3, ... in order.
    assert values == list(range(1, len(values) + 1))
    assert len({c.timestamp for c in seen}) > 2


async def test_max_cardinality_keeps_the_newest_values(a: AdapterClient) -> None:
    await ok(
        a,
        "CREATE SOURCE capped FROM LOAD GENERATOR COUNTER "
        "(TICK INTERVAL '50ms', MAX CARDINALITY 4)",
    )
    deadline = time.monotonic() + 60
    while True:
        count, distinct, low, high, offset = await counter_state(a, "capped")
        if offset >= 8:
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert (count, distinct, low, high) == (4, 4, offset - 3, offset)


async def test_a_materialized_view_over_auction_matches_a_recomputation(
    a: AdapterClient, stack: SqlStack
) -> None:
    created = await ok(
        a, "CREATE SOURCE house FROM LOAD GENERATOR AUCTION (TICK INTERVAL '100ms') FOR ALL TABLES"
    )
    assert "subsources" in created.notices[0]
    listed = dict((await ok(a, "SHOW SOURCES")).rows)
    for name in ("organizations", "users", "accounts", "auctions", "bids"):
        assert listed[name] == "subsource"
    assert listed["house"] == "load-generator" and listed["house_progress"] == "progress"
    assert (await ok(a, "SHOW SUBSOURCES ON house")).rows == [
        ("accounts", "subsource"),
        ("auctions", "subsource"),
        ("bids", "subsource"),
        ("house_progress", "progress"),
        ("organizations", "subsource"),
        ("users", "subsource"),
    ]
    assert ("house_progress", "progress") in (await ok(a, "SHOW SUBSOURCES")).rows
    # A second AUCTION in the same schema would take the same subsource names.
    clash = await fails(a, "CREATE SOURCE again FROM LOAD GENERATOR AUCTION FOR ALL TABLES")
    assert clash.code == "42P07" and "organizations" in clash.message
    assert "again" not in dict((await ok(a, "SHOW SOURCES")).rows)
    assert [r[0] for r in (await ok(a, "SHOW COLUMNS FROM bids")).rows] == [
        "id", "buyer", "auction_id", "amount", "bid_time"
    ]  # fmt: skip
    await check_holds(stack, "house", 7)
    query = (
        "SELECT a.id, a.item, count(*) AS bids, max(b.amount) AS top, o.name AS organization "
        "FROM auctions a JOIN bids b ON b.auction_id = a.id JOIN users u ON u.id = a.seller "
        "JOIN organizations o ON o.id = u.org_id GROUP BY a.id, a.item, o.name"
    )
    await ok(a, f"CREATE MATERIALIZED VIEW top_bids AS {query}")
    assert (await fails(a, "DROP SOURCE bids")).code == "2BP01"
    async with OracleClient(stack.oracle.address) as oracle:
        seen = 0
        for _ in range(3):
            await asyncio.sleep(0.7)
            moment = await oracle.read_ts(timelines.DATA)
            view = sorted((await ok(a, f"SELECT * FROM top_bids AS OF {moment}")).rows)
            direct = sorted((await ok(a, f"{query} AS OF {moment}")).rows)
            assert view == direct
            assert len(view) >= seen
            seen = len(view)
        assert seen > 3
    drop = await fails(a, "DROP SOURCE house")
    assert drop.code == "2BP01" and "top_bids" in drop.message
    dropped = await ok(a, "DROP SOURCE house CASCADE")
    assert any("top_bids" in n for n in dropped.notices)
    names = {r[0] for r in (await ok(a, "SHOW SOURCES")).rows}
    assert not names & {"house", "house_progress", "bids", "auctions", "users"}
    assert stack.sources is not None
    stack.sources.wait_for_record(
        lambda r: r.get("event") == "source_stopping" and r.get("source", "").endswith("house")
    )


async def check_holds(stack: SqlStack, source: str, relations: int) -> None:
    """Every collection of the source (itself, its subsources, its progress relation) carries
    the catalog's durable read hold and the sources process's write capability."""
    async with OracleClient(stack.oracle.address) as oracle:
        at = await oracle.read_ts(timelines.CATALOG)
    async with CatalogClient(stack.catalog.address) as catalog:
        items = (await catalog.snapshot_at(at)).items
    (primary,) = [i for i in items if i.WhichOneof("body") == "source" and i.name.item == source]
    members = [i for i in items if i.source.primary_id == primary.id]
    collections = [collection_of(i) for i in (primary, *members)]
    assert len(collections) == relations
    async with StorageClient(stack.storage.address) as storage:
        for collection in collections:
            deadline = time.monotonic() + 30
            while True:
                held = (await storage.describe(collection)).capabilities
                critical = [c for c in held if c.critical and c.holder == CATALOG_HOLDER]
                writers = [c for c in held if c.kind == "write" and c.holder == "sources"]
                if critical and writers:
                    break
                assert time.monotonic() < deadline, (collection, held)
                await asyncio.sleep(0.2)


async def test_kill_9_of_the_sources_process_loses_and_doubles_no_tick(
    a: AdapterClient, stack: SqlStack
) -> None:
    await ok(a, "CREATE SOURCE steady FROM LOAD GENERATOR COUNTER (TICK INTERVAL '20ms')")
    states = [await until_count(a, "steady", 20)]
    rng = random.Random(16)
    for _ in range(3):
        assert stack.sources is not None
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        stack.sources.kill()  # SIGKILL, mid-stream
        stack.start_sources()
        states.append(await until_count(a, "steady", states[-1][0] + 10))
    for count, distinct, low, high, offset in states:
        # Exactly 1..n, and the progress relation bound to exactly these ticks.
        assert (distinct, low, high, offset) == (count, 1, count, count)
    # Every restart recovered from the binding its predecessor left.
    assert stack.sources is not None
    recovered = stack.sources.wait_for_record(
        lambda r: r.get("event") == "source_recovered" and r.get("source", "").endswith("steady")
    )
    assert recovered["offset"] >= states[-2][0]


async def test_tpch_is_readable_whole_from_the_first_read_then_orders_change(
    a: AdapterClient, stack: SqlStack
) -> None:
    """The initial tables land at the time the source's collections start at, so even the
    first read after CREATE SOURCE sees all of them; then orders change under a view."""
    tpch = generator_for(LoadGeneratorSpec("TPCH", scale_factor=0.001))
    tables = list(tpch.schemas())
    await ok(
        a,
        "CREATE SOURCE h FROM LOAD GENERATOR TPCH (SCALE FACTOR 0.001, TICK INTERVAL '100ms') "
        "FOR ALL TABLES",
    )
    counts = ", ".join(f"(SELECT count(*) FROM {name})" for name in tables)
    (first,) = (await ok(a, f'SELECT {counts}, (SELECT max("offset") FROM h_progress)')).rows
    # Exactly the tables as of the ticks the progress relation says are in (TPCH's rows do
    # not depend on the clock, so the generator here makes the same ones).
    offset = int(first[-1])
    made = tpch.ticks(0, offset)
    expected = {name: sum(diff for _, diff in made[name]) for name in tables}
    assert dict(zip(tables, first[:-1], strict=True)) == expected
    assert expected["orders"] == 1500 and expected["lineitem"] > 1500
    revenue = (
        "SELECT o.o_orderpriority, count(DISTINCT o.o_orderkey) AS orders, "
        "sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue "
        "FROM orders o JOIN lineitem l ON l.l_orderkey = o.o_orderkey GROUP BY o.o_orderpriority"
    )
    await ok(a, f"CREATE MATERIALIZED VIEW revenue AS {revenue}")
    async with OracleClient(stack.oracle.address) as oracle:
        answers = []
        for _ in range(2):
            await asyncio.sleep(0.5)
            moment = await oracle.read_ts(timelines.DATA)
            view = sorted((await ok(a, f"SELECT * FROM revenue AS OF {moment}")).rows)
            assert view == sorted((await ok(a, f"{revenue} AS OF {moment}")).rows)
            assert sum(int(r[1]) for r in view) == expected["orders"]
            answers.append(view)
        assert answers[0] != answers[1]  # orders were replaced in between
    await ok(a, "DROP SOURCE h CASCADE")
