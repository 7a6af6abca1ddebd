"""Plan relations as Spark DataFrames with a ``diff`` column (layout in :mod:`.types`).

Linear nodes (Filter, Map, Project, Union, Negate, inner Join) work on unconsolidated rows and
multiply or negate diffs. Nodes whose answer depends on totals consolidate their input first:
Threshold, Distinct, Reduce (with MIN or MAX), TopK, Window, and an outer join the side that
decides the other's padding (a row is unmatched only when no row of non-zero multiplicity
matches it). A relation known to be consolidated already (a Reduce's output, joins and
projections keeping such keys: ``Rel.unique``) is not consolidated again.

- Join: key expressions are lowered on their own side, numbers promoted to one kind exactly;
  Spark's ``=`` never matches a NULL key. A matched pair's diff is the product; outer padding
  keeps the preserved row's diff.
- TopK: per group, rows ordered by the sort keys and then the whole row (NULLs last), a
  running sum of diffs gives each row's positions [end - diff, end), and the row keeps
  ``min(end, offset + limit) - max(end - diff, offset)`` of its copies.
- Window (fallback): each partition's rows are collected and evaluated by the in-process
  engine's window code (``evaluate_partition``), which already handles copies, frames and
  peers exactly.
- Let/LocalGet: the bound DataFrame is reused by every LocalGet (Spark may recompute it; the
  plan stays one query).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from functools import reduce as fold
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from services.compute.spark.lowering.aggregates import plan_aggregate
from services.compute.spark.lowering.fallback import from_spark
from services.compute.spark.lowering.scalars import (
    Lowered,
    ScalarLowering,
    literal,
    to_decimal,
    to_float,
)
from services.compute.spark.lowering.types import (
    DIFF,
    Rel,
    checked,
    diff_sum,
    name,
    spark_schema,
    spark_type,
)
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.plan import aggregate_type
from tidemark.plan.datum import from_datum
from tidemark.plan.derive import window_function_type
from tidemark.plan.optimize.scalars import columns_of
from tidemark.plan.scalar_types import ScalarType, widest_numeric_kind
from tidemark.plan.walk import relations
from tidemark.v1 import plan_pb2

T = ColumnType
_Join = plan_pb2.Join


def _types(schema: RelationSchema) -> list[ScalarType]:
    return [ScalarType.of_column(c) for c in schema.columns]


def _layout(df: DataFrame, columns: Iterable[Column], diff: Column) -> DataFrame:
    return df.select(*(c.alias(name(i)) for i, c in enumerate(columns)), diff.alias(DIFF))


class RelationLowering:
    """``capture``: serialized (deterministic) relations of the plan whose lowered form to
    keep in ``captured`` as they are met (bulk hydration reads a dataflow's intermediate
    relations from one lowering of its plan). ``replace``: for some of those, a function
    giving what the rest of the plan reads instead of the lowered form (an equivalent for
    its consumer, computed once and cached, say). ``states``: serialized Reduce relations
    of the plan, every aggregate of which has a summed state (``aggregates.summed_state``),
    whose groups' partial aggregates to cache and keep in ``captured_states`` (the group key
    ``g0 ..``, the group's sum of diffs ``total``, then each aggregate's parts in order):
    the Reduce's output is computed from them, and hydration stages them as its state."""

    def __init__(
        self,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        kept: list[DataFrame] | None = None,
        capture: Collection[bytes] = (),
        replace: Mapping[bytes, Callable[[Rel], Rel]] | None = None,
        states: Collection[bytes] = (),
    ) -> None:
        self.spark = spark
        self.inputs = inputs
        self.lets: dict[int, Rel] = {}
        self.capture = capture
        self.replace = replace or {}
        self.captured: dict[bytes, Rel] = {}
        self.states = states
        self.captured_states: dict[bytes, DataFrame] = {}
        # Where cached DataFrames go, for the caller to unpersist after its action (None:
        # nothing is cached).
        self.kept = kept

    def lower(self, relation: plan_pb2.Relation) -> Rel:
        kind = relation.WhichOneof("kind")
        key = relation.SerializeToString(deterministic=True) if self.capture or self.states else b""
        if kind == "reduce" and key in self.states:
            rel = self._reduce(relation.reduce, states_key=key)
        else:
            method: Callable[[Any], Rel] = getattr(self, f"_{kind}")
            rel = method(getattr(relation, str(kind)))
        if self.capture:
            if key in self.capture:
                replacement = self.replace.get(key)
                if replacement is not None:
                    rel = replacement(rel)
                self.captured[key] = rel
        return rel

    def scalars(self, rel: Rel) -> ScalarLowering:
        return ScalarLowering(rel.df, rel.columns(), rel.types)

    # -- leaves ----------------------------------------------------------------------------

    def _get(self, get: plan_pb2.Get) -> Rel:
        types = _types(RelationSchema.from_proto(get.schema))
        df = self.inputs.get(get.collection_id)
        if df is None:
            raise InvalidArgument(f"no input DataFrame for collection {get.collection_id!r}")
        if len(df.columns) != len(types) + 1 or df.columns[-1] != DIFF:
            raise InvalidArgument(
                f"input {get.collection_id!r} has columns {df.columns}; expected the "
                f"collection's {len(types)} columns and then {DIFF!r}"
            )
        # Renamed by position: plan names may repeat or need quoting.
        renamed = df.toDF(*(name(i) for i in range(len(types))), DIFF)
        fields = df.schema.fields  # read once already, by df.columns
        # Expressions over a column take its Spark type to be its plan type's.
        retyped = [
            i
            for i, (f, t) in enumerate(zip(fields[:-1], types, strict=True))
            if t.kind is T.DECIMAL and f.dataType != spark_type(t)
        ]
        if not retyped and isinstance(fields[-1].dataType, LongType):
            return Rel(renamed, types)
        columns = [
            F.col(name(i)).cast(spark_type(t)) if i in retyped else F.col(name(i))
            for i, t in enumerate(types)
        ]
        return Rel(_layout(renamed, columns, F.col(DIFF).cast("long")), types)

    def _constant(self, constant: plan_pb2.Constant) -> Rel:
        types = _types(RelationSchema.from_proto(constant.schema))
        rows = [(*(from_datum(d) for d in row.values), row.diff or 1) for row in constant.rows]
        # Literals in the plan, not a parallelized Python list: no RDD to ship and convert per
        # job, and Spark's optimizer folds it into a local relation.
        structs = [
            F.struct(
                *(
                    literal(v, t).alias(name(i))
                    for i, (v, t) in enumerate(zip(row[:-1], types, strict=True))
                ),
                F.lit(row[-1]).cast("long").alias(DIFF),
            )
            for row in rows
        ]
        if structs:
            df = self.spark.range(0, 1, 1, 1).select(F.inline(F.array(*structs)))
        else:
            empty = [literal(None, t).alias(name(i)) for i, t in enumerate(types)]
            df = self.spark.range(0, 0, 1, 1).select(*empty, F.lit(0).cast("long").alias(DIFF))
        # One row with a non-zero diff is consolidated, and distinct on no columns at all.
        single = len(rows) == 1 and rows[0][-1] != 0
        return Rel(df, types, single, () if single else None)

    # -- linear ----------------------------------------------------------------------------

    def _filter(self, node: plan_pb2.Filter) -> Rel:
        rel = self.lower(node.input)
        lowering = self.scalars(rel)
        predicates = [lowering.lower(p).column for p in node.predicates]
        if not predicates:
            return rel
        # A NULL predicate drops the row, as FALSE does.
        kept = rel.df.where(fold(lambda a, b: a & b, predicates))
        return rel.with_df(kept, consolidated=rel.consolidated_already)

    def _map(self, node: plan_pb2.Map) -> Rel:
        rel = self.lower(node.input)
        # Each expression sees the columns appended before it. Expressions that read none
        # appended by the same projection share it: one projection per batch, not per
        # expression (each DataFrame operation costs an analysis of the whole plan).
        batch: list[tuple[Column, ScalarType]] = []
        for expr in node.expressions:
            if any(c >= rel.width for c in columns_of(expr)):
                rel = _appended(rel, batch)
                batch = []
            found = self.scalars(rel).lower(expr)
            # The plan type's Spark type exactly, so unions and later nodes line up.
            batch.append((found.column.cast(spark_type(found.type)), found.type))
        return _appended(rel, batch)

    def _project(self, node: plan_pb2.Project) -> Rel:
        rel = self.lower(node.input)
        picked = [F.col(name(c)) for c in node.columns]
        df = _layout(rel.df, picked, F.col(DIFF))
        types = [rel.types[c] for c in node.columns]
        key = rel.key()
        if key is None or not set(key) <= set(node.columns):
            return Rel(df, types)
        # The columns that told rows apart are all kept: the rows stay distinct.
        kept = list(node.columns)
        return Rel(df, types, True, tuple(kept.index(c) for c in key))

    def _union(self, node: plan_pb2.Union) -> Rel:
        branches = [self.lower(r) for r in node.inputs]
        df = fold(lambda a, b: a.union(b), (b.df for b in branches))
        types = [
            t.with_nullable(any(b.types[i].nullable for b in branches))
            for i, t in enumerate(branches[0].types)
        ]
        return Rel(df, types)

    def _negate(self, node: plan_pb2.Negate) -> Rel:
        rel = self.lower(node.input)
        negated = rel.df.withColumn(DIFF, -F.col(DIFF))
        return rel.with_df(negated, consolidated=rel.consolidated_already)

    def _threshold(self, node: plan_pb2.Threshold) -> Rel:
        rel = self.lower(node.input).consolidated()
        return rel.with_df(rel.df.where(F.col(DIFF) > 0), consolidated=True)

    def _distinct(self, node: plan_pb2.Distinct) -> Rel:
        rel = self.lower(node.input).consolidated()
        df = rel.df.where(F.col(DIFF) > 0).withColumn(DIFF, F.lit(1).cast("long"))
        return rel.with_df(df, consolidated=True)

    # -- join ------------------------------------------------------------------------------

    def _join(self, node: plan_pb2.Join) -> Rel:
        left, right = self.lower(node.left), self.lower(node.right)
        padded = self._one_row_padded(node, left, right)
        if padded is not None:
            return padded
        keep_left = node.kind in (_Join.KIND_LEFT_OUTER, _Join.KIND_FULL_OUTER)
        keep_right = node.kind in (_Join.KIND_RIGHT_OUTER, _Join.KIND_FULL_OUTER)
        # A preserved row is padded when no row of non-zero total multiplicity on the other
        # side matches it: that side must be consolidated. The preserved side need not be:
        # its copies' outputs, padded or matched, add up as its diffs do.
        if keep_right:
            left = left.consolidated()
        if keep_left:
            right = right.consolidated()
        left_keys = [self.scalars(left).lower(k) for k in node.left_keys]
        right_keys = [self.scalars(right).lower(k) for k in node.right_keys]
        pairs = [_promoted_pair(lk, rk) for lk, rk in zip(left_keys, right_keys, strict=True)]
        # A key that is a column as it is joins on that column: no copy of it rides along
        # (a narrower side also looks small enough to Spark to broadcast).
        lnames = [
            _plain_column(k, lk, c, "l")
            for k, lk, (c, _) in zip(node.left_keys, left_keys, pairs, strict=True)
        ]
        rnames = [
            _plain_column(k, rk, c, "r")
            for k, rk, (_, c) in zip(node.right_keys, right_keys, pairs, strict=True)
        ]
        ldf = left.df.select(
            *(F.col(name(i)).alias(f"l{i}") for i in range(left.width)),
            *(lk.alias(f"lk{i}") for i, (lk, _) in enumerate(pairs) if lnames[i] is None),
            F.col(DIFF).alias("ld"),
        )
        rdf = right.df.select(
            *(F.col(name(i)).alias(f"r{i}") for i in range(right.width)),
            *(rk.alias(f"rk{i}") for i, (_, rk) in enumerate(pairs) if rnames[i] is None),
            F.col(DIFF).alias("rd"),
        )
        condition = fold(
            lambda a, b: a & b,
            [
                F.col(lnames[i] or f"lk{i}") == F.col(rnames[i] or f"rk{i}")
                for i in range(len(pairs))
            ],
            F.lit(True),
        )
        how = {
            _Join.KIND_INNER: "inner",
            _Join.KIND_LEFT_OUTER: "left",
            _Join.KIND_RIGHT_OUTER: "right",
            _Join.KIND_FULL_OUTER: "full",
        }[node.kind]
        joined = ldf.join(rdf, condition, how)
        # Padding rows keep the preserved side's diff; the other side's is NULL there.
        diff = checked(
            F.try_multiply(F.coalesce(F.col("ld"), F.lit(1)), F.coalesce(F.col("rd"), F.lit(1)))
        )
        columns = [F.col(f"l{i}") for i in range(left.width)]
        columns += [F.col(f"r{i}") for i in range(right.width)]
        left_types = [t.with_nullable(True) if keep_right else t for t in left.types]
        right_types = [t.with_nullable(True) if keep_left else t for t in right.types]
        df = _layout(joined, columns, diff)
        left_key, right_key = left.key(), right.key()
        if left_key is None or right_key is None or (keep_left and keep_right):
            return Rel(df, left_types + right_types)
        # Distinct rows on both sides make distinct pairs, and a padded row's preserved side
        # matched nothing, so no pair repeats it (a full join could pad an all-NULL row on
        # each side into the same row). Diffs are products of non-zero diffs.
        key = (*left_key, *(left.width + k for k in right_key))
        return Rel(df, left_types + right_types, True, key)

    def _one_row_padded(self, node: plan_pb2.Join, left: Rel, right: Rel) -> Rel | None:
        """A one-row constant LEFT JOIN a relation of at most one row (a global aggregate's
        output, ``unique`` on no columns) ON nothing: the row with the other's columns, or
        NULLs when it has none. Spark would run it as a broadcast nested loop join, a second
        job collecting the aggregate to the driver; a global aggregate over the other side
        (already in one partition: no shuffle) always yields the one row instead. None when
        the join is not of that shape."""
        if node.kind != _Join.KIND_LEFT_OUTER or node.left_keys or node.right_keys:
            return None
        if node.left.WhichOneof("kind") != "constant" or right.key() != ():
            return None
        rows = node.left.constant.rows
        if len(rows) != 1 or (rows[0].diff or 1) == 0:
            return None
        values = [from_datum(d) for d in rows[0].values]
        constant_diff = rows[0].diff or 1
        matched = right.df.groupBy().agg(
            *(F.first(F.col(name(i))).alias(f"r{i}") for i in range(right.width)),
            F.first(F.col(DIFF)).alias("rd"),
        )
        columns = [literal(v, t) for v, t in zip(values, left.types, strict=True)]
        columns += [F.col(f"r{i}") for i in range(right.width)]
        diff = checked(
            F.try_multiply(F.lit(constant_diff).cast("long"), F.coalesce(F.col("rd"), F.lit(1)))
        )
        types = [*left.types, *(t.with_nullable(True) for t in right.types)]
        return Rel(_layout(matched, columns, diff), types, True, ())

    # -- reduce ----------------------------------------------------------------------------

    def _reduce(self, node: plan_pb2.Reduce, states_key: bytes | None = None) -> Rel:
        rel = self.lower(node.input)
        # COUNT, SUM and AVG are sums of diffs and need no consolidated input (rows that
        # cancel add nothing), nor do DISTINCT aggregates (their values are consolidated on
        # their own). MIN and MAX must not see a row whose updates cancel out.
        if any(_extreme(a) and not a.distinct for a in node.aggregates):
            rel = rel.consolidated()
        lowering = self.scalars(rel)
        keys = [F.col(name(c)).alias(f"g{i}") for i, c in enumerate(node.group_key)]
        key_names = [f"g{i}" for i in range(len(keys))]
        values: list[Lowered | None] = [
            lowering.lower(a.expression) if a.HasField("expression") else None
            for a in node.aggregates
        ]
        base = rel.df.select(
            *keys,
            *((v.column if v else F.lit(None)).alias(f"v{i}") for i, v in enumerate(values)),
            F.col(DIFF),
        )
        diff = F.col(DIFF)
        parts: list[Column] = [diff_sum(diff).alias("total")]
        states: list[Column] = []
        finals: dict[int, Callable[[list[Column]], Column]] = {}
        part_names: dict[int, list[str]] = {}
        distinct_frames: list[tuple[int, DataFrame]] = []
        for i, aggregate in enumerate(node.aggregates):
            value = values[i]
            if aggregate.distinct and value is not None:
                frame = self._distinct_aggregate(i, aggregate, value, rel, list(node.group_key))
                distinct_frames.append((i, frame))
                continue
            plan = plan_aggregate(
                aggregate,
                F.col(f"v{i}") if value else None,
                value.type if value else None,
                diff,
                rel.types,
                base,
            )
            raw = [f"r{i}_{j}" for j in range(len(plan.parts))]
            parts += [p.alias(n) for p, n in zip(plan.parts, raw, strict=True)]
            made = plan.state_of([F.col(n) for n in raw])
            part_names[i] = [f"p{i}_{j}" for j in range(len(made))]
            states += [c.alias(n) for c, n in zip(made, part_names[i], strict=True)]
            finals[i] = plan.final
        aggregated = base.groupBy(*key_names).agg(*parts).select(*key_names, "total", *states)
        if states_key is not None:
            if distinct_frames:
                raise InvalidArgument("a Reduce with DISTINCT aggregates has no summed state")
            aggregated = aggregated.persist()
            if self.kept is not None:
                self.kept.append(aggregated)
            self.captured_states[states_key] = aggregated
        grouped = aggregated.where(F.col("total") > 0)
        for _, frame in distinct_frames:
            grouped = _join_on_keys(grouped, frame, key_names)
        outputs = [F.col(k) for k in key_names]
        for i in range(len(node.aggregates)):
            if i in finals:
                outputs.append(finals[i]([F.col(n) for n in part_names[i]]))
            elif node.aggregates[i].func == plan_pb2.Aggregate.FUNC_COUNT:
                # A group with no non-NULL value has no row in the distinct frame.
                outputs.append(F.coalesce(F.col(f"a{i}"), F.lit(0).cast("long")))
            else:
                outputs.append(F.col(f"a{i}"))
        types = [rel.types[c] for c in node.group_key]
        types += [aggregate_type(a, rel.types) for a in node.aggregates]
        typed = [c.cast(spark_type(t)) for c, t in zip(outputs, types, strict=True)]
        # One row per group, and the group key columns come first: consolidated.
        key = tuple(range(len(node.group_key)))
        return Rel(_layout(grouped, typed, F.lit(1).cast("long")), types, True, key)

    def _distinct_aggregate(
        self, index: int, aggregate: plan_pb2.Aggregate, value: Lowered, rel: Rel, key: list[int]
    ) -> DataFrame:
        """``aggregate`` over each group's distinct non-NULL values (multiplicity 1 each): a
        frame of the group key columns ``g*`` and the result ``a{index}``. A value is present
        when its rows' diffs add up to more than zero; grouping treats NaN as one value and
        -0.0 as 0.0, as the contract's equality does."""
        key_names = [f"g{i}" for i in range(len(key))]
        values = (
            rel.df.select(
                *(F.col(name(c)).alias(k) for c, k in zip(key, key_names, strict=True)),
                value.column.alias("v"),
                F.col(DIFF),
            )
            .where(F.col("v").isNotNull())
            .groupBy(*key_names, "v")
            .agg(diff_sum(F.col(DIFF)).alias("n"))
            .where(F.col("n") > 0)
            .select(*key_names, "v")
        )
        plain = plan_pb2.Aggregate()
        plain.CopyFrom(aggregate)
        plain.distinct = False
        plan = plan_aggregate(
            plain, F.col("v"), value.type, F.lit(1).cast("long"), rel.types, values
        )
        parts = [p.alias(f"q{j}") for j, p in enumerate(plan.parts)]
        result = plan.final(plan.state_of([F.col(f"q{j}") for j in range(len(parts))]))
        if aggregate.func == plan_pb2.Aggregate.FUNC_COUNT:
            result = F.coalesce(result, F.lit(0).cast("long"))
        grouped = values.groupBy(*key_names).agg(*parts)
        return grouped.select(*key_names, result.alias(f"a{index}"))

    # -- top k -----------------------------------------------------------------------------

    def _top_k(self, node: plan_pb2.TopK) -> Rel:
        rel = self.lower(node.input).consolidated()
        order = _order_columns(node.order, rel.width)
        window = Window.partitionBy(*(F.col(name(c)) for c in node.group_key)).orderBy(*order)
        running = window.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        end = checked(F.try_sum(DIFF).over(running))
        start = end - F.col(DIFF)
        low = F.greatest(start, F.lit(node.offset))
        if node.HasField("limit"):
            kept = F.least(end, F.lit(node.offset + node.limit)) - low
        else:
            kept = end - low
        df = rel.df.where(F.col(DIFF) > 0).select(*rel.columns(), kept.alias(DIFF))
        return rel.with_df(df.where(F.col(DIFF) > 0), consolidated=True)

    # -- window ----------------------------------------------------------------------------

    def _window(self, node: plan_pb2.Window) -> Rel:
        rel = self.lower(node.input).consolidated()
        types = list(rel.types)
        out_types = [*types, *(window_function_type(f, types) for f in node.functions)]
        window_bytes = node.SerializeToString()
        evaluate = _partition_evaluator(window_bytes, types)
        partition_key = list(node.partition_key)

        def keyed(row: Any) -> tuple[Any, tuple[tuple[Any, ...], int]]:
            values = tuple(from_spark(v) for v in row[:-1])
            key = tuple(("NaN",) if v != v else v for v in (values[c] for c in partition_key))
            return key, (values, row[-1])

        rdd = rel.df.rdd.map(keyed).groupByKey().flatMap(lambda item: evaluate(item[1]))
        df = self.spark.createDataFrame(rdd, spark_schema(out_types))
        return Rel(df, out_types)

    # -- sharing ---------------------------------------------------------------------------

    def _let(self, node: plan_pb2.Let) -> Rel:
        value = self.lower(node.value)
        if self.kept is not None and _shuffles(node.value) and _uses(node.body, node.id) > 1:
            # Cached (filled while the query runs) for every LocalGet: Spark would compute it
            # again for each, as it pushes different filters into each copy.
            cached = value.df.cache()
            self.kept.append(cached)
            value = Rel(cached, value.types, value.consolidated_already, value.unique)
        shadowed = self.lets.get(node.id)
        self.lets[node.id] = value
        try:
            return self.lower(node.body)
        finally:
            if shadowed is None:
                del self.lets[node.id]
            else:
                self.lets[node.id] = shadowed

    def _local_get(self, node: plan_pb2.LocalGet) -> Rel:
        rel = self.lets.get(node.id)
        if rel is None:
            raise InvalidArgument(f"no enclosing let binds id {node.id}")
        return rel


