"""A readable, indented text rendering of plans (what EXPLAIN shows).

One line per relation node, children indented below it; columns appear as ``#i`` (positions in
the node's input). Rendering does not validate: a malformed plan renders as far as it goes.
"""

from __future__ import annotations

import datetime
from decimal import Decimal

from tidemark.columnar import ColumnType
from tidemark.errors import InvalidArgument
from tidemark.plan.cardinality import Env, is_cross_product
from tidemark.plan.datum import from_datum
from tidemark.plan.derive import (
    AGGREGATE_NAMES,
    BOUND_NAMES,
    JOIN_KIND_NAMES,
    WINDOW_FUNCTION_NAMES,
)
from tidemark.v1 import common_pb2, plan_pb2

INDENT = "  "
# Constant rows shown before the rest are summarised.
SHOWN_ROWS = 5


def explain(plan: plan_pb2.Plan | plan_pb2.Relation) -> str:
    """The plan as indented text, one node per line (no trailing newline)."""
    lines: list[str] = []
    if isinstance(plan, plan_pb2.Plan):
        if plan.output_schema.columns:
            lines.append(f"Output {_columns(plan.output_schema)}")
            _relation(plan.root, 1, lines)
        else:
            _relation(plan.root, 0, lines)
    else:
        _relation(plan, 0, lines)
    return "\n".join(lines)


def _type_name(column: common_pb2.Column) -> str:
    try:
        kind = ColumnType(column.type)
    except ValueError:
        return f"type{column.type}"
    if kind is ColumnType.DECIMAL:
        return f"decimal({column.precision or 38},{column.scale})"
    return kind.name.lower()


def _columns(schema: common_pb2.RelationSchema) -> str:
    shown = (f"{c.name} {_type_name(c)}{'' if c.nullable else ' not null'}" for c in schema.columns)
    return f"({', '.join(shown)})"


def _positions(positions: list[int]) -> str:
    return ", ".join(f"#{p}" for p in positions)


def _relation(rel: plan_pb2.Relation, depth: int, lines: list[str], env: Env | None = None) -> None:
    pad = INDENT * depth
    kind = rel.WhichOneof("kind")

    def line(text: str) -> None:
        lines.append(pad + text)

    def child(node: plan_pb2.Relation, label: str | None = None, inner: Env | None = None) -> None:
        scope = env if inner is None else inner
        if label is not None:
            lines.append(pad + INDENT + label)
            _relation(node, depth + 2, lines, scope)
        else:
            _relation(node, depth + 1, lines, scope)

    if kind == "get":
        line(f"Get {rel.get.collection_id} {_columns(rel.get.schema)}")
    elif kind == "constant":
        rows = rel.constant.rows
        line(f"Constant {_columns(rel.constant.schema)} {len(rows)} rows")
        for row in rows[:SHOWN_ROWS]:
            diff = row.diff or 1
            values = ", ".join(_literal(v) for v in row.values)
            lines.append(pad + INDENT + f"({values})" + (f" x{diff}" if diff != 1 else ""))
        if len(rows) > SHOWN_ROWS:
            lines.append(pad + INDENT + f"... {len(rows) - SHOWN_ROWS} more")
    elif kind == "filter":
        line(f"Filter {', '.join(scalar_text(p) for p in rel.filter.predicates)}")
        child(rel.filter.input)
    elif kind == "map":
        line(f"Map {', '.join(scalar_text(e) for e in rel.map.expressions)}")
        child(rel.map.input)
    elif kind == "project":
        line(f"Project {_positions(list(rel.project.columns))}")
        child(rel.project.input)
    elif kind == "union":
        line("Union")
        for branch in rel.union.inputs:
            child(branch)
    elif kind in ("negate", "threshold", "distinct"):
        line(kind.capitalize())
        child(getattr(rel, kind).input)
    elif kind == "join":
        join = rel.join
        keys = [
            f"{scalar_text(lk)} = {scalar_text(rk)}"
            for lk, rk in zip(join.left_keys, join.right_keys, strict=False)
        ]
        if keys:
            on = f" on {', '.join(keys)}"
        elif is_cross_product(join, env):
            on = " (cross product)"
        else:
            on = " (no keys: one side has at most one row)"
        line(f"Join {JOIN_KIND_NAMES.get(join.kind, f'kind{join.kind}')}{on}")
        child(join.left, "left:")
        child(join.right, "right:")
    elif kind == "reduce":
        reduce = rel.reduce
        aggregates = ", ".join(_aggregate(a) for a in reduce.aggregates)
        line(f"Reduce group=[{_positions(list(reduce.group_key))}] aggregates=[{aggregates}]")
        child(reduce.input)
    elif kind == "top_k":
        top = rel.top_k
        order = ", ".join(_sort_key(k) for k in top.order)
        limit = f" limit={top.limit}" if top.HasField("limit") else ""
        offset = f" offset={top.offset}" if top.offset else ""
        line(f"TopK group=[{_positions(list(top.group_key))}] order=[{order}]{limit}{offset}")
        child(top.input)
    elif kind == "window":
        window = rel.window
        order = ", ".join(_sort_key(k) for k in window.order)
        functions = ", ".join(_window_function(f) for f in window.functions)
        line(
            f"Window partition=[{_positions(list(window.partition_key))}] order=[{order}] "
            f"functions=[{functions}]"
        )
        child(window.input)
    elif kind == "let":
        line(f"Let l{rel.let.id}")
        child(rel.let.value, "value:")
        child(rel.let.body, "body:", {**(env or {}), rel.let.id: rel.let.value})
    elif kind == "local_get":
        line(f"LocalGet l{rel.local_get.id}")
    else:
        line("<empty relation>")


