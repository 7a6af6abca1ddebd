"""The optimizer: each rule, and the whole pipeline, keeps every plan's answer (random plans
evaluated by the reference evaluator before and after, at every time of a random history),
keeps the output schema valid, and rewrites the shapes it is for."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.random_plans import Scenario, scenarios, versions
from tests.support.reference_eval import UndefinedResult, evaluate
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import check_plan, explain
from tidemark.plan.optimize import Statistics, optimize
from tidemark.plan.optimize.fusion import fuse
from tidemark.plan.optimize.join_order import order_joins
from tidemark.plan.optimize.prune import prune_columns
from tidemark.plan.optimize.pushdown import push_predicates
from tidemark.plan.optimize.rewrite import Context, Rule
from tidemark.plan.optimize.share import share_subplans
from tidemark.plan.walk import relations
from tidemark.v1 import plan_pb2

RULES: dict[str, Rule] = {
    "fuse": fuse,
    "push_predicates": push_predicates,
    "order_joins": order_joins,
    "prune_columns": prune_columns,
    "share_subplans": share_subplans,
}


def _same_answers(scenario: Scenario, rewritten: plan_pb2.Plan) -> None:
    check_plan(rewritten, scenario.schemas)
    for at, inputs in versions(scenario.history):
        try:
            expected = evaluate(scenario.plan, inputs)
        except UndefinedResult:
            continue
        assert evaluate(rewritten, inputs) == expected, (at, explain(rewritten))


def _with_root(plan: plan_pb2.Plan, root: plan_pb2.Relation) -> plan_pb2.Plan:
    result = plan_pb2.Plan()
    result.CopyFrom(plan)
    result.root.CopyFrom(root)
    return result


@pytest.mark.parametrize("name", sorted(RULES))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=scenarios())
def test_each_rule_keeps_the_answers(name: str, scenario: Scenario) -> None:
    rewritten = RULES[name](scenario.plan.root, Context())
    _same_answers(scenario, _with_root(scenario.plan, rewritten))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=scenarios(max_depth=4))
def test_the_pipeline_keeps_the_answers(scenario: Scenario) -> None:
    _same_answers(scenario, optimize(scenario.plan).plan)


def _table(collection_id: str, *names: str) -> plan_pb2.Relation:
    return pb.get(collection_id, RelationSchema([Column(n, ColumnType.INT64) for n in names]))


def _schema(*names: str) -> RelationSchema:
    return RelationSchema([Column(n, ColumnType.INT64) for n in names])


def _joins(root: plan_pb2.Relation) -> list[plan_pb2.Join]:
    return [node.join for node in relations(root) if node.HasField("join")]


def test_equalities_over_a_cross_product_become_join_keys() -> None:
    a, b = _table("u1", "k", "x"), _table("u2", "k", "y")
    plan = pb.plan(pb.filter(pb.join(a, b), pb.call("eq", pb.column(0), pb.column(2))))
    optimized = optimize(plan).plan
    (join,) = _joins(optimized.root)
    assert len(join.left_keys) == 1
    assert "cross product" not in explain(optimized)


def test_a_comma_join_of_five_tables_is_ordered_without_cross_products() -> None:
    # customer(c_key, c_nation), orders(o_key, o_cust), lineitem(l_order, l_supp),
    # supplier(s_key, s_nation), nation(n_key, n_region) in FROM order, equalities in WHERE.
    tables = [
        _table("customer", "c_key", "c_nation"),
        _table("orders", "o_key", "o_cust"),
        _table("lineitem", "l_order", "l_supp"),
        _table("supplier", "s_key", "s_nation"),
        _table("nation", "n_key", "n_region"),
    ]
    product = tables[0]
    for table in tables[1:]:
        product = pb.join(product, table)
    eq = lambda a, b: pb.call("eq", pb.column(a), pb.column(b))  # noqa: E731
    where = [eq(0, 3), eq(4, 2), eq(5, 6), eq(1, 7), eq(7, 8)]
    plan = pb.plan(pb.filter(product, *where))
    stats = Statistics(
        {"customer": 1500, "orders": 15000, "lineitem": 60000, "supplier": 100, "nation": 25}
    )
    optimized = optimize(plan, stats).plan
    joins = _joins(optimized.root)
    assert len(joins) == 4
    assert all(join.left_keys for join in joins), explain(optimized)
    assert "cross product" not in explain(optimized)


def test_a_left_join_with_a_null_rejecting_predicate_becomes_inner() -> None:
    a, b = _table("u1", "k", "x"), _table("u2", "k", "y")
    joined = pb.join(a, b, [0], [0], kind="left_outer")
    plan = pb.plan(pb.filter(joined, pb.call("gt", pb.column(3), pb.literal(1, ColumnType.INT64))))
    optimized = optimize(plan).plan
    (join,) = _joins(optimized.root)
    assert join.kind == plan_pb2.Join.KIND_INNER
    assert join.right.HasField("filter") or join.right.HasField("project")


def test_an_in_subquery_predicate_narrows_the_outer_join_it_reads_through() -> None:
    """SQL's ``k IN (subquery)``: a left join to the subquery's distinct keys, a one-row
    count beside it, and a CASE that is TRUE only where the key matched. The CASE rejects
    the padded rows of the inner join, so that join becomes INNER."""
    facts, keys = _table("u1", "k", "x"), _table("u2", "k")
    matched = pb.join(facts, pb.distinct(keys), [0], [0], kind="left_outer")  # k, x, key
    counts = pb.reduce(keys, [], [pb.aggregate("count"), pb.aggregate("count", 0)])
    beside = pb.join(matched, counts, kind="left_outer")  # k, x, key, n, n_keys
    col, call = pb.column, pb.call
    false, null = pb.literal(False, ColumnType.BOOL), pb.literal(None, ColumnType.BOOL)
    unknown = pb.case(call("or", call("is_null", col(0)), call("lt", col(4), col(3))), null, false)
    predicate = pb.case(
        call("is_not_null", col(2)),
        pb.literal(True, ColumnType.BOOL),
        pb.case(call("is_null", col(3)), false, unknown),
    )
    plan = pb.plan(pb.project(pb.filter(beside, predicate), 0, 1))
    optimized = optimize(plan).plan
    kinds = sorted(join.kind for join in _joins(optimized.root))
    assert kinds == [plan_pb2.Join.KIND_INNER, plan_pb2.Join.KIND_LEFT_OUTER], explain(optimized)
    check_plan(optimized, {"u1": _schema("k", "x"), "u2": _schema("k")})


def test_a_fact_is_joined_to_its_filtered_dimension_first() -> None:
    """lineitem joins part (filtered) before partsupp, whose two key equalities with lineitem
    are one composite key, not two independent ones."""
    lineitem = _table("lineitem", "l_part", "l_supp")
    part = pb.filter(_table("part", "p_key", "p_name"), pb.call("gt", pb.column(1), 0))
    partsupp = _table("partsupp", "ps_part", "ps_supp")
    supplier = _table("supplier", "s_key")
    eq = lambda a, b: pb.call("eq", pb.column(a), pb.column(b))  # noqa: E731
    product = pb.join(pb.join(pb.join(lineitem, part), partsupp), supplier)
    plan = pb.plan(pb.filter(product, eq(0, 2), eq(0, 4), eq(1, 5), eq(1, 6)))
    stats = Statistics({"lineitem": 6_000_000, "part": 200_000, "partsupp": 800_000})
    stats = Statistics({**stats.rows, "supplier": 10_000})
    optimized = optimize(plan, stats).plan
    gets = [n.get.collection_id for n in relations(optimized.root) if n.HasField("get")]
    # Left-deep: the innermost join (listed last) is the first one made.
    first = [g for g in reversed(gets)][:2]
    assert sorted(first) == ["lineitem", "part"], explain(optimized)


def test_implied_equalities_join_a_fact_to_a_key_set_through_a_projection() -> None:
    """facts.k = orders.k under a projection, and orders.k = keys.k above it: the fact joins
    the (small) key set first, on the equality the two imply."""
    facts, orders = _table("facts", "k", "x"), _table("orders", "k", "c")
    keys = pb.distinct(pb.filter(_table("keys", "k"), pb.call("gt", pb.column(0), 0)))
    inner = pb.project(pb.join(facts, orders, [0], [0]), 1, 2, 3)  # x, orders.k, c
    plan = pb.plan(pb.join(inner, keys, [1], [0]))
    stats = Statistics({"facts": 6_000_000, "orders": 1_500_000, "keys": 1_500_000})
    optimized = optimize(plan, stats).plan
    gets = [n.get.collection_id for n in relations(optimized.root) if n.HasField("get")]
    assert sorted(gets[-2:]) == ["facts", "keys"], explain(optimized)
    check_plan(
        optimized, {"facts": _schema("k", "x"), "orders": _schema("k", "c"), "keys": _schema("k")}
    )


def test_a_subplan_used_twice_is_bound_once() -> None:
    a = _table("u1", "k", "x")
    grouped = pb.reduce(a, [0], [pb.aggregate("count")])
    plan = pb.plan(pb.union(grouped, grouped))
    optimized = optimize(plan).plan
    assert optimized.root.HasField("let")
    assert sum(node.HasField("reduce") for node in relations(optimized.root)) == 1


def test_a_false_filter_becomes_an_empty_constant() -> None:
    plan = pb.plan(pb.filter(_table("u1", "k"), pb.literal(False, ColumnType.BOOL)))
    optimized = optimize(plan).plan
    assert optimized.root.HasField("constant")
    assert not optimized.root.constant.rows


def test_a_twenty_way_chain_join_is_ordered_without_cross_products() -> None:
    tables = [_table(f"u{i}", "a", "b") for i in range(20)]
    product = tables[0]
    for table in tables[1:]:
        product = pb.join(product, table)
    where = [pb.call("eq", pb.column(2 * i + 1), pb.column(2 * i + 2)) for i in range(19)]
    plan = pb.plan(pb.filter(product, *where))
    optimized = optimize(plan).plan
    assert len(_joins(optimized.root)) == 19
    assert "cross product" not in explain(optimized)


def test_a_let_that_rebinds_an_outer_id_reads_the_outer_value() -> None:
    """``let 2 = u2 in let 2 = (l2 union {7}) in l2 join l2``: the inner value's LocalGet means the
    outer binding (a value cannot read its own Let). The optimizer's analyses once resolved
    it to the inner value itself, recursing without end."""
    schema = _schema("a")
    inner = pb.union(pb.local_get(2), pb.constant(schema, [[7]]))
    body = pb.join(pb.local_get(2), pb.local_get(2), [0], [0])
    plan = pb.plan(pb.let(2, _table("u2", "a"), pb.let(2, inner, body)))
    inputs = {"u2": {(1,): 1, (2,): 2}}
    expected = {(1, 1): 1, (2, 2): 4, (7, 7): 1}
    assert evaluate(plan, inputs) == expected
    optimized = optimize(plan, Statistics({"u2": 10})).plan
    assert evaluate(optimized, inputs) == expected