def _shuffles(relation: plan_pb2.Relation) -> bool:
    """Whether computing ``relation`` takes a shuffle (a grouping of some kind), so that
    computing it twice costs more than keeping it."""
    grouping = ("reduce", "distinct", "threshold", "top_k", "window")
    return any(r.WhichOneof("kind") in grouping for r in relations(relation))


def _uses(relation: plan_pb2.Relation, let_id: int) -> int:
    """How many LocalGets of ``let_id`` ``relation`` holds (an inner Let of the same id
    shadowing it only makes this an overcount)."""
    return sum(
        1
        for r in relations(relation)
        if r.WhichOneof("kind") == "local_get" and r.local_get.id == let_id
    )


def _appended(rel: Rel, columns: list[tuple[Column, ScalarType]]) -> Rel:
    """``rel`` with ``columns`` appended, in one projection."""
    if not columns:
        return rel
    added = [c.alias(name(rel.width + i)) for i, (c, _) in enumerate(columns)]
    df = rel.df.select(*rel.columns(), *added, DIFF)
    # Distinct rows stay distinct with columns computed from them.
    types = [*rel.types, *(t for _, t in columns)]
    return Rel(df, types, rel.consolidated_already, rel.key())


def _extreme(aggregate: plan_pb2.Aggregate) -> bool:
    return aggregate.func in (plan_pb2.Aggregate.FUNC_MIN, plan_pb2.Aggregate.FUNC_MAX)


