"""GROUP BY, aggregate calls and HAVING: the Reduce node and the names after it.

After aggregation a query sees one row per group: its key columns and aggregate results. An
expression there is lowered by substitution: a subexpression equal to a GROUP BY key (compared
as lowered plan scalars) or an aggregate call becomes that column, and any other column
reference is a grouping error (42803), as in PostgreSQL.

Aggregate results follow PostgreSQL: COUNT is bigint; SUM of bigint is numeric; AVG of
integers is numeric (computed over numeric(38,10), giving 16 fractional digits); a global
aggregate over no rows still yields one row (COUNT 0, the others NULL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.correlation import Correlation, all_groups
from services.adapter.sql.errors import (
    GROUPING_ERROR,
    UNDEFINED_FUNCTION,
    SqlError,
    not_supported,
)
from services.adapter.sql.expressions import (
    Lowerer,
    SubqueryPlanner,
    contains_aggregate,
    contains_subquery,
    is_aggregate,
)
from services.adapter.sql.names import identifier, position
from services.adapter.sql.scope import Frame, Scope, ScopeColumn
from services.adapter.sql.typed import Typed
from services.adapter.sql.types import type_name
from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType
from tidemark.v1 import plan_pb2

# AVG over integers runs on this type, so the result is numeric(38, 16).
_AVG_INPUT = ScalarType.decimal(MAX_PRECISION, 10)
_NO_ORDER = {ColumnType.BOOL, ColumnType.JSON, ColumnType.BYTES}


def aggregate_key(node: exp.Expr) -> str:
    return node.sql(dialect="postgres")


def aggregates_inside(window: exp.Window) -> list[exp.Expr]:
    """The parts of a window call lowered over the grouped frame, where aggregate calls may
    appear: the function's arguments, PARTITION BY and ORDER BY."""
    function = window.this
    if isinstance(function, exp.Filter):
        parts = [*function.this.iter_expressions(), function.expression]
    else:
        parts = list(function.iter_expressions()) if isinstance(function, exp.Expr) else []
    parts += list(window.args.get("partition_by") or [])
    order = window.args.get("order")
    if order is not None:
        parts += [entry.this for entry in order.expressions]
    return parts


def collect_aggregates(nodes: Sequence[exp.Expr | None]) -> list[exp.Expr]:
    """The aggregate calls in ``nodes`` outside subqueries, each once, in order."""
    found: dict[str, exp.Expr] = {}

    def visit(node: exp.Expr) -> None:
        if isinstance(node, exp.Window):
            # The window function itself is not a grouping aggregate, but its arguments,
            # PARTITION BY and ORDER BY are lowered after grouping and may hold aggregates.
            for part in aggregates_inside(node):
                visit(part)
            return
        if is_aggregate(node):
            found.setdefault(aggregate_key(node), node)
            return
        if isinstance(node, exp.Subquery | exp.Exists | exp.Query):
            return
        for child in node.iter_expressions():
            visit(child)

    for node in nodes:
        if node is not None:
            visit(node)
    return list(found.values())


def _scalar_key(value: Typed) -> bytes:
    return value.scalar.SerializeToString(deterministic=True)


@dataclass
class Grouping:
    """Substitution for expressions after aggregation."""

    input_frame: Frame
    planner: SubqueryPlanner
    clause: str
    # Lowered GROUP BY keys (scalars over the input) -> output column.
    keys: dict[bytes, int] = field(default_factory=dict)
    # GROUP BY keys holding subqueries, matched by their SQL text instead.
    key_texts: dict[str, int] = field(default_factory=dict)
    aggregates: dict[str, int] = field(default_factory=dict)

    def substitute(self, node: exp.Expr, lowerer: Lowerer) -> Typed | None:
        if is_aggregate(node):
            column = self.aggregates.get(aggregate_key(node))
            if column is None:
                raise SqlError(
                    GROUPING_ERROR,
                    f"aggregate functions are not allowed in {lowerer.clause}",
                    position(node),
                )
            return lowerer.frame.column(column)
        if contains_aggregate(node):
            return None
        if contains_subquery(node):
            column = self.key_texts.get(aggregate_key(node))
            return lowerer.frame.column(column) if column is not None else None
        if isinstance(node, exp.Literal | exp.Boolean | exp.Null):
            return None
        try:
            value = Lowerer(
                Frame(self.input_frame.rel, self.input_frame.scope), self.planner, self.clause
            ).lower(node)
        except SqlError:
            if isinstance(node, exp.Column):
                raise
            return None
        column = self.keys.get(_scalar_key(value))
        if column is not None:
            return lowerer.frame.column(column)
        if isinstance(node, exp.Column):
            name = node.sql(dialect="postgres")
            raise SqlError(
                GROUPING_ERROR,
                f'column "{name}" must appear in the GROUP BY clause or be used in an '
                "aggregate function",
                position(node),
            )
        return None


