"""Planning SQL into the plan IR: name resolution, PostgreSQL semantics (checked by evaluating
the plans with the reference evaluator), finishing, DML plans and clear errors.

The helpers at the top (:class:`SqlWorld`) are shared with ``test_sql_vs_duckdb.py``.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from services.adapter.sql import (
    CatalogView,
    PlannedQuery,
    SqlError,
    explain_query,
    key_positions,
    parse,
    plan_delete,
    plan_insert,
    plan_query,
    plan_update,
    plan_view,
    relation_schema,
    type_name,
)
from services.adapter.sql.statements import CreateView, Delete, Insert, Select, Update
from services.adapter.sql.types import parse_type_name
from tests.support.reference_eval import evaluate
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.plan.catalog_relations import relation_plan
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import catalog_pb2

Row = tuple[Any, ...]
D = Decimal


# Shared helpers ---------------------------------------------------------------------------


def _name(database: str = "", schema: str = "", item: str = "") -> catalog_pb2.QualifiedName:
    return catalog_pb2.QualifiedName(database=database, schema=schema, item=item)


class SqlWorld:
    """A catalog of tables (and views planned from SQL) with data, to plan and run queries."""

    def __init__(self, tables: Mapping[str, RelationSchema], database: str = "tidemark") -> None:
        self.items: list[catalog_pb2.CatalogItem] = [
            catalog_pb2.CatalogItem(id="s1", name=_name(database), database=catalog_pb2.Database()),
            catalog_pb2.CatalogItem(
                id="s2", name=_name(database, "public"), schema=catalog_pb2.Schema()
            ),
            catalog_pb2.CatalogItem(
                id="s3", name=_name(item="default"), cluster=catalog_pb2.Cluster()
            ),
        ]
        self.database = database
        self.data: dict[str, dict[Row, int]] = {}
        self.ids: dict[str, str] = {}
        self._next = 1
        for name, schema in tables.items():
            self.add_table(name, schema)

    def _allocate(self) -> str:
        global_id = f"u{self._next}"
        self._next += 1
        return global_id

    def add_table(self, name: str, schema: RelationSchema, schema_name: str = "public") -> str:
        global_id = self._allocate()
        self.items.append(
            catalog_pb2.CatalogItem(
                id=global_id,
                name=_name(self.database, schema_name, name),
                table=catalog_pb2.Table(schema=schema.to_proto(), collection_id=global_id),
            )
        )
        self.data[global_id] = {}
        self.ids[name] = global_id
        return global_id

    def add_schema(self, name: str) -> None:
        self.items.append(
            catalog_pb2.CatalogItem(
                id=self._allocate(), name=_name(self.database, name), schema=catalog_pb2.Schema()
            )
        )

    def add_view(self, name: str, sql: str, materialized: bool = False) -> PlannedQuery:
        (statement,) = parse(
            f"CREATE {'MATERIALIZED ' if materialized else ''}VIEW {name} AS {sql}"
        )
        assert isinstance(statement, CreateView)
        planned = plan_view(statement.query, self.catalog, {}, statement.column_names)
        global_id = self._allocate()
        body: dict[str, Any]
        if materialized:
            body = {
                "materialized_view": catalog_pb2.MaterializedView(
                    sql=sql,
                    schema=planned.plan.output_schema,
                    plan=planned.plan.SerializeToString(),
                    cluster_id="s3",
                    output_collection_id=global_id,
                )
            }
            # A materialized view's collection holds what its plan computes now.
            self.data[global_id] = self.evaluate(planned)
        else:
            body = {
                "view": catalog_pb2.View(
                    sql=sql,
                    schema=planned.plan.output_schema,
                    plan=planned.plan.SerializeToString(),
                )
            }
        self.items.append(
            catalog_pb2.CatalogItem(
                id=global_id,
                name=_name(self.database, "public", name),
                depends_on=sorted(planned.depends_on),
                **body,
            )
        )
        self.ids[name] = global_id
        return planned

    @property
    def catalog(self) -> CatalogView:
        return CatalogView(self.items)

    def set_rows(self, name: str, rows: Sequence[Row]) -> None:
        multiset: dict[Row, int] = {}
        for row in rows:
            multiset[row] = multiset.get(row, 0) + 1
        self.data[self.ids[name]] = multiset

    def plan(self, sql: str, settings: Mapping[str, str] | None = None) -> PlannedQuery:
        (statement,) = parse(sql)
        assert isinstance(statement, Select), statement
        return plan_query(statement.query, self.catalog, settings or {})

    def evaluate(self, planned: PlannedQuery) -> dict[Row, int]:
        return evaluate(planned.plan, self.data)

    def rows(self, sql: str, settings: Mapping[str, str] | None = None) -> list[Row]:
        """The query's result as the adapter returns it: finishing applied."""
        planned = self.plan(sql, settings)
        return finish(planned, self.evaluate(planned))


