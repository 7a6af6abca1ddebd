"""``generate_series`` in FROM: PostgreSQL's rows, names and errors, planned as constant rows
and checked by evaluating the plans with the reference evaluator."""

from __future__ import annotations

import pytest

from services.adapter.sql import SqlError, parse, plan_insert
from services.adapter.sql.series import MAX_SERIES_ROWS, series_length
from services.adapter.sql.statements import Insert
from tests.unit.test_sql_plan import SqlWorld, multiset, sql_error

# The fixture, shared with the planner tests.
from tests.unit.test_sql_plan import world as world


def _columns(world: SqlWorld, sql: str) -> list[tuple[str, str, bool]]:
    return [(c.name, c.sql_type, c.nullable) for c in world.plan(sql).columns]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM generate_series(1, 5)", [1, 2, 3, 4, 5]),
        ("SELECT * FROM generate_series(1, 10, 3)", [1, 4, 7, 10]),
        ("SELECT * FROM generate_series(1, 9, 3)", [1, 4, 7]),
        ("SELECT * FROM generate_series(10, 1, -4)", [10, 6, 2]),
        ("SELECT * FROM generate_series(-3, -1)", [-3, -2, -1]),
        ("SELECT * FROM generate_series(4, 4)", [4]),
        ("SELECT * FROM generate_series(5, 1)", []),
        ("SELECT * FROM generate_series(1, 5, -1)", []),
        ("SELECT * FROM generate_series(1, NULL)", []),
        ("SELECT * FROM generate_series(1, 3, NULL)", []),
        ("SELECT * FROM generate_series(1, 3::bigint)", [1, 2, 3]),
        ("SELECT * FROM generate_series(CAST('2' AS integer), 3)", [2, 3]),
        ("SELECT * FROM generate_series('1', (3))", [1, 2, 3]),
        (
            "SELECT * FROM generate_series(9223372036854775806, 9223372036854775807)",
            [9223372036854775806, 9223372036854775807],
        ),
    ],
)
def test_series_rows_include_stop_and_follow_the_step(
    world: SqlWorld, sql: str, expected: list[int]
) -> None:
    assert sorted(world.rows(sql)) == [(v,) for v in sorted(expected)]


def test_series_length_matches_the_rows() -> None:
    for start, stop, step in [(1, 10, 3), (10, -10, -7), (0, 0, 5), (3, 1, 1), (1, 3, -1)]:
        assert series_length(start, stop, step) == len(range(start, stop + (step > 0 or -1), step))


def test_series_is_a_constant_bigint_column_that_is_never_null(world: SqlWorld) -> None:
    planned = world.plan("SELECT * FROM generate_series(1, 3)")
    assert planned.plan.root.WhichOneof("kind") == "constant"
    assert planned.collections == set()
    # Every integer is a bigint in Tidemark, whatever PostgreSQL's int4/int8 choice.
    assert _columns(world, "SELECT * FROM generate_series(1, 3)") == [
        ("generate_series", "bigint", False)
    ]


def test_series_naming_follows_postgres(world: SqlWorld) -> None:
    # No alias: the function's name names the table and its column.
    assert _columns(world, "SELECT generate_series.generate_series FROM generate_series(1, 2)") == [
        ("generate_series", "bigint", False)
    ]
    # A table alias names the column too (a function returning one column).
    assert world.rows("SELECT g.g + 1 AS n FROM generate_series(1, 2) AS g ORDER BY n") == [
        (2,),
        (3,),
    ]
    assert _columns(world, "SELECT * FROM generate_series(1, 2) g") == [("g", "bigint", False)]
    # A column alias names the column.
    assert world.rows("SELECT g.x FROM generate_series(1, 2) AS g(x) ORDER BY x") == [(1,), (2,)]
    assert sql_error(world, "SELECT g.g FROM generate_series(1, 2) AS g(x)").code == "42703"
    error = sql_error(world, "SELECT * FROM generate_series(1, 2) AS g(x, y)")
    assert error.code == "42P10" and "1 columns available" in error.message