def _plain_column(key: plan_pb2.Scalar, lowered: Lowered, used: Column, side: str) -> str | None:
    """The side's name (``l3``, say) of a join key that is one of its columns, used as it
    is (no promotion); None for any other key."""
    if key.WhichOneof("kind") != "column" or used is not lowered.column:
        return None
    return f"{side}{key.column}"


def _promoted_pair(left: Lowered, right: Lowered) -> tuple[Column, Column]:
    """Join key columns of one kind, so that equal numbers are equal Spark values."""
    if not (left.type.is_numeric and right.type.is_numeric) or left.type.kind is right.type.kind:
        if left.type.kind is T.DECIMAL and right.type.kind is T.DECIMAL:
            scale = max(left.type.scale, right.type.scale)
            return to_decimal(left, 38, scale), to_decimal(right, 38, scale)
        return left.column, right.column
    kind = widest_numeric_kind([left.type, right.type])
    if kind is T.FLOAT64:
        return to_float(left), to_float(right)
    scale = max(left.type.scale, right.type.scale)  # INT64 has scale 0
    return to_decimal(left, 38, scale), to_decimal(right, 38, scale)


def _order_columns(order: Iterable[plan_pb2.SortKey], width: int) -> list[Column]:
    """The sort keys (ascending NULLs last, descending NULLs first, unless flipped), then the
    whole row ascending with NULLs last: a total order, so positions are deterministic."""
    columns = []
    for key in order:
        column = F.col(name(key.column))
        nulls_first = key.descending != key.nulls_flipped
        if key.descending:
            columns.append(column.desc_nulls_first() if nulls_first else column.desc_nulls_last())
        else:
            columns.append(column.asc_nulls_first() if nulls_first else column.asc_nulls_last())
    columns += [F.col(name(i)).asc_nulls_last() for i in range(width)]
    return columns