def _compare_values(a: Any, b: Any, descending: bool, nulls_first: bool) -> int:
    if a is None and b is None:
        return 0
    if a is None or b is None:
        return -1 if (a is None) == nulls_first else 1
    result = (a > b) - (a < b)
    return -result if descending else result


def finish(planned: PlannedQuery, result: Mapping[Row, int]) -> list[Row]:
    """Applies ``planned.finishing`` to an evaluated result, as the adapter does."""
    rows = [row for row, count in result.items() for _ in range(count)]
    assert all(count > 0 for count in result.values())
    spec = planned.finishing

    def compare(x: Row, y: Row) -> int:
        for key in spec.order_by:
            c = _compare_values(x[key.column], y[key.column], key.descending, key.nulls_first)
            if c:
                return c
        return 0

    rows.sort(key=functools.cmp_to_key(compare))
    end = None if spec.limit is None else spec.offset + spec.limit
    return [tuple(row[c] for c in spec.project) for row in rows[spec.offset : end]]


def multiset(rows: Sequence[Row]) -> dict[Row, int]:
    counts: dict[Row, int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    return counts


# Fixtures ---------------------------------------------------------------------------------

T = RelationSchema(
    [
        Column("a", ColumnType.INT64),
        Column("b", ColumnType.TEXT),
        Column("c", ColumnType.DECIMAL, True, 10, 2),
        Column("d", ColumnType.DATE),
    ]
)
U = RelationSchema([Column("a", ColumnType.INT64, nullable=False), Column("x", ColumnType.FLOAT64)])


@pytest.fixture
def world() -> SqlWorld:
    w = SqlWorld({"t": T, "u": U})
    w.set_rows(
        "t",
        [
            (1, "x", D("1.50"), datetime.date(2020, 1, 1)),
            (2, None, None, None),
            (2, None, None, None),
            (None, "y", D("-3.25"), datetime.date(2021, 5, 6)),
            (3, "x", D("0.00"), None),
        ],
    )
    w.set_rows("u", [(1, 1.5), (1, 2.5), (5, None)])
    return w


def sql_error(world: SqlWorld, sql: str) -> SqlError:
    with pytest.raises(SqlError) as caught:
        world.plan(sql)
    return caught.value


# Name resolution --------------------------------------------------------------------------


def test_tables_are_read_from_their_collections(world: SqlWorld) -> None:
    planned = world.plan("SELECT a, b FROM t")
    assert planned.depends_on == {world.ids["t"]}
    assert planned.collections == {world.ids["t"]}
    assert [(c.name, c.sql_type, c.nullable) for c in planned.columns] == [
        ("a", "bigint", True),
        ("b", "text", True),
    ]
    assert planned.plan.root.WhichOneof("kind") == "project"


def test_qualified_names_and_search_path(world: SqlWorld) -> None:
    world.add_schema("other")
    world.add_table("t", RelationSchema([Column("z", ColumnType.TEXT)]), schema_name="other")
    other = world.ids["t"]
    assert world.plan("SELECT * FROM tidemark.public.u").columns[0].name == "a"
    assert world.plan("SELECT z FROM other.t").collections == {other}
    assert world.plan("SELECT * FROM t", {"search_path": "other, public"}).collections == {other}
    assert world.plan("SELECT * FROM u", {"search_path": "other, public"}).columns[1].name == "x"


@pytest.mark.parametrize(
    ("sql", "code", "fragment"),
    [
        ("SELECT * FROM nope", "42P01", "nope"),
        ("SELECT * FROM nodb.public.t", "3D000", "nodb"),
        ("SELECT * FROM noschema.t", "3F000", "noschema"),
        ("SELECT zz FROM t", "42703", "zz"),
        ("SELECT a FROM t, u", "42702", "a"),
        ("SELECT q.a FROM t", "42P01", "q"),
        ("SELECT * FROM t, t", "42712", "t"),
    ],
)
def test_name_errors(world: SqlWorld, sql: str, code: str, fragment: str) -> None:
    error = sql_error(world, sql)
    assert error.code == code
    assert fragment in error.message
    # The second "t" is the duplicate one.
    expected = sql.rindex(fragment) if code == "42712" else sql.index(fragment)
    assert error.position == expected + 1


def test_views_are_inlined_and_listed_as_dependencies(world: SqlWorld) -> None:
    world.add_view("v", "SELECT a, b FROM t WHERE a > 1")
    planned = world.plan("SELECT b FROM v WHERE a < 3")
    assert planned.depends_on == {world.ids["v"]}
    assert planned.collections == {world.ids["t"]}
    assert multiset(finish(planned, world.evaluate(planned))) == {(None,): 2}


def test_materialized_views_are_read_from_their_collection(world: SqlWorld) -> None:
    world.add_view("mv", "SELECT a, count(*) AS n FROM t GROUP BY a", materialized=True)
    planned = world.plan("SELECT n FROM mv WHERE a = 2")
    assert planned.collections == {world.ids["mv"]}
    assert finish(planned, world.evaluate(planned)) == [(2,)]


def test_view_with_order_and_limit_keeps_a_top_k(world: SqlWorld) -> None:
    planned = world.add_view("top", "SELECT a FROM t ORDER BY a DESC LIMIT 2")
    assert "TopK" in explain_query(planned)
    assert planned.finishing.is_trivial
    assert world.rows("SELECT * FROM top") in ([(3,), (None,)], [(None,), (3,)])


def test_view_column_names_must_be_unique(world: SqlWorld) -> None:
    (statement,) = parse("CREATE VIEW w AS SELECT a, a FROM t")
    assert isinstance(statement, CreateView)
    with pytest.raises(SqlError) as caught:
        plan_view(statement.query, world.catalog, {})
    assert caught.value.code == "42701"
    (statement,) = parse("CREATE VIEW w (p, q) AS SELECT a, a FROM t")
    assert isinstance(statement, CreateView)
    planned = plan_view(statement.query, world.catalog, {}, statement.column_names)
    assert [c.name for c in planned.plan.output_schema.columns] == ["p", "q"]


def test_ctes_shadow_tables(world: SqlWorld) -> None:
    rows = world.rows("WITH u AS (SELECT 7 AS a) SELECT a FROM u")
    assert rows == [(7,)]


# PostgreSQL semantics ---------------------------------------------------------------------


def test_null_comparisons_and_in_lists(world: SqlWorld) -> None:
    assert world.rows("SELECT NULL = NULL, 1 IN (1, NULL), 2 IN (1, NULL), 2 NOT IN (1, NULL)") == [
        (None, True, None, None)
    ]
    assert multiset(world.rows("SELECT a FROM t WHERE a <> 2")) == {(1,): 1, (3,): 1}


def test_in_subquery_three_valued(world: SqlWorld) -> None:
    world.set_rows("u", [(1, None), (4, 2.0)])
    got = multiset(
        world.rows("SELECT a, a IN (SELECT a FROM u), a NOT IN (SELECT a FROM u) FROM t")
    )
    assert got == {
        (1, True, False): 1,
        (2, False, True): 2,
        (3, False, True): 1,
        (None, None, None): 1,
    }
    world.set_rows("u", [])
    got = multiset(world.rows("SELECT a IN (SELECT a FROM u), a NOT IN (SELECT a FROM u) FROM t"))
    assert got == {(False, True): 5}


def test_not_in_with_null_in_subquery_is_never_true(world: SqlWorld) -> None:
    assert world.rows("SELECT a FROM t WHERE a NOT IN (SELECT NULL::bigint UNION SELECT 1)") == []


def test_count_star_versus_count_column(world: SqlWorld) -> None:
    assert world.rows("SELECT count(*), count(a), count(b), count(DISTINCT a) FROM t") == [
        (5, 4, 3, 3)
    ]


def test_empty_input_aggregates_give_one_row(world: SqlWorld) -> None:
    rows = world.rows("SELECT count(*), sum(a), max(b), avg(c) FROM t WHERE a > 100")
    assert rows == [(0, None, None, None)]
    assert world.rows("SELECT a, count(*) FROM t WHERE a > 100 GROUP BY a") == []
    assert world.rows("SELECT 1 FROM t WHERE a > 100 HAVING count(*) = 0") == [(1,)]


def test_avg_of_integers_is_numeric_and_integer_division_truncates(world: SqlWorld) -> None:
    planned = world.plan("SELECT avg(a), sum(a), 7 / 2, -7 / 2, 7 % 3, 7.0 / 2 FROM t")
    assert [c.sql_type for c in planned.columns] == [
        "numeric(38,16)",
        "numeric(38,0)",
        "bigint",
        "bigint",
        "bigint",
        "numeric(38,16)",
    ]
    ((avg, total, div, negdiv, mod, decdiv),) = finish(planned, world.evaluate(planned))
    assert avg == D("2") and total == 8 and (div, negdiv, mod) == (3, -3, 1)
    assert decdiv == D("3.5")


def test_except_intersect_set_versus_all(world: SqlWorld) -> None:
    world.set_rows("u", [(2, None), (3, None), (3, None)])
    assert multiset(world.rows("SELECT a FROM t EXCEPT SELECT a FROM u")) == {(1,): 1, (None,): 1}
    assert multiset(world.rows("SELECT a FROM t EXCEPT ALL SELECT a FROM u")) == {
        (1,): 1,
        (2,): 1,
        (None,): 1,
    }
    assert multiset(world.rows("SELECT a FROM t INTERSECT SELECT a FROM u")) == {(2,): 1, (3,): 1}
    assert multiset(world.rows("SELECT a FROM u INTERSECT ALL SELECT a FROM t")) == {
        (2,): 1,
        (3,): 1,
    }
    assert multiset(world.rows("SELECT a FROM t UNION SELECT a FROM u")) == {
        (1,): 1,
        (2,): 1,
        (3,): 1,
        (None,): 1,
    }


def test_outer_joins_pad_with_nulls(world: SqlWorld) -> None:
    rows = world.rows("SELECT t.a, u.x FROM t LEFT JOIN u ON t.a = u.a AND u.x > 2")
    assert multiset(rows) == {(1, 2.5): 1, (2, None): 2, (3, None): 1, (None, None): 1}
    rows = world.rows("SELECT t.a, u.a FROM t RIGHT JOIN u ON t.a = u.a")
    assert multiset(rows) == {(1, 1): 2, (None, 5): 1}
    # A condition on the preserved side decides matching, it does not filter rows.
    rows = world.rows("SELECT t.a, u.x FROM t FULL JOIN u ON t.a = u.a AND t.b = 'y'")
    assert multiset(rows) == {
        (1, None): 1,
        (2, None): 2,
        (3, None): 1,
        (None, None): 2,
        (None, 1.5): 1,
        (None, 2.5): 1,
    }


def test_join_using_merges_columns(world: SqlWorld) -> None:
    planned = world.plan("SELECT * FROM t FULL JOIN u USING (a)")
    assert [c.name for c in planned.columns] == ["a", "b", "c", "d", "x"]
    rows = multiset(finish(planned, world.evaluate(planned)))
    assert rows[(5, None, None, None, None)] == 1
    assert rows[(1, "x", D("1.50"), datetime.date(2020, 1, 1), 2.5)] == 1


def test_literals_take_their_type_from_context(world: SqlWorld) -> None:
    assert world.rows("SELECT a FROM t WHERE d > '2020-06-01'") == [(None,)]
    assert world.rows("SELECT a FROM t WHERE c = '1.5'") == [(1,)]
    error = sql_error(world, "SELECT a FROM t WHERE d > 'soon'")
    assert error.code == "22007"


def test_casts_round_like_postgres(world: SqlWorld) -> None:
    rows = multiset(world.rows("SELECT c::bigint, c::numeric(5,1) FROM t WHERE c IS NOT NULL"))
    assert rows == {(2, D("1.5")): 1, (-3, D("-3.3")): 1, (0, D("0.0")): 1}
    assert world.rows("SELECT 2.5::bigint, (-2.5)::bigint, '7'::bigint + 1, true::bigint") == [
        (3, -3, 8, 1)
    ]


def test_case_coalesce_and_strings(world: SqlWorld) -> None:
    rows = world.rows(
        "SELECT CASE WHEN a > 1 THEN 'big' WHEN a = 1 THEN 'one' END, coalesce(b, '-') || '!', "
        "concat(b, a), upper(b), length(b), substring(b from 1 for 1) FROM t WHERE a IS NOT NULL"
    )
    assert multiset(rows) == {
        ("one", "x!", "x1", "X", 1, "x"): 1,
        ("big", "-!", "2", None, None, None): 2,
        ("big", "x!", "x3", "X", 1, "x"): 1,
    }


def test_scalar_and_exists_subqueries(world: SqlWorld) -> None:
    rows = world.rows(
        "SELECT a, (SELECT max(x) FROM u), EXISTS (SELECT 1 FROM u WHERE x > 2) FROM t"
    )
    assert {row[1:] for row in rows} == {(2.5, True)}
    assert world.rows("SELECT (SELECT x FROM u WHERE a = 5 LIMIT 1)") == [(None,)]


def test_order_by_limit_offset_go_to_finishing(world: SqlWorld) -> None:
    planned = world.plan("SELECT b FROM t ORDER BY a DESC NULLS LAST, b LIMIT 3 OFFSET 1")
    assert planned.finishing.limit == 3 and planned.finishing.offset == 1
    assert planned.finishing.project == (0,)
    assert len(planned.plan.output_schema.columns) == 2  # b, then the hidden sort key a
    assert finish(planned, world.evaluate(planned)) == [(None,), (None,), ("x",)]
    assert "TopK" not in explain_query(planned)


def test_order_by_inside_subquery_becomes_top_k(world: SqlWorld) -> None:
    planned = world.plan("SELECT count(*) FROM (SELECT a FROM t ORDER BY a LIMIT 2) s")
    assert "TopK" in explain_query(planned)
    assert finish(planned, world.evaluate(planned)) == [(2,)]


# Errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "code", "fragment"),
    [
        ("SELECT ntile(2) OVER () FROM t", "0A000", "ntile"),
        ("SELECT a, b FROM t GROUP BY a", "42803", "b"),
        ("SELECT a FROM t WHERE count(*) > 1", "42803", "count"),
        ("SELECT a + b FROM t", "42883", "a + b"),
        ("SELECT a FROM t WHERE b", "42804", "b"),
        ("SELECT 'abc'::bigint", "22P02", "'abc'"),
        ("SELECT now()", "0A000", "now"),
        ("SELECT CAST(d AS timestamp) - CAST(d AS timestamp) FROM t", "0A000", "d AS timestamp) -"),
        ("SELECT (SELECT a FROM u)", "0A000", "a FROM u"),
        ("SELECT DISTINCT a FROM t ORDER BY b", "42P10", "b"),
        ("SELECT a FROM t UNION SELECT a, x FROM u", "42601", "a FROM t"),
        ("SELECT b LIKE '%\\_' FROM t", "0A000", "'%"),
        ("SELECT x::text FROM u", "0A000", "x::text"),
        ("WITH RECURSIVE r AS (SELECT 1) SELECT * FROM r", "0A000", "r AS"),
        ("SELECT a FROM t LIMIT a", "0A000", "a"),
    ],
)
def test_planning_errors(world: SqlWorld, sql: str, code: str, fragment: str) -> None:
    error = sql_error(world, sql)
    assert error.code == code, error
    # Single letters name the last such column in the statement.
    expected = sql.rindex(fragment) + 1 if len(fragment) == 1 else sql.index(fragment) + 1
    assert error.position == expected, (error, expected)


