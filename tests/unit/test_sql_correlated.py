"""Correlated subqueries (EXISTS, NOT EXISTS, IN, NOT IN, scalar) in WHERE, SELECT and HAVING,
nested, with NULLs on both sides and empty subquery results: planned by Tidemark, evaluated by
the reference evaluator, against DuckDB on the same rows. Also: the plans keep no cross
product once optimized."""

from __future__ import annotations

import random

import pytest

from tests.unit.test_sql_vs_duckdb import Backends, random_rows
from tidemark.plan import explain
from tidemark.plan.optimize import optimize

CORRELATED = [
    "SELECT k, v FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.k)",
    "SELECT k, v FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.k)",
    "SELECT k FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.k AND t2.w > t1.v)",
    "SELECT k FROM t1 WHERE NOT EXISTS (SELECT * FROM t2 WHERE t2.k = t1.k AND t2.s <> t1.s)",
    "SELECT k, v FROM t1 WHERE v IN (SELECT w FROM t2 WHERE t2.k = t1.k)",
    "SELECT k, v FROM t1 WHERE v NOT IN (SELECT w FROM t2 WHERE t2.k = t1.k)",
    "SELECT k, v, v IN (SELECT w FROM t2 WHERE t2.s = t1.s) FROM t1",
    "SELECT k, v NOT IN (SELECT w FROM t2 WHERE t2.k = t1.k OR t2.k IS NULL) FROM t1",
    "SELECT k, (SELECT count(*) FROM t2 WHERE t2.k = t1.k) FROM t1",
    "SELECT k, (SELECT count(w) + 1 FROM t2 WHERE t2.k = t1.k) FROM t1",
    "SELECT k, (SELECT max(w) FROM t2 WHERE t2.k = t1.k), "
    "(SELECT min(z) FROM t3 WHERE t3.k = t1.k) FROM t1",
    "SELECT k, v FROM t1 WHERE v > (SELECT avg(w) FROM t2 WHERE t2.k = t1.k)",
    "SELECT k FROM t1 WHERE v < (SELECT sum(w) FROM t2 WHERE t2.k = t1.k AND t2.d <= t1.d)",
    "SELECT k, (SELECT w FROM t2 WHERE t2.k = t1.k ORDER BY w DESC NULLS LAST, s LIMIT 1) FROM t1",
    "SELECT k, count(*) FROM t1 GROUP BY k "
    "HAVING count(*) > (SELECT count(*) FROM t2 WHERE t2.k = t1.k)",
    "SELECT k, EXISTS (SELECT 1 FROM t3 WHERE t3.k = t1.k) FROM t1",
    # Nested: the innermost query reads the outermost one.
    "SELECT k FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.k = t1.k "
    "AND EXISTS (SELECT 1 FROM t3 WHERE t3.k = t2.w AND t3.z <> t1.s))",
    "SELECT k, v FROM t1 WHERE v IN (SELECT w FROM t2 WHERE t2.k = t1.k "
    "AND w > (SELECT count(*) FROM t3 WHERE t3.k = t1.k))",
    # Correlated on an expression and on a NULL-able value compared with IS NOT DISTINCT FROM.
    "SELECT k, s FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.s IS NOT DISTINCT FROM t1.s)",
    "SELECT k FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.k + 1 = t1.k * 2)",
    # Duplicates in the subquery, DISTINCT inside it, and a correlated reference in SELECT.
    "SELECT k, (SELECT count(DISTINCT w) FROM t2 WHERE t2.k = t1.k) FROM t1",
    "SELECT k FROM t1 WHERE k IN (SELECT DISTINCT t1.k FROM t2 WHERE t2.w = t1.v)",
    "SELECT a.k FROM t1 AS a WHERE EXISTS (SELECT 1 FROM t1 AS b WHERE b.k = a.k AND b.v <> a.v)",
    "SELECT k FROM t1 WHERE EXISTS (SELECT k FROM t2 WHERE t2.k = t1.k UNION ALL "
    "SELECT k FROM t3 WHERE t3.k = t1.v)",
]


@pytest.mark.parametrize("seed", range(6))
def test_correlated_subqueries_agree_with_duckdb(seed: int) -> None:
    backends = Backends(random_rows(random.Random(seed)))
    for sql in CORRELATED:
        backends.check(sql)


def test_correlated_plans_have_no_cross_product_once_optimized() -> None:
    backends = Backends(random_rows(random.Random(0)))
    for sql in CORRELATED[:6]:
        planned = backends.world.plan(sql)
        text = explain(optimize(planned.plan).plan)
        assert "cross product" not in text, f"{sql}\n{text}"
