"""TPC-H for tests and benchmarks: data and query texts generated offline by DuckDB's TPC-H
extension, the same tables created in Tidemark, rows loaded the way the adapter writes a table,
and a round of changes applied to both sides.

DuckDB is the independent answer: every comparison is Tidemark against DuckDB over the same
rows, never Tidemark against itself. DuckDB runs with PostgreSQL's conventions where the two
differ (integer division, NULL order).
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from tests.support.duckdb_conventions import postgres_conventions
from tidemark import timelines
from tidemark.clients.adapter import AdapterClient
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar import Column, ColumnType, RelationSchema, table_from_updates, to_ipc
from tidemark.columnar.updates import frontier_bound
from tidemark.errors import FailedPrecondition

Row = tuple[Any, ...]

TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")


def tpch_duckdb(scale_factor: float) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding TPC-H at ``scale_factor`` (no download: the extension ships
    in the ``duckdb-extension-tpch`` package)."""
    import duckdb_extension_tpch

    version = duckdb.__version__
    path = (
        Path(duckdb_extension_tpch.__file__).parent
        / "extensions"
        / f"v{version}"
        / "tpch.duckdb_extension"
    )
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    connection.execute(f"LOAD '{path}'")
    connection.execute(f"CALL dbgen(sf={scale_factor})")
    postgres_conventions(connection)
    return connection


def queries(connection: duckdb.DuckDBPyConnection) -> dict[int, str]:
    """The 22 TPC-H queries as the extension writes them (dates as literals, no intervals)."""
    return {
        int(number): str(text).strip().rstrip(";")
        for number, text in connection.execute(
            "SELECT query_nr, query FROM tpch_queries() ORDER BY query_nr"
        ).fetchall()
    }


def _column(name: str, duck_type: str, nullable: bool) -> Column:
    upper = duck_type.upper()
    if upper.startswith("DECIMAL"):
        precision, scale = (int(p) for p in upper[len("DECIMAL(") : -1].split(","))
        return Column(name, ColumnType.DECIMAL, nullable, precision, scale)
    kinds = {
        "INTEGER": ColumnType.INT64,
        "BIGINT": ColumnType.INT64,
        "VARCHAR": ColumnType.TEXT,
        "DATE": ColumnType.DATE,
        "DOUBLE": ColumnType.FLOAT64,
    }
    return Column(name, kinds[upper], nullable)


def schemas(connection: duckdb.DuckDBPyConnection) -> dict[str, RelationSchema]:
    """Each TPC-H table's schema in Tidemark's types, read from DuckDB's catalog."""
    found: dict[str, RelationSchema] = {}
    for table in TABLES:
        described = connection.execute(f"DESCRIBE {table}").fetchall()
        found[table] = RelationSchema(
            [_column(name, kind, null == "YES") for name, kind, null, *_ in described]
        )
    return found


def sql_type(column: Column) -> str:
    if column.type is ColumnType.DECIMAL:
        return f"numeric({column.precision},{column.scale})"
    return {
        ColumnType.INT64: "bigint",
        ColumnType.TEXT: "text",
        ColumnType.DATE: "date",
        ColumnType.FLOAT64: "double precision",
    }[column.type]


def create_table_sql(name: str, schema: RelationSchema) -> str:
    columns = ", ".join(
        f"{c.name} {sql_type(c)}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns
    )
    return f"CREATE TABLE {name} ({columns})"


def rows(connection: duckdb.DuckDBPyConnection, table: str) -> list[Row]:
    return [tuple(row) for row in connection.execute(f"SELECT * FROM {table}").fetchall()]


async def table_collection(catalog: CatalogClient, oracle: OracleClient, name: str) -> str:
    """The storage collection behind the table called ``name`` (any schema)."""
    snapshot = await catalog.snapshot_at(await oracle.read_ts(timelines.CATALOG))
    for item in snapshot.items:
        if item.WhichOneof("body") == "table" and item.name.item == name:
            return item.table.collection_id
    raise KeyError(name)


async def bulk_load(
    storage: StorageClient,
    oracle: OracleClient,
    collection_id: str,
    schema: RelationSchema,
    loaded: Sequence[Row],
) -> int:
    """Appends ``loaded`` to a table's collection as one write, exactly as the adapter writes
    a table (at a WriteTs, compare-and-append against the current upper, then ApplyWrite),
    without the SQL round trip per row. Returns the write timestamp."""
    payload_rows = [(row, 1) for row in loaded]
    pair = await storage.acquire(collection_id, holder="tpch-loader")
    try:
        for _ in range(200):
            w = await oracle.write_ts(timelines.DATA)
            upper = frontier_bound((await storage.describe(collection_id)).upper)
            if upper is None or upper > w:
                continue
            payload = to_ipc(
                table_from_updates(schema, [(row, w, diff) for row, diff in payload_rows])
            )
            try:
                await storage.append_ipc(pair.write, payload, w + 1, expected_upper=upper)
            except FailedPrecondition:
                continue  # the table ticker or another writer moved the upper: try again
            await oracle.apply_write(timelines.DATA, w)
            return w
        raise RuntimeError(f"could not load {collection_id}: lost every race")
    finally:
        await storage.drop(pair.read)
        await storage.drop(pair.write)