# DML --------------------------------------------------------------------------------------


def _statement(sql: str) -> Any:
    (statement,) = parse(sql)
    return statement


def test_insert_values_are_folded_to_typed_rows(world: SqlWorld) -> None:
    statement = _statement(
        "INSERT INTO t (d, a, c) VALUES ('2024-02-29', 1, 2.345), (NULL, -4, '7'), (DEFAULT, 3, 1)"
    )
    assert isinstance(statement, Insert)
    plan = plan_insert(statement, world.catalog, {})
    assert plan.query is None
    assert plan.rows == (
        (1, None, D("2.35"), datetime.date(2024, 2, 29)),
        (-4, None, D("7.00"), None),
        (3, None, D("1.00"), None),
    )


def test_insert_with_expressions_and_select_is_a_plan(world: SqlWorld) -> None:
    plan = plan_insert(_statement("INSERT INTO u VALUES (1 + 1, NULL)"), world.catalog, {})
    assert plan.rows is None and plan.query is not None
    assert world.evaluate(plan.query) == {(2, None): 1}
    plan = plan_insert(
        _statement("INSERT INTO u SELECT a, c FROM t WHERE a > 1"), world.catalog, {}
    )
    assert plan.query is not None
    assert [c.sql_type for c in plan.query.columns] == ["bigint", "double precision"]
    assert world.evaluate(plan.query) == {(2, None): 2, (3, 0.0): 1}


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("INSERT INTO t (a) VALUES ('x')", "22P02"),
        ("INSERT INTO t (a) VALUES (1, 2)", "42601"),
        ("INSERT INTO t (a, b) VALUES (1)", "42601"),
        ("INSERT INTO t (zz) VALUES (1)", "42703"),
        ("INSERT INTO t (a, a) VALUES (1, 1)", "42701"),
        ("INSERT INTO u (x) VALUES (1.5)", "23502"),
        ("INSERT INTO u VALUES (NULL, 1)", "23502"),
        ("INSERT INTO t (d) SELECT b FROM t", "42804"),
        ("INSERT INTO t (c) VALUES (123456789.5)", "22003"),
    ],
)
def test_insert_errors(world: SqlWorld, sql: str, code: str) -> None:
    with pytest.raises(SqlError) as caught:
        plan_insert(_statement(sql), world.catalog, {})
    assert caught.value.code == code, caught.value


