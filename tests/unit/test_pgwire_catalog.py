"""Catalog queries as psql, psycopg and SQLAlchemy send them (captured from the real clients
against PostgreSQL 15), answered from a catalog snapshot by the pgwire interpreter."""

from __future__ import annotations

from typing import Any

import pytest

from services.adapter.pgwire.catalog_sql import Interpreter
from services.adapter.pgwire.catalog_tables import CatalogTables, oid_of
from services.adapter.sql.catalog_view import CatalogView
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.v1 import catalog_pb2


def _name(database: str = "", schema: str = "", item: str = "") -> catalog_pb2.QualifiedName:
    return catalog_pb2.QualifiedName(database=database, schema=schema, item=item)


@pytest.fixture
def interpreter() -> Interpreter:
    schema = RelationSchema(
        [
            Column("id", ColumnType.INT64, nullable=False),
            Column("note", ColumnType.TEXT),
            Column("amount", ColumnType.DECIMAL, precision=10, scale=2),
        ]
    )
    items = [
        catalog_pb2.CatalogItem(id="d1", name=_name("tidemark"), database=catalog_pb2.Database()),
        catalog_pb2.CatalogItem(
            id="s1", name=_name("tidemark", "public"), schema=catalog_pb2.Schema()
        ),
        catalog_pb2.CatalogItem(
            id="u1",
            name=_name("tidemark", "public", "orders"),
            table=catalog_pb2.Table(schema=schema.to_proto(), collection_id="u1"),
        ),
        catalog_pb2.CatalogItem(
            id="u2",
            name=_name("tidemark", "public", "orders_by_id"),
            index=catalog_pb2.Index(on_id="u1", key_columns=["id"], cluster_id="c1"),
        ),
    ]
    tables = CatalogTables(CatalogView(items), "tidemark")
    context: dict[str, Any] = {
        "current_schema": "public",
        "search_path": ["public"],
        "version": "PostgreSQL 15.0 (Tidemark)",
    }
    return Interpreter(tables, context)


PSQL_LIST = """SELECT n.nspname as "Schema",
  c.relname as "Name",
  CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
  WHEN 'i' THEN 'index' WHEN 'S' THEN 'sequence' END as "Type",
  pg_catalog.pg_get_userbyid(c.relowner) as "Owner",
  c2.relname as "Table"
FROM pg_catalog.pg_class c
     LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam
     LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.oid
     LEFT JOIN pg_catalog.pg_class c2 ON i.indrelid = c2.oid
WHERE c.relkind IN ({kinds})
      AND n.nspname <> 'pg_catalog'
      AND n.nspname !~ '^pg_toast'
      AND n.nspname <> 'information_schema'
  AND pg_catalog.pg_table_is_visible(c.oid)
ORDER BY 1,2;"""


def test_psql_lists_relations_by_kind(interpreter: Interpreter) -> None:
    names, rows = interpreter.run(PSQL_LIST.format(kinds="'r','p','v','m','S','f',''"))
    assert names == ["Schema", "Name", "Type", "Owner", "Table"]
    assert rows == [["public", "orders", "table", "tidemark", None]]
    _, rows = interpreter.run(PSQL_LIST.format(kinds="'i','I',''"))
    assert rows == [["public", "orders_by_id", "index", "tidemark", "orders"]]


def test_psql_describes_a_table(interpreter: Interpreter) -> None:
    _, found = interpreter.run(
        """SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c
        LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname OPERATOR(pg_catalog.~) '^(orders)$' COLLATE pg_catalog.default
        AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3;"""
    )
    assert found == [[oid_of("u1"), "public", "orders"]]
    _, columns = interpreter.run(
        f"""SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
          (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) FROM pg_catalog.pg_attrdef d
           WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef),
          a.attnotnull
        FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = '{oid_of("u1")}' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum;"""
    )
    assert columns == [
        ["id", "bigint", None, True],
        ["note", "text", None, False],
        ["amount", "numeric(10,2)", None, False],
    ]
    _, indexes = interpreter.run(
        f"""SELECT c2.relname, i.indisprimary, pg_catalog.pg_get_indexdef(i.indexrelid, 0, true)
        FROM pg_catalog.pg_class c, pg_catalog.pg_class c2, pg_catalog.pg_index i
        WHERE c.oid = '{oid_of("u1")}' AND c.oid = i.indrelid AND i.indexrelid = c2.oid
        ORDER BY i.indisprimary DESC, c2.relname;"""
    )
    assert indexes == [
        ["orders_by_id", False, "CREATE INDEX orders_by_id ON public.orders USING btree (id)"]
    ]


