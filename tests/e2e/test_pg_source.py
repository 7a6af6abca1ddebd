"""PostgreSQL sources end to end: a real PostgreSQL (Debian's server, wal_level=logical)
upstream, Tidemark's processes, and SQL through the adapter.

CREATE SECRET / CONNECTION / SOURCE and their errors; the replicated tables equal to the
upstream ones after inserts, updates and deletes, after a kill -9 of the sources process
while a writer commits upstream, and after an upstream restart."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.postgres import DATABASE, PASSWORD, SUPERUSER, PostgresCluster
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient, StatementError, StatementResult


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("pgsrc"), adapters=1, engine="local") as running:
        yield running


@pytest.fixture
async def client(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as c:
        yield c


async def ok(client: AdapterClient, sql: str) -> StatementResult:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


async def fails(client: AdapterClient, sql: str) -> StatementError:
    result = await client.execute(sql)
    assert result.error is not None, f"{sql!r} succeeded: {result.results}"
    return result.error


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
    dropped = await fails(client, "DROP SECRET e_conn_pw")
    assert dropped.code == "2BP01"
    await ok(client, "DROP SOURCE e_src CASCADE")
    await ok(client, "DROP CONNECTION e_conn; DROP SECRET e_conn_pw")
