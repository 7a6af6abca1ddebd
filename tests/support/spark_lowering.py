"""Running a plan through the Spark lowering on Python multisets, for tests: inputs become
DataFrames with a ``diff`` column, and the result comes back as a canonical multiset to
compare with ``reference_eval``'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from services.compute.spark.lowering import lower, release, spark_schema
from services.compute.spark.lowering.fallback import from_spark
from tests.support import reference_eval
from tidemark.columnar import RelationSchema
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]


def input_frame(spark: SparkSession, schema: RelationSchema, rows: Mapping[Row, int]) -> DataFrame:
    types = [ScalarType.of_column(c) for c in schema.columns]
    names = [c.name for c in schema.columns]
    data = [(*row, count) for row, count in rows.items()]
    return spark.createDataFrame(data, spark_schema(types, names))


def run(
    spark: SparkSession,
    plan: plan_pb2.Plan,
    schemas: Mapping[str, RelationSchema],
    inputs: Mapping[str, Mapping[Row, int]],
) -> dict[Row, int]:
    """The plan's output through ``lower`` (Lets read twice cached, as one-shots run it), as
    a canonical multiset. Fails if the output is not consolidated: a row twice or with a
    zero multiplicity."""
    frames = {name: input_frame(spark, schemas[name], inputs.get(name, {})) for name in schemas}
    result: dict[Row, int] = {}
    kept: list[DataFrame] = []
    try:
        rows = lower(plan, frames, spark, kept=kept).collect()
    finally:
        release(kept)
    for row in rows:
        values = tuple(from_spark(v) for v in row[:-1])
        assert values not in result and row[-1] != 0, f"not consolidated: {row}"
        result[values] = row[-1]
    return reference_eval.canonical(result)
