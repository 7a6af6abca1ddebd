"""Window function calls in SELECT lowered to Window plan nodes.

Windows are evaluated after GROUP BY and HAVING and before the select list's DISTINCT, ORDER
BY and LIMIT, as in PostgreSQL: their arguments, PARTITION BY and ORDER BY are lowered over
the grouped frame (so ``rank() OVER (ORDER BY sum(x))`` reads the aggregate's column). Calls
with the same PARTITION BY and ORDER BY share one Window node; each call becomes one column
appended to the frame, and the select list and ORDER BY read those columns through a
substitution keyed by the call's SQL text.

Supported: ROW_NUMBER, RANK, DENSE_RANK, LAG and LEAD (integer constant offset, any default),
FIRST_VALUE, LAST_VALUE, and COUNT/SUM/AVG/MIN/MAX (with FILTER) over ROWS frames with any
bounds and RANGE frames bounded by UNBOUNDED or CURRENT ROW; named windows (WINDOW w AS ...).
Anything else is refused the way PostgreSQL refuses it: 42P20 for misplaced or ill-formed
windows, 0A000 for what PostgreSQL has and Tidemark does not (GROUPS, EXCLUDE, RANGE with an
offset, DISTINCT, other window functions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.aggregates import lower_aggregate
from services.adapter.sql.errors import UNDEFINED_OBJECT, SqlError, not_supported
from services.adapter.sql.expressions import Lowerer, SubqueryPlanner, Substitution
from services.adapter.sql.names import identifier, position
from services.adapter.sql.scope import Frame
from services.adapter.sql.typed import Typed
from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb
from tidemark.plan.derive import window_function_type
from tidemark.v1 import plan_pb2

WINDOWING_ERROR = "42P20"
INVALID_PRECEDING_OR_FOLLOWING_SIZE = "22013"

_Kind = plan_pb2.WindowFunction
_Bound = plan_pb2.WindowFrameBound
_RANKING: dict[type[exp.Expr], int] = {
    exp.RowNumber: _Kind.KIND_ROW_NUMBER,
    exp.Rank: _Kind.KIND_RANK,
    exp.DenseRank: _Kind.KIND_DENSE_RANK,
}
_VALUES: dict[type[exp.Expr], int] = {
    exp.Lag: _Kind.KIND_LAG,
    exp.Lead: _Kind.KIND_LEAD,
    exp.FirstValue: _Kind.KIND_FIRST_VALUE,
    exp.LastValue: _Kind.KIND_LAST_VALUE,
}
_AGGREGATES = {
    plan_pb2.Aggregate.FUNC_COUNT: _Kind.KIND_COUNT,
    plan_pb2.Aggregate.FUNC_SUM: _Kind.KIND_SUM,
    plan_pb2.Aggregate.FUNC_MIN: _Kind.KIND_MIN,
    plan_pb2.Aggregate.FUNC_MAX: _Kind.KIND_MAX,
    plan_pb2.Aggregate.FUNC_AVG: _Kind.KIND_AVG,
}
_NAMES = {
    exp.RowNumber: "row_number",
    exp.Rank: "rank",
    exp.DenseRank: "dense_rank",
    exp.Lag: "lag",
    exp.Lead: "lead",
    exp.FirstValue: "first_value",
    exp.LastValue: "last_value",
}


def window_key(node: exp.Expr) -> str:
    return node.sql(dialect="postgres")


def collect_windows(nodes: Sequence[exp.Expr | None]) -> list[exp.Window]:
    """The window function calls in ``nodes`` outside subqueries, each once, in order."""
    found: dict[str, exp.Window] = {}
    for node in nodes:
        if node is None:
            continue
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, exp.Window):
                found.setdefault(window_key(current), current)
                continue
            if isinstance(current, exp.Subquery | exp.Exists | exp.Query):
                continue
            stack.extend(reversed(list(current.iter_expressions())))
    return list(found.values())


def output_name(window: exp.Window) -> str:
    """The column name PostgreSQL gives an unaliased window call: its function's name."""
    function = window.this
    if isinstance(function, exp.Filter):
        function = function.this
    name = _NAMES.get(type(function))
    if name is not None:
        return name
    return str(function.key) if isinstance(function, exp.Expr) else "?column?"


