"""The Python side of the plan IR (``tidemark/v1/plan.proto``): builders, Datum conversion,
type derivation and validation, the function registry, and EXPLAIN text.

Evaluation is deliberately absent: the compute engine and the test suite's reference evaluator
implement the semantics separately, so each checks the other.
"""

from tidemark.plan.datum import datum_type, from_datum, to_datum
from tidemark.plan.derive import aggregate_type, check_plan, derive_schema, scalar_type
from tidemark.plan.explain import explain, scalar_text
from tidemark.plan.functions import (
    DETERMINISTIC,
    FUNCTIONS,
    NONDETERMINISTIC,
    FunctionSpec,
    cast_can_fail,
    cast_type,
    lookup,
    result_type,
)
from tidemark.plan.scalar_types import ScalarType, unify

__all__ = [
    "DETERMINISTIC",
    "FUNCTIONS",
    "NONDETERMINISTIC",
    "FunctionSpec",
    "ScalarType",
    "aggregate_type",
    "cast_can_fail",
    "cast_type",
    "check_plan",
    "datum_type",
    "derive_schema",
    "explain",
    "from_datum",
    "lookup",
    "result_type",
    "scalar_text",
    "scalar_type",
    "to_datum",
    "unify",
]
