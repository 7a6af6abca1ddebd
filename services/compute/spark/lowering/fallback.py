"""Python UDFs that run the project's own scalar code where Spark's semantics differ.

Each fallback evaluates one function call (or one cast) over argument values Spark has
already computed: the call is rebuilt over argument columns ``0..k-1`` and compiled once per
worker by ``services.compute.dataflow.scalar.compile_scalar``, the in-process engine's
compiler, so the Spark lowering and the resident engine share one definition of the function.
Plain (pickled) Python UDFs, not Arrow ones: pickling carries dates and timestamps in years
1..9999 and decimals at full precision, where pandas would not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from services.compute.spark.lowering.types import spark_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2


def from_spark(value: Any) -> Any:
    """A value as Spark hands it to Python, in the engine's form (BYTES arrive as
    bytearray; every NaN becomes the engine's one NaN object)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, float):
        from services.compute.dataflow.ordering import canonical_float

        return canonical_float(value)
    return value


def _evaluator(
    expr_bytes: bytes, arg_types: Sequence[ScalarType]
) -> Callable[[tuple[Any, ...]], Any]:
    from services.compute.dataflow.scalar import compile_scalar

    expr = plan_pb2.Scalar.FromString(expr_bytes)
    return compile_scalar(expr, arg_types, "spark fallback").evaluate


def scalar_udf(
    expr: plan_pb2.Scalar, arg_types: Sequence[ScalarType], out: ScalarType, args: Sequence[Column]
) -> Column:
    """``expr`` (whose column references are ``0..len(args)-1``) evaluated by the engine's
    compiler on ``args``."""
    expr_bytes = expr.SerializeToString()
    types = list(arg_types)
    compiled: list[Callable[[tuple[Any, ...]], Any]] = []

    def evaluate(*values: Any) -> Any:
        if not compiled:
            compiled.append(_evaluator(expr_bytes, types))
        return compiled[0](tuple(from_spark(v) for v in values))

    function = F.udf(evaluate, spark_type(out), useArrow=False)
    if not args:  # a UDF needs a column to run per row
        return function(F.lit(None))
    return function(*args)


def call_over_arguments(call: plan_pb2.Call | plan_pb2.Cast, arity: int) -> plan_pb2.Scalar:
    """The call (or cast) rebuilt over input columns ``0..arity-1``."""
    columns = [plan_pb2.Scalar(column=i) for i in range(arity)]
    if isinstance(call, plan_pb2.Cast):
        return plan_pb2.Scalar(cast=plan_pb2.Cast(input=columns[0], to=call.to))
    return plan_pb2.Scalar(call=plan_pb2.Call(function=call.function, args=columns))
