"""Two tenants on one Tidemark: database ``a`` with cluster ``ca`` for role ``alice``,
database ``b`` with cluster ``cb`` for role ``bob``, set up by the bootstrap superuser. One
adapter runs ``auth = password`` (gRPC metadata and SCRAM over pgwire), one the default
``trust``. A tenant cannot read, write, drop or use the other's objects (42501), sees only its
own, and a wrong password is refused (28P01) over gRPC and over pgwire."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg
import psycopg2
import pytest

from tests.support.ports import free_port
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import (
    AdapterClient,
    StatementError,
    StatementResult,
    SubscribeError,
)

ROOT_PASSWORD = "root-pw"


@dataclass
class Tenants:
    stack: SqlStack
    pg_port: int

    @asynccontextmanager
    async def client(
        self, user: str = "", password: str = "", **settings: str
    ) -> AsyncIterator[AdapterClient]:
        """A session on the password adapter (index 0), its ``settings`` SET first (a client
        cannot make up a session: the adapter signs them); ``user`` empty: the superuser."""
        async with AdapterClient(
            self.stack.adapter(0),
            user=user or "tidemark",
            password=password or (ROOT_PASSWORD if not user else ""),
        ) as client:
            for name, value in settings.items():
                result = await client.execute(f"SET {name} = '{value}'")
                assert result.error is None, result.error
            yield client


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


async def ok(client: AdapterClient, sql: str) -> StatementResult:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


async def fails(client: AdapterClient, sql: str, code: str = "42501") -> StatementError:
    result = await client.execute(sql)
    assert result.error is not None, f"{sql!r} succeeded: {result.results}"
    assert result.error.code == code, f"{sql!r}: {result.error}"
    return result.error


SETUP = """
CREATE ROLE alice LOGIN PASSWORD 'alice-pw';
CREATE ROLE bob LOGIN PASSWORD 'bob-pw';
CREATE DATABASE a; CREATE DATABASE b;
CREATE CLUSTER ca; CREATE CLUSTER cb;
GRANT USAGE, CREATE ON DATABASE a TO alice;
GRANT USAGE, CREATE ON SCHEMA a.public TO alice;
GRANT USAGE, CREATE ON CLUSTER ca TO alice;
GRANT USAGE, CREATE ON DATABASE b TO bob;
GRANT ALL ON SCHEMA b.public TO bob;
GRANT ALL PRIVILEGES ON CLUSTER cb TO bob
"""


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    directory = tmp_path_factory.mktemp("tenants")
    root_password = directory / "root-password"
    root_password.write_text(ROOT_PASSWORD + "\n")
    with sql_stack(
        directory,
        adapters=0,
        engine="local",
        warm_up=False,
        clusters=("default", "ca", "cb"),
    ) as stack:
        pg_port = free_port()
        stack.start_adapter(
            *("--auth", "password", "--pgwire-listen", f"127.0.0.1:{pg_port}"),
            *("--bootstrap-superuser-password-file", str(root_password)),
        )
        stack.start_adapter()  # auth = trust, the default
        _wait_listening(pg_port)
        tenants = Tenants(stack, pg_port)
        asyncio.run(_set_up(tenants))
        yield tenants


@pytest.fixture(scope="module")
def setup(tenants: Tenants) -> Tenants:
    return tenants


async def _set_up(tenants: Tenants) -> None:
    async with tenants.client() as root:
        await ok(root, SETUP)
    async with tenants.client("alice", "alice-pw", database="a", cluster="ca") as alice:
        await ok(alice, "CREATE TABLE t (x bigint)")
        await ok(alice, "INSERT INTO t VALUES (1), (2)")
        await ok(alice, "CREATE MATERIALIZED VIEW total AS SELECT sum(x) AS s FROM t")
    async with tenants.client("bob", "bob-pw", database="b", cluster="cb") as bob:
        await ok(bob, "CREATE TABLE secret (s text)")
        await ok(bob, "INSERT INTO secret VALUES ('bob only')")
        await ok(bob, "CREATE VIEW shown AS SELECT upper(s) AS u FROM secret")


@pytest.fixture
async def alice(setup: Tenants) -> AsyncIterator[AdapterClient]:
    async with setup.client("alice", "alice-pw", database="a", cluster="ca") as client:
        yield client


@pytest.fixture
async def bob(setup: Tenants) -> AsyncIterator[AdapterClient]:
    async with setup.client("bob", "bob-pw", database="b", cluster="cb") as client:
        yield client


async def test_a_tenant_uses_its_own_objects(alice: AdapterClient) -> None:
    assert (await ok(alice, "SELECT x FROM t ORDER BY x")).rows == [(1,), (2,)]
    assert (await ok(alice, "SELECT s FROM total")).rows == [(3,)]
    await ok(alice, "UPDATE t SET x = x + 10 WHERE x = 2")
    await ok(alice, "DELETE FROM t WHERE x = 12")
    await ok(alice, "INSERT INTO t VALUES (2)")
    await ok(alice, "CREATE INDEX t_x ON t (x)")
    assert (await ok(alice, "SELECT count(*) FROM t")).rows == [(2,)]


async def test_a_tenant_cannot_touch_the_other_tenants_objects(
    setup: Tenants, alice: AdapterClient
) -> None:
    denied = await fails(alice, "SELECT * FROM b.public.secret")
    assert denied.message == "permission denied for database b"
    await fails(alice, "INSERT INTO b.public.secret VALUES ('x')")
    await fails(alice, "DELETE FROM b.public.secret")
    await fails(alice, "CREATE TABLE b.public.mine (x bigint)")
    await fails(alice, "DROP TABLE b.public.secret")
    await fails(alice, "CREATE SCHEMA b.extra")
    # With USAGE on b's database and schema (so the names resolve), the table itself is
    # still out of reach.
    async with setup.client() as root:
        await ok(
            root, "GRANT USAGE ON DATABASE b TO alice; GRANT USAGE ON SCHEMA b.public TO alice"
        )
    try:
        assert (await fails(alice, "SELECT * FROM b.public.secret")).message == (
            "permission denied for table secret"
        )
        assert (await fails(alice, "UPDATE b.public.secret SET s = 'x'")).message == (
            "permission denied for table secret"
        )
        dropped = await fails(alice, "DROP TABLE b.public.secret")
        assert dropped.message == "must be owner of table secret"
        async for event in alice.subscribe("SUBSCRIBE b.public.secret"):
            assert isinstance(event, SubscribeError)
            assert event.error.code == "42501"
            break
    finally:
        async with setup.client() as root:
            await ok(
                root,
                "REVOKE USAGE ON DATABASE b FROM alice; REVOKE USAGE ON SCHEMA b.public FROM alice",
            )


async def test_a_tenant_cannot_use_the_other_tenants_cluster(alice: AdapterClient) -> None:
    await ok(alice, "SET cluster = cb")  # setting it is allowed; using it is not
    denied = await fails(alice, "SELECT x FROM t")
    assert denied.message == "permission denied for cluster cb"
    await fails(alice, "CREATE MATERIALIZED VIEW m2 AS SELECT x FROM t")
    await fails(alice, "CREATE INDEX ON t (x) IN CLUSTER cb")
    await ok(alice, "SET cluster = ca")
    assert (await ok(alice, "SELECT count(*) FROM t")).rows[0][0] >= 1


async def test_only_superusers_manage_roles_databases_and_clusters(alice: AdapterClient) -> None:
    for sql in (
        "CREATE ROLE mallory LOGIN",
        "ALTER ROLE bob PASSWORD 'mine'",
        "ALTER ROLE alice SUPERUSER",
        "DROP ROLE bob",
        "CREATE DATABASE c",
        "CREATE CLUSTER cc",
        "GRANT alice TO bob",
        "GRANT USAGE ON CLUSTER cb TO alice",
    ):
        await fails(alice, sql)


async def test_grants_and_views_work_as_in_postgresql(
    alice: AdapterClient, bob: AdapterClient, setup: Tenants
) -> None:
    # bob opens his database and schema to alice, and only the view: the view reads secret
    # with bob's rights, so alice reads the view and not the table.
    await fails(bob, "GRANT USAGE ON DATABASE b TO alice")  # the superuser owns database b
    async with setup.client() as root:
        wrong = await fails(root, "GRANT SELECT ON CLUSTER ca TO bob", "0LP01")
        assert wrong.message == "invalid privilege type SELECT for cluster"
        await fails(root, "GRANT USAGE ON CLUSTER ca TO nobody", "42704")
        await ok(root, "ALTER DATABASE b OWNER TO bob; ALTER SCHEMA b.public OWNER TO bob")
    await ok(bob, "GRANT USAGE ON DATABASE b TO alice; GRANT USAGE ON SCHEMA public TO alice")
    await ok(bob, "GRANT SELECT ON shown TO alice")
    try:
        assert (await ok(alice, "SELECT u FROM b.public.shown")).rows == [("BOB ONLY",)]
        await fails(alice, "SELECT s FROM b.public.secret")
        await ok(bob, "GRANT SELECT ON TABLE secret TO PUBLIC")
        assert (await ok(alice, "SELECT s FROM b.public.secret")).rows == [("bob only",)]
        await fails(alice, "INSERT INTO b.public.secret VALUES ('no')")
        await ok(bob, "REVOKE ALL ON secret FROM PUBLIC")
        await fails(alice, "SELECT s FROM b.public.secret")
        # A view alice makes over bob's table needs her to read it: refused at creation.
        await fails(alice, "CREATE VIEW peek AS SELECT * FROM b.public.secret")
        # Ownership moves; the new owner may then drop it.
        await ok(bob, "CREATE TABLE gift (x bigint)")
        await fails(bob, "ALTER TABLE gift OWNER TO alice")  # bob cannot act as alice
        async with setup.client() as root:
            await ok(root, "ALTER TABLE b.public.gift OWNER TO alice")
        await ok(alice, "INSERT INTO b.public.gift VALUES (1)")
        await fails(bob, "DROP TABLE gift")
        await ok(alice, "DROP TABLE b.public.gift")
        # Membership: a member of bob acts with bob's privileges.
        async with setup.client() as root:
            await ok(root, "GRANT bob TO alice")
        assert (await ok(alice, "SELECT s FROM b.public.secret")).rows == [("bob only",)]
        async with setup.client() as root:
            await ok(root, "REVOKE bob FROM alice")
        await fails(alice, "SELECT s FROM b.public.secret")
    finally:
        await ok(bob, "REVOKE ALL ON DATABASE b FROM alice; REVOKE ALL ON SCHEMA public FROM alice")


async def test_wrong_passwords_are_refused_over_grpc_and_pgwire(setup: Tenants) -> None:
    async with setup.client("alice", "wrong") as intruder:
        result = await intruder.execute("SELECT 1")
        assert result.error is not None and result.error.code == "28P01"
        assert result.error.message == 'password authentication failed for user "alice"'
        async for event in intruder.subscribe("SELECT 1"):
            assert isinstance(event, SubscribeError) and event.error.code == "28P01"
            break
    async with AdapterClient(setup.stack.adapter(0)) as anonymous:
        assert (await anonymous.execute("SELECT 1")).error.code == "28000"  # type: ignore[union-attr]
    dsn = f"host=127.0.0.1 port={setup.pg_port} dbname=a user=alice"
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(f"{dsn} password=wrong")
    conn = psycopg2.connect(f"{dsn} password=alice-pw")
    try:
        conn.autocommit = True
        assert conn.get_parameter_status("is_superuser") == "off"
        with conn.cursor() as cursor:
            cursor.execute("SET cluster = ca")
            cursor.execute("SELECT count(*) FROM t")
            assert cursor.fetchone()[0] >= 1  # type: ignore[index]
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cursor.execute("SELECT * FROM b.public.secret")
    finally:
        conn.close()


async def test_trust_mode_takes_the_user_at_its_word(setup: Tenants) -> None:
    trusted = setup.stack.adapter(1)
    async with AdapterClient(trusted) as nobody_named:
        # No user: the bootstrap superuser, as every existing test and `make run` use it.
        assert (await ok(nobody_named, "SELECT s FROM b.public.secret")).rows == [("bob only",)]
    async with AdapterClient(trusted, user="alice") as alice:
        await ok(alice, "SET database = a")
        await fails(alice, "SELECT s FROM b.public.secret")
    # Trust checks no password, but the role must exist (as in PostgreSQL).
    async with AdapterClient(trusted, user="mallory") as mallory:
        unknown = (await mallory.execute("SELECT 1")).error
        assert unknown is not None and unknown.code == "28000"
        assert unknown.message == 'role "mallory" does not exist'


async def test_each_role_lists_only_what_it_may_use(setup: Tenants, alice: AdapterClient) -> None:
    databases = {row[0] for row in (await ok(alice, "SHOW DATABASES")).rows}
    assert databases == {"a"}
    assert {row[0] for row in (await ok(alice, "SHOW CLUSTERS")).rows} == {"ca"}
    assert {row[0] for row in (await ok(alice, "SHOW TABLES")).rows} == {"t"}
    await fails(alice, "SHOW TABLES FROM b.public", "3D000")  # as if b did not exist
    async with setup.client() as root:
        assert {"a", "b", "tidemark"} <= {r[0] for r in (await ok(root, "SHOW DATABASES")).rows}
        assert {"ca", "cb", "default"} <= {r[0] for r in (await ok(root, "SHOW CLUSTERS")).rows}
        assert (await ok(root, "SHOW TABLES FROM b.public")).rows == [("secret",)]
    # The pg_catalog / information_schema emulation behind psql's \d, over pgwire.
    conn = psycopg2.connect(
        f"host=127.0.0.1 port={setup.pg_port} dbname=a user=alice password=alice-pw"
    )
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_catalog.pg_database")
            assert {row[0] for row in cursor.fetchall()} == {"a"}
            cursor.execute("SELECT table_name FROM information_schema.tables")
            assert {row[0] for row in cursor.fetchall()} == {"t", "total"}
            cursor.execute("SELECT current_user")
            assert cursor.fetchone() == ("alice",)
            # Owners as psql's \d shows them.
            cursor.execute(
                "SELECT c.relname, pg_catalog.pg_get_userbyid(c.relowner) FROM "
                "pg_catalog.pg_class c WHERE c.relkind IN ('r', 'm')"
            )
            assert sorted(cursor.fetchall()) == [("t", "alice"), ("total", "alice")]
    finally:
        conn.close()


async def test_role_management(setup: Tenants, alice: AdapterClient) -> None:
    async with setup.client() as root:
        await ok(root, "CREATE ROLE manager LOGIN CREATEROLE PASSWORD 'm-pw'")
        # "system" owns the default objects, PUBLIC means everyone: neither can be a role.
        for reserved in ("system", '"PUBLIC"', "pg_admin"):
            await fails(root, f"CREATE ROLE {reserved}", "42939")
    async with setup.client("manager", "m-pw") as manager:
        await ok(manager, "CREATE ROLE temp LOGIN PASSWORD 'temp-pw'")
        await fails(manager, "CREATE ROLE boss SUPERUSER")
        await fails(manager, "ALTER ROLE tidemark PASSWORD 'taken'")  # a superuser
        await ok(manager, "GRANT temp TO alice; REVOKE temp FROM alice")
    # A role changes its own password, and nothing else about itself.
    async with setup.client("temp", "temp-pw") as temp:
        await fails(temp, "ALTER ROLE temp CREATEROLE")
        await ok(temp, "ALTER ROLE temp PASSWORD 'temp-pw2'")
        # The old password is refused from the next call on.
        assert (await temp.execute("SELECT 1")).error.code == "28P01"  # type: ignore[union-attr]
    async with setup.client("temp", "temp-pw2") as temp:
        assert (await ok(temp, "SELECT 1")).rows == [(1,)]
    # A role that owns something cannot be dropped until it owns nothing.
    async with setup.client() as root:
        await ok(root, "GRANT USAGE ON DATABASE a TO temp; GRANT USAGE ON SCHEMA a.public TO temp")
        await ok(root, "GRANT temp TO alice")
    await ok(alice, "CREATE TABLE temp_t (x bigint); ALTER TABLE temp_t OWNER TO temp")
    async with setup.client("manager", "m-pw") as manager:
        in_use = await fails(manager, "DROP ROLE temp", "2BP01")
        assert "table temp_t" in in_use.message
    await ok(alice, "DROP TABLE temp_t")  # alice acts as temp, its owner
    async with setup.client() as root:
        await ok(
            root, "REVOKE ALL ON DATABASE a FROM temp; REVOKE ALL ON SCHEMA a.public FROM temp"
        )
    async with setup.client("manager", "m-pw") as manager:
        await ok(manager, "DROP ROLE temp")  # its membership in alice's roles goes with it
    async with setup.client("temp", "temp-pw2") as gone:
        assert (await gone.execute("SELECT 1")).error.code == "28P01"  # type: ignore[union-attr]


def test_describing_a_statement_over_pgwire_is_checked_too(setup: Tenants) -> None:
    # The extended protocol's Parse/Describe tells a statement's columns: only to whoever
    # may run it.
    dsn = f"host=127.0.0.1 port={setup.pg_port} user=alice password=alice-pw"
    with psycopg.connect(f"{dsn} dbname=a", autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM b.public.secret WHERE s = %s", ("x",), prepare=True)


async def test_grant_on_all_tables_in_a_schema(
    setup: Tenants, alice: AdapterClient, bob: AdapterClient
) -> None:
    async with setup.client() as root:
        await ok(root, "GRANT USAGE ON DATABASE a TO bob; GRANT USAGE ON SCHEMA a.public TO bob")
    try:
        await fails(bob, "SELECT count(*) FROM a.public.t")
        await ok(alice, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO bob")
        await ok(bob, "SET cluster = cb")
        assert (await ok(bob, "SELECT s FROM a.public.total")).rows[0][0] is not None
        await ok(bob, "SELECT count(*) FROM a.public.t")
        await ok(alice, "REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM bob")
        await fails(bob, "SELECT s FROM a.public.total")
    finally:
        async with setup.client() as root:
            await ok(
                root, "REVOKE ALL ON DATABASE a FROM bob; REVOKE ALL ON SCHEMA a.public FROM bob"
            )
