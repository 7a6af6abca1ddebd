"""The 22 TPC-H queries (DuckDB's texts) plan, and their optimized plans hold no cross
product. Most are also evaluated by the reference evaluator over TPC-H at a tiny scale and
compared with DuckDB; the end-to-end test runs all 22 through the real processes."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from tests.support.tpch_workload import queries, rows, same_rows, schemas, tpch_duckdb
from tests.unit.test_sql_plan import SqlWorld
from tidemark.plan import explain

# The reference evaluator joins by nested loops: these take it tens of seconds.
SLOW_TO_EVALUATE = {5, 7, 9, 18, 19, 20}


@pytest.fixture(scope="module")
def tpch() -> Iterator[tuple[duckdb.DuckDBPyConnection, SqlWorld]]:
    duck = tpch_duckdb(0.001)
    world = SqlWorld(schemas(duck))
    for name in schemas(duck):
        world.set_rows(name, rows(duck, name))
    yield duck, world


@pytest.mark.parametrize("number", range(1, 23))
def test_tpch_query_plans_without_cross_products(
    tpch: tuple[duckdb.DuckDBPyConnection, SqlWorld], number: int
) -> None:
    duck, world = tpch
    planned = world.plan(queries(duck)[number])
    text = explain(planned.plan)
    assert "cross product" not in text, text
    assert planned.raw_plan is not None and planned.changed_by


@pytest.mark.parametrize("number", sorted(set(range(1, 23)) - SLOW_TO_EVALUATE))
def test_tpch_query_answers_like_duckdb(
    tpch: tuple[duckdb.DuckDBPyConnection, SqlWorld], number: int
) -> None:
    duck, world = tpch
    sql = queries(duck)[number]
    expected = [tuple(row) for row in duck.execute(sql).fetchall()]
    assert same_rows(world.rows(sql), expected)