def test_writes_to_views_are_rejected(world: SqlWorld) -> None:
    world.add_view("v", "SELECT a FROM t")
    with pytest.raises(SqlError) as caught:
        plan_insert(_statement("INSERT INTO v VALUES (1)"), world.catalog, {})
    assert caught.value.code == "42809"


def test_update_retracts_old_rows_and_inserts_new_ones(world: SqlWorld) -> None:
    statement = _statement("UPDATE t SET b = upper(coalesce(b, 'n')), c = c + 1 WHERE a >= 2")
    assert isinstance(statement, Update)
    plan = plan_update(statement, world.catalog, {})
    assert plan.insert is not None
    assert world.evaluate(plan.retract) == {
        (2, None, None, None): 2,
        (3, "x", D("0.00"), None): 1,
    }
    assert world.evaluate(plan.insert) == {(2, "N", None, None): 2, (3, "X", D("1.00"), None): 1}
    assert plan.depends_on == {world.ids["t"]}


def test_update_and_delete_with_subqueries(world: SqlWorld) -> None:
    statement = _statement("DELETE FROM t WHERE a IN (SELECT a FROM u)")
    assert isinstance(statement, Delete)
    plan = plan_delete(statement, world.catalog, {})
    assert plan.insert is None
    assert world.evaluate(plan.retract) == {(1, "x", D("1.50"), datetime.date(2020, 1, 1)): 1}
    assert plan.depends_on == {world.ids["t"], world.ids["u"]}
    statement = _statement("UPDATE u AS q SET x = (SELECT max(c) FROM t) WHERE q.a = 5")
    plan = plan_update(statement, world.catalog, {})
    assert plan.insert is not None
    assert world.evaluate(plan.insert) == {(5, 1.5): 1}


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("UPDATE t SET zz = 1", "42703"),
        ("UPDATE t SET a = 1, a = 2", "42601"),
        ("UPDATE u SET a = NULL", "23502"),
        ("UPDATE t SET d = a", "42804"),
        ("DELETE FROM nope", "42P01"),
    ],
)
def test_change_errors(world: SqlWorld, sql: str, code: str) -> None:
    statement = _statement(sql)
    with pytest.raises(SqlError) as caught:
        if isinstance(statement, Update):
            plan_update(statement, world.catalog, {})
        else:
            plan_delete(statement, world.catalog, {})
    assert caught.value.code == code


