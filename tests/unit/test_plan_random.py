"""The random plan and history generators: well-typed plans the reference evaluator runs,
outputs that fit the derived schema, valid histories, and coverage of the whole IR."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.random_plans import (
    History,
    Scenario,
    batches,
    children,
    histories,
    input_schemas,
    inputs_at,
    plans,
    scenarios,
    versions,
)
from tests.support.reference_eval import evaluate
from tidemark.columnar import RelationSchema
from tidemark.plan import DETERMINISTIC, check_plan, derive_schema, to_datum
from tidemark.v1 import plan_pb2


def relations(relation: plan_pb2.Relation) -> Iterator[plan_pb2.Relation]:
    yield relation
    for child in children(relation):
        yield from relations(child)


def scalars(expr: plan_pb2.Scalar) -> Iterator[plan_pb2.Scalar]:
    yield expr
    kind = expr.WhichOneof("kind")
    if kind == "call":
        for arg in expr.call.args:
            yield from scalars(arg)
    elif kind == "case":
        for part in (expr.case.cond, expr.case.then, expr.case.otherwise):
            yield from scalars(part)
    elif kind == "cast":
        yield from scalars(expr.cast.input)


def features(plan: plan_pb2.Plan) -> set[str]:
    """Names of the node kinds, join kinds, aggregates and functions a plan uses."""
    found: set[str] = set()
    for relation in relations(plan.root):
        kind = relation.WhichOneof("kind")
        assert kind is not None
        found.add(kind)
        node = getattr(relation, kind)
        exprs: list[plan_pb2.Scalar] = []
        if kind == "filter":
            exprs += node.predicates
        elif kind == "map":
            exprs += node.expressions
        elif kind == "join":
            found.add(f"join:{plan_pb2.Join.Kind.Name(node.kind)}")
            exprs += [*node.left_keys, *node.right_keys]
        elif kind == "reduce":
            for aggregate in node.aggregates:
                name = plan_pb2.Aggregate.Func.Name(aggregate.func)
                found.add(f"aggregate:{name}{':distinct' if aggregate.distinct else ''}")
                if aggregate.HasField("expression"):
                    exprs.append(aggregate.expression)
        elif kind == "window":
            for function in node.functions:
                found.add(f"window:{plan_pb2.WindowFunction.Kind.Name(function.kind)}")
                if function.HasField("frame"):
                    frame = function.frame
                    found.add(f"frame:{plan_pb2.WindowFrame.Mode.Name(frame.mode)}")
                    for bound in (frame.start, frame.end):
                        found.add(f"bound:{plan_pb2.WindowFrameBound.Kind.Name(bound.kind)}")
                if function.HasField("default"):
                    found.add("window:default")
                exprs += [
                    getattr(function, f) for f in ("argument", "default") if function.HasField(f)
                ]
        for expr in exprs:
            for part in scalars(expr):
                part_kind = part.WhichOneof("kind")
                found.add(f"scalar:{part_kind}")
                if part_kind == "call":
                    found.add(f"function:{part.call.function}")
    return found


def assert_fits(schema: RelationSchema, output: dict[tuple[Any, ...], int]) -> None:
    """Every output row has the schema's width, and every value the column's Python type,
    range and nullability (``to_datum`` checks all but the last)."""
    for row, count in output.items():
        assert count != 0
        assert len(row) == len(schema.columns)
        for value, column in zip(row, schema.columns, strict=True):
            if value is None:
                assert column.nullable, f"NULL in NOT NULL column {column.name}: {row}"
            else:
                to_datum(value, column)


@given(scenarios())
def test_random_plans_validate_and_evaluate_within_their_schema(scenario: Scenario) -> None:
    plan = scenario.plan
    schema = check_plan(plan)
    assert schema == derive_schema(plan.root)
    reparsed = plan_pb2.Plan.FromString(plan.SerializeToString())
    for time in range(scenario.history.max_time + 1):
        inputs = inputs_at(scenario.history, time)
        output = evaluate(plan, inputs)
        assert_fits(schema, output)
        assert evaluate(reparsed, inputs) == output


@given(input_schemas().flatmap(lambda schemas: st.tuples(st.just(schemas), histories(schemas))))
def test_histories_are_valid(drawn: tuple[dict[str, RelationSchema], History]) -> None:
    schemas, history = drawn
    assert set(history.updates) == set(schemas)
    for name, updates in history.updates.items():
        for row, time, diff in updates:
            assert 0 <= time <= history.max_time
            assert diff != 0
            for value, column in zip(row, schemas[name].columns, strict=True):
                assert value is not None or column.nullable
                to_datum(value, column)
    for time in range(history.max_time + 1):
        for version in inputs_at(history, time).values():
            assert all(count > 0 for count in version.values())
    # The batches partition the updates in time order.
    uppers = history.batch_uppers
    assert uppers == sorted(set(uppers)) and uppers[-1] == history.max_time + 1
    seen: dict[str, list[Any]] = {name: [] for name in history.updates}
    for lower, upper, chosen in batches(history):
        assert lower < upper
        for name, updates in chosen.items():
            assert all(lower <= time < upper for _, time, _ in updates)
            seen[name] += updates
    assert {name: sorted(u, key=repr) for name, u in seen.items()} == {
        name: sorted(u, key=repr) for name, u in history.updates.items()
    }


def test_inputs_at_sums_updates_up_to_the_time() -> None:
    history = History(
        {"u1": [((1,), 0, 2), ((2,), 1, 1), ((1,), 2, -2), ((2,), 2, 1), ((3,), 2, 1)]},
        max_time=2,
        batch_uppers=[1, 3],
    )
    assert inputs_at(history, 0) == {"u1": {(1,): 2}}
    assert inputs_at(history, 1) == {"u1": {(1,): 2, (2,): 1}}
    assert inputs_at(history, 2) == {"u1": {(2,): 2, (3,): 1}}
    assert [(lo, up, len(b["u1"])) for lo, up, b in batches(history)] == [(0, 1, 1), (1, 3, 4)]
    assert list(versions(history)) == [(t, inputs_at(history, t)) for t in range(3)]


EVERYTHING = (
    {
        "get",
        "constant",
        "filter",
        "map",
        "project",
        "union",
        "negate",
        "join",
        "reduce",
        "distinct",
        "top_k",
        "window",
        "window:default",
        "threshold",
        "let",
        "local_get",
        "scalar:column",
        "scalar:literal",
        "scalar:call",
        "scalar:case",
        "scalar:cast",
    }
    | {f"join:{name}" for name in plan_pb2.Join.Kind.keys()}
    | {f"aggregate:{name}" for name in plan_pb2.Aggregate.Func.keys()}
    | {f"aggregate:{name}:distinct" for name in plan_pb2.Aggregate.Func.keys()}
    | {f"function:{name}" for name in DETERMINISTIC}
    | {f"window:{name}" for name in plan_pb2.WindowFunction.Kind.keys()}
    | {f"frame:{name}" for name in plan_pb2.WindowFrame.Mode.keys()}
    | {f"bound:{name}" for name in plan_pb2.WindowFrameBound.Kind.keys()}
)


def test_generator_covers_every_node_aggregate_and_function() -> None:
    seen: set[str] = set()
    nested = [False]

    # Plans only (no histories), which are cheap enough for many examples: each feature
    # shows up in 20 or more of these 1000 plans, so the check is not a matter of luck.
    @settings(
        max_examples=1000,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(input_schemas().flatmap(plans))
    def collect(plan: plan_pb2.Plan) -> None:
        seen.update(features(plan))
        # Operators nest: a stateful node somewhere below another stateful node.
        for relation in relations(plan.root):
            if relation.WhichOneof("kind") in ("join", "reduce", "top_k", "window"):
                below = [r.WhichOneof("kind") for c in children(relation) for r in relations(c)]
                nested[0] |= any(
                    k in ("join", "reduce", "top_k", "window", "distinct") for k in below
                )

    collect()
    assert EVERYTHING - seen == set()
    assert nested[0]
