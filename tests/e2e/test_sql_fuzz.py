"""Random SQL sent to a running adapter over its gRPC API.

Two grammars:

- the DuckDB-comparable one of tests/unit/test_sql_vs_duckdb.py (joins, subqueries,
  aggregates, set operations, expressions of every type, casts, functions), where the answer
  must be DuckDB's over the same data, or a clear SQLSTATE refusal;
- a sqlsmith-like one that also mixes types, casts anything to anything, calls functions with
  odd arguments, divides by zero and overflows, where only robustness is checked: rows or a
  clear SQLSTATE, never XX000 (internal error), never a call past its deadline, and the
  adapter still answering afterwards.
"""

from __future__ import annotations

import asyncio
import datetime
import random
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tests.unit.test_sql_vs_duckdb import (
    TABLES,
    Backends,
    QueryGenerator,
    multisets_match,
    random_rows,
    rows_match,
)
from tidemark.clients.adapter import AdapterClient, ExecuteResult
from tidemark.columnar import ColumnType

QUERIES = 200
WILD_QUERIES = 400
STATEMENT_SECONDS = 30.0
SQL_TYPES = {
    ColumnType.INT64: "bigint",
    ColumnType.TEXT: "text",
    ColumnType.FLOAT64: "double precision",
    ColumnType.DATE: "date",
    ColumnType.BOOL: "boolean",
    ColumnType.DECIMAL: "numeric(8,2)",
}


def sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, float):
        return f"CAST({value!r} AS double precision)"
    if isinstance(value, Decimal):
        return f"CAST({value} AS numeric(8,2))"
    return str(value)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("sqlfuzz"), adapters=1, engine="local") as running:
        yield running


@pytest.fixture(scope="module")
def duck(stack: SqlStack) -> Backends:
    """The same random rows in the running Tidemark and in DuckDB."""
    rows = random_rows(random.Random(1919))
    backends = Backends(rows)

    async def load() -> None:
        async with AdapterClient(stack.adapter(0)) as client:
            for name, schema in TABLES.items():
                columns = ", ".join(
                    f"{c.name} {SQL_TYPES[c.type]}{'' if c.nullable else ' NOT NULL'}"
                    for c in schema.columns
                )
                statements = [f"CREATE TABLE {name} ({columns})"]
                if rows[name]:
                    values = ", ".join(
                        "(" + ", ".join(sql_literal(v) for v in row) + ")" for row in rows[name]
                    )
                    statements.append(f"INSERT INTO {name} VALUES {values}")
                for sql in statements:
                    result = await client.execute(sql)
                    assert result.error is None, (sql, result.error)

    asyncio.run(load())
    return backends


async def run(client: AdapterClient, sql: str) -> ExecuteResult:
    async with asyncio.timeout(STATEMENT_SECONDS):
        return await client.execute(sql)


async def test_random_queries_get_duckdbs_answer_or_a_clear_sqlstate(
    stack: SqlStack, duck: Backends
) -> None:
    generator = QueryGenerator(random.Random(4242))
    refused: Counter[str] = Counter()
    wrong: list[str] = []
    async with AdapterClient(stack.adapter(0)) as client:
        for _ in range(QUERIES):
            sql, ordered = generator.query()
            result = await run(client, sql)
            if result.error is not None:
                assert result.error.code != "XX000", (sql, result.error)
                refused[result.error.code] += 1
                continue
            ours = result.results[-1].rows
            theirs = duck.theirs(sql)
            same = (
                len(ours) == len(theirs)
                and all(rows_match(a, b) for a, b in zip(ours, theirs, strict=True))
                if ordered
                else multisets_match(ours, theirs)
            )
            if not same:
                ours_text, theirs_text = sorted(map(repr, ours)), sorted(map(repr, theirs))
                wrong.append(f"{sql}\n  ours:   {ours_text}\n  duckdb: {theirs_text}")
    print(
        f"{QUERIES} queries: {QUERIES - sum(refused.values())} as DuckDB, refused {dict(refused)}"
    )
    assert not wrong, "\n".join(wrong)
    # The grammar keeps to what both engines support: refusals are the exception.
    assert sum(refused.values()) <= QUERIES // 10, refused


