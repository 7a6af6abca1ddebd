"""SQL end to end: oracle, storage, catalog, compute (Spark) and two adapter processes.

DDL round trips and errors (with SQLSTATEs and positions), writes through one adapter read
through the other, tables, views, materialized views and indexed views agreeing, the
transaction rules, SUBSCRIBE, and what bad input and a missing backend look like."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal

import pytest

from tests.support.service_process import ServiceProcess
from tests.support.sql_results import fails, ok
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import (
    AdapterClient,
    Changes,
    Progress,
    SubscribeError,
    SubscribeHeader,
)
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.errors import InvalidArgument

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("sql"), adapters=2) as running:
        yield running


@pytest.fixture
async def a(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as client:
        yield client


@pytest.fixture
async def b(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(1)) as client:
        yield client


async def rows(client: AdapterClient, sql: str) -> list[tuple[object, ...]]:
    return sorted((await ok(client, sql)).rows, key=repr)


# -- DDL ----------------------------------------------------------------------------------


async def test_ddl_round_trip_across_adapters(a: AdapterClient, b: AdapterClient) -> None:
    created = await ok(
        a, "CREATE TABLE ddl_t (id bigint NOT NULL, name text, amount numeric(10,2))"
    )
    assert created.tag == "CREATE TABLE"
    # The other adapter sees it at once: its catalog read timestamp is past the creation.
    columns = await ok(b, "SHOW COLUMNS FROM ddl_t")
    assert columns.rows == [
        ("id", "false", "bigint"),
        ("name", "true", "text"),
        ("amount", "true", "numeric(10,2)"),
    ]
    assert ("ddl_t",) in (await ok(b, "SHOW TABLES")).rows
    await ok(b, "CREATE VIEW ddl_v AS SELECT id, amount FROM ddl_t WHERE amount > 1")
    await ok(a, "CREATE INDEX ddl_i ON ddl_v (id)")
    indexes = await ok(b, "SHOW INDEXES ON ddl_v")
    assert indexes.rows == [("ddl_i", "ddl_v", "default", "id")]
    dropped = await fails(a, "DROP TABLE ddl_t")
    assert dropped.code == "2BP01"
    assert "ddl_v" in dropped.message
    cascade = await ok(b, "DROP TABLE ddl_t CASCADE")
    assert sorted(cascade.notices) == [
        "drop cascades to index tidemark.public.ddl_i",
        "drop cascades to view tidemark.public.ddl_v",
    ]
    missing = await fails(a, "SELECT * FROM ddl_v")
    assert missing.code == "42P01"
    assert (await ok(a, "DROP TABLE IF EXISTS ddl_t")).notices == [
        'table "ddl_t" does not exist, skipping'
    ]


async def test_ddl_errors_carry_sqlstate_and_position(a: AdapterClient) -> None:
    await ok(a, "CREATE TABLE err_t (x bigint)")
    duplicate = await fails(a, "CREATE TABLE err_t (y bigint)")
    assert duplicate.code == "42P07"
    assert (await ok(a, "CREATE TABLE IF NOT EXISTS err_t (y bigint)")).notices == [
        'table "err_t" already exists, skipping'
    ]
    sql = "SELECT x, nope FROM err_t"
    unknown = await fails(a, sql)
    assert unknown.code == "42703"
    assert unknown.position == sql.index("nope") + 1
    sql = "CREATE INDEX ON err_t (zz)"
    assert (await fails(a, sql)).code == "42703"
    assert (await fails(a, "CREATE MATERIALIZED VIEW m IN CLUSTER nowhere AS SELECT 1")).code == (
        "42704"
    )
    assert (await fails(a, "DROP VIEW err_t")).code == "42809"
    assert (await fails(a, "DROP INDEX no_such_index")).code == "42704"
    syntax = await fails(a, "SELECT * FROM err_t; SELEC 1")
    assert syntax.code == "42601"


async def test_concurrent_ddl_on_two_adapters(a: AdapterClient, b: AdapterClient) -> None:
    """Lost compare-and-append races are retried: every distinct name is created once, and of
    two adapters creating the same name exactly one succeeds."""
    statements = [(a, f"CREATE TABLE race_{i} (x bigint)") for i in range(4)]
    statements += [(b, f"CREATE TABLE race_{i} (x bigint)") for i in range(4, 8)]
    statements += [(a, "CREATE TABLE race_same (x bigint)"), (b, "CREATE TABLE race_same (y text)")]
    results = await asyncio.gather(*(client.execute(sql) for client, sql in statements))
    assert all(r.error is None for r in results[:8])
    same = [r.error for r in results[8:]]
    assert sorted(e.code if e else "ok" for e in same) == ["42P07", "ok"]
    tables = {row[0] for row in (await ok(b, "SHOW TABLES")).rows}
    assert {f"race_{i}" for i in range(8)} | {"race_same"} <= tables


async def test_a_failed_statement_stops_the_batch(a: AdapterClient) -> None:
    await ok(a, "CREATE TABLE batch_t (x bigint)")
    result = await a.execute(
        "INSERT INTO batch_t VALUES (1); SELECT * FROM missing_t; INSERT INTO batch_t VALUES (2)"
    )
    assert [r.tag for r in result.results] == ["INSERT 0 1", ""]
    assert result.results[1].error is not None
    assert result.results[1].error.code == "42P01"
    assert (await ok(a, "SELECT x FROM batch_t")).rows == [(1,)]


async def test_create_cluster_only_records_it(a: AdapterClient, b: AdapterClient) -> None:
    created = await ok(a, "CREATE CLUSTER analytics (SIZE 'small')")
    assert created.tag == "CREATE CLUSTER"
    assert "compute process" in created.notices[0]
    assert ("analytics", "small", "1") in (await ok(b, "SHOW CLUSTERS")).rows
    # No compute endpoint for it here: a clear error, not a hang.
    await ok(b, "SET cluster = analytics")
    await ok(b, "CREATE TABLE cl_t (x bigint)")
    error = await fails(b, "SELECT * FROM cl_t")
    assert error.code == "42704"
    assert "analytics" in error.message
    await ok(b, "SET cluster = default")
    await ok(a, "DROP CLUSTER analytics")


# -- writes and reads across adapters ------------------------------------------------------


async def test_writes_on_one_adapter_are_read_on_the_other(
    a: AdapterClient, b: AdapterClient
) -> None:
    await ok(a, "CREATE TABLE acc (id bigint NOT NULL, owner text, balance numeric(12,2))")
    inserted = await ok(a, "INSERT INTO acc VALUES (1, 'ann', 10.5), (2, 'bob', 20), (3, 'cy', 0)")
    assert inserted.tag == "INSERT 0 3"
    assert inserted.timestamp > 0
    read = await ok(b, "SELECT id, owner, balance FROM acc ORDER BY id")
    assert read.rows == [
        (1, "ann", Decimal("10.50")),
        (2, "bob", Decimal("20.00")),
        (3, "cy", Decimal("0.00")),
    ]
    assert read.timestamp >= inserted.timestamp
    updated = await ok(b, "UPDATE acc SET balance = balance + 1 WHERE id >= 2")
    assert updated.tag == "UPDATE 2"
    assert await rows(a, "SELECT id, balance FROM acc") == sorted(
        [(1, Decimal("10.50")), (2, Decimal("21.00")), (3, Decimal("1.00"))], key=repr
    )
    deleted = await ok(a, "DELETE FROM acc WHERE owner = 'cy'")
    assert deleted.tag == "DELETE 1"
    assert (await ok(b, "SELECT count(*) FROM acc")).rows == [(2,)]
    null = await fails(b, "UPDATE acc SET id = NULL")
    assert null.code == "23502"
    assert (await ok(a, "SELECT sum(balance) FROM acc")).rows == [(Decimal("31.50"),)]


async def test_as_of_reads_history(a: AdapterClient, b: AdapterClient) -> None:
    await ok(a, "CREATE TABLE hist (x bigint)")
    first = await ok(a, "INSERT INTO hist VALUES (1)")
    second = await ok(b, "INSERT INTO hist VALUES (2)")
    assert (await ok(b, f"SELECT x FROM hist AS OF {first.timestamp}")).rows == [(1,)]
    assert await rows(a, f"SELECT x FROM hist AS OF {second.timestamp}") == [(1,), (2,)]
    assert (await ok(a, f"SELECT x FROM hist AS OF {first.timestamp - 1}")).rows == []
    # A time that has not come yet is refused, for reads and subscriptions alike, and moves
    # nothing: writes to the table still land at once (a read of the future would have
    # moved its upper past every write timestamp for the next hour).
    future = second.timestamp + 3_600_000
    refused = await fails(a, f"SELECT x FROM hist AS OF {future}")
    assert refused.code == "22023" and "later than the latest complete time" in refused.message
    events = [event async for event in b.subscribe(f"SUBSCRIBE hist AS OF {future}")]
    assert len(events) == 1 and isinstance(events[0], SubscribeError)
    assert events[0].error.code == "22023"
    third = await ok(b, "INSERT INTO hist VALUES (3)")
    assert third.timestamp < future
    assert await rows(a, "SELECT x FROM hist") == [(1,), (2,), (3,)]


async def test_tables_views_materialized_views_and_indexes_agree(
    a: AdapterClient, b: AdapterClient
) -> None:
    await ok(a, "CREATE TABLE sales (region text NOT NULL, item text, qty bigint)")
    await ok(
        a,
        "INSERT INTO sales VALUES ('n', 'x', 1), ('n', 'y', 2), ('s', 'x', 5), ('s', NULL, 7),"
        " ('e', 'z', NULL)",
    )
    query = "SELECT region, count(*) AS n, sum(qty) AS total FROM sales GROUP BY region"
    await ok(a, f"CREATE VIEW sales_v AS {query}")
    await ok(b, f"CREATE MATERIALIZED VIEW sales_mv AS {query}")
    await ok(a, f"CREATE VIEW sales_iv AS {query}")
    await ok(b, "CREATE INDEX sales_iv_idx ON sales_iv (region)")
    explained = await ok(a, "EXPLAIN SELECT * FROM sales_iv")
    assert "Peek index" in str(explained.rows[0][0])
    for change in (
        None,
        "INSERT INTO sales VALUES ('w', 'q', 3), ('n', 'x', 4)",
        "UPDATE sales SET qty = qty * 10 WHERE region = 's'",
        "DELETE FROM sales WHERE item = 'x'",
    ):
        if change is not None:
            await ok(a, change)
        expected = await rows(b, query)
        for relation in ("sales_v", "sales_mv", "sales_iv"):
            for client in (a, b):
                assert await rows(client, f"SELECT * FROM {relation}") == expected, relation


async def test_order_limit_and_offset_are_applied(a: AdapterClient) -> None:
    await ok(a, "CREATE TABLE ordered (k bigint, v text)")
    await ok(a, "INSERT INTO ordered VALUES (3, 'c'), (1, 'a'), (NULL, 'n'), (2, 'b')")
    assert (await ok(a, "SELECT v FROM ordered ORDER BY k")).rows == [
        ("a",),
        ("b",),
        ("c",),
        ("n",),
    ]
    assert (await ok(a, "SELECT v FROM ordered ORDER BY k DESC LIMIT 2")).rows == [("n",), ("c",)]
    assert (await ok(a, "SELECT k FROM ordered ORDER BY k LIMIT 2 OFFSET 1")).rows == [(2,), (3,)]


async def test_generate_series_fills_a_table_and_feeds_a_view(
    a: AdapterClient, b: AdapterClient
) -> None:
    await ok(a, "CREATE TABLE filled (g bigint, m bigint)")
    inserted = await ok(
        a, "INSERT INTO filled SELECT g, g % 10 FROM generate_series(1, 100000) AS g"
    )
    assert inserted.tag == "INSERT 0 100000"
    assert (await ok(b, "SELECT count(*), sum(g), min(m), max(m) FROM filled")).rows == [
        (100000, Decimal(5000050000), 0, 9)
    ]
    await ok(
        b,
        "CREATE MATERIALIZED VIEW filled_mv AS SELECT s.x, count(f.g) AS n "
        "FROM generate_series(0, 10, 5) AS s(x) LEFT JOIN filled f ON f.m = s.x GROUP BY s.x",
    )
    assert sorted((await ok(a, "SELECT * FROM filled_mv")).rows) == [
        (0, 10000),
        (5, 10000),
        (10, 0),
    ]
    await ok(a, "INSERT INTO filled VALUES (0, 0), (10, 10)")
    assert sorted((await ok(b, "SELECT * FROM filled_mv")).rows) == [
        (0, 10001),
        (5, 10000),
        (10, 1),
    ]
    assert (await fails(a, "SELECT * FROM generate_series(1, 10, 0)")).code == "22023"
    assert (await fails(a, "SELECT * FROM generate_series(1, 2000000)")).code == "54000"
    assert (await fails(a, "SELECT * FROM filled, generate_series(1, g)")).code == "0A000"


# -- transactions --------------------------------------------------------------------------


async def test_read_only_transaction_reads_at_one_time(a: AdapterClient, b: AdapterClient) -> None:
    await ok(a, "CREATE TABLE ro (x bigint)")
    await ok(a, "INSERT INTO ro VALUES (1)")
    await ok(a, "BEGIN")
    first = await ok(a, "SELECT x FROM ro")
    await ok(b, "INSERT INTO ro VALUES (2)")
    again = await ok(a, "SELECT x FROM ro")
    assert again.rows == first.rows == [(1,)]
    assert again.timestamp == first.timestamp
    await ok(a, "COMMIT")
    assert await rows(a, "SELECT x FROM ro") == [(1,), (2,)]


async def test_write_only_transaction_applies_at_commit(a: AdapterClient, b: AdapterClient) -> None:
    await ok(a, "CREATE TABLE wo (x bigint)")
    await ok(a, "BEGIN; INSERT INTO wo VALUES (1); INSERT INTO wo VALUES (2)")
    assert (await ok(b, "SELECT count(*) FROM wo")).rows == [(0,)]
    committed = await ok(a, "COMMIT")
    assert committed.tag == "COMMIT"
    assert committed.timestamp > 0
    assert await rows(b, "SELECT x FROM wo") == [(1,), (2,)]
    await ok(a, "BEGIN; INSERT INTO wo VALUES (3); ROLLBACK")
    assert (await ok(b, "SELECT count(*) FROM wo")).rows == [(2,)]


async def test_read_then_write_conflict_is_a_serialization_failure(
    a: AdapterClient, b: AdapterClient
) -> None:
    await ok(a, "CREATE TABLE rw (id bigint, v bigint)")
    await ok(a, "INSERT INTO rw VALUES (1, 10)")
    await ok(a, "BEGIN")
    assert (await ok(a, "SELECT v FROM rw WHERE id = 1")).rows == [(10,)]
    await ok(a, "UPDATE rw SET v = 11 WHERE id = 1")
    await ok(b, "UPDATE rw SET v = 20 WHERE id = 1")  # the input changed after a's read
    failure = await fails(a, "COMMIT")
    assert failure.code == "40001"
    assert a.session.transaction == b""
    assert (await ok(a, "SELECT v FROM rw")).rows == [(20,)]
    # Without interference the same transaction commits.
    await ok(a, "BEGIN; SELECT v FROM rw WHERE id = 1; UPDATE rw SET v = v + 1 WHERE id = 1")
    await ok(a, "COMMIT")
    assert (await ok(b, "SELECT v FROM rw")).rows == [(21,)]


async def test_transaction_limits(a: AdapterClient, b: AdapterClient) -> None:
    await ok(a, "CREATE TABLE lim1 (x bigint); CREATE TABLE lim2 (x bigint)")
    await ok(a, "BEGIN; INSERT INTO lim1 VALUES (1)")
    multi = await fails(a, "INSERT INTO lim2 VALUES (1)")
    assert multi.code == "0A000"
    aborted = await fails(a, "SELECT 1")
    assert aborted.code == "25P02"
    assert (await ok(a, "COMMIT")).tag == "ROLLBACK"
    assert (await ok(b, "SELECT count(*) FROM lim1")).rows == [(0,)]
    await ok(a, "BEGIN; INSERT INTO lim1 VALUES (1)")
    assert (await fails(a, "SELECT * FROM lim1")).code == "0A000"
    await ok(a, "ROLLBACK")
    assert (await fails(a, "BEGIN; CREATE TABLE lim3 (x bigint)")).code == "25001"
    await ok(a, "ROLLBACK")


async def test_a_transaction_continues_on_the_other_adapter(
    a: AdapterClient, b: AdapterClient, stack: SqlStack
) -> None:
    await ok(a, "CREATE TABLE moved (x bigint)")
    await ok(a, "BEGIN; INSERT INTO moved VALUES (7)")
    async with AdapterClient(stack.adapter(1)) as elsewhere:
        elsewhere.session = a.session
        assert (await ok(elsewhere, "COMMIT")).tag == "COMMIT"
    assert (await ok(b, "SELECT x FROM moved")).rows == [(7,)]


# -- SUBSCRIBE -----------------------------------------------------------------------------


SUBJECTS = {
    # storage's subscription to the table
    "table": "sub_t",
    # a temporary dataflow
    "view": "sub_v",
    "query": "(SELECT k, sum(v) AS s FROM sub_t GROUP BY k)",
    "top k": "(SELECT k, count(*) AS n FROM sub_t GROUP BY k ORDER BY k DESC LIMIT 5)",
    # compute's subscription to an index
    "indexed view": "sub_iv",
    # storage's subscription to the view's collection
    "materialized view": "sub_mv",
}


async def _temporary_dataflows(stack: SqlStack) -> list[str]:
    async with ComputeClient(stack.compute.compute().address) as compute:
        status = await compute.status()
    return [d.dataflow_id for d in status.dataflows if d.dataflow_id.startswith("subscribe-")]


@pytest.mark.parametrize("kind", list(SUBJECTS))
async def test_subscribe_sees_an_insert_made_on_the_other_adapter(
    a: AdapterClient, b: AdapterClient, stack: SqlStack, kind: str
) -> None:
    subject = SUBJECTS[kind]
    await ok(a, "CREATE TABLE IF NOT EXISTS sub_t (k bigint, v bigint)")
    await ok(a, "CREATE VIEW IF NOT EXISTS sub_v AS SELECT k, v FROM sub_t WHERE v > 0")
    await ok(a, "CREATE VIEW IF NOT EXISTS sub_iv AS SELECT k, v FROM sub_t WHERE v < 100")
    await ok(a, "CREATE INDEX IF NOT EXISTS sub_iv_k ON sub_iv (k)")
    await ok(a, "CREATE MATERIALIZED VIEW IF NOT EXISTS sub_mv AS SELECT k, v FROM sub_t")
    start = await ok(a, "INSERT INTO sub_t VALUES (1, 1)")
    before = await ok(b, f"SELECT * FROM {subject} AS x AS OF {start.timestamp}")
    events = a.subscribe(f"SUBSCRIBE {subject} AS OF {start.timestamp}")
    header = await anext(events)
    assert isinstance(header, SubscribeHeader), header
    assert header.as_of == start.timestamp
    assert [c.name for c in header.columns] == [c.name for c in before.columns]
    inserted = await ok(b, "INSERT INTO sub_t VALUES (2, 5)")
    seen: list[tuple[int, int, tuple[object, ...]]] = []
    async with asyncio.timeout(120):
        async for event in events:
            assert not isinstance(event, SubscribeError), event
            if isinstance(event, Changes):
                seen += [(c.timestamp, c.diff, c.row) for c in event.changes]
            if isinstance(event, Progress) and event.upper is not None:
                if event.upper > inserted.timestamp:
                    break
    await events.aclose()
    snapshot: Counter[tuple[object, ...]] = Counter()
    for time, diff, row in seen:
        if time <= start.timestamp:
            assert time == start.timestamp
            snapshot[row] += diff
    assert sorted(snapshot.elements(), key=repr) == sorted(before.rows, key=repr)
    later = [(t, d, r) for t, d, r in seen if t > start.timestamp]
    assert any(t == inserted.timestamp and d == 1 and r[0] == 2 for t, d, r in later), seen
    assert all(t == inserted.timestamp for t, _, _ in later), later
    # A temporary dataflow goes when its subscription does.
    async with asyncio.timeout(60):
        # Polling another process's status: there is no event to wait on.
        while await _temporary_dataflows(stack):  # noqa: ASYNC110
            await asyncio.sleep(0.2)


async def test_subscribe_errors_are_messages(a: AdapterClient) -> None:
    events = [event async for event in a.subscribe("SUBSCRIBE no_such_relation")]
    assert len(events) == 1
    assert isinstance(events[0], SubscribeError)
    assert events[0].error.code == "42P01"


async def test_session_settings(a: AdapterClient) -> None:
    await ok(a, "SET search_path = nowhere")
    assert (await ok(a, "SHOW search_path")).rows == [("nowhere",)]
    assert (await fails(a, "CREATE TABLE sp_t (x bigint)")).code == "3F000"
    await ok(a, "RESET search_path")
    assert (await fails(a, "SET no_such_setting = 1")).code == "42704"
    assert (await fails(a, "SET transaction_isolation = 'read uncommitted'")).code == "22023"
    await ok(a, "CREATE SCHEMA other; CREATE TABLE other.o (x bigint)")
    await ok(a, "INSERT INTO other.o VALUES (5)")
    await ok(a, "SET search_path = other, public")
    assert (await ok(a, "SELECT x FROM o")).rows == [(5,)]
    assert (await ok(a, "SHOW TABLES")).rows == [("o",)]


async def test_sources_are_read_once_their_feed_passes_the_read_time(
    a: AdapterClient, stack: SqlStack
) -> None:
    created = await ok(a, "CREATE SOURCE feed (id bigint NOT NULL, note text) FROM CDCV2")
    assert "IngestCdc" in created.notices[0]
    listed = await ok(a, "SHOW SOURCES")
    assert ("feed", "cdcv2") in listed.rows
    described = await ok(a, "SHOW COLUMNS FROM feed")
    assert described.rows == [("id", "false", "bigint"), ("note", "true", "text")]
    async with AdapterClient(stack.adapter(0)) as probe:
        await ok(probe, "SELECT 1")
    # The source's collection is the item's id; feed it directly, far past the read time.
    async with StorageClient(stack.storage.address) as storage:
        source_id = next(
            info.collection_id
            for info in await storage.list()
            if [c.name for c in info.schema.columns] == ["id", "note"]
        )
        pair = await storage.acquire(source_id, "test-feed")
        upper = min(pair.write.frontier.elements)
        await storage.append(
            pair.write, [((1, "one"), upper, 1), ((2, None), upper, 1)], upper + 10**9
        )
        await storage.drop(pair.read)
        await storage.drop(pair.write)
    assert await rows(a, "SELECT id, note FROM feed") == [(1, "one"), (2, None)]
    assert (await fails(a, "INSERT INTO feed VALUES (3, 'x')")).code == "42809"


async def test_statement_timeout_cancels_a_read_that_waits(a: AdapterClient) -> None:
    """Nothing feeds ``stalled``, so a read of it waits for its feed to pass the read time;
    ``statement_timeout`` ends the wait with 57014, and the session goes on."""
    await ok(a, "CREATE SOURCE stalled (id bigint) FROM CDCV2")
    await ok(a, "SET statement_timeout = 300")
    cancelled = await fails(a, "SELECT id FROM stalled")
    assert cancelled.code == "57014" and "statement timeout" in cancelled.message
    await ok(a, "RESET statement_timeout")
    assert (await ok(a, "SELECT 1")).rows == [(1,)]


async def test_views_over_idle_tables_keep_advancing_without_reads(
    a: AdapterClient, stack: SqlStack
) -> None:
    """Nobody writes or reads ``idle_dim``; the adapters' table ticker must still move its upper,
    or the materialized view joining it would never pass the insert into ``busy_fact``."""
    await ok(a, "CREATE TABLE busy_fact (busy_key bigint, amount bigint)")
    await ok(a, "CREATE TABLE idle_dim (busy_key bigint, idle_label text)")
    await ok(
        a,
        "CREATE MATERIALIZED VIEW idle_join AS SELECT f.busy_key AS joined_key, d.idle_label "
        "FROM busy_fact f JOIN idle_dim d ON f.busy_key = d.busy_key",
    )
    inserted = await ok(a, "INSERT INTO busy_fact VALUES (1, 10)")
    assert inserted.timestamp > 0
    async with StorageClient(stack.storage.address) as storage:
        view_id = next(
            info.collection_id
            for info in await storage.list()
            if [c.name for c in info.schema.columns] == ["joined_key", "idle_label"]
        )
        for _ in range(600):
            upper = (await storage.describe(view_id)).upper
            if upper.elements and min(upper.elements) > inserted.timestamp:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail(f"the view's upper {upper} never passed the insert at {inserted.timestamp}")


async def test_a_malformed_session_is_invalid_argument(stack: SqlStack) -> None:
    """A session the client made up fails its signature check before anything else
    (tests/e2e/test_session_signing.py has the rest)."""
    async with AdapterClient(stack.adapter(1)) as client:
        client.session.transaction = b"not a transaction"
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            await client.execute("SELECT 1")
        client.session.transaction = b""
        client.session.settings["statement_timeout"] = "-1"
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            await client.execute("SELECT 1")


@pytest.mark.parametrize(
    "sql",
    [
        "",
        ";;",
        "SELECT '\u0000'",
        "SELECT 9999999999999999999999999999",
        'CREATE TABLE "time" (time bigint)',
        "SELECT * FROM (SELECT",
        "INSERT INTO nowhere SELECT",
        "\x00\x01",
        "UPDATE",
        "SUBSCRIBE",
    ],
)
async def test_bad_input_is_an_sql_error_never_a_trace(a: AdapterClient, sql: str) -> None:
    result = await a.execute(sql)
    for statement in result.results:
        if statement.error is not None:
            assert statement.error.code != "XX000", statement.error
            assert "Traceback" not in statement.error.message


async def test_an_oracle_outage_is_08006_then_recovers(a: AdapterClient, stack: SqlStack) -> None:
    await ok(a, "CREATE TABLE outage (x bigint)")
    oracle = stack.compute.oracle
    assert oracle is not None
    port = oracle.port
    consensus = f"sqlite://{stack.compute.directory}/oracle.db"
    args = ["--listen", f"127.0.0.1:{port}", "--consensus-url", consensus]
    oracle.kill()
    try:
        result = await a.execute("INSERT INTO outage VALUES (1)")
        assert result.error is not None
        assert result.error.code == "08006", result.error
    finally:
        stack.compute.oracle = ServiceProcess("services.oracle", args)
    await ok(a, "INSERT INTO outage VALUES (2)")
    assert (await ok(a, "SELECT x FROM outage")).rows == [(2,)]