def test_databases_schemas_and_functions(interpreter: Interpreter) -> None:
    _, databases = interpreter.run(
        """SELECT d.datname as "Name", pg_catalog.pg_encoding_to_char(d.encoding) as "Encoding"
        FROM pg_catalog.pg_database d ORDER BY 1;"""
    )
    assert databases == [["tidemark", "UTF8"]]
    _, schemas = interpreter.run(
        """SELECT n.nspname AS "Name" FROM pg_catalog.pg_namespace n
        WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema' ORDER BY 1;"""
    )
    assert schemas == [["public"]]
    _, values = interpreter.run("select pg_catalog.version(), current_schema()")
    assert values == [["PostgreSQL 15.0 (Tidemark)", "public"]]


def test_psycopg_type_lookup(interpreter: Interpreter) -> None:
    names, rows = interpreter.run(
        """SELECT typname AS name, oid, typarray AS array_oid,
            oid::regtype::text AS regtype, typdelim AS delimiter
        FROM pg_type t WHERE t.oid = to_regtype('numeric') ORDER BY t.oid"""
    )
    assert names == ["name", "oid", "array_oid", "regtype", "delimiter"]
    assert rows == [["numeric", 1700, 1231, "numeric", ","]]


def test_sqlalchemy_reflects_columns_and_tables(interpreter: Interpreter) -> None:
    _, rows = interpreter.run(
        """SELECT pg_catalog.pg_attribute.attname AS name,
        pg_catalog.format_type(pg_catalog.pg_attribute.atttypid,
          pg_catalog.pg_attribute.atttypmod) AS format_type,
        pg_catalog.pg_attribute.attnotnull AS not_null,
        pg_catalog.pg_class.relname AS table_name,
        pg_catalog.pg_description.description AS comment
        FROM pg_catalog.pg_class LEFT OUTER JOIN pg_catalog.pg_attribute
          ON pg_catalog.pg_class.oid = pg_catalog.pg_attribute.attrelid
          AND pg_catalog.pg_attribute.attnum > 0::SMALLINT
          AND NOT pg_catalog.pg_attribute.attisdropped
        LEFT OUTER JOIN pg_catalog.pg_description
          ON pg_catalog.pg_description.objoid = pg_catalog.pg_attribute.attrelid
        JOIN pg_catalog.pg_namespace
          ON pg_catalog.pg_namespace.oid = pg_catalog.pg_class.relnamespace
        WHERE pg_catalog.pg_class.relkind = ANY (ARRAY['r'::VARCHAR, 'p'::VARCHAR, 'v'::VARCHAR])
          AND pg_catalog.pg_table_is_visible(pg_catalog.pg_class.oid)
          AND pg_catalog.pg_namespace.nspname != 'pg_catalog'::VARCHAR
          AND pg_catalog.pg_class.relname IN ('orders'::VARCHAR)
        ORDER BY pg_catalog.pg_class.relname, pg_catalog.pg_attribute.attnum"""
    )
    assert rows == [
        ["id", "bigint", True, "orders", None],
        ["note", "text", False, "orders", None],
        ["amount", "numeric(10,2)", False, "orders", None],
    ]
    _, tables = interpreter.run(
        """SELECT table_name, table_type FROM information_schema.tables
        WHERE table_schema = 'public' ORDER BY table_name"""
    )
    assert tables == [["orders", "BASE TABLE"]]