class WildGenerator(QueryGenerator):
    """sqlsmith-like: anything of any type, where errors are expected and must be clear."""

    TYPES = (
        "bigint",
        "text",
        "double precision",
        "numeric(8,2)",
        "numeric",
        "date",
        "boolean",
        "timestamp",
        "bytea",
        "jsonb",
        "integer",
        "smallint",
        "real",
    )

    UNARY = ("abs", "upper", "lower", "length", "round", "floor", "ceil", "sqrt", "ln", "trim")
    UNARY += ("md5", "reverse", "exp", "sign", "date_trunc", "to_char")
    BINARY = ("coalesce", "greatest", "least", "nullif", "concat", "substr", "left", "right")
    BINARY += ("position", "power", "mod", "round", "split_part", "date_part", "strpos")

    def any_expression(self, tables: list[str], depth: int = 0) -> str:
        rng = self.rng
        kind = self.pick([ColumnType.INT64, ColumnType.TEXT, ColumnType.DECIMAL, ColumnType.DATE])
        if depth >= 2 or rng.random() < 0.3:
            return self.expression(tables, kind, 1)
        sub = lambda: self.any_expression(tables, depth + 1)  # noqa: E731
        options = [
            lambda: f"CAST({sub()} AS {self.pick(self.TYPES)})",
            lambda: f"({sub()})::{self.pick(self.TYPES)}",
            lambda: (
                f"({sub()} {self.pick(['+', '-', '*', '/', '%', '||', '<', '=', 'AND'])} {sub()})"
            ),
            lambda: f"({sub()} / 0)",
            lambda: f"({sub()} * 9223372036854775807)",
            lambda: f"{self.pick(self.UNARY)}({sub()})",
            lambda: f"{self.pick(self.BINARY)}({sub()}, {sub()})",
            lambda: f"CASE WHEN {sub()} THEN {sub()} ELSE {sub()} END",
            lambda: f"{self.pick(['count', 'sum', 'avg', 'min', 'max'])}({sub()})",
            lambda: f"(SELECT {sub()} FROM {self.pick(['t1', 't2', 't3'])} LIMIT 1)",
            lambda: f"{sub()} {self.pick(['IS NULL', 'IS NOT TRUE', 'LIKE NULL', 'IN (1, NULL)'])}",
            lambda: self.pick(
                [
                    "NULL",
                    "'x'",
                    "1e308",
                    "-9223372036854775808",
                    "'2020-02-30'",
                    "DATE '2020-01-01'",
                    "'{\"a\": 1}'::jsonb",
                    "true",
                    "0.0",
                ]
            ),
        ]
        return str(self.pick(options)())

    def wild(self) -> str:
        rng = self.rng
        source, tables = self.from_clause()
        items = ", ".join(self.any_expression(tables) for _ in range(rng.randint(1, 3)))
        sql = f"SELECT {items} FROM {source}"
        if rng.random() < 0.4:
            sql += f" WHERE {self.any_expression(tables)}"
        if rng.random() < 0.3:
            sql += f" GROUP BY {self.any_expression(tables)}"
        if rng.random() < 0.2:
            sql += f" ORDER BY {self.any_expression(tables)} LIMIT {rng.randint(-1, 5)}"
        return sql


async def test_wild_queries_get_rows_or_a_clear_sqlstate(stack: SqlStack, duck: Backends) -> None:
    generator = WildGenerator(random.Random(777))
    outcomes: Counter[str] = Counter()
    async with AdapterClient(stack.adapter(0)) as client:
        for _ in range(WILD_QUERIES):
            sql = generator.wild()
            result = await run(client, sql)
            if result.error is None:
                outcomes["rows"] += 1
                continue
            assert result.error.code != "XX000", (sql, result.error)
            assert len(result.error.code) == 5 and result.error.message, (sql, result.error)
            outcomes[result.error.code] += 1
        alive = await run(client, "SELECT count(*) FROM t1")
        assert alive.error is None
    print(dict(outcomes))
    assert outcomes["rows"] > 0