def _aggregate_argument(node: exp.Expr) -> tuple[exp.Expr | None, bool]:
    """The argument of an aggregate call and whether it is DISTINCT (None for ``*``)."""
    argument = node.this
    if isinstance(argument, exp.Distinct):
        if len(argument.expressions) != 1:
            raise not_supported("DISTINCT aggregates over several arguments", position(node))
        return argument.expressions[0], True
    if isinstance(argument, exp.Star) or argument is None:
        return None, False
    if node.expressions:
        raise not_supported(f"{node.key}() with several arguments", position(node))
    return argument, False


def lower_aggregate(
    node: exp.Expr, lowerer: Lowerer, *, nested: bool = False
) -> tuple[plan_pb2.Aggregate, bool]:
    """One aggregate call over the input frame; also whether it is a COUNT. ``nested``
    allows aggregate calls in the argument (a window aggregate over grouped rows, whose
    inner aggregates the lowerer's substitution reads)."""
    where = position(node)
    condition: Typed | None = None
    if isinstance(node, exp.Filter):
        clause = node.expression
        condition = lowerer.condition(
            clause.this if isinstance(clause, exp.Where) else clause, "FILTER"
        )
        node = node.this
    if not isinstance(node, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max):
        raise not_supported(f"aggregate function {node.key}()", where)
    name = str(node.key)
    argument, distinct = _aggregate_argument(node)
    if argument is not None and not nested and contains_aggregate(argument):
        raise SqlError(GROUPING_ERROR, "aggregate function calls cannot be nested", where)
    if argument is None:
        if not isinstance(node, exp.Count):
            raise SqlError(UNDEFINED_FUNCTION, f"function {name}(*) does not exist", where)
        if condition is None:
            return pb.aggregate("count"), True
        flag = t.case(condition, t.true_literal(), t.null(t.BOOL))
        return pb.aggregate("count", flag.scalar), True
    value = t.resolve(lowerer.lower(argument))
    if condition is not None:
        value = t.case(condition, value, t.null(value.type))
    if isinstance(node, exp.Count):
        return pb.aggregate("count", value.scalar, distinct=distinct), True
    kind = value.type.kind
    if isinstance(node, exp.Sum | exp.Avg) and not value.type.is_numeric:
        raise SqlError(
            UNDEFINED_FUNCTION, f"function {name}({type_name(value.type)}) does not exist", where
        )
    if isinstance(node, exp.Min | exp.Max) and kind in _NO_ORDER:
        raise SqlError(
            UNDEFINED_FUNCTION, f"function {name}({type_name(value.type)}) does not exist", where
        )
    if isinstance(node, exp.Avg) and kind is ColumnType.INT64:
        value = t.cast(value, _AVG_INPUT)
    func = {"sum": "sum", "avg": "avg", "min": "min", "max": "max"}[name]
    return pb.aggregate(func, value.scalar, distinct=distinct), False  # type: ignore[arg-type]


@dataclass
class GroupedQuery:
    """The frame after aggregation and the substitution that reads it."""

    frame: Frame
    grouping: Grouping


def group_key_nodes(
    select: exp.Select, outputs: Sequence[exp.Expr], input_scope: Scope
) -> list[exp.Expr]:
    """GROUP BY items as expressions over the input: ``GROUP BY 2`` is the second select
    item, and a bare name that no input column has is a select item's alias."""
    group = select.args.get("group")
    if group is None:
        return []
    for unsupported in ("rollup", "cube", "grouping_sets", "totals", "all"):
        if group.args.get(unsupported):
            raise not_supported(f"GROUP BY {unsupported.upper()}", position(group))
    nodes: list[exp.Expr] = []
    for item in group.expressions:
        if isinstance(item, exp.Rollup | exp.Cube | exp.GroupingSets):
            raise not_supported(f"GROUP BY {item.key.upper()}", position(item))
        nodes.append(_group_item(item, outputs, input_scope))
    return nodes


def _unalias(node: exp.Expr) -> exp.Expr:
    return node.this if isinstance(node, exp.Alias) else node


