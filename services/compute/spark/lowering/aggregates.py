"""Reduce's aggregates over a consolidated relation with multiplicities.

A row of multiplicity d counts d times, so each aggregate is written over (value, diff)
pairs: COUNT sums the diffs of non-NULL values, SUM sums value * diff exactly as a decimal
(the contract's SUM(INT64) is DECIMAL(38, 0); a row of diff 1 adds its value as it is), MIN
and MAX are Spark's (every row of a defined group has a positive multiplicity, and Spark
orders NaN above every float, as the contract does). Each aggregate is partial aggregates
computed in the one ``groupBy`` plus a final expression over them.

Fallbacks (a Python UDF running the in-process engine's aggregate state,
``services.compute.dataflow.operators.aggregates``):

- SUM and AVG of FLOAT64: the contract wants the exact sum correctly rounded, independent of
  order, which Spark's running double sum is not. The group's (value, diff) pairs are
  collected and summed exactly.
- SUM of DECIMAL(p, s) when Spark's product value * diff would drop digits of the scale
  (only possible for s > 6 with precision loss allowed).
- AVG's final division (per group, over the native exact sum and count): Python's
  int / int is correctly rounded and decimal quotients round half to even, where Spark's
  decimal division rounds half up.

DISTINCT aggregates run natively over the group's distinct non-NULL values (each with
multiplicity 1), computed apart and joined back to the groups by key, NULL equal to NULL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as S

from services.compute.spark.lowering.fallback import from_spark
from services.compute.spark.lowering.types import diff_sum, result_type, spark_type
from tidemark.columnar import ColumnType
from tidemark.plan import aggregate_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType
_Func = plan_pb2.Aggregate
DEC19 = S.DecimalType(19, 0)
UNIT_DIFF_FAST_PATH = True


@dataclass(frozen=True)
class AggregatePlan:
    """Partial aggregates (Spark aggregate Columns, aliased by the caller) and the final
    expression over the columns holding them."""

    parts: list[Column]
    final: Callable[[list[Column]], Column]


def _counted(value: Column, diff: Column) -> Column:
    """The diffs of non-NULL values: COUNT(value) when summed."""
    return F.when(value.isNotNull(), diff).otherwise(F.lit(0))


def plan_aggregate(
    aggregate: plan_pb2.Aggregate,
    value: Column | None,
    value_type: ScalarType | None,
    diff: Column,
    input_types: Sequence[ScalarType],
    df: DataFrame,
) -> AggregatePlan:
    """How to compute ``aggregate`` natively, or with the fallbacks above. ``value`` is the
    aggregate's expression already lowered (None for COUNT(*)); ``df`` is only analysed."""
    out = aggregate_type(aggregate, input_types)
    func = aggregate.func
    if value is None:
        return AggregatePlan([diff_sum(diff)], lambda p: p[0])
    assert value_type is not None
    if func == _Func.FUNC_COUNT:
        return AggregatePlan([diff_sum(_counted(value, diff))], lambda p: p[0])
    if func in (_Func.FUNC_MIN, _Func.FUNC_MAX):
        extreme = F.min if func == _Func.FUNC_MIN else F.max
        return AggregatePlan([extreme(value)], lambda p: p[0])
    if value_type.kind is T.FLOAT64:
        return _fallback(aggregate, value, diff, input_types, out)
    scale = value_type.scale if value_type.kind is T.DECIMAL else 0
    number = value.cast(DEC19) if value_type.kind is T.INT64 else value
    product = F.try_multiply(number, diff.cast(DEC19))
    number_type = DEC19 if value_type.kind is T.INT64 else spark_type(value_type)
    product_type = result_type(df.sparkSession, "mul", F.try_multiply, number_type, DEC19)
    if not isinstance(product_type, S.DecimalType) or product_type.scale != scale:
        return _fallback(aggregate, value, diff, input_types, out)
    if UNIT_DIFF_FAST_PATH:
        # Most rows have diff 1 (a table's inserts): the value itself, widened exactly to the
        # product's type (same scale, more digits), spares a BigDecimal multiplication.
        product = F.when(diff == 1, number.cast(product_type)).otherwise(product)
    # A product too wide for Spark is NULL: flag it, so the sum is NULL and not short.
    overflow = F.max(F.when(value.isNotNull() & product.isNull(), F.lit(1)))
    parts = [F.try_sum(product), diff_sum(_counted(value, diff)), overflow]
    if func == _Func.FUNC_SUM:
        target = spark_type(out)

        def final_sum(p: list[Column]) -> Column:
            return F.when(p[2].isNull(), p[0].cast(target))

        return AggregatePlan(parts, final_sum)
    finish = _average_finisher(scale, out)

    def final_average(p: list[Column]) -> Column:
        return F.when(p[2].isNull(), finish(p[0], p[1]))

    return AggregatePlan(parts, final_average)


def _average_finisher(scale: int, out: ScalarType) -> Callable[..., Column]:
    """exact sum / count, rounded as the contract says, by the engine's AVG state."""
    result_scale = out.scale if out.kind is T.DECIMAL else None

    def finish(total: Decimal | None, count: int | None) -> Any:
        from services.compute.dataflow.operators.aggregates import AvgExact

        if total is None or count is None or count <= 0:
            return None
        state = AvgExact(scale, result_scale)
        state.total = int(total.scaleb(scale))
        state.count = count
        return state.result(count)

    return F.udf(finish, spark_type(out), useArrow=False)


def _fallback(
    aggregate: plan_pb2.Aggregate,
    value: Column,
    diff: Column,
    input_types: Sequence[ScalarType],
    out: ScalarType,
) -> AggregatePlan:
    """The group's (value, diff) pairs collected and fed to the engine's aggregate state."""
    aggregate_bytes = aggregate.SerializeToString()
    types = list(input_types)

    def finish(pairs: list[Any] | None) -> Any:
        from services.compute.dataflow.lower import aggregate_spec

        spec, _ = aggregate_spec(_Func.FromString(aggregate_bytes), types)
        state = spec.new_state()
        rows = 0
        for pair in pairs or []:
            state.add(from_spark(pair[0]), pair[1])
            rows += pair[1]
        return state.result(rows)

    udf = F.udf(finish, spark_type(out), useArrow=False)
    pairs = F.collect_list(F.when(value.isNotNull(), F.struct(value, diff)))
    return AggregatePlan([pairs], lambda p: udf(p[0]))
