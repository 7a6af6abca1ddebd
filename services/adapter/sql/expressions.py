"""SQL expressions (sqlglot trees) lowered to typed plan scalars over a frame.

Every construct maps to plan.proto functions with PostgreSQL's meaning, including NULL
handling (three-valued logic, IN lists with NULLs, IS DISTINCT FROM). Anything without an
exact lowering is SqlError 0A000 naming it, never an approximation: correlated subqueries,
date arithmetic, regular expressions, casts whose text form differs from PostgreSQL's (double
precision and timestamp to text), ... Window calls are planned by ``windows.py`` and read
through a substitution; one found anywhere else is 42P20.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Protocol

from sqlglot import exp

from services.adapter.sql import intervals, subqueries
from services.adapter.sql import typed as t
from services.adapter.sql.correlation import Correlation, OuterResolver
from services.adapter.sql.errors import (
    DATATYPE_MISMATCH,
    GROUPING_ERROR,
    SYNTAX_ERROR,
    UNDEFINED_FUNCTION,
    SqlError,
    not_supported,
)
from services.adapter.sql.literals import number_literal
from services.adapter.sql.names import identifier, position
from services.adapter.sql.planned import Planned
from services.adapter.sql.scope import Frame, Scope
from services.adapter.sql.typed import Typed
from services.adapter.sql.types import SqlType, sql_type, type_name
from tidemark.columnar import ColumnType
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType

WINDOWING_ERROR = "42P20"
# Scale a decimal dividend is lifted to, so quotients keep about as many digits as
# PostgreSQL's numeric division (at least 16 significant ones) rather than the IR's 6.
_DIVISION_SCALE = 16

AGGREGATE_TYPES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


class SubqueryPlanner(Protocol):
    """What lowering needs from the query planner: subqueries planned in an inner scope."""

    def plan_subquery(self, node: exp.Expr, outer: Scope) -> Planned: ...

    def plan_correlated(
        self, node: exp.Expr, frame: Frame, resolve_outer: OuterResolver
    ) -> tuple[Planned, Correlation | None]: ...

    def new_binding(self) -> int: ...


class Substitution(Protocol):
    """Replaces whole subexpressions by columns (GROUP BY keys and aggregates after
    aggregation); None to lower the node as usual."""

    def substitute(self, node: exp.Expr, lowerer: Lowerer) -> Typed | None: ...


def is_aggregate(node: exp.Expr) -> bool:
    return (
        isinstance(node, AGGREGATE_TYPES)
        or (isinstance(node, exp.Filter) and isinstance(node.this, AGGREGATE_TYPES))
        or isinstance(node, exp.AggFunc)
    )


def contains_aggregate(node: exp.Expr) -> bool:
    """Whether ``node`` has an aggregate call outside any subquery."""
    stack = [node]
    while stack:
        current = stack.pop()
        if is_aggregate(current) and not isinstance(current, exp.Window):
            return True
        if isinstance(current, exp.Subquery | exp.Exists | exp.Query) and current is not node:
            continue
        if isinstance(current, exp.Window):
            continue
        stack.extend(current.iter_expressions())
    return False


def contains_subquery(node: exp.Expr) -> bool:
    return any(isinstance(n, exp.Query | exp.Subquery | exp.Exists) for n in node.walk())


class Lowerer:
    """Lowers expressions over ``frame`` (which subqueries may extend with columns)."""

    def __init__(
        self,
        frame: Frame,
        planner: SubqueryPlanner,
        clause: str,
        substitution: Substitution | None = None,
    ) -> None:
        self.frame = frame
        self.planner = planner
        self.clause = clause
        self.substitution = substitution

    def lower(self, node: exp.Expr) -> Typed:
        if self.substitution is not None:
            found = self.substitution.substitute(node, self)
            if found is not None:
                return found
        if isinstance(node, exp.Window):
            # Window calls are planned before the select list and read through the
            # substitution; one that gets here stands where SQL allows none.
            raise SqlError(
                WINDOWING_ERROR,
                f"window functions are not allowed in {self.clause}",
                position(node),
            )
        handler = _HANDLERS.get(type(node))
        if handler is not None:
            return handler(self, node).at(position(node))
        if is_aggregate(node):
            raise SqlError(
                GROUPING_ERROR,
                f"aggregate functions are not allowed in {self.clause}",
                position(node),
            )
        raise _unsupported_expression(node)

    def condition(self, node: exp.Expr, what: str) -> Typed:
        return t.boolean(self.lower(node), what, position(node))

    def subquery(self, node: exp.Expr) -> tuple[Planned, Correlation | None]:
        """A subquery over this frame, and its correlation if it reads outer columns."""
        return self.planner.plan_correlated(node, self.frame, self.resolve_outer)

    def resolve_outer(self, name: str, table: str | None, where: int) -> int:
        """Where a subquery's reference to this frame's ``[table.]name`` reads: after GROUP
        BY, the group key column it is (42803 if it is no key)."""
        if self.substitution is not None:
            column = exp.Column(
                this=exp.Identifier(this=name, quoted=True),
                table=exp.Identifier(this=table, quoted=True) if table else None,
            )
            column.this.meta["start"] = max(0, where - 1)
            value = self.substitution.substitute(column, self)
            if value is not None and value.scalar.WhichOneof("kind") == "column":
                return value.scalar.column
        return self.frame.scope.resolve(name, table, where)


def _unsupported_expression(node: exp.Expr) -> SqlError:
    where = position(node)
    if isinstance(
        node,
        exp.CurrentTimestamp
        | exp.CurrentDate
        | exp.CurrentTime
        | exp.CurrentUser
        | exp.Rand
        | exp.CurrentTimestampLTZ,
    ):
        name = node.sql(dialect="postgres").lower()
        return not_supported(f"the nondeterministic function {name}", where)
    if isinstance(node, exp.Placeholder | exp.Parameter):
        return not_supported("query parameters", where)
    if isinstance(node, exp.Anonymous):
        return not_supported(f"function {identifier(node.this) or node.name}()", where)
    if isinstance(node, exp.AggFunc):
        return not_supported(f"aggregate function {node.sql_name().lower()}()", where)
    if isinstance(node, exp.Func):
        return not_supported(f"function {node.sql_name().lower()}()", where)
    text = node.sql(dialect="postgres")
    if len(text) > 60:
        text = text[:57] + "..."
    return not_supported(f"the expression {text}", where)


# Leaves -----------------------------------------------------------------------------------


def _column(lowerer: Lowerer, node: exp.Column) -> Typed:
    where = position(node)
    if isinstance(node.this, exp.Star):
        raise SqlError(SYNTAX_ERROR, "* is not allowed here", where)
    table = identifier(node.args["table"]) if node.args.get("table") else None
    index = lowerer.frame.scope.resolve(identifier(node.this), table, where)
    return lowerer.frame.column(index)


def _literal(lowerer: Lowerer, node: exp.Literal) -> Typed:
    if node.is_string:
        return t.unknown_text(str(node.this), position(node))
    try:
        value, value_type = number_literal(str(node.this))
    except SqlError as exc:
        raise exc.at(position(node)) from None
    return t.literal(value, value_type, position(node))


def _boolean(lowerer: Lowerer, node: exp.Boolean) -> Typed:
    return t.literal(bool(node.this), t.BOOL)


def _null(lowerer: Lowerer, node: exp.Null) -> Typed:
    return t.unknown_null(position(node))


def _paren(lowerer: Lowerer, node: exp.Paren) -> Typed:
    return lowerer.lower(node.this)


# Logic and comparison ---------------------------------------------------------------------


def _flatten(node: exp.Expr, kind: type[exp.Expr]) -> list[exp.Expr]:
    if isinstance(node, kind):
        return [*_flatten(node.this, kind), *_flatten(node.expression, kind)]
    if isinstance(node, exp.Paren) and isinstance(node.this, kind):
        return _flatten(node.this, kind)
    return [node]


def _and_or(lowerer: Lowerer, node: exp.Expr) -> Typed:
    name = "and" if isinstance(node, exp.And) else "or"
    parts = [lowerer.condition(p, name.upper()) for p in _flatten(node, type(node))]
    return t.call(name, *parts)


def _not(lowerer: Lowerer, node: exp.Not) -> Typed:
    return t.call("not", lowerer.condition(node.this, "NOT"))


_COMPARISONS: dict[type[exp.Expr], tuple[str, str]] = {
    exp.EQ: ("eq", "="),
    exp.NEQ: ("ne", "<>"),
    exp.LT: ("lt", "<"),
    exp.LTE: ("le", "<="),
    exp.GT: ("gt", ">"),
    exp.GTE: ("ge", ">="),
}


def compare(left: Typed, right: Typed, name: str, operator: str, where: int) -> Typed:
    left, right = t.comparable_pair(left, right, operator, where)
    return t.call(name, left, right, position=where)


def _comparison(lowerer: Lowerer, node: exp.Expr) -> Typed:
    name, operator = _COMPARISONS[type(node)]
    where = position(node)
    right_node = node.expression
    if isinstance(right_node, exp.Any | exp.All):
        quantified = isinstance(right_node, exp.Any) and name == "eq"
        inner = right_node.this
        if quantified and isinstance(inner, exp.Query | exp.Subquery):
            return _in_query(lowerer, node.this, inner, where)
        raise not_supported(f"{operator} {right_node.key.upper()} (...)", where)
    return compare(lowerer.lower(node.this), lowerer.lower(right_node), name, operator, where)


def _distinct_from(left: Typed, right: Typed, where: int) -> Typed:
    left, right = t.comparable_pair(left, right, "IS DISTINCT FROM", where)
    both_known = t.case(t.call("is_null", right), t.true_literal(), t.call("ne", left, right))
    return t.case(t.call("is_null", left), t.call("is_not_null", right), both_known, where)


def _null_safe(lowerer: Lowerer, node: exp.Expr) -> Typed:
    where = position(node)
    distinct = _distinct_from(lowerer.lower(node.this), lowerer.lower(node.expression), where)
    return distinct if isinstance(node, exp.NullSafeNEQ) else t.call("not", distinct)


def _is(lowerer: Lowerer, node: exp.Is) -> Typed:
    where = position(node)
    target = node.expression
    if isinstance(target, exp.Null):
        value = t.resolve(lowerer.lower(node.this))
        result = t.call("is_null", value)
    elif isinstance(target, exp.Boolean):
        value = lowerer.condition(node.this, "IS")
        truth = value if target.this else t.call("not", value)
        result = t.call("and", t.call("is_not_null", value), truth)
    else:
        raise _unsupported_expression(node)
    if node.args.get("negate"):
        result = t.call("not", result)
    return result.at(where)


def _in(lowerer: Lowerer, node: exp.In) -> Typed:
    where = position(node)
    if isinstance(node.this, exp.Tuple):
        raise not_supported("row comparisons in IN", where)
    query = node.args.get("query")
    if query is not None:
        result = _in_query(lowerer, node.this, query, where)
    elif node.args.get("unnest") or node.args.get("field"):
        raise _unsupported_expression(node)
    elif not node.expressions:
        raise SqlError(SYNTAX_ERROR, "IN needs at least one value", where)
    else:
        needle = lowerer.lower(node.this)
        items = [lowerer.lower(e) for e in node.expressions]
        common = t.common_type([needle, *items], "IN", where)
        needle = t.convert(needle, common, where)
        tests = [
            t.call("eq", needle, t.convert(item, common, where), position=where) for item in items
        ]
        result = tests[0] if len(tests) == 1 else t.call("or", *tests)
    if node.args.get("negate"):
        result = t.call("not", result)
    return result


def _in_query(lowerer: Lowerer, needle_node: exp.Expr, query: exp.Expr, where: int) -> Typed:
    # The needle first: lowering it may extend the frame, which a correlated subquery reads.
    needle = lowerer.lower(needle_node)
    # A subquery's untyped literals are text by now, as PostgreSQL resolves them.
    planned, correlation = lowerer.subquery(query)
    binding = lowerer.planner.new_binding()
    return subqueries.in_subquery(lowerer.frame, needle, planned.rel, binding, where, correlation)


def _exists(lowerer: Lowerer, node: exp.Exists) -> Typed:
    planned, correlation = lowerer.subquery(node.this)
    return subqueries.exists(lowerer.frame, planned.rel, position(node), correlation)


def _subquery(lowerer: Lowerer, node: exp.Subquery) -> Typed:
    planned, correlation = lowerer.subquery(node)
    return subqueries.scalar_subquery(
        lowerer.frame, planned.rel, planned.at_most_one_row, position(node), correlation
    )


def _between(lowerer: Lowerer, node: exp.Between) -> Typed:
    where = position(node)
    if node.args.get("symmetric"):
        raise not_supported("BETWEEN SYMMETRIC", where)
    value = lowerer.lower(node.this)
    low = compare(value, lowerer.lower(node.args["low"]), "ge", ">=", where)
    high = compare(value, lowerer.lower(node.args["high"]), "le", "<=", where)
    return t.call("and", low, high)


def _like(lowerer: Lowerer, node: exp.Expr) -> Typed:
    where = position(node)
    subject = t.require_kind(lowerer.lower(node.this), {ColumnType.TEXT}, "LIKE's operand", where)
    pattern_node = node.expression
    while isinstance(pattern_node, exp.Paren):
        pattern_node = pattern_node.this
    if not (isinstance(pattern_node, exp.Literal) and pattern_node.is_string):
        raise not_supported("LIKE with a pattern that is not a string literal", where)
    pattern = str(pattern_node.this)
    if "\\" in pattern:
        raise not_supported("LIKE patterns with escapes (\\)", position(pattern_node))
    if isinstance(node, exp.ILike):
        subject = t.call("lower", subject)
        pattern = pattern.lower()
    result = t.call("like", subject, t.literal(pattern, t.TEXT))
    if node.args.get("negate"):
        result = t.call("not", result)
    return result


# Arithmetic and text ----------------------------------------------------------------------

_ARITHMETIC: dict[type[exp.Expr], tuple[str, str]] = {
    exp.Add: ("add", "+"),
    exp.Sub: ("sub", "-"),
    exp.Mul: ("mul", "*"),
    exp.Div: ("div", "/"),
    exp.Mod: ("mod", "%"),
}
_DATETIME = {ColumnType.DATE, ColumnType.TIMESTAMP}


def _numeric_operands(left: Typed, right: Typed, operator: str, where: int) -> tuple[Typed, Typed]:
    if left.is_unknown and not right.is_unknown and right.type.is_numeric:
        left = t.coerce(left, right.type, where)
    elif right.is_unknown and not left.is_unknown and left.type.is_numeric:
        right = t.coerce(right, left.type, where)
    left, right = t.resolve(left), t.resolve(right)
    if left.type.is_numeric and right.type.is_numeric:
        return left, right
    if left.type.kind in _DATETIME or right.type.kind in _DATETIME:
        raise not_supported(f"date and time arithmetic ({operator})", where)
    raise SqlError(
        UNDEFINED_FUNCTION,
        f"operator does not exist: {type_name(left.type)} {operator} {type_name(right.type)}",
        where,
    )


def _arithmetic(lowerer: Lowerer, node: exp.Expr) -> Typed:
    name, operator = _ARITHMETIC[type(node)]
    where = position(node)
    if operator in "+-" and isinstance(node.expression, exp.Interval):
        interval = intervals.interval_of(node.expression, where)
        moved = interval if operator == "+" else interval.negated()
        return intervals.shifted(lowerer.lower(node.this), moved, where)
    if operator == "+" and isinstance(node.this, exp.Interval):
        interval = intervals.interval_of(node.this, where)
        return intervals.shifted(lowerer.lower(node.expression), interval, where)
    left, right = lowerer.lower(node.this), lowerer.lower(node.expression)
    if operator in "+-":
        dated = intervals.date_arithmetic(operator, left, right, where)
        if dated is not None:
            return dated
    left, right = _numeric_operands(left, right, operator, where)
    if name == "div":
        left = _lift_dividend(left, right)
    return t.call(name, left, right, position=where)


def _lift_dividend(left: Typed, right: Typed) -> Typed:
    kinds = {left.type.kind, right.type.kind}
    if ColumnType.FLOAT64 in kinds or ColumnType.DECIMAL not in kinds:
        return left
    scale = left.type.scale if left.type.kind is ColumnType.DECIMAL else 0
    if scale >= _DIVISION_SCALE or left.type.integer_digits > MAX_PRECISION - _DIVISION_SCALE:
        return left
    target = ScalarType.decimal(MAX_PRECISION, _DIVISION_SCALE)
    return t.convert(left, target)


def _neg(lowerer: Lowerer, node: exp.Neg) -> Typed:
    inner = node.this
    if isinstance(inner, exp.Literal) and not inner.is_string:
        try:
            value, value_type = number_literal("-" + str(inner.this))
        except SqlError as exc:
            raise exc.at(position(node)) from None
        return t.literal(value, value_type, position(node))
    value = lowerer.lower(inner)
    if value.is_unknown or not value.type.is_numeric:
        raise SqlError(
            UNDEFINED_FUNCTION,
            f"operator does not exist: - {type_name(t.resolve(value).type)}",
            position(node),
        )
    return t.call("neg", value)


def text_of(value: Typed, where: int) -> Typed:
    """A value as text the way PostgreSQL writes it; 0A000 for types whose text form the
    plan IR cannot reproduce."""
    value = t.resolve(value)
    kind = value.type.kind
    if kind is ColumnType.TEXT:
        return value
    if kind in (ColumnType.FLOAT64, ColumnType.TIMESTAMP, ColumnType.BYTES):
        raise not_supported(f"converting {type_name(value.type)} to text here", where)
    return t.cast(value, t.TEXT, where)


def _dpipe(lowerer: Lowerer, node: exp.DPipe) -> Typed:
    where = position(node)
    parts = [text_of(lowerer.lower(p), where) for p in _flatten(node, exp.DPipe)]
    return t.call("concat", *parts)


def _concat(lowerer: Lowerer, node: exp.Concat) -> Typed:
    where = position(node)
    # concat() skips NULL arguments.
    parts = [
        t.call("coalesce", text_of(lowerer.lower(p), where), t.literal("", t.TEXT))
        for p in node.expressions
    ]
    return t.call("concat", *parts)


def _text_function(name: str) -> Callable[[Lowerer, exp.Expr], Typed]:
    def lower(lowerer: Lowerer, node: exp.Expr) -> Typed:
        where = position(node)
        value = t.require_kind(
            lowerer.lower(node.this), {ColumnType.TEXT}, f"{name}()'s argument", where
        )
        return t.call(name, value)

    return lower


def _abs(lowerer: Lowerer, node: exp.Abs) -> Typed:
    where = position(node)
    value = lowerer.lower(node.this)
    if value.is_unknown or not value.type.is_numeric:
        raise SqlError(
            UNDEFINED_FUNCTION,
            f"function abs({type_name(t.resolve(value).type)}) does not exist",
            where,
        )
    return t.call("abs", value)


def _substring(lowerer: Lowerer, node: exp.Substring) -> Typed:
    where = position(node)
    text = t.require_kind(
        lowerer.lower(node.this), {ColumnType.TEXT}, "substring()'s string", where
    )
    args = [text]
    for part in ("start", "length"):
        if node.args.get(part) is not None:
            value = lowerer.lower(node.args[part])
            args.append(t.require_kind(value, {ColumnType.INT64}, f"substring()'s {part}", where))
    if len(args) == 1:
        raise SqlError(SYNTAX_ERROR, "substring() needs a start position", where)
    return t.call("substr", *args)


def _trim(lowerer: Lowerer, node: exp.Trim) -> Typed:
    where = position(node)
    side = str(node.args.get("position") or "BOTH").upper()
    chars = node.args.get("expression")
    plain_chars = chars is None or (isinstance(chars, exp.Literal) and chars.this == " ")
    if side != "BOTH" or not plain_chars or node.args.get("collation"):
        raise not_supported("trim() of other characters than spaces or of one side only", where)
    value = t.require_kind(lowerer.lower(node.this), {ColumnType.TEXT}, "trim()'s argument", where)
    return t.call("trim", value)


# Conditional expressions ------------------------------------------------------------------


def _case(lowerer: Lowerer, node: exp.Case) -> Typed:
    where = position(node)
    operand = lowerer.lower(node.this) if node.args.get("this") is not None else None
    conditions: list[Typed] = []
    results: list[Typed] = []
    for branch in node.args.get("ifs") or []:
        when = branch.this
        if operand is not None:
            conditions.append(compare(operand, lowerer.lower(when), "eq", "=", position(when)))
        else:
            conditions.append(lowerer.condition(when, "CASE/WHEN"))
        results.append(lowerer.lower(branch.args["true"]))
    default = node.args.get("default")
    otherwise = lowerer.lower(default) if default is not None else t.unknown_null(where)
    common = t.common_type([*results, otherwise], "CASE", where)
    value = t.convert(otherwise, common, where)
    for condition, result in zip(reversed(conditions), reversed(results), strict=True):
        value = t.case(condition, t.convert(result, common, where), value, where)
    return value


def _unified_args(
    lowerer: Lowerer, nodes: list[exp.Expr], what: str, where: int
) -> tuple[list[Typed], ScalarType]:
    values = [lowerer.lower(n) for n in nodes]
    common = t.common_type(values, what, where)
    return [t.convert(v, common, where) for v in values], common


def _coalesce(lowerer: Lowerer, node: exp.Coalesce) -> Typed:
    where = position(node)
    args, _ = _unified_args(lowerer, [node.this, *node.expressions], "COALESCE", where)
    return t.call("coalesce", *args)


def _nullif(lowerer: Lowerer, node: exp.Nullif) -> Typed:
    where = position(node)
    value, other = lowerer.lower(node.this), lowerer.lower(node.expression)
    left, right = t.comparable_pair(value, other, "=", where)
    return t.case(t.call("eq", left, right), t.null(left.type), left, where)


def _greatest_least(lowerer: Lowerer, node: exp.Expr) -> Typed:
    where = position(node)
    name = "GREATEST" if isinstance(node, exp.Greatest) else "LEAST"
    args, _ = _unified_args(lowerer, [node.this, *node.expressions], name, where)
    if args[0].type.kind in (ColumnType.JSON, ColumnType.BOOL):
        raise not_supported(f"{name} of {type_name(args[0].type)} values", where)
    better = "ge" if name == "GREATEST" else "le"
    result = args[0]
    # NULL arguments are ignored; the result is NULL only when all are.
    for arg in args[1:]:
        pick = t.case(t.call(better, result, arg), result, arg)
        pick = t.case(t.call("is_null", arg), result, pick)
        result = t.case(t.call("is_null", result), arg, pick, where)
    return result


# Casts and dates --------------------------------------------------------------------------

_BOOL_TRUE_WORDS = ("t", "tr", "tru", "true", "y", "ye", "yes", "on", "1")
_BOOL_FALSE_WORDS = ("f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0")


def _cast(lowerer: Lowerer, node: exp.Cast) -> Typed:
    where = position(node)
    if isinstance(node, exp.TryCast):
        raise not_supported("TRY_CAST", where)
    target = sql_type(node.args["to"], where)
    return cast_value(lowerer.lower(node.this), target, where)


def cast_value(value: Typed, target_sql: SqlType, where: int) -> Typed:
    """An explicit CAST with PostgreSQL's meaning."""
    target = _cast_target(value, target_sql)
    if value.is_unknown:
        return t.coerce(value, target, where)
    folded = t.fold(value, target, where)
    if folded is not None:
        return folded
    source = value.type
    if source.same_type(target):
        return value
    kind, from_kind = target.kind, source.kind
    if from_kind is ColumnType.DECIMAL and kind in (ColumnType.INT64, ColumnType.DECIMAL):
        return t.cast(
            round_half_away(value, target.scale if kind is ColumnType.DECIMAL else 0), target, where
        )
    if kind is ColumnType.TEXT:
        return text_of(value, where)
    if from_kind is ColumnType.BOOL and kind is ColumnType.INT64:
        one, zero = t.literal(1, t.INT64), t.literal(0, t.INT64)
        return t.case(value, one, t.case(t.call("is_null", value), t.null(t.INT64), zero), where)
    if from_kind is ColumnType.INT64 and kind is ColumnType.BOOL:
        return t.call("ne", value, t.literal(0, t.INT64), position=where)
    if from_kind is ColumnType.TEXT and kind is ColumnType.BOOL:
        return _text_to_bool(value, where)
    if from_kind is ColumnType.TEXT and kind is ColumnType.JSON:
        raise not_supported("casting text to jsonb at run time (its text is not normalized)", where)
    if from_kind is ColumnType.JSON:
        raise not_supported(f"casting jsonb to {type_name(target)}", where)
    return t.cast(value, target, where)