def _group_item(item: exp.Expr, outputs: Sequence[exp.Expr], input_scope: Scope) -> exp.Expr:
    where = position(item)
    if isinstance(item, exp.Literal) and not item.is_string:
        index = int(item.this) if str(item.this).isdigit() else 0
        if not 1 <= index <= len(outputs):
            raise SqlError("42P10", f"GROUP BY position {item.this} is not in select list", where)
        chosen = _unalias(outputs[index - 1])
        if isinstance(chosen, exp.Star) or (
            isinstance(chosen, exp.Column) and isinstance(chosen.this, exp.Star)
        ):
            raise SqlError("42P10", "GROUP BY position refers to *", where)
        if contains_aggregate(chosen):
            raise SqlError(GROUPING_ERROR, "aggregate functions are not allowed in GROUP BY", where)
        return chosen
    if isinstance(item, exp.Column) and not item.args.get("table"):
        name = identifier(item.this)
        known = any(c.name == name and not c.qualified_only for c in input_scope.columns)
        if not known:
            for output in outputs:
                if isinstance(output, exp.Alias) and identifier(output.args["alias"]) == name:
                    aliased: exp.Expr = output.this
                    return aliased
    if contains_aggregate(item):
        raise SqlError(GROUPING_ERROR, "aggregate functions are not allowed in GROUP BY", where)
    return item


def aggregate(
    frame: Frame,
    planner: SubqueryPlanner,
    key_nodes: Sequence[exp.Expr],
    aggregate_nodes: Sequence[exp.Expr],
    has_group_by: bool,
    correlation: Correlation | None = None,
) -> GroupedQuery:
    """Reduces ``frame`` by the keys, computing the aggregates. In a correlated subquery the
    outer values (the frame's first columns) are keys too, and lead the output."""
    lowerer = Lowerer(frame, planner, "GROUP BY")
    key_values = [lowerer.lower(node) for node in key_nodes]
    key_values = [t.resolve(v) for v in key_values]
    computed = [v for v in key_values if v.scalar.WhichOneof("kind") != "column"]
    refs = iter(frame.add(computed))
    width = correlation.width if correlation is not None else 0
    positions: list[int] = list(range(width))
    scalar_keys: dict[bytes, int] = {_scalar_key(frame.column(i)): i for i in range(width)}
    for value in key_values:
        column = value if value.scalar.WhichOneof("kind") == "column" else next(refs)
        index = column.scalar.column
        if index in positions:
            scalar_keys.setdefault(_scalar_key(value), positions.index(index))
            continue
        scalar_keys.setdefault(_scalar_key(value), len(positions))
        positions.append(index)
    aggregate_lowerer = Lowerer(frame, planner, "aggregate function calls")
    lowered = [lower_aggregate(node, aggregate_lowerer) for node in aggregate_nodes]
    if not positions and not lowered:
        # HAVING without aggregates: still one group, which Reduce needs a column for.
        lowered.append((pb.aggregate("count"), True))
    reduced = r.reduce(frame.rel, positions, [a for a, _ in lowered])
    if not has_group_by and correlation is not None and width:
        reduced = all_groups(reduced, correlation, [is_count for _, is_count in lowered])
    elif not has_group_by:
        reduced = _one_row_always(reduced, [is_count for _, is_count in lowered])
    grouping = Grouping(frame, planner, "SELECT")
    grouping.keys = scalar_keys
    for node, value in zip(key_nodes, key_values, strict=True):
        if contains_subquery(node):
            grouping.key_texts[aggregate_key(node)] = scalar_keys[_scalar_key(value)]
    grouping.aggregates = {
        aggregate_key(node): len(positions) + i for i, node in enumerate(aggregate_nodes)
    }
    scope = Scope([ScopeColumn("") for _ in reduced.types], parent=frame.scope)
    if width:
        scope.correlation = correlation
    return GroupedQuery(Frame(reduced, scope), grouping)


def _one_row_always(reduced: r.Rel, counts: Sequence[bool]) -> r.Rel:
    """A global aggregate's single row even over no input: joined to a one-row relation
    (left outer), the aggregates are NULL when there were no rows, and counts become 0."""
    joined = r.join(r.one_row(), reduced, kind="left_outer")
    fixed = []
    for index, is_count in enumerate(counts):
        value = t.column(1 + index, joined.types[1 + index])
        if is_count:
            value = t.call("coalesce", value, t.literal(0, t.INT64))
        fixed.append(value)
    mapped = r.map_(joined, fixed)
    return r.project(mapped, range(joined.arity, mapped.arity))
