"""Parsing SQL into typed statements: every statement kind, source text and positions, and
syntax errors with SQLSTATE codes and positions."""

from __future__ import annotations

from typing import Any

import pytest
from sqlglot import exp

from services.adapter.sql import SqlError, parse
from services.adapter.sql import statements as st
from tidemark.columnar import ColumnType


def one(sql: str) -> Any:
    (statement,) = parse(sql)
    return statement


def test_statements_carry_their_text_and_position() -> None:
    sql = "  SELECT 1;\nCREATE TABLE t (a int) ;; SHOW TABLES"
    first, second, third = parse(sql)
    assert (first.text, first.position) == ("SELECT 1", 3)
    assert (second.text, second.position) == ("CREATE TABLE t (a int)", sql.index("CREATE") + 1)
    assert (third.text, third.position) == ("SHOW TABLES", sql.index("SHOW") + 1)


def test_semicolons_inside_strings_do_not_split() -> None:
    (statement,) = parse("SELECT 'a;b', $$c;d$$")
    assert isinstance(statement, st.Select)


def test_empty_input_has_no_statements() -> None:
    assert parse("") == []
    assert parse(" ; ;\n-- only a comment\n") == []


def test_create_table() -> None:
    statement = one(
        'CREATE TABLE IF NOT EXISTS db.s.t (a bigint NOT NULL, "Mixed" varchar(20) NULL, '
        "c numeric(10,2), d double precision, e timestamp without time zone)"
    )
    assert isinstance(statement, st.CreateTable)
    assert statement.name == ("db", "s", "t") and statement.if_not_exists
    columns = statement.columns
    assert [c.name for c in columns] == ["a", "Mixed", "c", "d", "e"]
    assert [c.not_null for c in columns] == [True, False, False, False, False]
    assert [c.type.type.kind for c in columns] == [
        ColumnType.INT64,
        ColumnType.TEXT,
        ColumnType.DECIMAL,
        ColumnType.FLOAT64,
        ColumnType.TIMESTAMP,
    ]
    assert (columns[2].type.type.precision, columns[2].type.type.scale) == (10, 2)
    assert columns[1].type_text == "varchar(20)"
    assert columns[1].position == statement.text.index('"Mixed"') + 1


def test_create_source_from_cdcv2() -> None:
    statement = one("CREATE SOURCE IF NOT EXISTS feed (id bigint NOT NULL, v text) FROM CDCV2")
    assert isinstance(statement, st.CreateSource)
    assert statement.name == ("feed",) and statement.format == "CDCV2"
    assert [c.name for c in statement.columns] == ["id", "v"] and statement.if_not_exists


def test_create_views() -> None:
    view = one("CREATE VIEW v (x, y) AS SELECT a, b FROM t")
    assert isinstance(view, st.CreateView)
    assert not view.materialized and view.column_names == ("x", "y")
    assert isinstance(view.query.ast, exp.Select)
    assert view.query.text == "SELECT a, b FROM t"
    assert view.query.position == view.text.index("SELECT") + 1
    mv = one("CREATE MATERIALIZED VIEW IF NOT EXISTS s.mv IN CLUSTER c1 AS SELECT 1 UNION SELECT 2")
    assert isinstance(mv, st.CreateView)
    assert mv.materialized and mv.in_cluster == "c1" and mv.name == ("s", "mv")
    assert mv.if_not_exists and isinstance(mv.query.ast, exp.Union)


def test_create_index_forms() -> None:
    unnamed = one("CREATE INDEX ON v (a, b)")
    assert isinstance(unnamed, st.CreateIndex)
    assert (unnamed.name, unnamed.on, unnamed.columns, unnamed.in_cluster) == (
        None,
        ("v",),
        ("a", "b"),
        None,
    )
    before = one("CREATE INDEX i IN CLUSTER c ON s.v (a)")
    after = one("CREATE INDEX IF NOT EXISTS i ON s.v (a) IN CLUSTER c")
    assert (before.name, before.on, before.in_cluster) == ("i", ("s", "v"), "c")
    assert (after.name, after.on, after.in_cluster, after.if_not_exists) == (
        "i",
        ("s", "v"),
        "c",
        True,
    )


def test_create_cluster_database_schema() -> None:
    cluster = one("CREATE CLUSTER big (SIZE = 'large', REPLICATION FACTOR = 2)")
    assert isinstance(cluster, st.CreateCluster)
    assert (cluster.name, cluster.size, cluster.replication_factor) == ("big", "large", 2)
    bare = one("CREATE CLUSTER small SIZE 'local'")
    assert bare.size == "local" and bare.replication_factor is None
    database = one("CREATE DATABASE IF NOT EXISTS Shop")
    assert isinstance(database, st.CreateDatabase)
    assert (database.name, database.if_not_exists) == ("shop", True)
    schema = one("CREATE SCHEMA shop.sales")
    assert isinstance(schema, st.CreateSchema) and schema.name == ("shop", "sales")