def _cast_target(value: Typed, target_sql: SqlType) -> ScalarType:
    """A bare ``numeric`` target keeps what it can of the value's own digits."""
    if not target_sql.unconstrained or value.is_unknown:
        return target_sql.type
    source = value.type
    if source.kind is ColumnType.DECIMAL:
        return source.with_nullable(True)
    if source.kind is ColumnType.INT64:
        return ScalarType.decimal(19, 0)
    return target_sql.type


def round_half_away(value: Typed, scale: int) -> Typed:
    """A decimal rounded half away from zero to ``scale`` digits, as PostgreSQL rounds (the
    IR's casts round half to even): add half a unit away from zero, then cut the digits
    past ``scale`` off with ``mod``."""
    if value.type.scale <= scale:
        return value
    half = Decimal(5).scaleb(-(scale + 1))
    unit = Decimal(1).scaleb(-scale)
    half_type = ScalarType.decimal(max(1, scale + 1), scale + 1)
    unit_type = ScalarType.decimal(max(1, scale + 1), scale)
    positive = t.literal(half, half_type)
    negative = t.literal(-half, half_type)
    shift = t.case(t.call("lt", value, t.literal(0, t.INT64)), negative, positive)
    shifted = t.call("add", value, shift)
    return t.call("sub", shifted, t.call("mod", shifted, t.literal(unit, unit_type)))


