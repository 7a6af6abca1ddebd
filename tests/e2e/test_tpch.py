"""All 22 TPC-H queries through the real processes, against DuckDB on the same rows: each
direct SELECT, each query as a materialized view, and each view again after a round of
inserts, deletes and updates to ``orders`` and ``lineitem``. The optimized plan of every query
has no cross product (read from EXPLAIN).

The scale factor is small inside ``make test`` (``TIDEMARK_TPCH_SF``, default 0.002, about 17k
rows); ``bench/tpch.py`` runs the same workload at larger scales and prints timings.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tests.support.tpch_workload import (
    change_statements,
    load_tables,
    queries,
    same_rows,
    tpch_duckdb,
)
from tidemark.clients.adapter import AdapterClient
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

SCALE_FACTOR = float(os.environ.get("TIDEMARK_TPCH_SF", "0.002"))
ALL_QUERIES = list(range(1, 23))


class Tpch:
    def __init__(self, stack: SqlStack, duck: duckdb.DuckDBPyConnection) -> None:
        self.stack = stack
        self.duck = duck
        self.queries = queries(duck)


async def load(stack: SqlStack, duck: duckdb.DuckDBPyConnection) -> None:
    async with (
        AdapterClient(stack.adapter(0)) as adapter,
        StorageClient(stack.storage.address) as storage,
        OracleClient(stack.oracle.address) as oracle,
        CatalogClient(stack.catalog.address) as catalog,
    ):
        await load_tables(adapter, storage, oracle, catalog, duck)


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tpch]:
    duck = tpch_duckdb(SCALE_FACTOR)
    with sql_stack(tmp_path_factory.mktemp("tpch"), adapters=1) as stack:
        asyncio.run(load(stack, duck))
        yield Tpch(stack, duck)


async def execute(client: AdapterClient, sql: str) -> list[tuple[Any, ...]]:
    result = await client.execute(sql)
    assert result.error is None, f"{sql[:200]!r}: {result.error}"
    return result.results[-1].rows


def expected(tpch: Tpch, number: int) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in tpch.duck.execute(tpch.queries[number]).fetchall()]


async def test_direct_selects_equal_duckdb(tpch: Tpch) -> None:
    wrong: list[str] = []
    async with AdapterClient(tpch.stack.adapter(0), timeout=600) as client:
        for number in ALL_QUERIES:
            result = await client.execute(tpch.queries[number])
            if result.error is not None:
                wrong.append(f"Q{number}: {result.error}")
                continue
            got = result.results[-1].rows
            if not same_rows(got, expected(tpch, number)):
                wrong.append(f"Q{number}: {len(got)} rows differ from DuckDB's")
    assert not wrong, "\n".join(wrong)


async def test_optimized_plans_have_no_cross_product(tpch: Tpch) -> None:
    async with AdapterClient(tpch.stack.adapter(0)) as client:
        for number in ALL_QUERIES:
            plan = "\n".join(
                str(row[0]) for row in await execute(client, f"EXPLAIN {tpch.queries[number]}")
            )
            assert "cross product" not in plan.lower(), f"Q{number}:\n{plan}"
        # The plan as planned still joins the comma-separated tables with no keys.
        raw = await execute(client, f"EXPLAIN RAW PLAN FOR {tpch.queries[3]}")
        assert "cross product" in str(raw[0][0]), raw


async def test_materialized_views_equal_duckdb_before_and_after_changes(tpch: Tpch) -> None:
    wrong: list[str] = []
    async with AdapterClient(tpch.stack.adapter(0), timeout=600) as client:
        created = []
        for number in ALL_QUERIES:
            result = await client.execute(
                f"CREATE MATERIALIZED VIEW q{number:02d} AS {tpch.queries[number]}"
            )
            if result.error is not None:
                wrong.append(f"Q{number} CREATE: {result.error}")
                continue
            created.append(number)
        await compare_views(client, tpch, created, "before changes", wrong)
        rng = random.Random(20261124)
        for statement in change_statements(tpch.duck, rng):
            await execute(client, statement)
            tpch.duck.execute(statement)
        await compare_views(client, tpch, created, "after changes", wrong)
    assert not wrong, "\n".join(wrong)


async def compare_views(
    client: AdapterClient, tpch: Tpch, numbers: list[int], when: str, wrong: list[str]
) -> None:
    for number in numbers:
        result = await client.execute(f"SELECT * FROM q{number:02d}")
        if result.error is not None:
            wrong.append(f"Q{number} view {when}: {result.error}")
            continue
        got = result.results[-1].rows
        if not same_rows(got, expected(tpch, number)):
            wrong.append(f"Q{number} view {when}: {len(got)} rows differ from DuckDB's")
