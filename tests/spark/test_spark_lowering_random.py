"""Random plans over random inputs through the Spark lowering (``lower``) equal the reference
evaluator's answer, multiset for multiset."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from tests.support import random_plans, reference_eval, spark_lowering
from tidemark.columnar import RelationSchema
from tidemark.plan.walk import relations
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark


@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(scenario=random_plans.scenarios(), at=st.integers(0, 5))
def test_random_plans_through_spark_equal_the_reference(
    spark: SparkSession, scenario: random_plans.Scenario, at: int
) -> None:
    inputs = random_plans.inputs_at(scenario.history, min(at, scenario.history.max_time))
    try:
        expected = reference_eval.evaluate(scenario.plan, inputs)
    except reference_eval.UndefinedResult:
        assume(False)
        raise
    event("empty answer" if not expected else "non-empty answer")
    for kind in {node.WhichOneof("kind") for node in relations(scenario.plan.root)}:
        event(f"node {kind}")
    got = spark_lowering.run(spark, scenario.plan, scenario.schemas, inputs)
    assert got == expected


@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    data=random_plans.input_schemas().flatmap(
        lambda schemas: st.tuples(
            st.just(schemas),
            random_plans.expression_plans(schemas),
            random_plans.histories(schemas, 1),
        )
    )
)
def test_random_expressions_and_aggregates_through_spark_equal_the_reference(
    spark: SparkSession,
    data: tuple[dict[str, RelationSchema], plan_pb2.Plan, random_plans.History],
) -> None:
    schemas, plan, history = data
    inputs = random_plans.inputs_at(history, 1)
    expected = reference_eval.evaluate(plan, inputs)
    event("empty answer" if not expected else "non-empty answer")
    assert spark_lowering.run(spark, plan, schemas, inputs) == expected
