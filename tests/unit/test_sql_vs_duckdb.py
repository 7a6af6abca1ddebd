"""Planned queries evaluated by the reference evaluator must agree with DuckDB running the same
SQL over the same data (with DuckDB set to PostgreSQL's conventions: integer division, NULLs
last ascending and first descending; DuckDB's division by zero is NULL already).

Results are compared as multisets, numbers with a small relative tolerance (DuckDB computes
some numeric results in double precision). Queries with ORDER BY ... LIMIT order by every
output column, so the expected rows, in order, are unique; they are compared as lists after
the adapter's finishing is applied.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import duckdb
import pytest

from services.adapter.sql import SqlError
from tests.support.duckdb_conventions import postgres_conventions
from tests.unit.test_sql_plan import SqlWorld
from tidemark.columnar import Column, ColumnType, RelationSchema

Row = tuple[Any, ...]

TABLES = {
    "t1": RelationSchema(
        [
            Column("k", ColumnType.INT64),
            Column("v", ColumnType.INT64),
            Column("s", ColumnType.TEXT),
            Column("n", ColumnType.DECIMAL, True, 8, 2),
            Column("f", ColumnType.FLOAT64),
            Column("d", ColumnType.DATE),
            Column("b", ColumnType.BOOL),
        ]
    ),
    "t2": RelationSchema(
        [
            Column("k", ColumnType.INT64),
            Column("w", ColumnType.INT64),
            Column("s", ColumnType.TEXT),
            Column("d", ColumnType.DATE),
        ]
    ),
    "t3": RelationSchema(
        [Column("k", ColumnType.INT64, nullable=False), Column("z", ColumnType.TEXT)]
    ),
}
DUCKDB_TYPES = {
    ColumnType.INT64: "BIGINT",
    ColumnType.TEXT: "VARCHAR",
    ColumnType.FLOAT64: "DOUBLE",
    ColumnType.DATE: "DATE",
    ColumnType.BOOL: "BOOLEAN",
}

KEYS = [0, 0, 0, 0, 1, 1, 2, 3, None]  # skewed, with NULLs
TEXTS = ["a", "ab", "b", "ba", "abc", "", "B", None, None]
DATES = [datetime.date(2020, 1, 1) + datetime.timedelta(days=40 * i) for i in range(8)] + [None]


def _maybe(rng: random.Random, value: Any, null_rate: float = 0.2) -> Any:
    return None if rng.random() < null_rate else value


def random_rows(rng: random.Random) -> dict[str, list[Row]]:
    def count() -> int:
        return rng.choice([0, 1, 3, 6, 9, 12])

    t1 = [
        (
            rng.choice(KEYS),
            _maybe(rng, rng.randint(-5, 5)),
            rng.choice(TEXTS),
            _maybe(rng, Decimal(rng.randint(-999, 999)).scaleb(-2)),
            _maybe(rng, rng.choice([-1.5, 0.0, 0.25, 2.0, 1000.0, 3.75])),
            rng.choice(DATES),
            _maybe(rng, rng.random() < 0.5),
        )
        for _ in range(count())
    ]
    t2 = [
        (rng.choice(KEYS), _maybe(rng, rng.randint(-3, 8)), rng.choice(TEXTS), rng.choice(DATES))
        for _ in range(count())
    ]
    t3 = [(rng.choice([0, 1, 2, 4]), rng.choice(TEXTS)) for _ in range(rng.choice([0, 2, 5]))]
    # Exact duplicates matter for multiset semantics.
    if t1:
        t1.append(t1[0])
    return {"t1": t1, "t2": t2, "t3": t3}


class Backends:
    """The same tables loaded into a SqlWorld and a DuckDB connection."""

    def __init__(self, rows: dict[str, list[Row]]) -> None:
        self.world = SqlWorld(TABLES)
        self.duck = duckdb.connect()
        postgres_conventions(self.duck)
        for name, schema in TABLES.items():
            columns = ", ".join(
                f"{c.name} "
                + (
                    f"DECIMAL({c.precision},{c.scale})"
                    if c.type is ColumnType.DECIMAL
                    else DUCKDB_TYPES[c.type]
                )
                for c in schema.columns
            )
            self.duck.execute(f"CREATE TABLE {name} ({columns})")
            if rows[name]:
                marks = ", ".join("?" for _ in schema.columns)
                self.duck.executemany(f"INSERT INTO {name} VALUES ({marks})", rows[name])
            self.world.set_rows(name, rows[name])

    def ours(self, sql: str) -> list[Row]:
        return self.world.rows(sql)

    def theirs(self, sql: str) -> list[Row]:
        return [tuple(row) for row in self.duck.execute(sql).fetchall()]

    def check(self, sql: str, ordered: bool = False) -> None:
        try:
            ours = self.ours(sql)
        except SqlError as exc:
            raise AssertionError(f"planning failed: {exc}\n{sql}") from exc
        theirs = self.theirs(sql)
        if ordered:
            assert len(ours) == len(theirs), (sql, ours, theirs)
            for a, b in zip(ours, theirs, strict=True):
                assert rows_match(a, b), (sql, ours, theirs)
        else:
            assert multisets_match(ours, theirs), (
                sql,
                sorted(map(repr, ours)),
                sorted(map(repr, theirs)),
            )


def values_match(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float | Decimal) and isinstance(b, int | float | Decimal):
        return math.isclose(float(a), float(b), rel_tol=1e-7, abs_tol=1e-9)
    return bool(a == b)


def rows_match(a: Row, b: Row) -> bool:
    return len(a) == len(b) and all(values_match(x, y) for x, y in zip(a, b, strict=True))


def multisets_match(ours: Sequence[Row], theirs: Sequence[Row]) -> bool:
    if len(ours) != len(theirs):
        return False
    left = list(theirs)
    for row in ours:
        for index, candidate in enumerate(left):
            if rows_match(row, candidate):
                del left[index]
                break
        else:
            return False
    return True


# A hand-written corpus --------------------------------------------------------------------

CORPUS = [
    "SELECT * FROM t1",
    "SELECT k, v FROM t1 WHERE v > 0 AND s IS NOT NULL",
    "SELECT k, v FROM t1 WHERE v = NULL OR NOT (v <> 2)",
    "SELECT k FROM t1 WHERE k IN (0, 2, NULL)",
    "SELECT k FROM t1 WHERE k NOT IN (0, 2, NULL)",
    "SELECT k FROM t1 WHERE k NOT IN (1, 3)",
    "SELECT v, v IN (1, 2, NULL), v NOT IN (1, 2) FROM t1",
    "SELECT v, v BETWEEN -2 AND 2, v NOT BETWEEN 0 AND 9 FROM t1",
    "SELECT s, s LIKE 'a%', s LIKE '_b', s NOT LIKE '%a%', s ILIKE 'A%' FROM t1",
    "SELECT s, v, s IS DISTINCT FROM 'a', v IS NOT DISTINCT FROM 1 FROM t1",
    "SELECT b, b IS TRUE, b IS NOT FALSE, b IS NULL, NOT b FROM t1",
    "SELECT count(*), count(k), count(v), count(s), count(DISTINCT k), count(DISTINCT s) FROM t1",
    "SELECT sum(v), min(v), max(v), avg(v), sum(n), avg(n), min(s), max(d) FROM t1",
    "SELECT sum(f), avg(f), min(f), max(f) FROM t1",
    "SELECT count(*), sum(v), avg(v), max(s) FROM t1 WHERE v > 100",
    "SELECT k, count(*), sum(v), avg(v), min(s), max(n) FROM t1 GROUP BY k",
    "SELECT k, count(*) FROM t1 GROUP BY k HAVING count(*) > 1",
    "SELECT k, sum(v) FROM t1 GROUP BY k HAVING sum(v) > 0 OR k IS NULL",
    "SELECT k % 2 AS parity, count(*) FROM t1 GROUP BY k % 2",
    "SELECT s, count(DISTINCT k), sum(DISTINCT v) FROM t1 GROUP BY s",
    "SELECT k, v, count(*) FROM t1 GROUP BY k, v",
    "SELECT k, count(*) FILTER (WHERE v > 0) FROM t1 GROUP BY k",
    "SELECT count(*) FROM t1 HAVING count(*) > 0",
    "SELECT DISTINCT k FROM t1",
    "SELECT DISTINCT k, s FROM t1",
    "SELECT v / 2, v % 3, -v, abs(v), v * v - 1, v + 0.5 FROM t1",
    "SELECT n, n * 2, n + v, n / 4, n - 1.25 FROM t1",
    "SELECT 7 / 2, -7 / 2, 7 % -3, 1.0 / 3, 2 * 3.5",
    "SELECT v / 0, n / 0 FROM t1",
    "SELECT s || 'x', upper(s), lower(s), length(s), substr(s, 1, 2), substring(s, 2) FROM t1",
    "SELECT concat(s, k, 'z'), s || k FROM t1",
    "SELECT trim(s), coalesce(s, 'none'), nullif(s, 'a'), coalesce(v, k, -1) FROM t1",
    "SELECT greatest(v, k), least(v, k, 1) FROM t1",
    "SELECT d, extract(year FROM d), extract(month FROM d), extract(day FROM d) FROM t1",
    "SELECT d FROM t1 WHERE d >= '2020-04-01' AND d < DATE '2020-09-01'",
    "SELECT CAST(d AS timestamp), CAST(v AS text), CAST(n AS bigint), CAST(v AS numeric(5,1)) "
    "FROM t1",
    "SELECT CAST(n AS numeric(6,1)), CAST(f AS bigint), CAST(v AS double precision) FROM t1",
    "SELECT CASE WHEN v > 0 THEN 'pos' WHEN v < 0 THEN 'neg' ELSE 'zero' END FROM t1",
    "SELECT CASE k WHEN 0 THEN 'zero' WHEN 1 THEN 'one' END, CASE WHEN b THEN n ELSE v END FROM t1",
    "SELECT t1.k, t1.v, t2.w FROM t1 JOIN t2 ON t1.k = t2.k",
    "SELECT t1.k, t2.w FROM t1, t2 WHERE t1.k = t2.k AND t1.v < t2.w",
    "SELECT t1.v, t2.w FROM t1 CROSS JOIN t2",
    "SELECT t1.k, t1.v, t2.w FROM t1 LEFT JOIN t2 ON t1.k = t2.k",
    "SELECT t1.k, t1.v, t2.w FROM t1 RIGHT JOIN t2 ON t1.k = t2.k",
    "SELECT t1.k, t1.v, t2.k, t2.w FROM t1 FULL JOIN t2 ON t1.k = t2.k",
    "SELECT t1.k, t1.v, t2.w FROM t1 LEFT JOIN t2 ON t1.k = t2.k AND t2.w > 2",
    "SELECT t1.k, t1.v, t2.w FROM t1 LEFT JOIN t2 ON t1.k = t2.k AND t1.v > 0",
    "SELECT t1.k, t1.v, t2.w FROM t1 LEFT JOIN t2 ON t1.v < t2.w",
    "SELECT t1.k, t1.v, t2.w FROM t1 RIGHT JOIN t2 ON t1.k = t2.k AND t1.v > t2.w",
    "SELECT t1.k, t1.v, t2.k, t2.w FROM t1 FULL JOIN t2 ON t1.k = t2.k AND t1.v < t2.w",
    "SELECT t1.v, t2.w FROM t1 FULL JOIN t2 ON false",
    "SELECT * FROM t1 JOIN t2 USING (k)",
    "SELECT k, t1.s, t2.s FROM t1 LEFT JOIN t2 USING (k)",
    "SELECT k, v, w FROM t1 FULL JOIN t2 USING (k)",
    "SELECT * FROM t2 NATURAL JOIN t3",
    "SELECT t1.k, t2.w, t3.z FROM t1 JOIN t2 ON t1.k = t2.k LEFT JOIN t3 ON t2.w = t3.k",
    "SELECT a.k, b.k FROM t1 AS a JOIN t1 AS b ON a.k = b.k AND a.v < b.v",
    "SELECT k FROM t1 UNION SELECT k FROM t2",
    "SELECT k FROM t1 UNION ALL SELECT k FROM t2",
    "SELECT k, s FROM t1 EXCEPT SELECT k, s FROM t2",
    "SELECT k, s FROM t1 EXCEPT ALL SELECT k, s FROM t2",
    "SELECT k FROM t1 INTERSECT SELECT k FROM t2",
    "SELECT k FROM t1 INTERSECT ALL SELECT k FROM t2",
    "SELECT v FROM t1 UNION ALL SELECT n FROM t1",
    "SELECT k FROM t1 UNION SELECT k FROM t2 EXCEPT SELECT k FROM t3",
    "SELECT 1 UNION SELECT NULL",
    "SELECT k FROM t1 WHERE k IN (SELECT k FROM t2)",
    "SELECT k FROM t1 WHERE k NOT IN (SELECT k FROM t2)",
    "SELECT k FROM t1 WHERE k NOT IN (SELECT k FROM t3)",
    "SELECT k, k IN (SELECT w FROM t2), v NOT IN (SELECT w FROM t2 WHERE w > 0) FROM t1",
    "SELECT k FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE w > 5)",
    "SELECT k FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t3)",
    "SELECT k, (SELECT max(w) FROM t2), (SELECT count(*) FROM t3) FROM t1",
    "SELECT k FROM t1 WHERE v > (SELECT avg(w) FROM t2)",
    "SELECT s.k, s.total FROM (SELECT k, sum(v) AS total FROM t1 GROUP BY k) AS s "
    "WHERE s.total > 0",
    "SELECT * FROM (SELECT k, v FROM t1 WHERE v IS NOT NULL) AS x JOIN t2 ON x.k = t2.k",
    "WITH c AS (SELECT k, count(*) AS cnt FROM t1 GROUP BY k) "
    "SELECT c.k, c.cnt, t2.w FROM c JOIN t2 ON c.k = t2.k",
    "WITH a AS (SELECT k FROM t1), b AS (SELECT k FROM a WHERE k > 0) "
    "SELECT * FROM b UNION ALL SELECT * FROM a",
    "WITH a AS (SELECT k, v FROM t1) SELECT x.k, y.v FROM a AS x JOIN a AS y ON x.k = y.k",
    "SELECT * FROM (VALUES (1, 'a'), (2, NULL), (NULL, 'c')) AS v(p, q) "
    "WHERE p IS NOT NULL OR q = 'c'",
    "SELECT p, count(*) FROM (VALUES (1), (1), (2)) AS v(p) GROUP BY p",
    "SELECT k, max(v) - min(v), count(*) * 2 FROM t1 GROUP BY k",
    "SELECT max(s), min(d), count(*) FROM t1 WHERE b",
    "SELECT k, sum(v) AS sv FROM t1 GROUP BY k HAVING sum(v) IS NULL OR avg(v) > 1",
    "SELECT x FROM generate_series(1, 10, 3) AS g(x)",
    "SELECT x FROM generate_series(10, -10, -4) AS g(x)",
    "SELECT x FROM generate_series(5, 1) AS g(x)",
    "SELECT t1.k, t1.v, g.x FROM t1 JOIN generate_series(0, 2) AS g(x) ON t1.k = g.x",
    "SELECT g.x, count(t2.w) FROM generate_series(0, 4) AS g(x) LEFT JOIN t2 ON t2.k = g.x "
    "GROUP BY g.x",
    "WITH s AS (SELECT x, x % 3 AS r FROM generate_series(1, 20) AS g(x)) "
    "SELECT r, count(*), sum(x) FROM s GROUP BY r",
]

ORDERED_CORPUS = [
    "SELECT k, v FROM t1 ORDER BY k, v",
    "SELECT k, v FROM t1 ORDER BY k DESC, v ASC NULLS FIRST",
    "SELECT k, v FROM t1 ORDER BY 1 NULLS FIRST, 2 DESC NULLS LAST LIMIT 4",
    "SELECT k, v, s FROM t1 ORDER BY s DESC, k, v LIMIT 3 OFFSET 2",
    "SELECT DISTINCT k FROM t1 ORDER BY k LIMIT 2",
    "SELECT k, count(*) AS c FROM t1 GROUP BY k ORDER BY c DESC, k",
    "SELECT k FROM t1 UNION SELECT k FROM t2 ORDER BY 1 DESC",
    "SELECT v FROM t1 ORDER BY abs(v), v OFFSET 1",
    "SELECT s FROM t1 ORDER BY length(s) DESC, s LIMIT 5",
]


# Window functions. ROW_NUMBER, LAG/LEAD, FIRST/LAST_VALUE and ROWS frames order by every
# column (ALL_T1), so that only equal rows tie and DuckDB's answer is the one answer; RANK,
# DENSE_RANK and RANGE frames are deterministic over ties and order by fewer columns.
# (DuckDB 1.5.5 counts -1 rows in a frame that ends before it starts, such as ROWS BETWEEN
# 3 PRECEDING AND 5 PRECEDING, where PostgreSQL and Tidemark count 0: test_sql_windows.py
# checks that case.)
ALL_T1 = "v, s, n, f, d, b, k"
WINDOW_CORPUS = [
    "SELECT k, v, rank() OVER (PARTITION BY k ORDER BY v), "
    "dense_rank() OVER (PARTITION BY k ORDER BY v DESC), rank() OVER (ORDER BY s NULLS FIRST) "
    "FROM t1",
    f"SELECT k, v, s, row_number() OVER (PARTITION BY k ORDER BY {ALL_T1}) FROM t1",
    f"SELECT k, row_number() OVER (ORDER BY {ALL_T1} DESC), row_number() OVER () "
    "FROM t1 WHERE false",
    "SELECT k, v, lag(v) OVER w, lead(v, 2) OVER w, lag(s, 1, 'none') OVER w, "
    "lead(n, 1, 0) OVER w, lag(v, 0) OVER w, lag(d, 3) OVER w "
    f"FROM t1 WINDOW w AS (PARTITION BY k ORDER BY {ALL_T1})",
    "SELECT k, v, lead(v, 1, -100) OVER (ORDER BY s DESC NULLS LAST, v, n, f, d, b, k) FROM t1",
    f"SELECT k, v, first_value(v) OVER (PARTITION BY k ORDER BY {ALL_T1}), "
    f"last_value(v) OVER (PARTITION BY k ORDER BY {ALL_T1}), "
    f"last_value(s) OVER (PARTITION BY k ORDER BY {ALL_T1} ROWS BETWEEN CURRENT ROW AND "
    "UNBOUNDED FOLLOWING), first_value(n) OVER (PARTITION BY k), "
    "last_value(d) OVER (ORDER BY k RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) "
    "FROM t1",
    "SELECT k, v, count(*) OVER (PARTITION BY k ORDER BY v), sum(v) OVER (PARTITION BY k "
    "ORDER BY v), avg(v) OVER (PARTITION BY k), min(s) OVER (ORDER BY v), max(d) OVER "
    "(PARTITION BY k ORDER BY v RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING), "
    "count(v) OVER (), sum(n) OVER (ORDER BY k DESC), avg(n) OVER (PARTITION BY s) FROM t1",
    f"SELECT k, v, sum(v) OVER (ORDER BY {ALL_T1} ROWS BETWEEN 2 PRECEDING AND 1 PRECEDING), "
    f"count(v) OVER (ORDER BY {ALL_T1} ROWS BETWEEN 1 FOLLOWING AND 3 FOLLOWING), "
    f"max(v) OVER (ORDER BY {ALL_T1} ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING), "
    f"min(n) OVER (ORDER BY {ALL_T1} ROWS UNBOUNDED PRECEDING), "
    f"sum(f) OVER (PARTITION BY k ORDER BY {ALL_T1} ROWS BETWEEN 1 PRECEDING AND UNBOUNDED "
    "FOLLOWING), "
    f"avg(v) OVER (PARTITION BY k ORDER BY {ALL_T1} ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING), "
    f"count(*) OVER (ORDER BY {ALL_T1} ROWS BETWEEN 3 PRECEDING AND 2 PRECEDING), "
    f"max(s) OVER (ORDER BY {ALL_T1} ROWS BETWEEN 2 FOLLOWING AND 1 FOLLOWING) FROM t1",
    "SELECT k, count(*), rank() OVER (ORDER BY count(*) DESC), sum(sum(v)) OVER (), "
    "sum(count(*)) OVER (ORDER BY k), max(min(s)) OVER (PARTITION BY count(*) > 1) "
    "FROM t1 GROUP BY k",
    "SELECT k, sum(v) AS total, dense_rank() OVER (ORDER BY sum(v) DESC) FROM t1 GROUP BY k "
    "HAVING count(*) > 1",
    "SELECT DISTINCT k, dense_rank() OVER (ORDER BY k) FROM t1",
    "SELECT t1.k, t2.w, rank() OVER (PARTITION BY t1.k ORDER BY t2.w), "
    "count(*) OVER (PARTITION BY t2.s) FROM t1 JOIN t2 ON t1.k = t2.k",
    "SELECT * FROM (SELECT k, v, rank() OVER (PARTITION BY k ORDER BY v DESC) AS r FROM t1) q "
    "WHERE r <= 2",
    f"SELECT k, v, v - lag(v) OVER (PARTITION BY k ORDER BY {ALL_T1}), "
    "100 * count(*) OVER (PARTITION BY k) / count(*) OVER () FROM t1",
    "SELECT k, count(*) FILTER (WHERE v > 0) OVER (PARTITION BY k), "
    "sum(v) FILTER (WHERE s IS NOT NULL) OVER (ORDER BY k) FROM t1",
    "WITH r AS (SELECT k, s, rank() OVER (PARTITION BY s ORDER BY k) AS rk FROM t2) "
    "SELECT s, max(rk), count(*) FROM r GROUP BY s",
]

ORDERED_WINDOW_CORPUS = [
    "SELECT k, v, rank() OVER (ORDER BY v DESC) AS r FROM t1 ORDER BY r, k, v LIMIT 5",
    "SELECT k, sum(v) OVER (PARTITION BY k) AS s FROM t1 ORDER BY s DESC, k NULLS FIRST",
]


@pytest.fixture(scope="module")
def datasets() -> list[Backends]:
    return [Backends(random_rows(random.Random(seed))) for seed in range(4)]


@pytest.mark.parametrize("sql", CORPUS)
def test_corpus_matches_duckdb(datasets: list[Backends], sql: str) -> None:
    for backends in datasets:
        backends.check(sql)


@pytest.mark.parametrize("sql", ORDERED_CORPUS)
def test_ordered_corpus_matches_duckdb(datasets: list[Backends], sql: str) -> None:
    for backends in datasets:
        backends.check(sql, ordered=True)


@pytest.mark.parametrize("sql", WINDOW_CORPUS)
def test_window_corpus_matches_duckdb(datasets: list[Backends], sql: str) -> None:
    for backends in datasets:
        backends.check(sql)


@pytest.mark.parametrize("sql", ORDERED_WINDOW_CORPUS)
def test_ordered_window_corpus_matches_duckdb(datasets: list[Backends], sql: str) -> None:
    for backends in datasets:
        backends.check(sql, ordered=True)


# Random queries ---------------------------------------------------------------------------


class QueryGenerator:
    """Random SQL over TABLES, restricted to what both PostgreSQL and DuckDB agree on."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # The number of columns of the query built last.
        self.width = 0

    def pick(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(options)

    def columns(self, tables: Sequence[str], kind: ColumnType) -> list[str]:
        return [
            f"{table}.{column.name}"
            for table in tables
            for column in TABLES[table].columns
            if column.type is kind
        ]

    def expression(self, tables: Sequence[str], kind: ColumnType, depth: int = 0) -> str:
        leaves = self.columns(tables, kind)
        rng = self.rng
        if depth >= 2 or (leaves and rng.random() < 0.45):
            if leaves and rng.random() < 0.85:
                return self.pick(leaves)
            return self.literal(kind)
        sub: Callable[[ColumnType], str] = lambda k: self.expression(tables, k, depth + 1)  # noqa: E731
        if kind is ColumnType.INT64:
            options = [
                lambda: f"({sub(kind)} {self.pick(['+', '-', '*'])} {sub(kind)})",
                lambda: f"({sub(kind)} {self.pick(['/', '%'])} {self.pick([2, 3, -2])})",
                lambda: f"abs({sub(kind)})",
                lambda: f"length({sub(ColumnType.TEXT)})",
                lambda: f"coalesce({sub(kind)}, {self.literal(kind)})",
                lambda: f"least({sub(kind)}, {sub(kind)})",
                lambda: "(SELECT max(w) FROM t2)",
                # No division inside: DuckDB divides decimals in double precision, which
                # rounds 2.5 to 2 where PostgreSQL's numeric gives 3.
                lambda: f"CAST(({self.decimal_leaf(tables)} - {sub(kind)}) AS bigint)",
                lambda: (
                    f"CASE WHEN {self.predicate(tables, depth + 1)} "
                    f"THEN {sub(kind)} ELSE {sub(kind)} END"
                ),
            ]
            if self.columns(tables, ColumnType.DATE):
                options.append(
                    lambda: (
                        f"extract(month FROM {self.pick(self.columns(tables, ColumnType.DATE))})"
                    )
                )
            return str(self.pick(options)())
        if kind is ColumnType.TEXT:
            options = [
                lambda: f"({sub(kind)} || {sub(kind)})",
                lambda: f"upper({sub(kind)})",
                lambda: f"substr({sub(kind)}, {self.pick([1, 2])}, {self.pick([1, 2, 5])})",
                lambda: f"coalesce({sub(kind)}, 'null')",
                lambda: f"concat({sub(kind)}, {sub(ColumnType.INT64)})",
            ]
            return str(self.pick(options)())
        if kind is ColumnType.DECIMAL:
            options = [
                lambda: f"({sub(kind)} {self.pick(['+', '-', '*'])} {sub(ColumnType.INT64)})",
                lambda: f"({sub(kind)} / {self.pick([2, 4, '0.5'])})",
                lambda: f"greatest({sub(kind)}, {sub(ColumnType.INT64)})",
                lambda: f"nullif({sub(kind)}, 0)",
                lambda: f"CAST({sub(ColumnType.INT64)} AS numeric(6,1))",
            ]
            return str(self.pick(options)())
        if kind is ColumnType.DATE:
            return self.pick(leaves) if leaves else "DATE '2020-05-01'"
        return self.pick(leaves) if leaves else self.literal(kind)

    def decimal_leaf(self, tables: Sequence[str]) -> str:
        return str(self.pick([*self.columns(tables, ColumnType.DECIMAL), "1.25", "-0.5"]))

    def literal(self, kind: ColumnType) -> str:
        if kind is ColumnType.INT64:
            return str(self.rng.randint(-3, 4))
        if kind is ColumnType.TEXT:
            return "'" + self.pick(["a", "b", "ab", ""]) + "'"
        if kind is ColumnType.DATE:
            return "DATE '2020-05-01'"
        if kind is ColumnType.DECIMAL:
            return "1.25"
        return "true"

    def predicate(self, tables: Sequence[str], depth: int = 0, subqueries: bool = True) -> str:
        rng = self.rng
        if depth < 2 and rng.random() < 0.3:
            op = self.pick(["AND", "OR"])
            left = self.predicate(tables, depth + 1, subqueries)
            right = self.predicate(tables, depth + 1, subqueries)
            text = f"({left} {op} {right})"
            return f"NOT {text}" if rng.random() < 0.2 else text
        ints = lambda: self.expression(tables, ColumnType.INT64, depth + 1)  # noqa: E731
        texts = lambda: self.expression(tables, ColumnType.TEXT, depth + 1)  # noqa: E731
        options: list[Callable[[], str]] = [
            lambda: f"{ints()} {self.pick(['=', '<>', '<', '<=', '>', '>='])} {ints()}",
            lambda: f"{texts()} {self.pick(['=', '<', '>='])} {texts()}",
            lambda: f"{ints()} IS {self.pick(['', 'NOT '])}NULL",
            lambda: f"{texts()} IS NULL",
            lambda: (
                f"{ints()} {self.pick(['IN', 'NOT IN'])} ({self.literal(ColumnType.INT64)}, "
                f"{self.pick(['NULL', self.literal(ColumnType.INT64)])})"
            ),
            lambda: (
                f"{ints()} BETWEEN {self.literal(ColumnType.INT64)} "
                f"AND {self.literal(ColumnType.INT64)}"
            ),
            lambda: (
                f"{texts()} {self.pick(['LIKE', 'NOT LIKE'])} '{self.pick(['a%', '%b', '_', '%'])}'"
            ),
            lambda: f"{ints()} IS DISTINCT FROM {ints()}",
        ]
        subquery_options: list[Callable[[], str]] = [
            lambda: (
                f"{ints()} {self.pick(['IN', 'NOT IN'])} (SELECT {self.pick(['k', 'w'])} FROM t2"
                f"{self.pick(['', ' WHERE w > 1', ' WHERE s IS NOT NULL'])})"
            ),
            lambda: (
                f"{self.pick(['', 'NOT '])}EXISTS "
                f"(SELECT 1 FROM t3 WHERE k > {self.rng.randint(0, 4)})"
            ),
            lambda: f"{ints()} > (SELECT min(w) FROM t2)",
        ]
        if subqueries:
            options += subquery_options
            outer_ints = self.columns(tables, ColumnType.INT64)
            if outer_ints:
                options += self.correlated_predicates(tables, outer_ints)
        if self.columns(tables, ColumnType.DATE):
            options.append(
                lambda: (
                    f"{self.pick(self.columns(tables, ColumnType.DATE))} "
                    f"{self.pick(['<', '>='])} '2020-0{self.rng.randint(1, 9)}-15'"
                )
            )
        if self.columns(tables, ColumnType.BOOL):
            options.append(
                lambda: f"{self.pick(self.columns(tables, ColumnType.BOOL))} IS NOT TRUE"
            )
        return str(self.pick(options)())

    def correlated_predicates(
        self, tables: Sequence[str], outer_ints: list[str]
    ) -> list[Callable[[], str]]:
        """Subqueries reading the outer query's columns (correlated), of every kind."""
        ints = lambda: self.expression(tables, ColumnType.INT64, 2)  # noqa: E731
        outer = lambda: self.pick(outer_ints)  # noqa: E731
        texts = self.columns(tables, ColumnType.TEXT)

        def extra() -> str:
            if self.rng.random() < 0.5:
                return ""
            if texts and self.rng.random() < 0.5:
                return f" AND x.s {self.pick(['=', '<>'])} {self.pick(texts)}"
            return f" AND x.w {self.pick(['<', '>=', '<>'])} {outer()}"

        def aggregate() -> str:
            return str(self.pick(["count(*)", "count(x.w)", "min(x.w)", "max(x.k)", "sum(x.w)"]))

        return [
            lambda: (
                f"{self.pick(['', 'NOT '])}EXISTS (SELECT 1 FROM t2 AS x WHERE x.k = {outer()}"
                f"{extra()})"
            ),
            lambda: (
                f"{ints()} {self.pick(['IN', 'NOT IN'])} "
                f"(SELECT x.w FROM t2 AS x WHERE x.k = {outer()}{extra()})"
            ),
            lambda: (
                f"{ints()} {self.pick(['=', '<', '>='])} "
                f"(SELECT {aggregate()} FROM t2 AS x WHERE x.k = {outer()}{extra()})"
            ),
            lambda: (
                f"{self.pick(['', 'NOT '])}EXISTS (SELECT 1 FROM t3 AS y WHERE y.k = {outer()} "
                f"AND EXISTS (SELECT 1 FROM t2 AS x WHERE x.k = y.k AND x.w <> {outer()}))"
            ),
        ]

    def from_clause(self) -> tuple[str, list[str]]:
        rng = self.rng
        shape = rng.random()
        if shape < 0.45:
            table = self.pick(["t1", "t2", "t3"])
            return table, [table]
        left, right = self.pick([("t1", "t2"), ("t2", "t3"), ("t1", "t3")])
        kind = self.pick(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
        condition = f"{left}.k = {right}.k"
        # Subqueries in an outer join's ON are not supported (0A000).
        inner = kind == "JOIN"
        if rng.random() < 0.4:
            extra = self.predicate([left, right], depth=2, subqueries=inner)
            condition = f"{condition} AND {extra}"
        elif rng.random() < 0.15:
            condition = self.predicate([left, right], depth=2, subqueries=inner)
        return f"{left} {kind} {right} ON {condition}", [left, right]

    def select_items(self, tables: Sequence[str], count: int) -> list[tuple[str, ColumnType]]:
        items = []
        for _ in range(count):
            kind = self.pick(
                [
                    ColumnType.INT64,
                    ColumnType.INT64,
                    ColumnType.TEXT,
                    ColumnType.DECIMAL,
                    ColumnType.DATE,
                ]
            )
            items.append((self.expression(tables, kind), kind))
        return items

    def simple(self) -> str:
        source, tables = self.from_clause()
        items = self.select_items(tables, self.rng.randint(1, 3))
        distinct = "DISTINCT " if self.rng.random() < 0.2 else ""
        select = ", ".join(f"{e} AS c{i}" for i, (e, _) in enumerate(items))
        where = f" WHERE {self.predicate(tables)}" if self.rng.random() < 0.7 else ""
        self.width = len(items)
        return f"SELECT {distinct}{select} FROM {source}{where}"

    def aggregate_call(self, tables: Sequence[str]) -> str:
        ints = self.expression(tables, ColumnType.INT64, 1)
        texts = self.expression(tables, ColumnType.TEXT, 1)
        return str(
            self.pick(
                [
                    "count(*)",
                    f"count({ints})",
                    f"count(DISTINCT {texts})",
                    f"sum({ints})",
                    f"min({texts})",
                    f"max({ints})",
                    f"avg({ints})",
                    f"sum(DISTINCT {ints})",
                    f"avg({self.expression(tables, ColumnType.DECIMAL, 1)})",
                    f"max({self.expression(tables, ColumnType.DATE, 1)})",
                ]
            )
        )

    def grouped(self) -> str:
        source, tables = self.from_clause()
        aggregates = [self.aggregate_call(tables) for _ in range(self.rng.randint(1, 3))]
        where = f" WHERE {self.predicate(tables)}" if self.rng.random() < 0.5 else ""
        if self.rng.random() < 0.25:
            select = ", ".join(f"{a} AS c{i}" for i, a in enumerate(aggregates))
            self.width = len(aggregates)
            return f"SELECT {select} FROM {source}{where}"
        kind = self.pick([ColumnType.INT64, ColumnType.TEXT])
        key = self.expression(tables, kind, 1)
        if "." not in key:
            # A bare literal in GROUP BY would be an ordinal (or a constant key).
            key = self.pick(self.columns(tables, kind) or self.columns(tables, ColumnType.INT64))
        select = ", ".join([f"{key} AS g", *(f"{a} AS c{i}" for i, a in enumerate(aggregates))])
        having = ""
        self.width = 1 + len(aggregates)
        if self.rng.random() < 0.4:
            having = f" HAVING count(*) {self.pick(['>', '<=', '='])} {self.rng.randint(0, 3)}"
        return f"SELECT {select} FROM {source}{where} GROUP BY {key}{having}"

    def set_operation(self) -> str:
        kinds = [
            self.pick([ColumnType.INT64, ColumnType.TEXT, ColumnType.DECIMAL])
            for _ in range(self.rng.randint(1, 2))
        ]

        def branch() -> str:
            table = self.pick(["t1", "t2", "t3"])
            items = ", ".join(self.expression([table], k, 1) for k in kinds)
            where = f" WHERE {self.predicate([table], 1)}" if self.rng.random() < 0.5 else ""
            return f"SELECT {items} FROM {table}{where}"

        op = self.pick(["UNION", "UNION ALL", "EXCEPT", "EXCEPT ALL", "INTERSECT", "INTERSECT ALL"])
        self.width = len(kinds)
        return f"{branch()} {op} {branch()}"

    def window_order(self, tables: Sequence[str], total: bool) -> str:
        """ORDER BY items for a window: every column of ``tables`` when ``total`` (so only
        equal rows tie and every function has one answer), else one or two expressions."""
        if total:
            items = [f"{t}.{c.name}" for t in tables for c in TABLES[t].columns]
            self.rng.shuffle(items)
        else:
            kinds = [ColumnType.INT64, ColumnType.TEXT, ColumnType.DECIMAL, ColumnType.DATE]
            items = [
                self.expression(tables, self.pick(kinds), 1) for _ in range(self.rng.randint(1, 2))
            ]
        return ", ".join(
            f"{item}{self.pick(['', ' DESC'])}{self.pick(['', '', ' NULLS FIRST', ' NULLS LAST'])}"
            for item in items
        )

    def window_frame(self) -> str:
        if self.rng.random() < 0.4:
            start = self.pick(["UNBOUNDED PRECEDING", "CURRENT ROW"])
            end = self.pick(["CURRENT ROW", "UNBOUNDED FOLLOWING"])
            return f" RANGE BETWEEN {start} AND {end}"
        offset = self.rng.randint(0, 2)
        start, end = self.pick(
            [
                ("UNBOUNDED PRECEDING", "CURRENT ROW"),
                ("UNBOUNDED PRECEDING", f"{offset} FOLLOWING"),
                (f"{offset} PRECEDING", "CURRENT ROW"),
                (f"{offset} PRECEDING", f"{self.rng.randint(0, 2)} FOLLOWING"),
                (f"{offset + 1} PRECEDING", f"{offset} PRECEDING"),
                ("CURRENT ROW", "UNBOUNDED FOLLOWING"),
                (f"{offset} FOLLOWING", f"{offset + 1} FOLLOWING"),
                ("UNBOUNDED PRECEDING", "UNBOUNDED FOLLOWING"),
            ]
        )
        return f" ROWS BETWEEN {start} AND {end}"

    def window_call(self, tables: Sequence[str]) -> str:
        """One window function call, deterministic under PostgreSQL's rules."""
        rng = self.rng
        keys = [
            self.expression(tables, self.pick([ColumnType.INT64, ColumnType.TEXT]), 1)
            for _ in range(rng.choice([0, 1, 1, 2]))
        ]
        partition = f"PARTITION BY {', '.join(keys)} " if keys else ""
        ints = self.expression(tables, ColumnType.INT64, 1)
        shape = rng.random()
        if shape < 0.2:
            function = self.pick(["rank()", "dense_rank()"])
            return f"{function} OVER ({partition}ORDER BY {self.window_order(tables, False)})"
        if shape < 0.45:
            texts = self.expression(tables, ColumnType.TEXT, 1)
            function = self.pick(
                [
                    "row_number()",
                    f"lag({ints})",
                    f"lead({ints}, {rng.randint(0, 3)})",
                    f"lag({texts}, {rng.randint(1, 2)}, 'none')",
                    f"lead({self.expression(tables, ColumnType.DECIMAL, 1)}, 1, {ints})",
                    f"first_value({texts})",
                    f"last_value({ints})",
                ]
            )
            frame = self.window_frame() if function.endswith("_value") else ""
            return f"{function} OVER ({partition}ORDER BY {self.window_order(tables, True)}{frame})"
        aggregate = self.pick(
            [
                "count(*)",
                f"count({ints})",
                f"sum({ints})",
                f"avg({ints})",
                f"min({self.expression(tables, ColumnType.TEXT, 1)})",
                f"max({self.expression(tables, ColumnType.DATE, 1)})",
                f"sum({self.expression(tables, ColumnType.DECIMAL, 1)})",
            ]
        )
        if shape < 0.7:  # RANGE frames: peers share a value, so any order is deterministic
            order = f"ORDER BY {self.window_order(tables, False)}" if rng.random() < 0.7 else ""
            frame = ""
            if order and rng.random() < 0.4:
                frame = " RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING"
            return f"{aggregate} OVER ({partition}{order}{frame})"
        order = self.window_order(tables, True)
        return f"{aggregate} OVER ({partition}ORDER BY {order}{self.window_frame()})"

    def windowed(self) -> str:
        """A query with window functions, over base tables or over a grouped query."""
        if self.rng.random() < 0.25:
            table = self.pick(["t1", "t2"])
            value = self.pick(["k", "s"])
            other = "v" if table == "t1" else "w"
            self.width = 4
            return (
                f"SELECT {value} AS g, sum({other}) AS c0, rank() OVER (ORDER BY "
                f"sum({other}) DESC) AS c1, count(*) OVER (ORDER BY count(*), {value}) AS c2 "
                f"FROM {table} GROUP BY {value}"
            )
        source, tables = self.from_clause()
        items = [e for e, _ in self.select_items(tables, self.rng.randint(0, 2))]
        items += [self.window_call(tables) for _ in range(self.rng.randint(1, 3))]
        where = f" WHERE {self.predicate(tables)}" if self.rng.random() < 0.4 else ""
        self.width = len(items)
        select = ", ".join(f"{item} AS c{i}" for i, item in enumerate(items))
        return f"SELECT {select} FROM {source}{where}"

    def query(self) -> tuple[str, bool]:
        rng = self.rng
        shape = rng.random()
        if shape < 0.35:
            sql = self.simple()
        elif shape < 0.6:
            sql = self.grouped()
        elif shape < 0.72:
            sql = self.set_operation()
        elif shape < 0.87:
            sql = self.windowed()
        else:
            inner = self.pick([self.simple, self.grouped])()
            sql = (
                f"WITH q AS ({inner}) SELECT * FROM q WHERE {self.pick(['true', 'c0 IS NOT NULL'])}"
            )
        if rng.random() < 0.25:
            width = self.width
            keys = ", ".join(
                f"{i + 1}{self.pick(['', ' DESC'])}{self.pick(['', ' NULLS FIRST', ' NULLS LAST'])}"
                for i in range(width)
            )
            sql = f"SELECT * FROM ({sql}) AS o ORDER BY {keys} LIMIT {rng.randint(0, 6)}"
            return sql + (f" OFFSET {rng.randint(1, 3)}" if rng.random() < 0.3 else ""), True
        return sql, False


@pytest.mark.parametrize("seed", range(8))
def test_random_queries_match_duckdb(seed: int) -> None:
    rng = random.Random(1000 + seed)
    backends = Backends(random_rows(rng))
    generator = QueryGenerator(rng)
    for _ in range(40):
        sql, ordered = generator.query()
        backends.check(sql, ordered)