@dataclass
class _Definition:
    """A window's PARTITION BY, ORDER BY and frame, after resolving named windows."""

    partition: list[exp.Expr]
    order: list[exp.Ordered]
    spec: exp.WindowSpec | None

    def key(self) -> str:
        parts = [window_key(p) for p in self.partition] + ["|"]
        parts += [window_key(o) for o in self.order]
        return "\x00".join(parts)


def _definition(window: exp.Window, named: dict[str, exp.Window]) -> _Definition:
    where = position(window)
    partition = list(window.args.get("partition_by") or [])
    order_node = window.args.get("order")
    order = list(order_node.expressions) if order_node is not None else []
    spec = window.args.get("spec")
    reference = window.args.get("alias")
    if reference is None:
        return _Definition(partition, order, spec)
    name = identifier(reference)
    base = named.get(name)
    if base is None:
        raise SqlError(UNDEFINED_OBJECT, f'window "{name}" does not exist', where)
    if partition:
        raise SqlError(
            WINDOWING_ERROR, f'cannot override PARTITION BY clause of window "{name}"', where
        )
    base_order = base.args.get("order")
    if base_order is not None and order:
        raise SqlError(
            WINDOWING_ERROR, f'cannot override ORDER BY clause of window "{name}"', where
        )
    base_spec = base.args.get("spec")
    if base_spec is not None and spec is not None:
        raise SqlError(
            WINDOWING_ERROR, f'cannot copy window "{name}" because it has a frame clause', where
        )
    return _Definition(
        list(base.args.get("partition_by") or []),
        list(base_order.expressions) if base_order is not None else order,
        spec if spec is not None else base_spec,
    )


def named_windows(select: exp.Select) -> dict[str, exp.Window]:
    """The WINDOW clause's definitions by name (a definition may build on an earlier one)."""
    named: dict[str, exp.Window] = {}
    for definition in select.args.get("windows") or []:
        name = identifier(definition.this)
        if name in named:
            raise SqlError(
                WINDOWING_ERROR, f'window "{name}" is already defined', position(definition)
            )
        resolved = _definition(definition, named)
        order = exp.Order(expressions=resolved.order) if resolved.order else None
        named[name] = exp.Window(
            this=definition.this,
            partition_by=resolved.partition or None,
            order=order,
            spec=resolved.spec,
        )
    return named


# Frames -----------------------------------------------------------------------------------


def _offset(node: exp.Expr, what: str) -> int:
    value, negative = node, False
    if isinstance(value, exp.Neg):
        negative, value = True, value.this
    if not (isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit()):
        raise not_supported(
            f"a frame {what} offset that is not an integer constant", position(node)
        )
    if negative and int(value.this):
        raise SqlError(
            INVALID_PRECEDING_OR_FOLLOWING_SIZE,
            f"frame {what} offset must not be negative",
            position(node),
        )
    return int(value.this)


def _bound(node: object, side: object, what: str, where: int) -> plan_pb2.WindowFrameBound:
    side_text = str(side or "").upper()
    if isinstance(node, str) or node is None:
        text = str(node or "").upper()
        if text == "CURRENT ROW":
            return _Bound(kind=_Bound.KIND_CURRENT_ROW)
        if text == "UNBOUNDED" and side_text == "PRECEDING":
            return _Bound(kind=_Bound.KIND_UNBOUNDED_PRECEDING)
        if text == "UNBOUNDED" and side_text == "FOLLOWING":
            return _Bound(kind=_Bound.KIND_UNBOUNDED_FOLLOWING)
        raise SqlError(WINDOWING_ERROR, f"invalid frame {what}", where)
    assert isinstance(node, exp.Expr)
    offset = _offset(node, what)
    if side_text == "PRECEDING":
        return _Bound(kind=_Bound.KIND_PRECEDING, offset=offset)
    if side_text == "FOLLOWING":
        return _Bound(kind=_Bound.KIND_FOLLOWING, offset=offset)
    raise SqlError(WINDOWING_ERROR, f"invalid frame {what}", where)


