"""Reduce's aggregates over a consolidated relation with multiplicities.

A row of multiplicity d counts d times, so each aggregate is written over (value, diff)
pairs: COUNT sums the diffs of non-NULL values, SUM sums value * diff exactly (a DECIMAL as a
decimal, a row of diff 1 adding its value as it is; a BIGINT, whose contract SUM is
DECIMAL(38, 0), as three long sums of 21-bit pieces put back together per group), MIN
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

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import reduce as fold
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as S

from services.compute.spark.lowering.fallback import from_spark
from services.compute.spark.lowering.types import (
    INT64_SUM_OVERFLOW,
    diff_sum,
    result_type,
    spark_type,
)
from tidemark.columnar import ColumnType
from tidemark.plan import aggregate_type, scalar_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType
_Func = plan_pb2.Aggregate
DEC19 = S.DecimalType(19, 0)
UNIT_DIFF_FAST_PATH = True


@dataclass(frozen=True)
class AggregatePlan:
    """Partial aggregates (Spark aggregate Columns, aliased by the caller), the group's state
    made from the columns holding them (``state``; None: the partial aggregates are the
    state), and the final expression over the state's columns."""

    parts: list[Column]
    final: Callable[[list[Column]], Column]
    state: Callable[[list[Column]], list[Column]] | None = None

    def state_of(self, parts: list[Column]) -> list[Column]:
        """The state's columns, given the columns holding :attr:`parts`."""
        return parts if self.state is None else self.state(parts)


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
    product_type = _exact_product_type(df.sparkSession, value_type)
    if product_type is None:
        return _fallback(aggregate, value, diff, input_types, out)
    scale = product_type.scale
    parts: list[Column]
    state: Callable[[list[Column]], list[Column]] | None = None
    if value_type.kind is T.INT64:
        parts, state = _int64_sum(value, diff)
    else:
        product = F.try_multiply(value, diff.cast(DEC19))
        if UNIT_DIFF_FAST_PATH:
            # Most rows have diff 1 (a table's inserts): the value itself, widened exactly to
            # the product's type (same scale, more digits), spares a BigDecimal product.
            product = F.when(diff == 1, value.cast(product_type)).otherwise(product)
        # A product too wide for Spark is NULL: flag it, so the sum is NULL and not short.
        overflow = F.max(F.when(value.isNotNull() & product.isNull(), F.lit(1)))
        parts = [F.try_sum(product), diff_sum(_counted(value, diff)), overflow]
    if func == _Func.FUNC_SUM:
        target = spark_type(out)

        def final_sum(p: list[Column]) -> Column:
            return F.when(p[2].isNull(), p[0].cast(target))

        return AggregatePlan(parts, final_sum, state)
    finish = _average_finisher(scale, out)

    def final_average(p: list[Column]) -> Column:
        return F.when(p[2].isNull(), finish(p[0], p[1]))

    return AggregatePlan(parts, final_average, state)


_PIECE_BITS = 21
_PIECE_MASK = (1 << _PIECE_BITS) - 1


def _int64_sum(
    value: Column, diff: Column
) -> tuple[list[Column], Callable[[list[Column]], list[Column]]]:
    """SUM of an INT64 with long arithmetic, exactly: the value is cut into three 21-bit
    pieces (v = a * 2^42 + b * 2^21 + c, ``a`` signed), each summed times its diff as a long,
    and the state's exact total is put back together as a DECIMAL(38, 0) per group. Summing
    longs costs about half of summing Spark's decimals (a BigDecimal per row) over a
    hydration's 10^7 rows. A piece's sum cannot overflow before its group's multiplicities
    reach 2^42; past that (or a diff over 2^42 that overflows a product) the query fails,
    since its exact sum is lost. The state is then the total (NULL when no value is),
    the count of non-NULL values and no overflow flag: the decimal sum's state."""
    pieces = [
        F.shiftright(value, 2 * _PIECE_BITS),
        F.shiftright(value, _PIECE_BITS).bitwiseAND(F.lit(_PIECE_MASK)),
        value.bitwiseAND(F.lit(_PIECE_MASK)),
    ]
    products = [F.when(diff == 1, p).otherwise(F.try_multiply(p, diff)) for p in pieces]
    lost = fold(operator.or_, [p.isNull() for p in products])
    # 1: a product overflowed; 0: values without overflow; NULL: no value at all.
    seen = F.max(F.when(value.isNotNull(), F.when(lost, F.lit(1)).otherwise(F.lit(0))))
    parts = [*(F.try_sum(p) for p in products), diff_sum(_counted(value, diff)), seen]

    def state(p: list[Column]) -> list[Column]:
        high, middle, low, count, flag = p
        present = flag.isNotNull()
        overflowed = present & (
            (flag == 1) | fold(operator.or_, [c.isNull() for c in (high, middle, low)])
        )
        dec = S.DecimalType(38, 0)
        total = (
            high.cast(dec) * F.lit(1 << (2 * _PIECE_BITS)).cast(dec)
            + middle.cast(dec) * F.lit(1 << _PIECE_BITS).cast(dec)
            + low.cast(dec)
        ).cast(dec)
        exact = F.when(overflowed, F.raise_error(F.lit(INT64_SUM_OVERFLOW)).cast(dec)).when(
            present, total
        )
        return [exact, count, F.lit(None).cast("int")]

    return parts, state


def _exact_product_type(spark: SparkSession, value_type: ScalarType) -> S.DecimalType | None:
    """The type of value * diff when Spark computes it exactly (an INT64, or a DECIMAL whose
    product keeps its scale); None when the sum falls back to Python (FLOAT64, or a scale
    Spark's product would round)."""
    if value_type.kind not in (T.INT64, T.DECIMAL):
        return None
    scale = value_type.scale if value_type.kind is T.DECIMAL else 0
    number_type = DEC19 if value_type.kind is T.INT64 else spark_type(value_type)
    product_type = result_type(spark, "mul", F.try_multiply, number_type, DEC19)
    if not isinstance(product_type, S.DecimalType) or product_type.scale != scale:
        return None
    return product_type


SUMMED_DECIMAL_PRECISION = 18
"""The widest DECIMAL whose SUM state hydration takes from Spark: a value under 10^18 times a
diff under 2^63 always fits Spark's DECIMAL(38), and so does any total of them a collection
can hold, so the state is always exact. A wider value's product or total may not fit; its
Reduce gets its input rows, which the engine sums without a bound."""


def summed_state(
    aggregate: plan_pb2.Aggregate, input_types: Sequence[ScalarType], spark: SparkSession
) -> bool:
    """Whether ``aggregate``'s partial aggregates (:func:`plan_aggregate`) are a group's whole
    state in the engine: COUNT's count of non-NULL values, or SUM's and AVG's exact total and
    count (Spark computing the total natively, and for a DECIMAL of at most
    :data:`SUMMED_DECIMAL_PRECISION` digits). Hydration by Spark then loads a Reduce all
    of whose aggregates are such from its groups' partial aggregates (a few rows) instead
    of its input rows (``services.compute.dataflow.operators.aggregates.add_summed_parts``
    reads them)."""
    if aggregate.distinct:
        return False
    if aggregate.func == _Func.FUNC_COUNT:
        return True
    if aggregate.func not in (_Func.FUNC_SUM, _Func.FUNC_AVG):
        return False
    if not aggregate.HasField("expression"):
        return False
    value_type = scalar_type(aggregate.expression, input_types)
    if value_type.kind is T.DECIMAL and value_type.precision > SUMMED_DECIMAL_PRECISION:
        return False
    return _exact_product_type(spark, value_type) is not None


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