# Types ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "kind", "rendered"),
    [
        ("bigint", ColumnType.INT64, "bigint"),
        ("int", ColumnType.INT64, "bigint"),
        ("smallint", ColumnType.INT64, "bigint"),
        ("double precision", ColumnType.FLOAT64, "double precision"),
        ("real", ColumnType.FLOAT64, "double precision"),
        ("float", ColumnType.FLOAT64, "double precision"),
        ("numeric(12,3)", ColumnType.DECIMAL, "numeric(12,3)"),
        ("decimal(5)", ColumnType.DECIMAL, "numeric(5,0)"),
        ("numeric", ColumnType.DECIMAL, "numeric(38,10)"),
        ("varchar(20)", ColumnType.TEXT, "text"),
        ("char(3)", ColumnType.TEXT, "text"),
        ("text", ColumnType.TEXT, "text"),
        ("boolean", ColumnType.BOOL, "boolean"),
        ("bytea", ColumnType.BYTES, "bytea"),
        ("date", ColumnType.DATE, "date"),
        ("timestamp", ColumnType.TIMESTAMP, "timestamp"),
        ("jsonb", ColumnType.JSON, "jsonb"),
        ("json", ColumnType.JSON, "jsonb"),
    ],
)
def test_sql_type_names(written: str, kind: ColumnType, rendered: str) -> None:
    parsed = parse_type_name(written)
    assert parsed.type.kind is kind
    assert type_name(parsed.type) == rendered
    assert type_name(parse_type_name(rendered).type) == rendered