def _join_on_keys(left: DataFrame, right: DataFrame, keys: list[str]) -> DataFrame:
    """``left`` with ``right``'s other columns, matching ``keys`` with NULL equal to NULL;
    rows of ``left`` without a match keep NULLs there."""
    renamed = right.select(
        *(F.col(k).alias(f"j_{k}") for k in keys), *(c for c in right.columns if c not in keys)
    )
    condition = fold(
        lambda a, b: a & b, [F.col(k).eqNullSafe(F.col(f"j_{k}")) for k in keys], F.lit(True)
    )
    joined = left.join(renamed, condition, "left")
    return joined.drop(*(f"j_{k}" for k in keys))


def _partition_evaluator(
    window_bytes: bytes, types: list[ScalarType]
) -> Callable[[Iterable[tuple[tuple[Any, ...], int]]], Iterator[tuple[Any, ...]]]:
    """Evaluates one partition's (row, diff) pairs with the engine's window code, compiled
    once per worker."""
    compiled: list[Any] = []

    def evaluate(rows: Iterable[tuple[tuple[Any, ...], int]]) -> Iterator[tuple[Any, ...]]:
        from services.compute.dataflow.lower import window_function_spec
        from services.compute.dataflow.operators.window import evaluate_partition
        from services.compute.dataflow.ordering import compile_order_key, compile_sort_key

        if not compiled:
            window = plan_pb2.Window.FromString(window_bytes)
            order = [
                (k.column, k.descending, k.descending != k.nulls_flipped) for k in window.order
            ]
            specs = [window_function_spec(f, types)[0] for f in window.functions]
            compiled.extend(
                [compile_sort_key(order, types), compile_order_key(order, types), specs]
            )
        sort_key, peer_key, specs = compiled
        copies = [
            row for row, count in sorted(rows, key=lambda e: sort_key(e[0])) for _ in range(count)
        ]
        for row, count in evaluate_partition(copies, peer_key, specs).items():
            yield (*row, count)

    return evaluate
