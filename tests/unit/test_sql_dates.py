"""Date and time arithmetic (``date ± interval``, ``date ± integer``, ``date - date``)
planned by Tidemark and evaluated by the reference evaluator, against DuckDB on the same rows."""

from __future__ import annotations

import datetime
import random

import pytest

from services.adapter.sql import SqlError
from tests.unit.test_sql_vs_duckdb import Backends, random_rows

QUERIES = [
    "SELECT d, d + INTERVAL '3' DAY, d - INTERVAL '90' DAY FROM t1",
    "SELECT d, d + INTERVAL '1' MONTH, d - INTERVAL '1' YEAR FROM t1",
    "SELECT d + INTERVAL '1 year 2 months 3 days 04:05:06' FROM t1",
    "SELECT d + INTERVAL '2 hours' - INTERVAL '30 minutes' FROM t1",
    "SELECT INTERVAL '7' DAY + d FROM t1",
    "SELECT d, d + 10, d - 3, 5 + d FROM t1",
    "SELECT t1.d - t2.d FROM t1, t2",
    "SELECT DATE '2020-01-31' + INTERVAL '1' MONTH, DATE '2020-03-31' - INTERVAL '1' MONTH",
    "SELECT DATE '1998-12-01' - INTERVAL '90' DAY",
    "SELECT k FROM t1 WHERE d <= DATE '2020-06-01' - INTERVAL '10' DAY",
    "SELECT k FROM t1 WHERE d >= DATE '2020-01-01' AND d < DATE '2020-01-01' + INTERVAL '1' YEAR",
    "SELECT CAST(d AS timestamp) + INTERVAL '36 hours' FROM t1",
]


@pytest.mark.parametrize("seed", range(3))
def test_date_arithmetic_agrees_with_duckdb(seed: int) -> None:
    backends = Backends(random_rows(random.Random(seed)))
    for sql in QUERIES:
        backends.check(sql)


def test_month_arithmetic_clamps_to_the_end_of_the_month() -> None:
    backends = Backends(random_rows(random.Random(0)))
    rows = backends.ours("SELECT DATE '2020-01-31' + INTERVAL '1' MONTH")
    assert rows == [(datetime.datetime(2020, 2, 29),)]


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT d + INTERVAL 'fortnight' FROM t1", "22007"),
        ("SELECT k + INTERVAL '1' DAY FROM t1", "42883"),
        ("SELECT CAST(d AS timestamp) - CAST(d AS timestamp) FROM t1", "0A000"),
        ("SELECT d + INTERVAL '1.5' DAY FROM t1", "0A000"),
    ],
)
def test_bad_date_arithmetic_is_a_clear_error(sql: str, sqlstate: str) -> None:
    backends = Backends(random_rows(random.Random(0)))
    with pytest.raises(SqlError) as raised:
        backends.ours(sql)
    assert raised.value.code == sqlstate