@pytest.mark.parametrize("written", ["interval", "timestamptz", "uuid", "int[]", "numeric(40,2)"])
def test_unsupported_types(written: str) -> None:
    with pytest.raises(SqlError) as caught:
        parse_type_name(written)
    assert caught.value.code in ("0A000", "22023")


def test_type_name_of_columns() -> None:
    assert type_name(Column("p", ColumnType.DECIMAL, True, 0, 0)) == "numeric(38,0)"
    assert type_name(ScalarType(ColumnType.JSON)) == "jsonb"


# DDL helpers and EXPLAIN ------------------------------------------------------------------


def test_relation_schema_from_column_definitions() -> None:
    statement = _statement(
        "CREATE TABLE x (id bigint NOT NULL, price numeric(8,2), tag varchar(4))"
    )
    schema = relation_schema(statement.columns)
    assert schema == RelationSchema(
        [
            Column("id", ColumnType.INT64, nullable=False),
            Column("price", ColumnType.DECIMAL, True, 8, 2),
            Column("tag", ColumnType.TEXT),
        ]
    )
    for sql, code in (
        ("CREATE TABLE x (a int, a text)", "42701"),
        ("CREATE TABLE x (time timestamp)", "42939"),
    ):
        with pytest.raises(SqlError) as caught:
            relation_schema(_statement(sql).columns)
        assert caught.value.code == code
        assert caught.value.position == sql.index("a text" if code == "42701" else "time ") + 1


