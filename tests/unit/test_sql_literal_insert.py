"""The literal-INSERT shortcut gives exactly what the ordinary parser and planner give: the
same rows, or (by handing the statement over) the same error at the same position."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.adapter.sql import parse, plan_insert
from services.adapter.sql.errors import SqlError
from services.adapter.sql.literal_insert import scan_literal_inserts
from services.adapter.sql.parser import parse_tokens
from services.adapter.sql.statements import Insert
from tests.unit.test_sql_plan import SqlWorld
from tidemark.columnar import Column, ColumnType, RelationSchema

SCHEMA = RelationSchema(
    [
        Column("i", ColumnType.INT64, nullable=False),
        Column("n", ColumnType.DECIMAL, precision=8, scale=2),
        Column("f", ColumnType.FLOAT64),
        Column("s", ColumnType.TEXT),
        Column("d", ColumnType.DATE),
        Column("ts", ColumnType.TIMESTAMP),
        Column("b", ColumnType.BOOL),
        Column("j", ColumnType.JSON),
    ]
)
PADDING = "x" * 200  # long enough for the scan to be tried

cells = st.one_of(
    st.integers(-(2**63) - 5, 2**63 + 5).map(str),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=3, min_value=-(10**7), max_value=10**7
    ).map(str),
    st.sampled_from(["1e3", "-2.5", ".5", "+7", "1.", "2.005", "99999999.995"]),
    st.text(alphabet="ab' \\1-:T.", max_size=6).map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.sampled_from(
        [
            "'2024-02-29'",
            "'2023-02-29'",
            "DATE '2024-01-05'",
            "TIMESTAMP '2024-01-05 10:11:12'",
            "'2024-01-05 10:11:12.5'",
            "'true'",
            "'no'",
            "'{\"a\": [1, 2]}'",
            "'[1,'",
            "NULL",
            "null",
            "DEFAULT",
            "TRUE",
            "false",
            "'NaN'",
            "'-Infinity'",
            "'12'",
            "' 3 '",
        ]
    ),
)


def outcome(world: SqlWorld, statement: Insert) -> Any:
    try:
        plan = plan_insert(statement, world.catalog, {})
    except SqlError as exc:
        return ("error", exc.code, exc.message, exc.position)
    return ("rows", plan.rows)


numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=3, min_value=-(10**5), max_value=10**5
    ).map(str),
)
GOOD: dict[str, Any] = {
    "i": numbers,
    "n": numbers,
    "f": st.one_of(numbers, st.sampled_from(["'NaN'", "'1.5'", "1e3"])),
    "s": st.text(alphabet="ab' \\1-", max_size=6).map(lambda s: "'" + s.replace("'", "''") + "'"),
    "d": st.sampled_from(["'2024-02-29'", "DATE '2024-01-05'", "'1999-12-31'"]),
    "ts": st.sampled_from(
        ["TIMESTAMP '2024-01-05 10:11:12'", "'2024-01-05 10:11:12.5'", "DATE '2020-01-01'"]
    ),
    "b": st.sampled_from(["TRUE", "false", "'yes'", "'f'"]),
    "j": st.sampled_from(["'{\"a\": [1, 2]}'", "'3'", "'\"x\"'"]),
}


def cell_for(column: str) -> Any:
    # Mostly values of the column's type, so that most statements insert rows; now and then
    # anything at all, so that errors are compared too.
    nulls = st.sampled_from(["NULL", "DEFAULT"])
    return st.integers(0, 39).flatmap(
        lambda k: cells if k == 0 else nulls if k <= 2 else GOOD[column]
    )


@settings(max_examples=300, deadline=None)
@given(
    columns=st.permutations(SCHEMA.names[1:]).flatmap(
        lambda names: st.integers(0, len(names)).map(lambda k: ["i", *names[:k]])
    ),
    data=st.data(),
)
def test_the_shortcut_agrees_with_the_planner(columns: list[str], data: st.DataObject) -> None:
    world = SqlWorld({"t": SCHEMA})
    rows = data.draw(st.lists(st.tuples(*(cell_for(c) for c in columns)), min_size=1, max_size=4))
    values = ", ".join("(" + ", ".join(row) + ")" for row in rows)
    sql = f"INSERT INTO t ({', '.join(columns)}) VALUES {values} ; -- {PADDING}"
    sql = sql.replace(f" ; -- {PADDING}", "; " + " " * 200)
    (fast,) = parse(sql)
    (slow,) = parse_tokens(sql)
    assert isinstance(fast, Insert) and isinstance(slow, Insert)
    assert fast.literal_rows is not None, sql
    assert outcome(world, fast) == outcome(world, slow), sql


def test_only_literal_inserts_take_the_shortcut() -> None:
    rows = ", ".join(f"({i}, 'x{i}')" for i in range(40))
    assert scan_literal_inserts(f"INSERT INTO t VALUES {rows}") is not None
    assert (
        scan_literal_inserts(f"INSERT INTO t VALUES {rows}; INSERT INTO u VALUES {rows};")
        is not None
    )
    for other in [
        f"INSERT INTO t VALUES {rows}, (1 + 1, 'y')",
        f"INSERT INTO t VALUES {rows}, (1, E'y')",
        f"INSERT INTO t VALUES {rows}, (1, 'y'::text)",
        f"INSERT INTO t VALUES {rows}; SELECT 1",
        f"INSERT INTO t VALUES {rows} RETURNING *",
        f"INSERT INTO t VALUES {rows} -- comment",
        f"INSERT INTO t SELECT * FROM u WHERE x IN {rows}",
    ]:
        assert scan_literal_inserts(other) is None, other


def test_two_inserts_keep_their_positions() -> None:
    rows = ", ".join(f"({i}, 'x')" for i in range(30))
    sql = f'INSERT INTO a VALUES {rows};\n  insert into "B" (y, x) VALUES {rows}'
    first, second = parse(sql)
    assert isinstance(first, Insert) and isinstance(second, Insert)
    assert (first.table, second.table, second.columns) == (("a",), ("B",), ("y", "x"))
    assert sql[second.position - 1 :].startswith("insert into")
    assert second.text == sql[second.position - 1 :]
    assert first.literal_rows is not None and len(first.literal_rows.rows) == 30
