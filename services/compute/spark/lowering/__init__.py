"""Plan IR -> Spark: ``lower(plan, inputs)`` builds one DataFrame computing the plan.

``inputs`` maps each Get's collection id to a DataFrame of the collection's columns (in
schema order) and then ``diff`` (a long multiplicity; the rows need not be consolidated).
The result has the plan's columns (named as the plan's output schema) and then ``diff``; it is
consolidated: each row once, with its non-zero total multiplicity. Its multiset is what
``tests/support/reference_eval.py`` computes from the same inputs.

Modules: :mod:`.types` (plan types as Spark types, the ``c0..cN, diff`` layout),
:mod:`.scalars` (expressions), :mod:`.aggregates` (Reduce), :mod:`.relations` (nodes),
:mod:`.fallback` (Python UDFs running the in-process engine's code where Spark's semantics
differ; each module's docstring lists its fallbacks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from services.compute.spark.lowering.relations import RelationLowering
from services.compute.spark.lowering.types import DIFF, Rel, name, spark_schema, spark_type
from tidemark.errors import InvalidArgument
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

__all__ = ["DIFF", "lower", "lower_with", "release", "spark_schema", "spark_type"]


def lower(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    inputs: Mapping[str, DataFrame],
    spark: SparkSession | None = None,
    *,
    kept: list[DataFrame] | None = None,
) -> DataFrame:
    """The DataFrame computing ``plan`` over ``inputs`` (see the module docstring). Raises
    ``InvalidArgument`` for an invalid plan or a missing or misshapen input.

    With ``kept``, a Let whose value takes a shuffle and that is read more than once is
    cached (filled by the first action) and appended there: the caller unpersists those
    after its action (:func:`release`)."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    schema = derive_schema(root)
    if isinstance(plan, plan_pb2.Plan) and plan.output_schema.columns:
        names = [c.name for c in plan.output_schema.columns]
    else:
        names = [c.name for c in schema.columns]
    session = spark or SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("lower needs a SparkSession")
    rel = RelationLowering(session, inputs, kept).lower(root).consolidated()
    return rel.df.select(*(rel.df[name(i)].alias(n) for i, n in enumerate(names)), rel.df[DIFF])


def lower_with(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    inputs: Mapping[str, DataFrame],
    relations: Sequence[plan_pb2.Relation],
    spark: SparkSession,
    replace: Mapping[bytes, Callable[[Rel], Rel]] | None = None,
    states: Sequence[plan_pb2.Relation] = (),
    kept: list[DataFrame] | None = None,
) -> tuple[DataFrame, list[DataFrame], list[DataFrame]]:
    """``lower(plan, inputs)``, and a DataFrame of each of ``relations`` (parts of ``plan``,
    met while lowering it) in the positional layout ``c0 .. cN, diff``, not consolidated: a
    row may come several times, and its diffs add up (a reader that sums anyway saves the
    shuffle). ``replace`` (by a relation's deterministic serialization): what both the
    caller and the rest of the plan get for that relation instead of its lowered form.
    ``states``: Reduces of ``plan`` whose aggregates all have summed states; the third
    result holds each one's groups' partial aggregates (``RelationLowering``), cached, the
    cache listed in ``kept`` (unpersist them after the actions: :func:`release`).
    Raises ``InvalidArgument`` when one of them is not part of the plan."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    keys = [r.SerializeToString(deterministic=True) for r in relations]
    state_keys = [r.SerializeToString(deterministic=True) for r in states]
    lowering = RelationLowering(
        spark, inputs, kept, capture=set(keys), replace=replace, states=set(state_keys)
    )
    rel = lowering.lower(root).consolidated()
    names = [c.name for c in derive_schema(root).columns]
    if isinstance(plan, plan_pb2.Plan) and plan.output_schema.columns:
        names = [c.name for c in plan.output_schema.columns]
    output = rel.df.select(*(rel.df[name(i)].alias(n) for i, n in enumerate(names)), rel.df[DIFF])
    parts = []
    for key in keys:
        captured = lowering.captured.get(key)
        if captured is None:
            raise InvalidArgument("a relation to capture is not part of the plan")
        parts.append(captured.df)
    aggregated = []
    for key in state_keys:
        frame = lowering.captured_states.get(key)
        if frame is None:
            raise InvalidArgument("a Reduce whose states to capture is not part of the plan")
        aggregated.append(frame)
    return output, parts, aggregated


def release(kept: list[DataFrame]) -> None:
    """Unpersists the DataFrames :func:`lower` cached (non-blocking)."""
    for frame in kept:
        frame.unpersist(blocking=False)
    kept.clear()
