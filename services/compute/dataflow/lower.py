"""Lowers a plan into an operator graph, checking it on the way.

Every node's column types are derived as the contract says; anything ill-formed (a column out
of range, an ill-typed expression, an unknown or nondeterministic function, a literal that does
not match its type) is rejected with ``InvalidArgument`` naming the node. A Let's value is
lowered once and shared by every LocalGet that refers to it; reading the same input twice also
shares one source node.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from services.compute.dataflow.batch import Key, KeyFunction, Row
from services.compute.dataflow.datum import datum_value
from services.compute.dataflow.functions import decimals
from services.compute.dataflow.graph import ConstantSource, GetSource, Graph, Node
from services.compute.dataflow.operators import aggregates
from services.compute.dataflow.operators.distinct import DistinctOperator
from services.compute.dataflow.operators.join import JoinOperator
from services.compute.dataflow.operators.linear import (
    Filter,
    Map,
    Negate,
    Normalize,
    Project,
    Union,
)
from services.compute.dataflow.operators.reduce import AggregateSpec, ReduceOperator
from services.compute.dataflow.operators.topk import TopKOperator
from services.compute.dataflow.operators.window import (
    DEFAULT_FRAME,
    WindowFunctionSpec,
    WindowOperator,
)
from services.compute.dataflow.ordering import compile_order_key, compile_sort_key
from services.compute.dataflow.scalar import CompiledScalar, compile_scalar, promoted
from services.compute.dataflow.types import computed_decimal, from_schema
from tidemark.columnar.schema import MAX_DECIMAL_PRECISION, ColumnType
from tidemark.errors import Internal, InvalidArgument
from tidemark.plan import check_plan, derive_schema
from tidemark.plan.derive import WINDOW_AGGREGATES, check_frame, window_aggregate
from tidemark.plan.scalar_types import ScalarType, comparable, widest_numeric_kind
from tidemark.v1 import plan_pb2

_Func = plan_pb2.Aggregate.Func
_Kind = plan_pb2.Join.Kind


def lower(plan: plan_pb2.Plan | plan_pb2.Relation) -> Graph:
    """The operator graph of ``plan`` (a whole Plan, or just its root Relation).

    The plan library's ``check_plan`` validates the plan and gives the output schema (names,
    nullability); lowering derives the column types again for itself, since evaluation
    depends on them, and refuses to run if the two derivations disagree on the output."""
    if isinstance(plan, plan_pb2.Plan):
        schema = check_plan(plan)
        root = plan.root
    else:
        schema = derive_schema(plan)
        root = plan
    graph = Graph()
    root_node = _Lowering(graph).relation(root)
    graph.root = root_node.id
    declared = [ScalarType.of_column(column) for column in schema.columns]
    if len(declared) != len(root_node.types) or not all(
        a.same_type(b) for a, b in zip(declared, root_node.types, strict=True)
    ):
        raise Internal(
            "the engine derives output types "
            f"{[t.describe() for t in root_node.types]} but the plan library derives "
            f"{[t.describe() for t in declared]}"
        )
    graph.output_names = tuple(schema.names)
    graph.output_schema = schema
    return graph


def key_function(evaluators: Sequence[Callable[[Row], Any]]) -> KeyFunction:
    if not evaluators:
        return lambda row: ()
    if len(evaluators) == 1:
        (only,) = evaluators

        def one(row: Row) -> Key:
            return (only(row),)

        return one

    def many(row: Row) -> Key:
        return tuple([evaluate(row) for evaluate in evaluators])

    return many


def columns_key(columns: Sequence[int]) -> KeyFunction:
    if len(columns) == 1:
        (only,) = columns

        def one(row: Row) -> Key:
            return (row[only],)

        return one
    if not columns:
        return lambda row: ()
    return operator.itemgetter(*columns)


class _Lowering:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.lets: dict[int, Node] = {}

    def relation(self, relation: plan_pb2.Relation) -> Node:
        kind = relation.WhichOneof("kind")
        if kind is None:
            raise InvalidArgument(f"empty relation (node {len(self.graph.nodes)})")
        lower_kind: Callable[[Any], Node] = getattr(self, f"lower_{kind}")
        node = lower_kind(getattr(relation, kind))
        if node.relation is None:  # a shared node keeps the relation that made it
            node.relation = relation
        return node

    def where(self, kind: str) -> str:
        return f"{kind} (node {len(self.graph.nodes)})"

    # -- sources ---------------------------------------------------------------------------

    def lower_get(self, get: plan_pb2.Get) -> Node:
        where = self.where("get")
        if not get.collection_id:
            raise InvalidArgument(f"{where}: no collection id")
        types = from_schema(get.schema, where)
        existing = self.graph.inputs.get(get.collection_id)
        if existing is not None:
            node = self.graph.nodes[existing]
            if [t.with_nullable(True) for t in node.types] != [
                t.with_nullable(True) for t in types
            ]:
                raise InvalidArgument(
                    f"{where}: collection {get.collection_id!r} is read with two different schemas"
                )
            return node
        floats = [i for i, t in enumerate(types) if t.kind is ColumnType.FLOAT64]
        node = self.graph.add("get", (), types, GetSource(get.collection_id, Normalize(floats)))
        self.graph.inputs[get.collection_id] = node.id
        return node

    def lower_constant(self, constant: plan_pb2.Constant) -> Node:
        where = self.where("constant")
        types = from_schema(constant.schema, where)
        rows: list[tuple[Row, int]] = []
        for number, proto_row in enumerate(constant.rows):
            if len(proto_row.values) != len(types):
                raise InvalidArgument(
                    f"{where}: row {number} has {len(proto_row.values)} values for "
                    f"{len(types)} columns"
                )
            values = []
            for column, (datum, column_type) in enumerate(
                zip(proto_row.values, types, strict=True)
            ):
                value, value_type = datum_value(datum, f"{where} row {number} column {column}")
                _check_constant_value(
                    value, value_type, column_type, f"{where} row {number} column {column}"
                )
                values.append(value)
            rows.append((tuple(values), proto_row.diff or 1))
        return self.graph.add("constant", (), types, ConstantSource(tuple(rows)))

    # -- linear ----------------------------------------------------------------------------

    def lower_filter(self, filter_: plan_pb2.Filter) -> Node:
        source = self.relation(filter_.input)
        where = self.where("filter")
        predicates = [compile_scalar(p, source.types, where) for p in filter_.predicates]
        for predicate in predicates:
            if predicate.type.kind is not ColumnType.BOOL:
                raise InvalidArgument(
                    f"{where}: a predicate is {predicate.type.describe()}, not BOOL"
                )
        if not predicates:
            return source
        return self.graph.add(
            "filter", (source.id,), list(source.types), Filter([p.evaluate for p in predicates])
        )

    def lower_map(self, map_: plan_pb2.Map) -> Node:
        source = self.relation(map_.input)
        where = self.where("map")
        types = list(source.types)
        evaluators = []
        for expression in map_.expressions:
            compiled = compile_scalar(expression, types, where)
            types.append(compiled.type)
            evaluators.append(compiled.evaluate)
        if not evaluators:
            return source
        return self.graph.add("map", (source.id,), types, Map(evaluators))

    def lower_project(self, project: plan_pb2.Project) -> Node:
        source = self.relation(project.input)
        where = self.where("project")
        if not project.columns:
            raise InvalidArgument(f"{where}: a relation needs at least one column")
        for column in project.columns:
            if column >= len(source.types):
                raise InvalidArgument(
                    f"{where}: column {column} is out of range (the input has "
                    f"{len(source.types)} columns)"
                )
        types = [source.types[c] for c in project.columns]
        return self.graph.add("project", (source.id,), types, Project(list(project.columns)))

    def lower_union(self, union: plan_pb2.Union) -> Node:
        where = self.where("union")
        if not union.inputs:
            raise InvalidArgument(f"{where}: a union needs at least one input")
        sources = [self.relation(r) for r in union.inputs]
        first = sources[0].types
        types = list(first)
        for other in sources[1:]:
            if len(other.types) != len(first):
                raise InvalidArgument(
                    f"{where}: inputs have {len(first)} and {len(other.types)} columns"
                )
            for i, (a, b) in enumerate(zip(first, other.types, strict=True)):
                if not a.same_type(b):
                    raise InvalidArgument(
                        f"{where}: column {i} is {a.describe()} in one input and "
                        f"{b.describe()} in another"
                    )
                types[i] = types[i].with_nullable(types[i].nullable or b.nullable)
        if len(sources) == 1:
            return sources[0]
        return self.graph.add("union", tuple(s.id for s in sources), types, Union())

    def lower_negate(self, negate: plan_pb2.Negate) -> Node:
        source = self.relation(negate.input)
        return self.graph.add("negate", (source.id,), list(source.types), Negate())

    # -- stateful --------------------------------------------------------------------------

    def lower_threshold(self, threshold: plan_pb2.Threshold) -> Node:
        source = self.relation(threshold.input)
        return self.graph.add(
            "threshold", (source.id,), list(source.types), DistinctOperator(threshold=True)
        )

    def lower_distinct(self, distinct: plan_pb2.Distinct) -> Node:
        source = self.relation(distinct.input)
        return self.graph.add(
            "distinct", (source.id,), list(source.types), DistinctOperator(threshold=False)
        )

    def lower_join(self, join: plan_pb2.Join) -> Node:
        left = self.relation(join.left)
        right = self.relation(join.right)
        where = self.where("join")
        if len(join.left_keys) != len(join.right_keys):
            raise InvalidArgument(
                f"{where}: {len(join.left_keys)} left keys but {len(join.right_keys)} right keys"
            )
        left_keys, right_keys = [], []
        # Where a key is plain columns, hydration hashes them without evaluating the key per row.
        left_columns: list[int] | None = []
        right_columns: list[int] | None = []
        for i, (lk, rk) in enumerate(zip(join.left_keys, join.right_keys, strict=True)):
            a = compile_scalar(lk, left.types, f"{where} left key {i}")
            b = compile_scalar(rk, right.types, f"{where} right key {i}")
            if not comparable(a.type, b.type):
                raise InvalidArgument(
                    f"{where}: key {i} compares {a.type.describe()} with {b.type.describe()}"
                )
            left_keys.append(_key_part(a, b))
            right_keys.append(_key_part(b, a))
            left_columns = _plain_column(lk, a, b, left_columns)
            right_columns = _plain_column(rk, b, a, right_columns)
        kind = join.kind
        if kind not in (
            _Kind.KIND_INNER,
            _Kind.KIND_LEFT_OUTER,
            _Kind.KIND_RIGHT_OUTER,
            _Kind.KIND_FULL_OUTER,
        ):
            raise InvalidArgument(f"{where}: unknown join kind {kind}")
        keep_left = kind in (_Kind.KIND_LEFT_OUTER, _Kind.KIND_FULL_OUTER)
        keep_right = kind in (_Kind.KIND_RIGHT_OUTER, _Kind.KIND_FULL_OUTER)
        left_types = [t.with_nullable(True) if keep_right else t for t in left.types]
        right_types = [t.with_nullable(True) if keep_left else t for t in right.types]
        spec = JoinOperator(
            key_function(left_keys),
            key_function(right_keys),
            len(left.types),
            len(right.types),
            keep_left,
            keep_right,
            key_columns=(
                None if left_columns is None else tuple(left_columns),
                None if right_columns is None else tuple(right_columns),
            ),
        )
        return self.graph.add("join", (left.id, right.id), left_types + right_types, spec)

    def lower_reduce(self, reduce: plan_pb2.Reduce) -> Node:
        source = self.relation(reduce.input)
        where = self.where("reduce")
        for column in reduce.group_key:
            if column >= len(source.types):
                raise InvalidArgument(
                    f"{where}: group key column {column} is out of range (the input has "
                    f"{len(source.types)} columns)"
                )
        if not reduce.group_key and not reduce.aggregates:
            raise InvalidArgument(f"{where}: a relation needs at least one column")
        types = [source.types[c] for c in reduce.group_key]
        specs = []
        for i, aggregate in enumerate(reduce.aggregates):
            spec, result_type = _aggregate(aggregate, source.types, f"{where} aggregate {i}")
            specs.append(spec)
            types.append(result_type)
        operator_ = ReduceOperator(columns_key(list(reduce.group_key)), specs)
        return self.graph.add("reduce", (source.id,), types, operator_)

    def lower_top_k(self, top_k: plan_pb2.TopK) -> Node:
        source = self.relation(top_k.input)
        where = self.where("top_k")
        width = len(source.types)
        for column in [*top_k.group_key, *(key.column for key in top_k.order)]:
            if column >= width:
                raise InvalidArgument(
                    f"{where}: column {column} is out of range (the input has {width} columns)"
                )
        order = [(k.column, k.descending, k.descending != k.nulls_flipped) for k in top_k.order]
        sort_key = compile_sort_key(order, source.types)
        limit = top_k.limit if top_k.HasField("limit") else None
        spec = TopKOperator(columns_key(list(top_k.group_key)), sort_key, top_k.offset, limit)
        return self.graph.add("top_k", (source.id,), list(source.types), spec)

    def lower_window(self, window: plan_pb2.Window) -> Node:
        source = self.relation(window.input)
        where = self.where("window")
        width = len(source.types)
        for column in [*window.partition_key, *(key.column for key in window.order)]:
            if column >= width:
                raise InvalidArgument(
                    f"{where}: column {column} is out of range (the input has {width} columns)"
                )
        order = [(k.column, k.descending, k.descending != k.nulls_flipped) for k in window.order]
        types = list(source.types)
        specs = []
        for i, function in enumerate(window.functions):
            spec, result_type = _window_function(function, source.types, f"{where} function {i}")
            specs.append(spec)
            types.append(result_type)
        operator_ = WindowOperator(
            columns_key(list(window.partition_key)),
            compile_sort_key(order, source.types),
            compile_order_key(order, source.types),
            specs,
        )
        return self.graph.add("window", (source.id,), types, operator_)

    # -- sharing ---------------------------------------------------------------------------

    def lower_let(self, let: plan_pb2.Let) -> Node:
        value = self.relation(let.value)
        shadowed = self.lets.get(let.id)
        self.lets[let.id] = value
        try:
            return self.relation(let.body)
        finally:
            if shadowed is None:
                del self.lets[let.id]
            else:
                self.lets[let.id] = shadowed

    def lower_local_get(self, local_get: plan_pb2.LocalGet) -> Node:
        node = self.lets.get(local_get.id)
        if node is None:
            raise InvalidArgument(
                f"{self.where('local_get')}: no enclosing let binds id {local_get.id}"
            )
        return node


def _key_part(side: CompiledScalar, other: CompiledScalar) -> Callable[[Row], Any]:
    """A join key part, converted to the numeric kind both sides promote to so that equal keys
    are equal Python values (and encode to the same shard)."""
    if side.type.is_numeric and side.type.kind is not other.type.kind:
        return promoted(side, widest_numeric_kind([side.type, other.type]))
    return side.evaluate


def _plain_column(
    expr: plan_pb2.Scalar, side: CompiledScalar, other: CompiledScalar, columns: list[int] | None
) -> list[int] | None:
    """``columns`` and the column ``expr`` reads when the key part is that column as it is (a
    column reference not converted by :func:`_key_part`), else None."""
    if columns is None or expr.WhichOneof("kind") != "column":
        return None
    if side.type.is_numeric and side.type.kind is not other.type.kind:
        return None
    return [*columns, expr.column]


def _check_constant_value(
    value: Any, value_type: ScalarType, column: ScalarType, where: str
) -> None:
    if value_type.kind is not column.kind:
        raise InvalidArgument(
            f"{where}: a {value_type.kind.name} value in a {column.describe()} column"
        )
    if value is None:
        if not column.nullable:
            raise InvalidArgument(f"{where}: NULL in a NOT NULL column")
        return
    if column.kind is ColumnType.DECIMAL:
        if value_type.scale > column.scale or not decimals.fits(
            value, column.scale, column.precision
        ):
            raise InvalidArgument(f"{where}: {value} does not fit {column.describe()}")


_NUMERIC = (ColumnType.INT64, ColumnType.DECIMAL, ColumnType.FLOAT64)


def _aggregate(
    aggregate: plan_pb2.Aggregate, input_types: Sequence[ScalarType], where: str
) -> tuple[AggregateSpec, ScalarType]:
    func = aggregate.func
    if not aggregate.HasField("expression"):
        if func != _Func.FUNC_COUNT:
            raise InvalidArgument(f"{where}: only COUNT may omit its expression")
        if aggregate.distinct:
            raise InvalidArgument(f"{where}: COUNT(*) cannot be DISTINCT")
        return AggregateSpec(None, aggregates.CountRows), ScalarType(ColumnType.INT64, False)
    value = compile_scalar(aggregate.expression, input_types, where)
    kind = value.type.kind
    make: Callable[[], aggregates.Aggregate]
    if func == _Func.FUNC_COUNT:
        make, result = aggregates.CountValues, ScalarType(ColumnType.INT64, False)
    elif func in (_Func.FUNC_MIN, _Func.FUNC_MAX):
        maximum, is_float = func == _Func.FUNC_MAX, kind is ColumnType.FLOAT64

        def make() -> aggregates.Aggregate:
            return aggregates.Extreme(maximum, is_float)

        result = value.type
    elif func in (_Func.FUNC_SUM, _Func.FUNC_AVG):
        if kind not in _NUMERIC:
            name = "SUM" if func == _Func.FUNC_SUM else "AVG"
            raise InvalidArgument(f"{where}: {name} takes a number, got {value.type.describe()}")
        make, result = _numeric_aggregate(func == _Func.FUNC_AVG, value.type)
    else:
        raise InvalidArgument(f"{where}: unknown aggregate function {func}")
    if aggregate.distinct:
        plain = make

        def make() -> aggregates.Aggregate:
            return aggregates.Distinct(plain())

    return AggregateSpec(value.evaluate, make), result


_Window = plan_pb2.WindowFunction
_RANKING = (_Window.KIND_ROW_NUMBER, _Window.KIND_RANK, _Window.KIND_DENSE_RANK)
_VALUE_KINDS = (
    _Window.KIND_LAG,
    _Window.KIND_LEAD,
    _Window.KIND_FIRST_VALUE,
    _Window.KIND_LAST_VALUE,
)


def _window_function(
    function: plan_pb2.WindowFunction, input_types: Sequence[ScalarType], where: str
) -> tuple[WindowFunctionSpec, ScalarType]:
    kind = function.kind
    frame = function.frame if function.HasField("frame") else DEFAULT_FRAME
    try:
        check_frame(frame)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc.message}") from None
    if kind in _RANKING:
        if function.HasField("argument"):
            raise InvalidArgument(f"{where}: a ranking function takes no argument")
        return WindowFunctionSpec(kind), ScalarType(ColumnType.INT64, False)
    if kind in WINDOW_AGGREGATES:
        aggregate_spec, result = _aggregate(window_aggregate(function), input_types, where)
        if kind != _Window.KIND_COUNT:
            result = result.with_nullable(True)  # an empty frame gives NULL
        spec = WindowFunctionSpec(
            kind, argument=aggregate_spec.value, frame=frame, new_aggregate=aggregate_spec.new_state
        )
        return spec, result
    if kind not in _VALUE_KINDS:
        raise InvalidArgument(f"{where}: unknown window function kind {kind}")
    if not function.HasField("argument"):
        raise InvalidArgument(f"{where}: the function needs an argument")
    argument = compile_scalar(function.argument, input_types, where)
    default = None
    if function.HasField("default"):
        compiled = compile_scalar(function.default, input_types, where)
        if not compiled.type.same_type(argument.type):
            raise InvalidArgument(
                f"{where}: the default is {compiled.type.describe()}, the argument "
                f"{argument.type.describe()}"
            )
        default = compiled.evaluate
    offset = function.offset if function.HasField("offset") else 1
    spec = WindowFunctionSpec(kind, argument.evaluate, default, offset, frame)
    return spec, argument.type.with_nullable(True)


def _numeric_aggregate(
    average: bool, input_type: ScalarType
) -> tuple[Callable[[], aggregates.Aggregate], ScalarType]:
    kind = input_type.kind
    if kind is ColumnType.FLOAT64:
        float_state = aggregates.AvgFloat if average else aggregates.SumFloat
        return float_state, ScalarType(ColumnType.FLOAT64, input_type.nullable)
    scale = input_type.scale if kind is ColumnType.DECIMAL else 0
    if not average:
        return (lambda: aggregates.SumExact(scale)), computed_decimal(scale)
    if kind is ColumnType.INT64:
        return (lambda: aggregates.AvgExact(0, None)), ScalarType(
            ColumnType.FLOAT64, input_type.nullable
        )
    result_scale = min(MAX_DECIMAL_PRECISION, scale + 6)
    return (lambda: aggregates.AvgExact(scale, result_scale)), computed_decimal(result_scale)


def aggregate_spec(
    aggregate: plan_pb2.Aggregate, input_types: Sequence[ScalarType], where: str = "aggregate"
) -> tuple[AggregateSpec, ScalarType]:
    """One Reduce aggregate as the engine evaluates it: its value and incremental state, and
    its result type. The Spark lowering's fallbacks reuse it."""
    return _aggregate(aggregate, input_types, where)


def window_function_spec(
    function: plan_pb2.WindowFunction, input_types: Sequence[ScalarType], where: str = "window"
) -> tuple[WindowFunctionSpec, ScalarType]:
    """One window function as the engine evaluates it, and its result type."""
    return _window_function(function, input_types, where)
