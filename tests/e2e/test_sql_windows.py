"""Window functions through the real processes: materialized views with window functions stay
equal to DuckDB on the same statements after rounds of inserts, updates and deletes, and so
do the same queries asked directly.

Compute runs its in-process engine here (the Spark runtime runs the same operator;
tests/spark/test_spark_dataflow.py checks a Window plan there)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import duckdb
import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient

ROUNDS = 4
SEED = 15

# Every ORDER BY that ROW_NUMBER, LAG, LEAD or a ROWS frame reads orders by whole rows
# (within the partition), so DuckDB's answer is the only one.
QUERIES = [
    "SELECT k, a, s, rank() OVER (PARTITION BY k ORDER BY a DESC) AS rk, "
    "sum(a) OVER (PARTITION BY k ORDER BY a) AS running, count(*) OVER (PARTITION BY k) AS n "
    "FROM r",
    "SELECT k, a, s, row_number() OVER (PARTITION BY k ORDER BY a, s) AS rn, "
    "lag(a, 1, -1) OVER (PARTITION BY k ORDER BY a, s) AS prev, "
    "lead(s) OVER (PARTITION BY k ORDER BY a, s) AS next, "
    "first_value(s) OVER (PARTITION BY k ORDER BY a, s ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING)"
    " AS near, max(a) OVER (PARTITION BY k ORDER BY a, s ROWS BETWEEN 2 PRECEDING AND CURRENT "
    "ROW) AS recent FROM r",
    "SELECT k, sum(a) AS total, dense_rank() OVER (ORDER BY sum(a) DESC NULLS LAST) AS place "
    "FROM r GROUP BY k",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("windows"), adapters=1, engine="local") as running:
        yield running


def normalize(value: Any) -> Any:
    """Tidemark's sums are decimals, DuckDB's integers: compare numbers as such."""
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return value


def multiset(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(normalize(v) for v in row) for row in rows), key=repr)


def random_rows(rng: random.Random) -> str:
    rows = []
    for _ in range(rng.randrange(1, 6)):
        a = "NULL" if rng.random() < 0.15 else str(rng.randrange(-2, 9))
        s = "NULL" if rng.random() < 0.15 else "'" + rng.choice(["a", "b", "ab", "c"]) + "'"
        rows.append(f"({rng.randrange(0, 4)}, {a}, {s})")
    return f"INSERT INTO r VALUES {', '.join(rows)}"


def random_change(rng: random.Random) -> str:
    choice = rng.randrange(4)
    if choice == 0:
        return random_rows(rng)
    if choice == 1:
        return f"DELETE FROM r WHERE a = {rng.randrange(-2, 9)} OR k = {rng.randrange(0, 6)}"
    if choice == 2:
        return f"UPDATE r SET a = a + {rng.randrange(1, 4)} WHERE k = {rng.randrange(0, 4)}"
    return f"DELETE FROM r WHERE s = '{rng.choice(['a', 'b', 'ab', 'c'])}'"


async def execute(client: AdapterClient, sql: str) -> list[tuple[Any, ...]]:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r}: {result.error}"
    return result.results[-1].rows


async def test_materialized_windows_agree_with_duckdb(stack: SqlStack) -> None:
    rng = random.Random(SEED)
    duck = duckdb.connect()
    duck.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
    async with AdapterClient(stack.adapter(0)) as client:
        await execute(client, "CREATE TABLE r (k bigint, a bigint, s text)")
        duck.execute("CREATE TABLE r (k bigint, a bigint, s text)")
        for _ in range(3):
            statement = random_rows(rng)
            await execute(client, statement)
            duck.execute(statement)
        for number, query in enumerate(QUERIES):
            await execute(client, f"CREATE MATERIALIZED VIEW w{number} AS {query}")
        compared = 0
        for round_ in range(ROUNDS + 1):
            if round_:
                for _ in range(rng.randrange(2, 5)):
                    statement = random_change(rng)
                    await execute(client, statement)
                    duck.execute(statement)
            for number, query in enumerate(QUERIES):
                expected = multiset(duck.execute(query).fetchall())
                for sql in (query, f"SELECT * FROM w{number}"):
                    got = multiset(await execute(client, sql))
                    assert got == expected, f"round {round_}: {sql!r} (for {query!r})"
                    compared += 1
        assert compared == (ROUNDS + 1) * len(QUERIES) * 2
        assert len(duck.execute("SELECT * FROM r").fetchall()) >= 5  # the views are not trivial
        explained = await execute(client, f"EXPLAIN {QUERIES[1]}")
        assert "Window partition=[#0] order=[#1, #2]" in str(explained[0][0])
