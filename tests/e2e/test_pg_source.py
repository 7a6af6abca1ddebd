"""PostgreSQL sources end to end: a real PostgreSQL (Debian's server, wal_level=logical)
upstream, Tidemark's processes, and SQL through the adapter.

CREATE SECRET / CONNECTION / SOURCE and their errors; the replicated tables equal to the
upstream ones after inserts, updates and deletes, after a kill -9 of the sources process
while a writer commits upstream, and after an upstream restart."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal

import psycopg2
import pytest

from tests.support.ports import free_port
from tests.support.postgres import DATABASE, PASSWORD, SUPERUSER, PostgresCluster
from tests.support.sql_results import fails, ok
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(
        tmp_path_factory.mktemp("pgsrc"), adapters=1, engine="local", sources=True
    ) as running:
        yield running


@pytest.fixture
async def client(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as c:
        yield c


async def connect_upstream(client: AdapterClient, pg: PostgresCluster, name: str) -> None:
    await ok(client, f"CREATE SECRET {name}_pw AS '{PASSWORD}'")
    await ok(
        client,
        f"CREATE CONNECTION {name} TO POSTGRES (HOST '{pg.host}', PORT {pg.port}, "
        f"USER '{SUPERUSER}', PASSWORD SECRET {name}_pw, DATABASE '{DATABASE}')",
    )


async def test_create_source_errors_create_nothing(
    client: AdapterClient, postgres: PostgresCluster
) -> None:
    postgres.execute(
        "DROP PUBLICATION IF EXISTS e_pub",
        "DROP TABLE IF EXISTS e_keyed, e_full, e_odd",
        "CREATE TABLE e_keyed (id int PRIMARY KEY, v text)",
        "CREATE TABLE e_full (id int, v text)",
        "ALTER TABLE e_full REPLICA IDENTITY FULL",
        "CREATE TABLE e_odd (id int, at timestamptz)",
        "ALTER TABLE e_odd REPLICA IDENTITY FULL",
        "CREATE PUBLICATION e_pub FOR TABLE e_keyed, e_full, e_odd",
    )
    await connect_upstream(client, postgres, "e_conn")
    missing = await fails(
        client,
        "CREATE SOURCE e1 FROM POSTGRES CONNECTION e_conn (PUBLICATION 'nope') FOR ALL TABLES",
    )
    assert missing.code == "42704"
    assert 'publication "nope" does not exist' in missing.message
    identity = await fails(
        client,
        "CREATE SOURCE e1 FROM POSTGRES CONNECTION e_conn (PUBLICATION 'e_pub') "
        "FOR TABLES (e_keyed)",
    )
    assert identity.code == "55000"
    assert "REPLICA IDENTITY FULL" in identity.message
    odd = await fails(
        client,
        "CREATE SOURCE e1 FROM POSTGRES CONNECTION e_conn (PUBLICATION 'e_pub') FOR TABLES (e_odd)",
    )
    assert odd.code == "0A000"
    assert "timestamp with time zone" in odd.message
    absent = await fails(
        client,
        "CREATE SOURCE e1 FROM POSTGRES CONNECTION e_conn (PUBLICATION 'e_pub') "
        "FOR TABLES (e_nothing)",
    )
    assert absent.code == "42704"
    no_connection = await fails(
        client,
        "CREATE SOURCE e1 FROM POSTGRES CONNECTION nope (PUBLICATION 'e_pub') FOR ALL TABLES",
    )
    assert no_connection.code == "42704"
    sources = await ok(client, "SHOW SOURCES")
    assert not [r for r in sources.rows if str(r[0]).startswith("e")]
    # The secret is never printed, not even in the error of a broken CREATE SECRET.
    broken = await fails(client, "CREATE SECRET e_broken 'hunter2'")
    assert "hunter2" not in broken.message
    created = await ok(
        client,
        "CREATE SOURCE e_src FROM POSTGRES CONNECTION e_conn (PUBLICATION 'e_pub') "
        "FOR TABLES (e_full AS full_copy)",
    )
    assert created.tag == "CREATE SOURCE"
    columns = await ok(client, "SHOW COLUMNS FROM full_copy")
    assert [(r[0], r[2]) for r in columns.rows] == [("id", "bigint"), ("v", "text")]
    shown = await ok(client, "SHOW SOURCES")
    assert ("e_src", "postgres") in shown.rows and ("full_copy", "subsource") in shown.rows
    assert ("e_src_progress", "progress") in shown.rows
    assert ("e_conn", "postgres") in (await ok(client, "SHOW CONNECTIONS")).rows
    secrets = await ok(client, "SHOW SECRETS")
    assert secrets.rows == [("e_conn_pw",)]
    assert PASSWORD not in repr(secrets)
    # A connection is checked when it is created: an upstream nobody answers at fails.
    unreachable = await fails(
        client,
        f"CREATE CONNECTION e_dead TO POSTGRES (HOST '127.0.0.1', PORT {free_port()}, "
        f"USER 'x', DATABASE 'y')",
    )
    assert unreachable.code == "08001"
    assert not [r for r in (await ok(client, "SHOW CONNECTIONS")).rows if r[0] == "e_dead"]
    # TEXT COLUMNS replicates a column of a type Tidemark lacks as its text.
    postgres.execute("INSERT INTO e_odd VALUES (1, '2024-05-06 07:08:09+00')")
    await ok(
        client,
        "CREATE SOURCE e_txt FROM POSTGRES CONNECTION e_conn (PUBLICATION 'e_pub', "
        "TEXT COLUMNS (e_odd.at)) FOR TABLES (e_odd)",
    )
    postgres.execute("INSERT INTO e_odd VALUES (2, NULL), (3, '2025-01-01 00:00:00.5+00')")
    expected = Counter(tuple(r) for r in postgres.query("SELECT id, at::text FROM e_odd"))
    for _ in range(100):
        got = Counter(tuple(r) for r in (await ok(client, "SELECT id, at FROM e_odd")).rows)
        if got == expected:
            break
        await asyncio.sleep(0.2)
    assert got == expected
    await ok(client, "DROP SOURCE e_txt")
    dropped = await fails(client, "DROP SECRET e_conn_pw")
    assert dropped.code == "2BP01"
    await ok(client, "DROP SOURCE e_src CASCADE")
    await ok(client, "DROP CONNECTION e_conn; DROP SECRET e_conn_pw")


# -- ingestion ----------------------------------------------------------------------------


COLUMNS = "id, name, amount, flag, at"


def make_upstream(pg: PostgresCluster, table: str, publication: str, rows: int) -> None:
    pg.execute(
        f"DROP PUBLICATION IF EXISTS {publication}",
        f"DROP TABLE IF EXISTS {table}",
        f"CREATE TABLE {table} (id bigint, name text, amount numeric(12,2), flag boolean, "
        f"at timestamp)",
        f"ALTER TABLE {table} REPLICA IDENTITY FULL",
        f"INSERT INTO {table} SELECT g, 'row ' || g, g * 1.25, g % 2 = 0, "
        f"timestamp '2024-01-01' + g * interval '1 second' FROM generate_series(1, {rows}) g",
        f"CREATE PUBLICATION {publication} FOR TABLE {table}",
    )


def upstream_rows(pg: PostgresCluster, table: str) -> Counter[tuple[object, ...]]:
    return Counter(tuple(r) for r in pg.query(f"SELECT {COLUMNS} FROM {table}"))


async def tidemark_rows(client: AdapterClient, relation: str) -> Counter[tuple[object, ...]]:
    result = await ok(client, f"SELECT {COLUMNS} FROM {relation}")
    return Counter(tuple(r) for r in result.rows)


async def wait_equal(
    client: AdapterClient, pg: PostgresCluster, table: str, relation: str, within: float = 90
) -> Counter[tuple[object, ...]]:
    """Waits until the Tidemark relation holds exactly the upstream table's rows (each as
    often); fails with the difference when it does not within ``within`` seconds."""
    expected = upstream_rows(pg, table)
    deadline = time.monotonic() + within
    while True:
        got = await tidemark_rows(client, relation)
        if got == expected:
            return got
        if time.monotonic() > deadline:
            missing = expected - got
            extra = got - expected
            raise AssertionError(
                f"{relation} differs from upstream {table}: {sum(missing.values())} rows "
                f"missing (e.g. {list(missing)[:3]}), {sum(extra.values())} extra "
                f"(e.g. {list(extra)[:3]})"
            )
        await asyncio.sleep(0.3)


class Writer:
    """Commits small transactions upstream (inserts, updates, deletes) on a thread until
    stopped; rides out an upstream restart by reconnecting."""

    def __init__(self, pg: PostgresCluster, table: str, first_id: int) -> None:
        self.pg = pg
        self.table = table
        self.next_id = first_id
        self.commits = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        rng = random.Random(7)
        conn = None
        while not self.stopped.is_set():
            try:
                if conn is None:
                    conn = self.pg.connect()
                with conn.cursor() as cur:
                    for _ in range(rng.randint(1, 5)):
                        choice = rng.random()
                        if choice < 0.6:
                            cur.execute(
                                f"INSERT INTO {self.table} "
                                "VALUES (%s, %s, %s, %s, now()::timestamp)",
                                (self.next_id, f"w{self.next_id}", self.next_id / 4, True),
                            )
                            self.next_id += 1
                        elif choice < 0.85:
                            cur.execute(
                                f"UPDATE {self.table} SET amount = amount + 1, flag = NOT flag "
                                f"WHERE id = %s",
                                (rng.randint(1, self.next_id),),
                            )
                        else:
                            cur.execute(
                                f"DELETE FROM {self.table} WHERE id = %s",
                                (rng.randint(1, self.next_id),),
                            )
                conn.commit()
                self.commits += 1
                time.sleep(0.005)
            except psycopg2.Error:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


async def create_source(
    client: AdapterClient, pg: PostgresCluster, name: str, publication: str, tables: str
) -> None:
    await connect_upstream(client, pg, f"{name}_conn")
    await ok(
        client,
        f"CREATE SOURCE {name} FROM POSTGRES CONNECTION {name}_conn "
        f"(PUBLICATION '{publication}') FOR TABLES ({tables})",
    )


async def test_insert_update_delete_upstream(
    client: AdapterClient, postgres: PostgresCluster, stack: SqlStack
) -> None:
    make_upstream(postgres, "orders", "iud_pub", 500)
    await create_source(client, postgres, "iud", "iud_pub", "orders AS iud_orders")
    snapshot = await wait_equal(client, postgres, "orders", "iud_orders")
    assert sum(snapshot.values()) == 500
    postgres.execute(
        "INSERT INTO orders VALUES (1001, 'new', 3.50, NULL, NULL), (1002, NULL, NULL, true, "
        "'2025-02-03 04:05:06.789')",
        "UPDATE orders SET name = 'changed', amount = amount * 2 WHERE id % 10 = 0",
        "DELETE FROM orders WHERE id % 7 = 0",
        # A row twice: a table without a key may hold duplicates, and so must the copy.
        "INSERT INTO orders SELECT * FROM orders WHERE id = 1",
    )
    final = await wait_equal(client, postgres, "orders", "iud_orders")
    assert final[(1, "row 1", Decimal("1.25"), False, datetime.datetime(2024, 1, 1, 0, 0, 1))] == 2
    progress = await ok(client, 'SELECT "offset" FROM iud_progress')
    assert len(progress.rows) == 1 and int(progress.rows[0][0]) > 0
    slots = "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'tidemark_%_iud'"
    assert len(postgres.query(slots)) == 1
    # Dropping the source drops its subsources, its progress and its slot upstream.
    await ok(client, "DROP SOURCE iud")
    assert postgres.query(slots) == []
    assert (await fails(client, "SELECT * FROM iud_orders")).code == "42P01"


async def test_kill_9_of_the_sources_process_mid_stream(
    client: AdapterClient, postgres: PostgresCluster, stack: SqlStack
) -> None:
    make_upstream(postgres, "k_orders", "k_pub", 200)
    await create_source(client, postgres, "k", "k_pub", "k_orders")
    await wait_equal(client, postgres, "k_orders", "k_orders")
    writer = Writer(postgres, "k_orders", 10_000)
    restarted = []
    try:
        for _ in range(3):
            await asyncio.sleep(1.5)
            assert stack.sources is not None
            stack.sources.kill()  # SIGKILL
            await asyncio.sleep(0.5)
            restarted.append(stack.start_sources())
        await asyncio.sleep(1.5)
    finally:
        writer.stop()
    assert writer.commits > 50
    await wait_equal(client, postgres, "k_orders", "k_orders")
    # Each new process went on from the binding the killed one had recorded.
    for process in restarted:
        record = process.wait_for_record(
            lambda r: r.get("event") == "source_recovered" and r.get("source", "").endswith(".k")
        )
        assert record.get("offset", 0) > 0


async def test_upstream_restart_mid_stream(
    client: AdapterClient, postgres: PostgresCluster, stack: SqlStack
) -> None:
    make_upstream(postgres, "r_orders", "r_pub", 200)
    await create_source(client, postgres, "rs", "r_pub", "r_orders")
    await wait_equal(client, postgres, "r_orders", "r_orders")
    writer = Writer(postgres, "r_orders", 10_000)
    try:
        await asyncio.sleep(1.5)
        postgres.restart()
        await asyncio.sleep(2.0)
    finally:
        writer.stop()
    assert writer.commits > 50
    await wait_equal(client, postgres, "r_orders", "r_orders")
    assert stack.sources is not None
    stack.sources.wait_for_record(lambda r: r.get("event") == "postgres_disconnected")


async def test_upstream_transactions_stay_whole_across_tables(
    client: AdapterClient, postgres: PostgresCluster, stack: SqlStack
) -> None:
    """A transaction moving rows between two upstream tables is never seen half done: every
    read of both subsources (at one timestamp) counts all the rows."""
    postgres.execute(
        "DROP PUBLICATION IF EXISTS m_pub",
        "DROP TABLE IF EXISTS m_left, m_right",
        "CREATE TABLE m_left (id bigint, v text)",
        "CREATE TABLE m_right (id bigint, v text)",
        "ALTER TABLE m_left REPLICA IDENTITY FULL",
        "ALTER TABLE m_right REPLICA IDENTITY FULL",
        "INSERT INTO m_left SELECT g, 'v' || g FROM generate_series(1, 100) g",
        "CREATE PUBLICATION m_pub FOR TABLE m_left, m_right",
    )
    await connect_upstream(client, postgres, "m_conn")
    await ok(
        client,
        "CREATE SOURCE m FROM POSTGRES CONNECTION m_conn (PUBLICATION 'm_pub') FOR ALL TABLES",
    )
    total = "SELECT (SELECT count(*) FROM m_left) + (SELECT count(*) FROM m_right)"
    first = await ok(client, total)
    assert first.rows == [(100,)]

    def move() -> None:
        with contextlib.closing(postgres.connect()) as conn, conn.cursor() as cur:
            for moved in range(1, 61):
                # Rows go right; every fifth move sends one back.
                source, target = ("m_right", "m_left") if moved % 5 == 0 else ("m_left", "m_right")
                cur.execute(
                    f"WITH gone AS (DELETE FROM {source} WHERE id = (SELECT min(id) FROM "
                    f"{source}) RETURNING *) INSERT INTO {target} SELECT * FROM gone"
                )
                conn.commit()
                time.sleep(0.02)

    mover = asyncio.get_running_loop().run_in_executor(None, move)
    reads = 0
    while not mover.done():
        assert (await ok(client, total)).rows == [(100,)]
        reads += 1
    await mover
    assert reads > 3
    await wait_columns_equal(client, postgres, "m_left")
    await wait_columns_equal(client, postgres, "m_right")


async def wait_columns_equal(client: AdapterClient, pg: PostgresCluster, table: str) -> None:
    expected = Counter(tuple(r) for r in pg.query(f"SELECT id, v FROM {table}"))
    for _ in range(300):
        got = Counter(tuple(r) for r in (await ok(client, f"SELECT id, v FROM {table}")).rows)
        if got == expected:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{table} differs from upstream")