def test_series_in_joins_ctes_and_subqueries(world: SqlWorld) -> None:
    world.set_rows("u", [(1, 1.5), (2, 2.5), (5, None)])
    joined = world.rows("SELECT u.a, s.n FROM u JOIN generate_series(0, 4, 2) AS s(n) ON u.a = s.n")
    assert joined == [(2, 2)]
    left = world.rows(
        "SELECT s, u.x FROM generate_series(1, 3) AS s LEFT JOIN u ON u.a = s ORDER BY s"
    )
    assert left == [(1, 1.5), (2, 2.5), (3, None)]
    crossed = world.rows("SELECT count(*) FROM u, generate_series(1, 4)")
    assert crossed == [(12,)]
    cte = world.rows(
        "WITH s AS (SELECT g, g % 3 AS r FROM generate_series(1, 7) AS g) "
        "SELECT r, count(*) FROM s GROUP BY r ORDER BY r"
    )
    assert cte == [(0, 2), (1, 3), (2, 2)]
    nested = world.rows(
        "SELECT max(n) FROM (SELECT x * 2 AS n FROM generate_series(1, 5) AS g(x)) AS d"
    )
    assert nested == [(10,)]
    in_list = world.rows("SELECT a FROM u WHERE a IN (SELECT * FROM generate_series(2, 9))")
    assert sorted(in_list) == [(2,), (5,)]
    # Two series in one FROM need different names, as two tables do.
    assert sql_error(world, "SELECT 1 FROM generate_series(1, 2), generate_series(1, 2)").code == (
        "42712"
    )


def test_insert_select_from_a_series(world: SqlWorld) -> None:
    (statement,) = parse("INSERT INTO u SELECT g, g % 10 FROM generate_series(1, 100000) AS g")
    assert isinstance(statement, Insert)
    plan = plan_insert(statement, world.catalog, {})
    assert plan.query is not None
    rows = world.evaluate(plan.query)
    assert len(rows) == 100_000
    assert rows[(12345, 5.0)] == 1 and sum(rows.values()) == 100_000


def test_materialized_view_over_a_series(world: SqlWorld) -> None:
    world.add_view(
        "squares",
        "SELECT g AS n, g * g AS square FROM generate_series(-2, 2) AS g",
        materialized=True,
    )
    world.add_view("evens", "SELECT n FROM squares WHERE n % 2 = 0")
    assert multiset(world.rows("SELECT * FROM squares")) == {
        (-2, 4): 1,
        (-1, 1): 1,
        (0, 0): 1,
        (1, 1): 1,
        (2, 4): 1,
    }
    assert sorted(world.rows("SELECT * FROM evens")) == [(-2,), (0,), (2,)]


def test_step_zero_is_an_error(world: SqlWorld) -> None:
    error = sql_error(world, "SELECT * FROM generate_series(1, 5, 0)")
    assert (error.code, error.message) == ("22023", "step size cannot equal zero")


def test_series_longer_than_the_cap_are_refused(world: SqlWorld) -> None:
    assert len(world.rows(f"SELECT * FROM generate_series(1, {MAX_SERIES_ROWS}, 1000)")) == 1000
    error = sql_error(world, f"SELECT * FROM generate_series(1, {MAX_SERIES_ROWS + 1})")
    assert error.code == "54000"
    assert "1,000,000" in error.message and "COPY" in error.hint
    error = sql_error(world, f"SELECT * FROM generate_series(0, -{MAX_SERIES_ROWS}, -1)")
    assert error.code == "54000"


@pytest.mark.parametrize(
    ("sql", "fragment", "message"),
    [
        ("SELECT * FROM u, generate_series(1, u.a)", "u.a", "other than constants"),
        ("SELECT * FROM generate_series(1, 1 + 2)", "1 + 2", "other than constants"),
        ("SELECT * FROM generate_series(1.5, 3)", "1.5", "over numeric"),
        (
            "SELECT * FROM generate_series('2024-01-01'::timestamp, '2024-01-02'::timestamp, "
            "interval '1 hour')",
            "'2024-01-01'",
            "over timestamp",
        ),
        ("SELECT * FROM generate_series(1, 3) WITH ORDINALITY", "generate_series", "ORDINALITY"),
        ("SELECT * FROM unknown_function(1)", "unknown_function", "table functions"),
    ],
)
def test_unsupported_series_are_0a000(
    world: SqlWorld, sql: str, fragment: str, message: str
) -> None:
    error = sql_error(world, sql)
    assert error.code == "0A000", error
    assert message in error.message and "not supported" in error.message
    assert error.position == sql.index(fragment) + 1, error


def test_bad_argument_text_is_22p02(world: SqlWorld) -> None:
    with pytest.raises(SqlError) as caught:
        world.plan("SELECT * FROM generate_series(1, 'x')")
    assert caught.value.code == "22P02"