def _text_to_bool(value: Typed, where: int) -> Typed:
    word = t.call("lower", t.call("trim", value))

    def any_of(words: tuple[str, ...]) -> Typed:
        return t.call("or", *(t.call("eq", word, t.literal(w, t.TEXT)) for w in words))

    unknown = t.null(t.BOOL)
    otherwise = t.case(any_of(_BOOL_FALSE_WORDS), t.false_literal(), unknown)
    return t.case(any_of(_BOOL_TRUE_WORDS), t.true_literal(), otherwise, where)


_EXTRACT_UNITS = {"YEAR": "extract_year", "MONTH": "extract_month", "DAY": "extract_day"}


def _unit(node: exp.Expr | None) -> str:
    if node is None:
        return ""
    return str(node.name if isinstance(node, exp.Literal | exp.Var) else node.sql()).upper()


def _extract(lowerer: Lowerer, node: exp.Extract) -> Typed:
    where = position(node)
    unit = _unit(node.this)
    function = _EXTRACT_UNITS.get(unit)
    if function is None:
        raise not_supported(f"extracting {unit.lower()}", where)
    value = lowerer.lower(node.expression)
    if value.is_unknown:
        value = t.coerce(value, t.TIMESTAMP, where)
    value = t.require_kind(value, _DATETIME, "EXTRACT's argument", where)
    return t.call(function, value)