async def load_tables(
    adapter: AdapterClient,
    storage: StorageClient,
    oracle: OracleClient,
    catalog: CatalogClient,
    connection: duckdb.DuckDBPyConnection,
) -> int:
    """Creates the eight tables through SQL and loads DuckDB's rows into each with one write;
    returns the number of rows loaded."""
    tables = schemas(connection)
    loaded = 0
    for name in TABLES:
        result = await adapter.execute(create_table_sql(name, tables[name]))
        if result.error is not None:
            raise RuntimeError(f"CREATE TABLE {name}: {result.error}")
        table_rows = rows(connection, name)
        collection = await table_collection(catalog, oracle, name)
        await bulk_load(storage, oracle, collection, tables[name], table_rows)
        loaded += len(table_rows)
    return loaded


# Changes ------------------------------------------------------------------------------------


def change_statements(
    connection: duckdb.DuckDBPyConnection, rng: random.Random, count: int = 6
) -> list[str]:
    """A round of inserts, deletes and updates to ``orders`` and ``lineitem``, as SQL both
    systems run: new orders with their line items, deleted orders with theirs, and updated
    prices, quantities and priorities."""
    statements: list[str] = []
    max_order = connection.execute("SELECT max(o_orderkey) FROM orders").fetchone()
    assert max_order is not None
    next_key = int(max_order[0]) + 1
    existing = [k for (k,) in connection.execute("SELECT o_orderkey FROM orders").fetchall()]
    order_columns = [c[0] for c in connection.execute("DESCRIBE orders").fetchall()]
    line_columns = [c[0] for c in connection.execute("DESCRIBE lineitem").fetchall()]
    for _ in range(count):
        # A new order copying a random existing one's attributes, with two line items.
        template = rng.choice(existing)
        order = connection.execute(
            "SELECT * FROM orders WHERE o_orderkey = ?", [template]
        ).fetchone()
        lines = connection.execute(
            "SELECT * FROM lineitem WHERE l_orderkey = ? ORDER BY l_linenumber", [template]
        ).fetchall()
        if order is None or not lines:
            continue
        key = next_key
        next_key += 1
        new_order = list(order)
        new_order[order_columns.index("o_orderkey")] = key
        statements.append(f"INSERT INTO orders VALUES ({_values(new_order)})")
        new_lines = []
        for line in lines[:2]:
            copy = list(line)
            copy[line_columns.index("l_orderkey")] = key
            new_lines.append(f"({_values(copy)})")
        statements.append(f"INSERT INTO lineitem VALUES {', '.join(new_lines)}")
    for _ in range(max(1, count // 2)):
        victim = rng.choice(existing)
        statements.append(f"DELETE FROM lineitem WHERE l_orderkey = {victim}")
        statements.append(f"DELETE FROM orders WHERE o_orderkey = {victim}")
    for _ in range(max(1, count // 2)):
        target = rng.choice(existing)
        statements.append(
            f"UPDATE lineitem SET l_quantity = l_quantity + 1, "
            f"l_extendedprice = l_extendedprice + 10.00 WHERE l_orderkey = {target}"
        )
        statements.append(
            f"UPDATE orders SET o_orderpriority = '1-URGENT' WHERE o_orderkey = {target}"
        )
    return statements


def _values(values: Sequence[Any]) -> str:
    return ", ".join(_literal(v) for v in values)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    return str(value)


# Comparison ---------------------------------------------------------------------------------


def _normal(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | Decimal | float):
        return float(value)
    return value


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return bool(a == b)


def same_rows(got: Sequence[Row], expected: Sequence[Row], *, ordered: bool = False) -> bool:
    """Equal as multisets (as lists when ``ordered``); numbers compared as numbers with a small
    relative tolerance (DuckDB computes averages in double precision, Tidemark exactly)."""
    left = [tuple(_normal(v) for v in row) for row in got]
    right = [tuple(_normal(v) for v in row) for row in expected]
    if len(left) != len(right):
        return False
    if not ordered:
        left.sort(key=repr)
        right.sort(key=repr)
        if all(_rows_close(a, b) for a, b in zip(left, right, strict=True)):
            return True
        # Values that differ within the tolerance can sort apart by repr: sort by the
        # non-float columns, then rounded floats.
        key = _rounded_key
        left.sort(key=key)
        right.sort(key=key)
    return all(_rows_close(a, b) for a, b in zip(left, right, strict=True))


def _rows_close(a: Row, b: Row) -> bool:
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))


def _rounded_key(row: Row) -> str:
    return repr(tuple(round(v, 4) if isinstance(v, float) else v for v in row))
