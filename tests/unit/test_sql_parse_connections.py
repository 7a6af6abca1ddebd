"""Parsing CREATE SECRET, CREATE CONNECTION ... TO POSTGRES and CREATE SOURCE ... FROM
POSTGRES (Materialize's syntax)."""

from __future__ import annotations

import pytest

from services.adapter.sql import statements as st
from services.adapter.sql.errors import SqlError
from services.adapter.sql.parser import parse


def one(sql: str) -> st.AnyStatement:
    (statement,) = parse(sql)
    return statement


def test_create_secret_masks_its_value() -> None:
    secret = one("CREATE SECRET IF NOT EXISTS pw AS 'hunter2'")
    assert isinstance(secret, st.CreateSecret)
    assert secret.name == ("pw",) and secret.value == b"hunter2" and secret.if_not_exists
    assert "hunter2" not in secret.text and "hunter2" not in repr(secret)
    assert secret.text == "CREATE SECRET IF NOT EXISTS pw AS '********'"


@pytest.mark.parametrize(
    "sql", ["CREATE SECRET pw 'hunter2'", "CREATE SECRET pw AS 'hunter2' 'more'"]
)
def test_create_secret_errors_never_quote_the_value(sql: str) -> None:
    with pytest.raises(SqlError) as error:
        parse(sql)
    assert error.value.code == "42601"
    assert "hunter2" not in error.value.message


def test_create_connection() -> None:
    connection = one(
        "CREATE CONNECTION pg TO POSTGRES (HOST 'db', PORT 6543, USER 'u', "
        "PASSWORD SECRET s.pw, DATABASE 'shop')"
    )
    assert isinstance(connection, st.CreateConnection)
    assert dict(connection.options) == {
        "host": "db",
        "port": "6543",
        "user": "u",
        "password": ("s", "pw"),
        "database": "shop",
    }


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("CREATE CONNECTION k TO KAFKA (BROKER 'b')", "0A000"),
        ("CREATE CONNECTION pg TO POSTGRES (HOST 'h', USER 'u')", "42601"),
        ("CREATE CONNECTION pg TO POSTGRES (HOST 'h', USER 'u', DATABASE 'd', SSL 'x')", "42601"),
        ("CREATE CONNECTION pg TO POSTGRES (HOST 'h', HOST 'i', USER 'u', DATABASE 'd')", "42601"),
    ],
)
def test_create_connection_errors(sql: str, code: str) -> None:
    with pytest.raises(SqlError) as error:
        parse(sql)
    assert error.value.code == code


def test_create_postgres_source() -> None:
    everything = one("CREATE SOURCE s FROM POSTGRES CONNECTION pg (PUBLICATION 'p') FOR ALL TABLES")
    assert isinstance(everything, st.CreatePostgresSource)
    assert (everything.connection, everything.publication, everything.tables) == (
        ("pg",),
        "p",
        None,
    )
    some = one(
        "CREATE SOURCE IF NOT EXISTS s IN CLUSTER c FROM POSTGRES CONNECTION pg "
        "(PUBLICATION 'p') FOR TABLES (t1, other.t2 AS alias) EXPOSE PROGRESS AS s_lsn"
    )
    assert isinstance(some, st.CreatePostgresSource)
    assert some.tables == (
        st.PostgresTableRef(("t1",), None),
        st.PostgresTableRef(("other", "t2"), "alias"),
    )
    assert (some.in_cluster, some.if_not_exists, some.progress_name) == ("c", True, "s_lsn")


def test_text_columns_and_for_schemas() -> None:
    source = one(
        "CREATE SOURCE s FROM POSTGRES CONNECTION pg (PUBLICATION 'p', TEXT COLUMNS "
        "(t.at, other.t2.shape)) FOR SCHEMAS (public, other)"
    )
    assert isinstance(source, st.CreatePostgresSource)
    assert source.text_columns == (("t", "at"), ("other", "t2", "shape"))
    assert (source.tables, source.schemas) == (None, ("public", "other"))
    with pytest.raises(SqlError) as error:
        parse(
            "CREATE SOURCE s FROM POSTGRES CONNECTION pg (PUBLICATION 'p', TEXT COLUMNS (at)) "
            "FOR ALL TABLES"
        )
    assert "table.at" in error.value.message


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE SOURCE s FROM POSTGRES CONNECTION pg (PUBLICATION 'p')",
        "CREATE SOURCE s FROM POSTGRES CONNECTION pg () FOR ALL TABLES",
        "CREATE SOURCE s FROM POSTGRES CONNECTION pg (PUBLICATION 'p') FOR TABLES ()",
    ],
)
def test_create_postgres_source_errors(sql: str) -> None:
    with pytest.raises(SqlError) as error:
        parse(sql)
    assert error.value.code == "42601"


def test_drop_secret_and_connection() -> None:
    assert one("DROP SECRET IF EXISTS a, b") == st.Drop(
        text="DROP SECRET IF EXISTS a, b",
        position=1,
        kind="secret",
        names=(("a",), ("b",)),
        if_exists=True,
    )
    drop = one("DROP CONNECTION pg CASCADE")
    assert isinstance(drop, st.Drop) and drop.kind == "connection" and drop.cascade


def test_role_statements_and_their_masked_passwords() -> None:
    (created,) = parse("CREATE ROLE bob WITH LOGIN SUPERUSER PASSWORD 'hunter2'")
    assert isinstance(created, st.CreateRole)
    assert (created.name, created.options.login, created.options.superuser) == ("bob", True, True)
    assert created.options.password == "hunter2"
    assert "hunter2" not in created.text and "hunter2" not in repr(created)
    (user,) = parse("CREATE USER carol")
    assert isinstance(user, st.CreateRole) and user.user and user.options.login is None
    (altered,) = parse("ALTER ROLE bob NOLOGIN PASSWORD NULL")
    assert isinstance(altered, st.AlterRole)
    assert (altered.options.login, altered.options.password) == (False, "")
    (dropped,) = parse("DROP ROLE IF EXISTS bob, carol")
    assert isinstance(dropped, st.Drop) and dropped.kind == "role"
    for bad, code in [
        ("CREATE ROLE x PASSWORD 'a' PASSWORD 'b'", "42601"),
        ("CREATE ROLE x CREATEDB", "0A000"),
        ("CREATE ROLE x CREATEROLE NOCREATEROLE", "42601"),
        ("CREATE ROLE x PASSWORD 'secret-value' NONSENSE", "42601"),
    ]:
        with pytest.raises(SqlError) as caught:
            parse(bad)
        assert caught.value.code == code
        assert "secret-value" not in caught.value.message