def _date_trunc(lowerer: Lowerer, node: exp.Expr) -> Typed:
    where = position(node)
    unit = _unit(node.args.get("unit"))
    value = lowerer.lower(node.this)
    if value.is_unknown:
        value = t.coerce(value, t.TIMESTAMP, where)
    if unit != "DAY" or value.type.kind is not ColumnType.TIMESTAMP:
        raise not_supported(f"date_trunc('{unit.lower()}', {type_name(value.type)})", where)
    return t.call("date_trunc_day", value)


def _not_here(lowerer: Lowerer, node: exp.Expr) -> Typed:
    raise SqlError(DATATYPE_MISMATCH, "a row value is not allowed here", position(node))


_HANDLERS: dict[type[exp.Expr], Callable[[Lowerer, exp.Expr], Typed]] = {
    exp.Column: _column,  # type: ignore[dict-item]
    exp.Literal: _literal,  # type: ignore[dict-item]
    exp.Boolean: _boolean,  # type: ignore[dict-item]
    exp.Null: _null,  # type: ignore[dict-item]
    exp.Paren: _paren,  # type: ignore[dict-item]
    exp.And: _and_or,
    exp.Or: _and_or,
    exp.Not: _not,  # type: ignore[dict-item]
    **dict.fromkeys(_COMPARISONS, _comparison),
    exp.NullSafeEQ: _null_safe,
    exp.NullSafeNEQ: _null_safe,
    exp.Is: _is,  # type: ignore[dict-item]
    exp.In: _in,  # type: ignore[dict-item]
    exp.Exists: _exists,  # type: ignore[dict-item]
    exp.Subquery: _subquery,  # type: ignore[dict-item]
    exp.Between: _between,  # type: ignore[dict-item]
    exp.Like: _like,
    exp.ILike: _like,
    **dict.fromkeys(_ARITHMETIC, _arithmetic),
    exp.Neg: _neg,  # type: ignore[dict-item]
    exp.DPipe: _dpipe,  # type: ignore[dict-item]
    exp.Concat: _concat,  # type: ignore[dict-item]
    exp.Lower: _text_function("lower"),
    exp.Upper: _text_function("upper"),
    exp.Length: _text_function("length"),
    exp.Abs: _abs,  # type: ignore[dict-item]
    exp.Substring: _substring,  # type: ignore[dict-item]
    exp.Trim: _trim,  # type: ignore[dict-item]
    exp.Case: _case,  # type: ignore[dict-item]
    exp.Coalesce: _coalesce,  # type: ignore[dict-item]
    exp.Nullif: _nullif,  # type: ignore[dict-item]
    exp.Greatest: _greatest_least,
    exp.Least: _greatest_least,
    exp.Cast: _cast,  # type: ignore[dict-item]
    exp.Extract: _extract,  # type: ignore[dict-item]
    exp.TimestampTrunc: _date_trunc,
    exp.DateTrunc: _date_trunc,
    exp.Tuple: _not_here,
}