def lower_frame(spec: exp.WindowSpec, where: int) -> plan_pb2.WindowFrame:
    """A frame clause as a WindowFrame, with PostgreSQL's checks and messages (errors at
    ``where``, the window call: sqlglot keeps no position for the clause itself)."""
    kind = str(spec.args.get("kind") or "").upper()
    if kind not in ("ROWS", "RANGE"):
        raise not_supported(f"{kind or 'this'} frame mode", where)
    if spec.args.get("exclude") is not None:
        raise not_supported("frame EXCLUDE", where)
    start = _bound(spec.args.get("start"), spec.args.get("start_side"), "starting", where)
    end_node = spec.args.get("end")
    end = (
        _Bound(kind=_Bound.KIND_CURRENT_ROW)
        if end_node is None
        else _bound(end_node, spec.args.get("end_side"), "ending", where)
    )
    if start.kind == _Bound.KIND_UNBOUNDED_FOLLOWING:
        raise SqlError(WINDOWING_ERROR, "frame start cannot be UNBOUNDED FOLLOWING", where)
    if end.kind == _Bound.KIND_UNBOUNDED_PRECEDING:
        raise SqlError(WINDOWING_ERROR, "frame end cannot be UNBOUNDED PRECEDING", where)
    if start.kind == _Bound.KIND_CURRENT_ROW and end.kind == _Bound.KIND_PRECEDING:
        raise SqlError(
            WINDOWING_ERROR, "frame starting from current row cannot have preceding rows", where
        )
    if start.kind == _Bound.KIND_FOLLOWING and end.kind in (
        _Bound.KIND_PRECEDING,
        _Bound.KIND_CURRENT_ROW,
    ):
        raise SqlError(
            WINDOWING_ERROR, "frame starting from following row cannot have preceding rows", where
        )
    offsets = {_Bound.KIND_PRECEDING, _Bound.KIND_FOLLOWING}
    if kind == "RANGE" and {start.kind, end.kind} & offsets:
        raise not_supported("RANGE with offset PRECEDING/FOLLOWING", where)
    mode = plan_pb2.WindowFrame.MODE_ROWS if kind == "ROWS" else plan_pb2.WindowFrame.MODE_RANGE
    return plan_pb2.WindowFrame(mode=mode, start=start, end=end)


# Functions --------------------------------------------------------------------------------


def _lag_offset(node: exp.Expr | None) -> int:
    if node is None:
        return 1
    value, negative = node, False
    if isinstance(value, exp.Neg):
        negative, value = True, value.this
    if not (isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit()):
        raise not_supported("a LAG/LEAD offset that is not an integer constant", position(node))
    return -int(value.this) if negative else int(value.this)


def lower_function(
    window: exp.Window, lowerer: Lowerer, frame: plan_pb2.WindowFrame | None
) -> plan_pb2.WindowFunction:
    """One window call's function over the (grouped) frame ``lowerer`` reads."""
    function = window.this
    where = position(window)
    if type(function) in _RANKING:
        if function.args.get("expressions"):
            raise SqlError(
                "42883", f"function {_NAMES[type(function)]} takes no arguments here", where
            )
        return pb.window_function(_NAMES[type(function)])  # type: ignore[arg-type]
    if isinstance(function, exp.Lag | exp.Lead):
        return _offset_function(function, lowerer, where)
    if isinstance(function, exp.FirstValue | exp.LastValue):
        argument = t.resolve(lowerer.lower(function.this))
        result = pb.window_function(_NAMES[type(function)], argument.scalar)  # type: ignore[arg-type]
        if frame is not None:
            result.frame.CopyFrom(frame)
        return result
    inner = function.this if isinstance(function, exp.Filter) else function
    if isinstance(inner, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max):
        aggregate, _ = lower_aggregate(function, lowerer, nested=True)
        if aggregate.distinct:
            raise not_supported("DISTINCT in window functions", where)
        result = plan_pb2.WindowFunction(kind=_AGGREGATES[aggregate.func])
        if aggregate.HasField("expression"):
            result.argument.CopyFrom(aggregate.expression)
        if frame is not None:
            result.frame.CopyFrom(frame)
        return result
    if isinstance(function, exp.Filter):
        raise not_supported("FILTER for non-aggregate window functions", where)
    name = output_name(window)
    raise not_supported(f"the window function {name}()", where)


