"""Randomized data and changes: every query answers the same from the tables directly (a Spark
job over the tables' Parquet parts), from a view, from a materialized view and from an indexed
view, on either adapter, as DuckDB does on the same statements. Every materialized view and
index is hydrated by Spark from the tables' parts, then maintained through the changes."""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import duckdb
import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient

pytestmark = pytest.mark.spark

ROUNDS = 5
SEED = 20240611

TABLES = {
    "r": "k bigint, a bigint, s text",
    "q": "k bigint, b bigint",
}

QUERIES = [
    "SELECT k, count(*) AS n, sum(a) AS total, min(s) AS least, max(a) AS most FROM r GROUP BY k",
    "SELECT r.k, r.a, q.b FROM r JOIN q ON r.k = q.k WHERE r.a > 2",
    "SELECT DISTINCT s FROM r",
    "SELECT k, a FROM r WHERE s LIKE 'a%' OR a IS NULL",
    "SELECT q.k, count(r.a) AS n FROM q LEFT JOIN r ON q.k = r.k GROUP BY q.k",
    "SELECT r.a + q.b AS c, r.s FROM r, q WHERE r.k = q.k AND q.b < 3",
    "SELECT k, sum(a) AS total FROM r GROUP BY k HAVING count(*) > 1",
    "SELECT count(*) AS n, sum(b) AS total FROM q",
    "SELECT k, b FROM q WHERE k IN (SELECT k FROM r WHERE a > 5)",
    "SELECT k FROM r UNION ALL SELECT k FROM q",
    "SELECT s, count(*) AS n FROM r WHERE k BETWEEN 1 AND 3 GROUP BY s",
    "SELECT CASE WHEN a > 4 THEN 'big' ELSE 'small' END AS size, count(*) AS n FROM r GROUP BY 1",
    "SELECT r.k, r.a, g.x FROM r JOIN generate_series(0, 4, 2) AS g(x) ON r.k = g.x",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    # Every one-shot query runs as a Spark job over the tables' Parquet parts (however small
    # its input), so the direct answers check the Spark lowering against DuckDB; every
    # dataflow hydrates by Spark likewise.
    spark_always = {
        "default": ("--spark-one-shot-rows", "0", "--spark-hydration-rows", "0"),
    }
    with sql_stack(
        tmp_path_factory.mktemp("duckdb"), adapters=2, compute_extra=spark_always
    ) as running:
        yield running


def normalize(value: Any) -> Any:
    """Tidemark's numeric sums are decimals, DuckDB's are integers: compare numbers as such."""
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return value


def multiset(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(normalize(v) for v in row) for row in rows), key=repr)


def random_value(rng: random.Random, kind: str) -> str:
    if rng.random() < 0.15:
        return "NULL"
    if kind == "text":
        return "'" + rng.choice(["a", "ab", "b", "ba", "c", "abc"]) + "'"
    return str(rng.randrange(-2, 9))


def random_insert(rng: random.Random, table: str) -> str:
    rows = []
    for _ in range(rng.randrange(1, 5)):
        values = [str(rng.randrange(0, 5))]  # k: a small range, so joins and groups meet
        for column in TABLES[table].split(", ")[1:]:
            values.append(random_value(rng, column.split()[1]))
        rows.append(f"({', '.join(values)})")
    return f"INSERT INTO {table} VALUES {', '.join(rows)}"


def random_change(rng: random.Random) -> str:
    choice = rng.randrange(5)
    if choice <= 1:
        return random_insert(rng, rng.choice(["r", "q"]))
    if choice == 2:
        return f"UPDATE r SET a = a + {rng.randrange(1, 4)} WHERE k = {rng.randrange(0, 5)}"
    if choice == 3:
        return f"DELETE FROM q WHERE b = {rng.randrange(-2, 9)} OR k = {rng.randrange(0, 5)}"
    return f"UPDATE r SET s = {random_value(rng, 'text')} WHERE a < {rng.randrange(0, 6)}"


async def execute(client: AdapterClient, sql: str) -> list[tuple[Any, ...]]:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r}: {result.error}"
    return result.results[-1].rows


async def test_answers_agree_with_duckdb(stack: SqlStack) -> None:
    rng = random.Random(SEED)
    duck = duckdb.connect()
    async with AdapterClient(stack.adapter(0)) as a, AdapterClient(stack.adapter(1)) as b:
        clients = (a, b)
        for table, columns in TABLES.items():
            await execute(a, f"CREATE TABLE {table} ({columns})")
            duck.execute(f"CREATE TABLE {table} ({columns})")
            for _ in range(3):
                statement = random_insert(rng, table)
                await execute(b, statement)
                duck.execute(statement)
        for number, query in enumerate(QUERIES):
            await execute(a, f"CREATE VIEW v{number} AS {query}")
            await execute(b, f"CREATE MATERIALIZED VIEW m{number} AS {query}")
            await execute(a, f"CREATE VIEW iv{number} AS {query}")
            first = (await execute(b, f"SHOW COLUMNS FROM iv{number}"))[0][0]
            await execute(b, f"CREATE INDEX ON iv{number} ({first})")
        compared = 0
        for round_ in range(ROUNDS + 1):
            if round_:
                for _ in range(rng.randrange(2, 6)):
                    statement = random_change(rng)
                    await execute(clients[rng.randrange(2)], statement)
                    duck.execute(statement)
            for number, query in enumerate(QUERIES):
                expected = multiset(duck.execute(query).fetchall())
                for sql in (
                    query,
                    f"SELECT * FROM v{number}",
                    f"SELECT * FROM m{number}",
                    f"SELECT * FROM iv{number}",
                ):
                    got = multiset(await execute(clients[rng.randrange(2)], sql))
                    assert got == expected, f"round {round_}: {sql!r} (for {query!r})"
                    compared += 1
        assert compared == (ROUNDS + 1) * len(QUERIES) * 4
        explained = await execute(a, "EXPLAIN SELECT * FROM iv0")
        assert "Peek index" in str(explained[0][0])
