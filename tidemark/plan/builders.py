"""Concise constructors for plan messages.

Meant to be imported as a module: ``from tidemark.plan import builders as pb``, then
``pb.filter(pb.get("u1", schema), pb.call("gt", pb.column(1), pb.literal(10, INT64)))``.
Builders do not validate; ``tidemark.plan.check_plan`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.plan.datum import datum_type, to_datum
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import common_pb2, plan_pb2

JoinKind = Literal["inner", "left_outer", "right_outer", "full_outer"]
AggregateName = Literal["count", "sum", "min", "max", "avg"]
WindowFunctionName = Literal[
    "row_number",
    "rank",
    "dense_rank",
    "lag",
    "lead",
    "first_value",
    "last_value",
    "count",
    "sum",
    "min",
    "max",
    "avg",
]
FrameBound = Literal[
    "unbounded_preceding", "preceding", "current_row", "following", "unbounded_following"
]
Schema = RelationSchema | common_pb2.RelationSchema

_JOIN_KINDS: dict[str, plan_pb2.Join.Kind.ValueType] = {
    "inner": plan_pb2.Join.KIND_INNER,
    "left_outer": plan_pb2.Join.KIND_LEFT_OUTER,
    "right_outer": plan_pb2.Join.KIND_RIGHT_OUTER,
    "full_outer": plan_pb2.Join.KIND_FULL_OUTER,
}
_AGGREGATES: dict[str, plan_pb2.Aggregate.Func.ValueType] = {
    "count": plan_pb2.Aggregate.FUNC_COUNT,
    "sum": plan_pb2.Aggregate.FUNC_SUM,
    "min": plan_pb2.Aggregate.FUNC_MIN,
    "max": plan_pb2.Aggregate.FUNC_MAX,
    "avg": plan_pb2.Aggregate.FUNC_AVG,
}


def _schema_proto(schema: Schema) -> common_pb2.RelationSchema:
    return schema.to_proto() if isinstance(schema, RelationSchema) else schema


# Relations --------------------------------------------------------------------------------


def plan(root: plan_pb2.Relation, output_schema: Schema | None = None) -> plan_pb2.Plan:
    result = plan_pb2.Plan(root=root)
    if output_schema is not None:
        result.output_schema.CopyFrom(_schema_proto(output_schema))
    return result


def get(collection_id: str, schema: Schema | None = None) -> plan_pb2.Relation:
    node = plan_pb2.Get(collection_id=collection_id)
    if schema is not None:
        node.schema.CopyFrom(_schema_proto(schema))
    return plan_pb2.Relation(get=node)


def constant(
    schema: RelationSchema, rows: Iterable[Sequence[Any] | tuple[Sequence[Any], int]]
) -> plan_pb2.Relation:
    """Fixed rows of ``schema``: each a sequence of Python values, or ``(values, diff)``."""
    node = plan_pb2.Constant(schema=schema.to_proto())
    for entry in rows:
        diff = 1
        if (
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[0], Sequence)
            and not isinstance(entry[0], str | bytes)
            and isinstance(entry[1], int)
            and not isinstance(entry[1], bool)
        ):
            values, diff = entry
        else:
            values = entry
        datums = [to_datum(v, c) for v, c in zip(values, schema.columns, strict=True)]
        node.rows.append(plan_pb2.ConstantRow(values=datums, diff=diff))
    return plan_pb2.Relation(constant=node)


def filter(input: plan_pb2.Relation, *predicates: plan_pb2.Scalar) -> plan_pb2.Relation:
    return plan_pb2.Relation(filter=plan_pb2.Filter(input=input, predicates=predicates))


def map(input: plan_pb2.Relation, *expressions: plan_pb2.Scalar) -> plan_pb2.Relation:
    return plan_pb2.Relation(map=plan_pb2.Map(input=input, expressions=expressions))


def project(input: plan_pb2.Relation, *columns: int) -> plan_pb2.Relation:
    return plan_pb2.Relation(project=plan_pb2.Project(input=input, columns=columns))


def union(*inputs: plan_pb2.Relation) -> plan_pb2.Relation:
    return plan_pb2.Relation(union=plan_pb2.Union(inputs=inputs))


def negate(input: plan_pb2.Relation) -> plan_pb2.Relation:
    return plan_pb2.Relation(negate=plan_pb2.Negate(input=input))


def threshold(input: plan_pb2.Relation) -> plan_pb2.Relation:
    return plan_pb2.Relation(threshold=plan_pb2.Threshold(input=input))


def distinct(input: plan_pb2.Relation) -> plan_pb2.Relation:
    return plan_pb2.Relation(distinct=plan_pb2.Distinct(input=input))


def join(
    left: plan_pb2.Relation,
    right: plan_pb2.Relation,
    left_keys: Sequence[plan_pb2.Scalar | int] = (),
    right_keys: Sequence[plan_pb2.Scalar | int] = (),
    kind: JoinKind = "inner",
) -> plan_pb2.Relation:
    """An equi-join; keys given as ints are column positions of their own side."""
    node = plan_pb2.Join(
        left=left,
        right=right,
        left_keys=[_scalar(k) for k in left_keys],
        right_keys=[_scalar(k) for k in right_keys],
        kind=_JOIN_KINDS[kind],
    )
    return plan_pb2.Relation(join=node)


def aggregate(
    func: AggregateName, expression: plan_pb2.Scalar | int | None = None, *, distinct: bool = False
) -> plan_pb2.Aggregate:
    """One aggregate; ``aggregate("count")`` is COUNT(*), an int argument is a column."""
    node = plan_pb2.Aggregate(func=_AGGREGATES[func], distinct=distinct)
    if expression is not None:
        node.expression.CopyFrom(_scalar(expression))
    return node


def reduce(
    input: plan_pb2.Relation,
    group_key: Sequence[int] = (),
    aggregates: Sequence[plan_pb2.Aggregate] = (),
) -> plan_pb2.Relation:
    node = plan_pb2.Reduce(input=input, group_key=group_key, aggregates=aggregates)
    return plan_pb2.Relation(reduce=node)


def sort_key(
    column: int, descending: bool = False, nulls_flipped: bool = False
) -> plan_pb2.SortKey:
    return plan_pb2.SortKey(column=column, descending=descending, nulls_flipped=nulls_flipped)


def top_k(
    input: plan_pb2.Relation,
    group_key: Sequence[int] = (),
    order: Sequence[plan_pb2.SortKey | int] = (),
    limit: int | None = None,
    offset: int = 0,
) -> plan_pb2.Relation:
    """Top-k per group; ``order`` entries given as ints sort that column ascending."""
    keys = [k if isinstance(k, plan_pb2.SortKey) else sort_key(k) for k in order]
    node = plan_pb2.TopK(input=input, group_key=group_key, order=keys, offset=offset)
    if limit is not None:
        node.limit = limit
    return plan_pb2.Relation(top_k=node)


def window(
    input: plan_pb2.Relation,
    partition_key: Sequence[int] = (),
    order: Sequence[plan_pb2.SortKey | int] = (),
    functions: Sequence[plan_pb2.WindowFunction] = (),
) -> plan_pb2.Relation:
    """Window functions per partition; ``order`` entries given as ints sort ascending."""
    keys = [k if isinstance(k, plan_pb2.SortKey) else sort_key(k) for k in order]
    node = plan_pb2.Window(
        input=input, partition_key=partition_key, order=keys, functions=functions
    )
    return plan_pb2.Relation(window=node)


def window_function(
    kind: WindowFunctionName,
    argument: plan_pb2.Scalar | int | None = None,
    *,
    offset: int | None = None,
    default: plan_pb2.Scalar | int | None = None,
    frame: plan_pb2.WindowFrame | None = None,
) -> plan_pb2.WindowFunction:
    """One window function; an int argument or default is a column."""
    node = plan_pb2.WindowFunction(kind=plan_pb2.WindowFunction.Kind.Value(f"KIND_{kind.upper()}"))
    if argument is not None:
        node.argument.CopyFrom(_scalar(argument))
    if offset is not None:
        node.offset = offset
    if default is not None:
        node.default.CopyFrom(_scalar(default))
    if frame is not None:
        node.frame.CopyFrom(frame)
    return node


def frame(
    mode: Literal["rows", "range"],
    start: FrameBound | tuple[FrameBound, int],
    end: FrameBound | tuple[FrameBound, int],
) -> plan_pb2.WindowFrame:
    """A window frame; a bound with an offset is ``("preceding", 2)``."""
    result = plan_pb2.WindowFrame(mode=plan_pb2.WindowFrame.Mode.Value(f"MODE_{mode.upper()}"))
    for target, bound in ((result.start, start), (result.end, end)):
        name, offset = bound if isinstance(bound, tuple) else (bound, 0)
        target.kind = plan_pb2.WindowFrameBound.Kind.Value(f"KIND_{name.upper()}")
        target.offset = offset
    return result


def let(id: int, value: plan_pb2.Relation, body: plan_pb2.Relation) -> plan_pb2.Relation:
    return plan_pb2.Relation(let=plan_pb2.Let(id=id, value=value, body=body))


def local_get(id: int) -> plan_pb2.Relation:
    return plan_pb2.Relation(local_get=plan_pb2.LocalGet(id=id))


# Scalars ----------------------------------------------------------------------------------


def _scalar(expr: plan_pb2.Scalar | int) -> plan_pb2.Scalar:
    return column(expr) if isinstance(expr, int) else expr


def column(position: int) -> plan_pb2.Scalar:
    return plan_pb2.Scalar(column=position)


def _target(to: ColumnType | Column | ScalarType) -> common_pb2.Column:
    if isinstance(to, Column):
        return to.to_proto()
    if isinstance(to, ScalarType):
        return to.column("cast").to_proto()
    return common_pb2.Column(type=to.value)  # type: ignore[arg-type]


def literal(value: Any, type: ColumnType | Column | ScalarType) -> plan_pb2.Scalar:
    """A literal of ``type`` (``None`` is NULL). For a decimal type with a precision and
    scale, the literal is cast to exactly that type."""
    datum = to_datum(value, type)
    expr = plan_pb2.Scalar(literal=datum)
    if isinstance(type, Column | ScalarType) and type.precision:
        natural = datum_type(datum)
        if (natural.precision, natural.scale) != (type.precision, type.scale):
            return cast(expr, type)
    return expr


def call(function: str, *args: plan_pb2.Scalar | int) -> plan_pb2.Scalar:
    """``function(args)``; int arguments are column positions."""
    node = plan_pb2.Call(function=function, args=[_scalar(a) for a in args])
    return plan_pb2.Scalar(call=node)


def case(
    cond: plan_pb2.Scalar | int, then: plan_pb2.Scalar | int, otherwise: plan_pb2.Scalar | int
) -> plan_pb2.Scalar:
    """CASE WHEN cond THEN then ELSE otherwise END; int arguments are column positions."""
    node = plan_pb2.Case(cond=_scalar(cond), then=_scalar(then), otherwise=_scalar(otherwise))
    return plan_pb2.Scalar(case=node)


def cast(expr: plan_pb2.Scalar | int, to: ColumnType | Column | ScalarType) -> plan_pb2.Scalar:
    return plan_pb2.Scalar(cast=plan_pb2.Cast(input=_scalar(expr), to=_target(to)))