def test_relation_plan_and_index_keys(world: SqlWorld) -> None:
    world.add_view("v", "SELECT b, a FROM t WHERE a > 1")
    table = world.catalog.resolve(("t",), {})
    view = world.catalog.resolve(("v",), {})
    assert relation_plan(table.item).root.get.collection_id == world.ids["t"]
    assert relation_plan(view.item) == view.plan
    assert evaluate(relation_plan(view.item), world.data) == {(None, 2): 2, ("x", 3): 1}
    assert key_positions(view, ["a"]) == [1]
    with pytest.raises(SqlError) as caught:
        key_positions(view, ["c"], position=9)
    assert (caught.value.code, caught.value.position) == ("42703", 9)
    assert caught.value.message == 'column "c" does not exist in tidemark.public.v'
    assert [i.id for i in world.catalog.indexes_on(view.id)] == []


def test_explain_shows_the_plan_and_the_finishing(world: SqlWorld) -> None:
    text = explain_query(world.plan("SELECT b FROM t WHERE a > 1 ORDER BY a LIMIT 2"))
    lines = text.splitlines()
    assert lines[0] == "Finish order_by=[#1 nulls last] limit=2 project=[#0]"
    assert any(line.strip().startswith("Filter gt(#0, 1)") for line in lines)
    assert lines[-1].strip().startswith(f"Get {world.ids['t']}")