@pytest.mark.parametrize(
    ("sql", "kind", "names", "if_exists", "cascade"),
    [
        ("DROP TABLE t", "table", (("t",),), False, False),
        ("DROP TABLE IF EXISTS a, s.b CASCADE", "table", (("a",), ("s", "b")), True, True),
        ("DROP VIEW v RESTRICT", "view", (("v",),), False, False),
        ("DROP MATERIALIZED VIEW IF EXISTS mv", "materialized view", (("mv",),), True, False),
        ("DROP INDEX i", "index", (("i",),), False, False),
        ("DROP CLUSTER c CASCADE", "cluster", (("c",),), False, True),
        ("DROP SOURCE s", "source", (("s",),), False, False),
        ("DROP DATABASE d", "database", (("d",),), False, False),
        ("DROP SCHEMA d.s", "schema", (("d", "s"),), False, False),
    ],
)
def test_drop(sql: str, kind: str, names: tuple[Any, ...], if_exists: bool, cascade: bool) -> None:
    statement = one(sql)
    assert isinstance(statement, st.Drop)
    assert (statement.kind, statement.names, statement.if_exists, statement.cascade) == (
        kind,
        names,
        if_exists,
        cascade,
    )


def test_alter_materialized_view_rebuild() -> None:
    statement = one("ALTER MATERIALIZED VIEW s.mv REBUILD")
    assert isinstance(statement, st.RebuildMaterializedView) and statement.name == ("s", "mv")
    for sql, code in (
        ("ALTER TABLE t ADD COLUMN x bigint", "0A000"),
        ("ALTER MATERIALIZED VIEW mv RENAME TO other", "0A000"),
        ("ALTER MATERIALIZED VIEW mv REBUILD now", "42601"),
        ("ALTER MATERIALIZED VIEW", "42601"),
    ):
        with pytest.raises(SqlError) as refused:
            parse(sql)
        assert refused.value.code == code, sql


def test_insert_forms() -> None:
    values = one("INSERT INTO s.t (a, b) VALUES (1, 'x'), (2, NULL)")
    assert isinstance(values, st.Insert)
    assert values.table == ("s", "t") and values.columns == ("a", "b")
    assert values.source is not None and isinstance(values.source.ast, exp.Values)
    query = one("INSERT INTO t SELECT * FROM u WHERE a > 1")
    assert query.columns is None and isinstance(query.source.ast, exp.Select)
    default = one("INSERT INTO t DEFAULT VALUES")
    assert default.source is None


def test_update_and_delete() -> None:
    update = one("UPDATE t AS x SET a = a + 1, b = 'y' WHERE x.a > 2")
    assert isinstance(update, st.Update)
    assert (update.table, update.alias) == (("t",), "x")
    assert [a.column for a in update.assignments] == ["a", "b"]
    assert isinstance(update.assignments[0].value, exp.Add)
    assert isinstance(update.where, exp.GT)
    delete = one("DELETE FROM t")
    assert isinstance(delete, st.Delete) and delete.where is None and delete.table == ("t",)


def test_select_and_as_of() -> None:
    plain = one("SELECT a FROM t ORDER BY a LIMIT 3")
    assert isinstance(plain, st.Select) and plain.as_of is None
    assert isinstance(plain.query.ast, exp.Select)
    timed = one("SELECT a FROM t AS x WHERE x.a IN (SELECT a AS of FROM u) AS OF 1700000000000")
    assert timed.as_of == 1700000000000
    assert timed.query.text.endswith("(SELECT a AS of FROM u)")
    for query in ("VALUES (1), (2)", "WITH w AS (SELECT 1) SELECT * FROM w", "(SELECT 1)"):
        assert isinstance(one(query), st.Select)


def test_subscribe_forms() -> None:
    named = one("SUBSCRIBE TO s.v AS OF 42")
    assert isinstance(named, st.Subscribe)
    assert (named.target, named.as_of) == (("s", "v"), 42)
    assert named.query.ast.sql() == 'SELECT * FROM "s"."v"'
    query = one("SUBSCRIBE (SELECT a FROM t WHERE a > 1)")
    assert query.target is None and query.as_of is None
    bare = one("SUBSCRIBE v")
    assert bare.target == ("v",)


@pytest.mark.parametrize(
    ("sql", "kind", "within", "on", "cluster"),
    [
        ("SHOW TABLES", "tables", None, None, None),
        ("SHOW VIEWS FROM s", "views", ("s",), None, None),
        ("SHOW MATERIALIZED VIEWS IN d.s", "materialized views", ("d", "s"), None, None),
        ("SHOW INDEXES ON v", "indexes", None, ("v",), None),
        ("SHOW INDEXES IN CLUSTER c", "indexes", None, None, "c"),
        ("SHOW CLUSTERS", "clusters", None, None, None),
        ("SHOW SOURCES", "sources", None, None, None),
        ("SHOW DATABASES", "databases", None, None, None),
        ("SHOW SCHEMAS", "schemas", None, None, None),
    ],
)
def test_show_objects(sql: str, kind: str, within: Any, on: Any, cluster: Any) -> None:
    statement = one(sql)
    assert isinstance(statement, st.ShowObjects)
    assert (statement.kind, statement.within, statement.on, statement.in_cluster) == (
        kind,
        within,
        on,
        cluster,
    )