def _aggregate(aggregate: plan_pb2.Aggregate) -> str:
    name = AGGREGATE_NAMES.get(aggregate.func, f"aggregate{aggregate.func}")
    if not aggregate.HasField("expression"):
        return f"{name}(*)"
    distinct = "distinct " if aggregate.distinct else ""
    return f"{name}({distinct}{scalar_text(aggregate.expression)})"


def _window_function(function: plan_pb2.WindowFunction) -> str:
    name = WINDOW_FUNCTION_NAMES.get(function.kind, f"window{function.kind}")
    args = []
    if function.HasField("argument"):
        args.append(scalar_text(function.argument))
    elif function.kind == plan_pb2.WindowFunction.KIND_COUNT:
        args.append("*")
    if function.HasField("offset") or function.HasField("default"):
        args.append(str(function.offset if function.HasField("offset") else 1))
    if function.HasField("default"):
        args.append(scalar_text(function.default))
    text = f"{name}({', '.join(args)})"
    if function.HasField("frame"):
        text += f" {_frame(function.frame)}"
    return text


def _frame(frame: plan_pb2.WindowFrame) -> str:
    mode = "rows" if frame.mode == plan_pb2.WindowFrame.MODE_ROWS else "range"
    return f"{mode} between {_bound(frame.start)} and {_bound(frame.end)}"


def _bound(bound: plan_pb2.WindowFrameBound) -> str:
    name = BOUND_NAMES.get(bound.kind, f"bound{bound.kind}")
    if bound.kind in (
        plan_pb2.WindowFrameBound.KIND_PRECEDING,
        plan_pb2.WindowFrameBound.KIND_FOLLOWING,
    ):
        return f"{bound.offset} {name}"
    return name


def _sort_key(key: plan_pb2.SortKey) -> str:
    nulls_first = key.descending != key.nulls_flipped
    text = f"#{key.column}{' desc' if key.descending else ''}"
    default_first = key.descending
    if nulls_first != default_first:
        text += " nulls first" if nulls_first else " nulls last"
    return text


def scalar_text(expr: plan_pb2.Scalar) -> str:
    """One expression as text: ``#i`` for columns, SQL-like literals, ``name(args)`` calls."""
    kind = expr.WhichOneof("kind")
    if kind == "column":
        return f"#{expr.column}"
    if kind == "literal":
        return _literal(expr.literal)
    if kind == "call":
        return f"{expr.call.function}({', '.join(scalar_text(a) for a in expr.call.args)})"
    if kind == "case":
        case = expr.case
        return (
            f"case when {scalar_text(case.cond)} then {scalar_text(case.then)} "
            f"else {scalar_text(case.otherwise)} end"
        )
    if kind == "cast":
        return f"cast({scalar_text(expr.cast.input)} as {_type_name(expr.cast.to)})"
    return "<empty scalar>"


def _literal(datum: plan_pb2.Datum) -> str:
    try:
        value = from_datum(datum)
        kind = ColumnType(datum.type)
    except (InvalidArgument, ValueError):
        return "<bad literal>"
    if value is None:
        return f"null::{kind.name.lower()}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        quoted = "'" + value.replace("'", "''") + "'"
        return f"json {quoted}" if kind is ColumnType.JSON else quoted
    if isinstance(value, bytes):
        return f"'\\x{value.hex()}'"
    if isinstance(value, datetime.datetime):
        return f"timestamp '{value.isoformat(sep=' ')}'"
    if isinstance(value, datetime.date):
        return f"date '{value.isoformat()}'"
    if isinstance(value, Decimal):
        return datum.decimal_value
    return repr(value)
