"""Window functions in SQL: how calls become Window nodes, their names and types, and the
errors PostgreSQL gives for misplaced, ill-formed or unsupported windows. Results are checked
against DuckDB in test_sql_vs_duckdb.py."""

from __future__ import annotations

import pytest

from services.adapter.sql import SqlError, explain_query
from tests.unit.test_sql_plan import SqlWorld, sql_error
from tests.unit.test_sql_plan import world as world  # the fixture
from tidemark.columnar import RelationSchema
from tidemark.plan.walk import relations


def window_nodes(world: SqlWorld, sql: str) -> int:
    planned = world.plan(sql)
    return sum(1 for node in relations(planned.plan.root) if node.HasField("window"))


def test_calls_with_one_definition_share_a_window_node(world: SqlWorld) -> None:
    sql = (
        "SELECT row_number() OVER (PARTITION BY b ORDER BY a), rank() OVER (PARTITION BY b "
        "ORDER BY a), sum(a) OVER (PARTITION BY b ORDER BY a ROWS 1 PRECEDING), "
        "count(*) OVER () FROM t"
    )
    assert window_nodes(world, sql) == 2
    text = explain_query(world.plan(sql))
    assert "rows between 1 preceding and current row" in text
    assert "row_number(), rank()" in text


def test_named_windows_and_output_names(world: SqlWorld) -> None:
    planned = world.plan(
        "SELECT a, lag(a) OVER w, first_value(b) OVER (w ROWS UNBOUNDED PRECEDING), "
        "dense_rank() OVER w AS dr, sum(c) OVER w FROM t WINDOW w AS (PARTITION BY b ORDER BY a)"
    )
    schema = RelationSchema.from_proto(planned.plan.output_schema)
    assert schema.names == ["a", "lag", "first_value", "dr", "sum"]
    types = {c.name: (c.type.name, c.nullable, c.precision, c.scale) for c in schema.columns}
    assert types["dr"] == ("INT64", False, 0, 0)
    assert types["sum"] == ("DECIMAL", True, 38, 2)
    assert types["first_value"] == ("TEXT", True, 0, 0)


def test_window_results_over_the_fixture(world: SqlWorld) -> None:
    rows = world.rows(
        "SELECT a, row_number() OVER (ORDER BY a DESC, b), lead(a, 1, -1) OVER (ORDER BY a, b), "
        "count(b) OVER (ORDER BY a) FROM t ORDER BY 2"
    )
    # a DESC: NULL (first, as in PostgreSQL), 3, 2, 2, 1. The two (2, NULL) rows are equal,
    # so each window breaks their tie by the whole row, row numbers included.
    assert rows == [
        (None, 1, -1, 3),
        (3, 2, None, 2),
        (2, 3, 2, 1),
        (2, 4, 3, 1),
        (1, 5, 2, 1),
    ]


def test_windows_over_aggregates(world: SqlWorld) -> None:
    rows = world.rows(
        "SELECT b, count(*) AS n, rank() OVER (ORDER BY count(*) DESC), "
        "sum(count(*)) OVER () FROM t GROUP BY b ORDER BY b"
    )
    assert [row[:3] for row in rows] == [("x", 2, 1), ("y", 1, 3), (None, 2, 1)]
    assert {row[3] for row in rows} == {5}


@pytest.mark.parametrize(
    ("sql", "code", "fragment"),
    [
        ("SELECT a FROM t WHERE row_number() OVER () > 1", "42P20", "row_number"),
        ("SELECT a FROM t GROUP BY a HAVING rank() OVER () > 1", "42P20", "rank"),
        ("SELECT sum(row_number() OVER ()) FROM t", "42P20", "row_number"),
        ("SELECT rank() OVER (ORDER BY row_number() OVER ()) FROM t", "42P20", "row_number()"),
        ("SELECT ntile(2) OVER () FROM t", "0A000", "ntile"),
        ("SELECT count(DISTINCT a) OVER () FROM t", "0A000", "count"),
        ("SELECT rank() FILTER (WHERE a > 1) OVER () FROM t", "0A000", "rank"),
        ("SELECT sum(a) OVER w FROM t", "42704", "sum"),
        ("SELECT sum(a) OVER (w PARTITION BY b) FROM t WINDOW w AS (ORDER BY a)", "42P20", "sum"),
        (
            "SELECT sum(a) OVER (w ORDER BY b) FROM t WINDOW w AS (ORDER BY a)",
            "42P20",
            "sum",
        ),
        (
            "SELECT sum(a) OVER (ORDER BY a ROWS BETWEEN UNBOUNDED FOLLOWING AND CURRENT ROW) "
            "FROM t",
            "42P20",
            "sum",
        ),
        (
            "SELECT sum(a) OVER (ORDER BY a ROWS BETWEEN CURRENT ROW AND 1 PRECEDING) FROM t",
            "42P20",
            "sum",
        ),
        (
            "SELECT sum(a) OVER (ORDER BY a ROWS BETWEEN 1 FOLLOWING AND CURRENT ROW) FROM t",
            "42P20",
            "sum",
        ),
        (
            "SELECT sum(a) OVER (ORDER BY a RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t",
            "0A000",
            "sum",
        ),
        (
            "SELECT sum(a) OVER (ORDER BY a ROWS BETWEEN CURRENT ROW AND CURRENT ROW "
            "EXCLUDE TIES) FROM t",
            "0A000",
            "sum",
        ),
        ("SELECT lag(a, a) OVER () FROM t", "0A000", "a) OVER"),
        ("SELECT lag(a, 1, 'x') OVER () FROM t", "22P02", "'x'"),
        ("SELECT lag(a, 1, b) OVER () FROM t", "42804", "lag"),
        ("SELECT a, b, sum(a) OVER (ORDER BY b) FROM t GROUP BY a", "42803", "b"),
    ],
)
def test_window_errors(world: SqlWorld, sql: str, code: str, fragment: str) -> None:
    error = sql_error(world, sql)
    assert error.code == code, error
    expected = sql.rindex(fragment) + 1 if len(fragment) == 1 else sql.index(fragment) + 1
    assert error.position == expected, (error, expected)


def test_frames_that_end_before_they_start_are_empty(world: SqlWorld) -> None:
    rows = world.rows(
        "SELECT a, count(*) OVER (ORDER BY a, b ROWS BETWEEN 1 PRECEDING AND 2 PRECEDING), "
        "sum(a) OVER (ORDER BY a, b ROWS BETWEEN 2 FOLLOWING AND 1 FOLLOWING), "
        "first_value(a) OVER (ORDER BY a, b ROWS BETWEEN 1 FOLLOWING AND 1 FOLLOWING) "
        "FROM t ORDER BY a"
    )
    assert rows == [
        (1, 0, None, 2),
        (2, 0, None, 2),
        (2, 0, None, 3),
        (3, 0, None, None),
        (None, 0, None, None),
    ]


def test_negative_lag_offsets_read_ahead(world: SqlWorld) -> None:
    ahead = world.rows("SELECT a, lag(a, -1) OVER (ORDER BY a) FROM t ORDER BY a")
    lead = world.rows("SELECT a, lead(a, 1) OVER (ORDER BY a) FROM t ORDER BY a")
    assert ahead == lead


def test_unsupported_window_errors_are_sql_errors(world: SqlWorld) -> None:
    with pytest.raises(SqlError):
        world.plan(
            "SELECT avg(a) OVER (ORDER BY a GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t"
        )