def test_select_star_with_group_by_and_aggregate_ordering(world: SqlWorld) -> None:
    rows = world.rows("SELECT * FROM u GROUP BY a, x ORDER BY count(*) DESC, a, x")
    assert rows == [(1, 1.5), (1, 2.5), (5, None)]
    rows = world.rows("SELECT a, count(*) AS n FROM t GROUP BY a ORDER BY n DESC, a LIMIT 1")
    assert rows == [(2, 2)]


def test_subquery_keys_in_group_by(world: SqlWorld) -> None:
    sql = (
        "SELECT CASE WHEN a > (SELECT min(a) FROM u) THEN 'up' ELSE 'down' END AS side, "
        "count(*) FROM t GROUP BY CASE WHEN a > (SELECT min(a) FROM u) THEN 'up' ELSE 'down' END"
    )
    assert multiset(world.rows(sql)) == {("up", 3): 1, ("down", 2): 1}


def test_errors_without_a_place_point_at_the_statement(world: SqlWorld) -> None:
    sql = "SELECT 1; SELECT current_date"
    statement = parse(sql)[1]
    with pytest.raises(SqlError) as caught:
        plan_query(statement.query, world.catalog, {})
    assert (caught.value.code, caught.value.position) == ("0A000", sql.rindex("SELECT") + 1)


def test_plan_query_without_finishing_keeps_limits_in_the_plan(world: SqlWorld) -> None:
    (statement,) = parse("SELECT a FROM t ORDER BY a LIMIT 1")
    planned = plan_query(statement.query, world.catalog, {}, finishing=False)
    assert planned.finishing.is_trivial
    assert world.evaluate(planned) == {(1,): 1}


def test_catalog_view_lists_items_for_show(world: SqlWorld) -> None:
    world.add_view("v", "SELECT a FROM t")
    catalog = world.catalog
    names = [i.name.item for i in catalog.objects_in("tidemark", "public", ["table"])]
    assert names == ["t", "u"]
    assert [i.name.item for i in catalog.objects_in("tidemark", "public", ["view"])] == ["v"]
    assert [i.name.schema for i in catalog.schemas("tidemark")] == ["public"]
    assert [i.name.item for i in catalog.clusters()] == ["default"]
    assert [i.name.item for i in catalog.dependents(world.ids["t"])] == ["v"]
    assert catalog.schema_of(("public",), {}) == ("tidemark", "public")
    with pytest.raises(SqlError) as caught:
        catalog.schema_of(("nope",), {}, position=4)
    assert (caught.value.code, caught.value.position) == ("3F000", 4)
    with pytest.raises(SqlError) as caught:
        catalog.resolve_cluster("big")
    assert caught.value.code == "42704"