def test_show_columns_and_settings() -> None:
    columns = one("SHOW COLUMNS FROM s.t")
    assert isinstance(columns, st.ShowColumns) and columns.relation == ("s", "t")
    assert one("SHOW search_path").name == "search_path"
    assert one("SHOW ALL").name == "all"
    assert one("SHOW TRANSACTION ISOLATION LEVEL").name == "transaction_isolation"


def test_explain() -> None:
    for sql in ("EXPLAIN SELECT a FROM t", "EXPLAIN PLAN FOR SELECT a FROM t"):
        statement = one(sql)
        assert isinstance(statement, st.Explain)
        assert statement.query.text == "SELECT a FROM t"


@pytest.mark.parametrize(
    ("sql", "name", "value", "local"),
    [
        ('SET search_path = a, "B"', "search_path", "a, B", False),
        ("SET cluster TO 'big'", "cluster", "big", False),
        ("SET LOCAL statement_timeout = 5000", "statement_timeout", "5000", True),
        ("SET SESSION database TO shop", "database", "shop", False),
        ("SET cluster TO DEFAULT", "cluster", None, False),
        (
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "transaction_isolation",
            "serializable",
            False,
        ),
        ("SET TIME ZONE 'UTC'", "timezone", "UTC", False),
        ("RESET cluster", "cluster", None, False),
    ],
)
def test_set(sql: str, name: str, value: str | None, local: bool) -> None:
    statement = one(sql)
    assert isinstance(statement, st.SetVariable)
    assert (statement.name, statement.value, statement.local) == (name, value, local)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("BEGIN", st.Begin),
        ("BEGIN TRANSACTION", st.Begin),
        ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY", st.Begin),
        ("COMMIT", st.Commit),
        ("COMMIT WORK", st.Commit),
        ("END", st.Commit),
        ("ROLLBACK", st.Rollback),
        ("ABORT TRANSACTION", st.Rollback),
    ],
)
def test_transactions(sql: str, kind: type) -> None:
    assert isinstance(one(sql), kind)


def test_begin_keeps_transaction_modes() -> None:
    statement = one("START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY")
    assert statement.modes == ("isolation level serializable", "read only")


# Errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "code", "at"),
    [
        ("SELEC 1", "42601", "SELEC"),
        ("SELECT 1; SELEC 2", "42601", "SELEC"),
        ("SELECT a FROM t WHERE", "42601", "WHERE"),
        ("INSERT INTO t VALUES (1", "42601", "1"),
        ("CREATE TABLE t (a int PRIMARY KEY)", "0A000", "PRIMARY"),
        ("CREATE TABLE t (a int, UNIQUE (a))", "0A000", "UNIQUE"),
        ("CREATE TABLE t (a int DEFAULT 1)", "0A000", "DEFAULT"),
        ("CREATE TABLE t (a interval)", "0A000", "interval"),
        ("CREATE TABLE t (a timestamptz)", "0A000", "timestamptz"),
        ("CREATE TABLE t (a numeric(50, 2))", "22023", "numeric"),
        ("CREATE TABLE t AS SELECT 1", "0A000", "AS"),
        ("CREATE OR REPLACE VIEW v AS SELECT 1", "0A000", "OR"),
        ("CREATE FUNCTION f", "0A000", "FUNCTION"),
        ("CREATE SOURCE s (a int) FROM KAFKA", "0A000", "KAFKA"),
        ("CREATE VIEW v IN CLUSTER c AS SELECT 1", "42601", "CREATE"),
        ("CREATE INDEX ON v (a + 1)", "0A000", "+"),
        ("DROP FUNCTION f", "0A000", "FUNCTION"),
        ("DROP TABLE", "42601", ""),
        ("SELECT 1 AS OF soon", "42601", "soon"),
        ("SUBSCRIBE TO v AS OF -1", "42601", "-"),
        ("INSERT INTO t VALUES (1) RETURNING a", "0A000", "a"),
        ("UPDATE t SET a = 1 FROM u", "0A000", "u"),
        ("SET cluster 'x'", "42601", "'x'"),
        ("SHOW COLUMNS t", "42601", "t"),
        ("EXPLAIN CREATE TABLE t (a int)", "0A000", "CREATE"),
        ("SELECT 'unterminated", "42601", "'"),
    ],
)
def test_errors(sql: str, code: str, at: str) -> None:
    with pytest.raises(SqlError) as caught:
        parse(sql)
    error = caught.value
    assert error.code == code, error
    if at:
        assert error.position == sql.rindex(at) + 1, error
    else:
        assert error.position > 0