def _offset_function(
    function: exp.Lag | exp.Lead, lowerer: Lowerer, where: int
) -> plan_pb2.WindowFunction:
    lead = isinstance(function, exp.Lead)
    offset = _lag_offset(function.args.get("offset"))
    if offset < 0:  # LAG(x, -k) reads k rows ahead, as LEAD(x, k) does
        lead, offset = not lead, -offset
    argument = lowerer.lower(function.this)
    default_node = function.args.get("default")
    default: Typed | None = None
    if default_node is not None:
        default = lowerer.lower(default_node)
        name = "LEAD" if isinstance(function, exp.Lead) else "LAG"
        target = t.common_type([argument, default], name, where)
        argument, default = t.convert(argument, target), t.convert(default, target)
    argument = t.resolve(argument)
    return pb.window_function(
        "lead" if lead else "lag",
        argument.scalar,
        offset=offset,
        default=default.scalar if default is not None else None,
    )


# Planning ---------------------------------------------------------------------------------


@dataclass
class WindowColumns:
    """Substitution after windows: each window call reads its column; anything else goes to
    the substitution in force before (GROUP BY's), if any."""

    columns: dict[str, int]
    inner: Substitution | None = None

    def substitute(self, node: exp.Expr, lowerer: Lowerer) -> Typed | None:
        if isinstance(node, exp.Window):
            column = self.columns.get(window_key(node))
            if column is None:  # a window call nested in another one's definition
                raise SqlError(
                    WINDOWING_ERROR, "window function calls cannot be nested", position(node)
                )
            return lowerer.frame.column(column)
        if self.inner is not None:
            return self.inner.substitute(node, lowerer)
        return None


@dataclass
class _Group:
    """Calls sharing a PARTITION BY and ORDER BY, each with its own frame clause."""

    definition: _Definition
    calls: list[tuple[exp.Window, exp.WindowSpec | None]] = field(default_factory=list)


def plan_windows(
    frame: Frame,
    planner: SubqueryPlanner,
    calls: Sequence[exp.Window],
    named: dict[str, exp.Window],
    substitution: Substitution | None,
) -> WindowColumns:
    """Appends one column per window call to ``frame`` (one Window node per distinct PARTITION
    BY and ORDER BY) and returns the substitution that reads them."""
    groups: dict[str, _Group] = {}
    for call in calls:
        definition = _definition(call, named)
        group = groups.setdefault(definition.key(), _Group(definition))
        group.calls.append((call, definition.spec))
    columns: dict[str, int] = {}
    for group in groups.values():
        lowerer = Lowerer(frame, planner, "window definitions", substitution)
        partition = _positions(frame, [lowerer.lower(p) for p in group.definition.partition])
        order_values = [lowerer.lower(entry.this) for entry in group.definition.order]
        for entry, value in zip(group.definition.order, order_values, strict=True):
            if t.resolve(value).type.kind is ColumnType.JSON:
                raise not_supported("ordering by jsonb values", position(entry))
        order_positions = _positions(frame, order_values)
        order = [
            _sort_key(entry, index)
            for entry, index in zip(group.definition.order, order_positions, strict=True)
        ]
        function_lowerer = Lowerer(frame, planner, "window function calls", substitution)
        functions = [
            lower_function(
                call,
                function_lowerer,
                lower_frame(spec, position(call)) if spec is not None else None,
            )
            for call, spec in group.calls
        ]
        types = list(frame.rel.types)
        result_types = [window_function_type(f, types) for f in functions]
        start = frame.rel.arity
        node = pb.window(frame.rel.node, partition, order, functions)
        frame.replace(r.Rel(node, (*frame.rel.types, *result_types)))
        for index, (call, _) in enumerate(group.calls):
            columns[window_key(call)] = start + index
    return WindowColumns(columns, substitution)


def _positions(frame: Frame, values: Sequence[Typed]) -> list[int]:
    """Column positions holding ``values``: plain columns as they are, the rest computed."""
    resolved = [t.resolve(v) for v in values]
    computed = [v for v in resolved if v.scalar.WhichOneof("kind") != "column"]
    added = iter(frame.add(computed))
    return [
        v.scalar.column if v.scalar.WhichOneof("kind") == "column" else next(added).scalar.column
        for v in resolved
    ]


def _sort_key(entry: exp.Expr, index: int) -> plan_pb2.SortKey:
    descending = bool(entry.args.get("desc"))
    nulls_first = entry.args.get("nulls_first")
    first = descending if nulls_first is None else bool(nulls_first)
    return pb.sort_key(index, descending, first != descending)
