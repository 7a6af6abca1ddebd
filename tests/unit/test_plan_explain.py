"""EXPLAIN text and the plan builders."""

from __future__ import annotations

import datetime
from decimal import Decimal

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import explain, scalar_text
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType
ORDERS = RelationSchema(
    [Column("id", T.INT64, False), Column("cust", T.TEXT), Column("amount", T.DECIMAL, True, 10, 2)]
)
CUSTOMERS = RelationSchema.of(("cust", T.TEXT), ("region", T.TEXT))


def test_explain_renders_every_node_indented() -> None:
    orders = pb.get("u1", ORDERS)
    big = pb.filter(orders, pb.call("gt", 2, pb.literal(Decimal("100.00"), T.DECIMAL)))
    joined = pb.join(big, pb.get("u2", CUSTOMERS), [1], [0], "left_outer")
    per_region = pb.reduce(
        joined, [4], [pb.aggregate("count"), pb.aggregate("sum", 2, distinct=True)]
    )
    body = pb.union(pb.local_get(0), pb.negate(pb.threshold(pb.distinct(pb.local_get(0)))))
    root = pb.top_k(
        pb.project(pb.map(pb.let(0, per_region, body), pb.call("concat", 0, 0)), 0, 3),
        [],
        [pb.sort_key(1, descending=True), pb.sort_key(0, nulls_flipped=True)],
        limit=5,
        offset=1,
    )
    rows = pb.constant(CUSTOMERS, [("a", None), (("b", "x'y"), 2)])
    plan = pb.plan(
        pb.union(pb.project(root, 0), pb.project(rows, 0)), RelationSchema.of(("r", T.TEXT))
    )
    assert explain(plan) == "\n".join(
        [
            "Output (r text)",
            "  Union",
            "    Project #0",
            "      TopK group=[] order=[#1 desc, #0 nulls first] limit=5 offset=1",
            "        Project #0, #3",
            "          Map concat(#0, #0)",
            "            Let l0",
            "              value:",
            "                Reduce group=[#4] aggregates=[count(*), sum(distinct #2)]",
            "                  Join left_outer on #1 = #0",
            "                    left:",
            "                      Filter gt(#2, 100.00)",
            "                        Get u1 (id int64 not null, cust text, amount decimal(10,2))",
            "                    right:",
            "                      Get u2 (cust text, region text)",
            "              body:",
            "                Union",
            "                  LocalGet l0",
            "                  Negate",
            "                    Threshold",
            "                      Distinct",
            "                        LocalGet l0",
            "    Project #0",
            "      Constant (cust text, region text) 2 rows",
            "        ('a', null::text)",
            "        ('b', 'x''y') x2",
        ]
    )


def test_explain_of_a_bare_relation_and_a_cross_join() -> None:
    one = pb.get("u2", CUSTOMERS)
    assert explain(pb.join(one, one)) == "\n".join(
        [
            "Join inner (cross product)",
            "  left:",
            "    Get u2 (cust text, region text)",
            "  right:",
            "    Get u2 (cust text, region text)",
        ]
    )
    many = pb.constant(RelationSchema.of(("n", T.INT64)), [(i,) for i in range(7)])
    assert explain(many).splitlines()[-1] == "  ... 2 more"
    assert explain(plan_pb2.Relation()) == "<empty relation>"


def test_scalar_text() -> None:
    expr = pb.case(
        pb.call("is_null", 0),
        pb.cast(pb.literal(1.5, T.FLOAT64), ScalarType.decimal(5, 1)),
        pb.literal(None, T.DECIMAL),
    )
    assert (
        scalar_text(expr)
        == "case when is_null(#0) then cast(1.5 as decimal(5,1)) else null::decimal end"
    )
    assert scalar_text(pb.literal(b"\x01", T.BYTES)) == "'\\x01'"
    assert scalar_text(pb.literal(datetime.date(2020, 1, 2), T.DATE)) == "date '2020-01-02'"
    stamp = pb.literal(datetime.datetime(2020, 1, 2, 3, 4), T.TIMESTAMP)
    assert scalar_text(stamp) == "timestamp '2020-01-02 03:04:00'"
    assert scalar_text(pb.literal("[1]", T.JSON)) == "json '[1]'"
    assert scalar_text(pb.literal(True, T.BOOL)) == "true"
    assert scalar_text(plan_pb2.Scalar()) == "<empty scalar>"


# Builders ---------------------------------------------------------------------------------


def test_builders_fill_the_messages() -> None:
    join = pb.join(pb.local_get(1), pb.local_get(2), [0, pb.call("lower", 1)], [2, 3], "full_outer")
    assert join.join.kind == plan_pb2.Join.KIND_FULL_OUTER
    assert [k.column for k in join.join.right_keys] == [2, 3]
    assert join.join.left_keys[1].call.function == "lower"
    count_star = pb.aggregate("count")
    assert not count_star.HasField("expression")
    avg = pb.aggregate("avg", 2, distinct=True)
    assert (avg.func, avg.expression.column, avg.distinct) == (plan_pb2.Aggregate.FUNC_AVG, 2, True)
    top = pb.top_k(pb.local_get(1), [0], [2, pb.sort_key(1, descending=True)])
    assert not top.top_k.HasField("limit")
    assert [(k.column, k.descending) for k in top.top_k.order] == [(2, False), (1, True)]
    assert pb.top_k(pb.local_get(1), limit=0).top_k.HasField("limit")
    assert not pb.get("u1").get.schema.columns


def test_literal_with_a_decimal_type_is_cast_to_it() -> None:
    exact = pb.literal(Decimal("1.50"), Column("d", T.DECIMAL, True, 3, 2))
    assert exact.WhichOneof("kind") == "literal"
    wider = pb.literal(Decimal("1.5"), ScalarType.decimal(10, 2))
    assert wider.WhichOneof("kind") == "cast"
    assert wider.cast.input.literal.decimal_value == "1.50"
    assert (wider.cast.to.precision, wider.cast.to.scale) == (10, 2)


def test_constant_takes_rows_with_or_without_diffs() -> None:
    schema = RelationSchema.of(("a", T.INT64), ("b", T.TEXT))
    constant = pb.constant(schema, [(1, "x"), ((2, "y"), -3), [3, None]]).constant
    assert [row.diff for row in constant.rows] == [1, -3, 1]
    assert constant.rows[1].values[1].text_value == "y"
    assert constant.rows[2].values[1].WhichOneof("value") is None


def test_explain_renders_window_functions_and_frames() -> None:
    schema = RelationSchema([Column("a", ColumnType.INT64), Column("b", ColumnType.TEXT)])
    window = pb.window(
        pb.get("u1", schema),
        [1],
        [pb.sort_key(0, descending=True, nulls_flipped=True)],
        [
            pb.window_function("row_number"),
            pb.window_function("lag", 0, offset=2, default=pb.literal(0, ColumnType.INT64)),
            pb.window_function("count"),
            pb.window_function(
                "sum", 0, frame=pb.frame("rows", ("preceding", 3), "unbounded_following")
            ),
            pb.window_function(
                "last_value", 1, frame=pb.frame("range", "current_row", "current_row")
            ),
        ],
    )
    assert explain(window) == (
        "Window partition=[#1] order=[#0 desc nulls last] functions=[row_number(), "
        "lag(#0, 2, 0), count(*), sum(#0) rows between 3 preceding and unbounded following, "
        "last_value(#1) range between current row and current row]\n"
        "  Get u1 (a int64, b text)"
    )
