"""FROM clauses: relations, derived tables and joins.

Join conditions are split into equality keys (one side's expression = the other's), which
become the Join node's keys, and the rest. An inner join filters on the rest afterwards. An
outer join cannot: a row that fails the rest must still be kept, NULL-padded. Conditions on
the padded side alone are pushed into that side's input; anything else is planned as the
matched pairs plus the preserved side's unmatched rows (those not among the matched pairs,
compared NULL-safely on all columns), padded with NULLs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import series
from services.adapter.sql import typed as t
from services.adapter.sql.errors import (
    SYNTAX_ERROR,
    UNDEFINED_COLUMN,
    SqlError,
    not_supported,
)
from services.adapter.sql.expressions import Lowerer, contains_subquery
from services.adapter.sql.names import identifier, position, table_name
from services.adapter.sql.scope import Frame, Scope, ScopeColumn
from services.adapter.sql.typed import Typed
from tidemark.plan import builders as pb
from tidemark.plan.derive import scalar_type
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

if TYPE_CHECKING:
    from services.adapter.sql.select import QueryPlanner

DUPLICATE_ALIAS = "42712"
INVALID_COLUMN_REFERENCE = "42P10"

_SIDES: dict[str, pb.JoinKind] = {
    "LEFT": "left_outer",
    "RIGHT": "right_outer",
    "FULL": "full_outer",
}


def plan_from(planner: QueryPlanner, select: exp.Select, outer: Scope | None) -> Frame:
    """The frame FROM produces (one row with no named columns when there is no FROM)."""
    from_clause = select.args.get("from_") or select.args.get("from")
    if from_clause is None:
        if select.args.get("joins"):
            raise SqlError(SYNTAX_ERROR, "JOIN without FROM", position(select))
        return Frame(r.one_row(), Scope([ScopeColumn("")], parent=outer))
    frame = from_item(planner, from_clause.this, outer)
    for extra in from_clause.expressions or []:
        frame = _join(planner, frame, exp.Join(this=extra), outer)
    for join in select.args.get("joins") or []:
        frame = _join(planner, frame, join, outer)
    return frame


def _alias(node: exp.Expr) -> tuple[str | None, list[str]]:
    alias = node.args.get("alias")
    if alias is None:
        return None, []
    if isinstance(alias, exp.TableAlias):
        name = identifier(alias.this) if alias.this is not None else None
        return name or None, [identifier(c) for c in alias.columns]
    return identifier(alias), []


def from_item(planner: QueryPlanner, node: exp.Expr, outer: Scope | None) -> Frame:
    """One FROM item (a table, view, CTE, derived table, VALUES or generate_series) and its
    names."""
    where = position(node)
    alias, renames = _alias(node)
    qualifier: str | None
    if isinstance(node, exp.Table):
        for unsupported in ("laterals", "joins", "pivots", "sample", "version", "when"):
            if node.args.get(unsupported):
                raise not_supported(f"{unsupported.upper()} in FROM", where)
        if node.args.get("ordinality"):
            raise not_supported("WITH ORDINALITY", where)
        if isinstance(node.this, exp.ExplodingGenerateSeries):
            rel = series.generate_series(planner, node.this)
            # As PostgreSQL names a function returning one column: the function's name, or
            # the table alias when there is one (AS g(x) renames the column below).
            qualifier = alias or series.NAME
            names = [qualifier]
        elif not isinstance(node.this, exp.Identifier):
            raise not_supported("table functions in FROM other than generate_series", where)
        else:
            rel, names = planner.table(table_name(node), where)
            qualifier = alias or table_name(node)[-1]
    elif isinstance(node, exp.Subquery):
        planned = planner.plan_subquery(node.this, outer)
        rel, names = planned.rel, planned.names[: planned.visible]
        qualifier = alias
    elif isinstance(node, exp.Values):
        planned = planner.plan_values(node, outer)
        rel, names = planned.rel, planned.names
        qualifier = alias
    elif isinstance(node, exp.Lateral):
        raise not_supported("LATERAL", where)
    else:
        raise not_supported(f"{node.key.upper()} in FROM", where)
    if len(renames) > len(names):
        raise SqlError(
            INVALID_COLUMN_REFERENCE,
            f'table "{qualifier}" has {len(names)} columns available but {len(renames)} '
            "columns specified",
            where,
        )
    names = [*renames, *names[len(renames) :]]
    columns = [ScopeColumn(name, qualifier) for name in names]
    tables = {qualifier} if qualifier else set()
    return Frame(rel, Scope(columns, parent=outer, tables=tables))


def _join(planner: QueryPlanner, left: Frame, join: exp.Join, outer: Scope | None) -> Frame:
    where = position(join)
    right = from_item(planner, join.this, outer)
    clash = left.scope.tables & right.scope.tables
    if clash:
        raise SqlError(
            DUPLICATE_ALIAS, f'table name "{sorted(clash)[0]}" specified more than once', where
        )
    side = str(join.args.get("side") or "").upper()
    join_kind = str(join.args.get("kind") or "").upper()
    method = str(join.args.get("method") or "").upper()
    if join_kind in ("SEMI", "ANTI", "ASOF", "STRAIGHT_JOIN", "ARRAY", "POSITIONAL"):
        raise not_supported(f"{join_kind} JOIN", where)
    kind: pb.JoinKind = _SIDES.get(side, "inner")
    on = join.args.get("on")
    using = [identifier(u) for u in join.args.get("using") or []]
    if method == "NATURAL":
        if on is not None or using:
            raise SqlError(SYNTAX_ERROR, "NATURAL JOIN takes no ON or USING", where)
        using = _common_names(left.scope, right.scope)
        return _using_join(left, right, using, kind, where)
    if using:
        return _using_join(left, right, using, kind, where)
    if on is None:
        if kind != "inner":
            raise SqlError(SYNTAX_ERROR, f"{side} JOIN needs ON or USING", where)
        return _combine(left, right, r.join(left.rel, right.rel))
    return _on_join(planner, left, right, on, kind, where)


def _star(scope: Scope) -> list[int]:
    return scope.star_positions(None, 0)


def _combine(left: Frame, right: Frame, rel: r.Rel) -> Frame:
    """The frame of a join whose output is the left's columns, then the right's."""
    shift = left.rel.arity
    scope = Scope(
        [*left.scope.columns, *right.scope.columns],
        parent=left.scope.parent,
        star=[*_star(left.scope), *(shift + p for p in _star(right.scope))],
        tables=left.scope.tables | right.scope.tables,
    )
    frame = Frame(rel, scope)
    if rel.arity > left.rel.arity + right.rel.arity:
        frame.scope = frame.scope.with_unnamed(rel.arity - left.rel.arity - right.rel.arity)
    return frame


def _common_names(left: Scope, right: Scope) -> list[str]:
    right_names = {right.columns[p].name for p in _star(right)}
    names: list[str] = []
    for position_ in _star(left):
        name = left.columns[position_].name
        if name in right_names and name not in names:
            names.append(name)
    return names


def _using_join(
    left: Frame, right: Frame, names: list[str], kind: pb.JoinKind, where: int
) -> Frame:
    left_positions, right_positions = [], []
    left_keys: list[Typed] = []
    right_keys: list[Typed] = []
    for name in names:
        try:
            lp = left.scope.resolve(name, None, where)
            rp = right.scope.resolve(name, None, where)
        except SqlError as exc:
            raise SqlError(
                UNDEFINED_COLUMN,
                f'column "{name}" specified in USING clause does not exist in both tables',
                where,
            ) from exc
        lk, rk = t.comparable_pair(left.column(lp), right.column(rp), "=", where)
        left_positions.append(lp)
        right_positions.append(rp)
        left_keys.append(lk)
        right_keys.append(rk)
    shift = left.rel.arity
    rel = r.join(left.rel, right.rel, left_keys, right_keys, kind)
    left_columns = list(left.scope.columns)
    right_columns = list(right.scope.columns)
    merged: list[int] = []
    if kind == "full_outer":
        # The merged column is whichever side has the value.
        values = []
        for lp, rp in zip(left_positions, right_positions, strict=True):
            lv, rv = t.column(lp, rel.types[lp]), t.column(shift + rp, rel.types[shift + rp])
            common = t.common_type([lv, rv], "JOIN/USING", where)
            values.append(t.call("coalesce", t.convert(lv, common), t.convert(rv, common)))
        start = rel.arity
        rel = r.map_(rel, values)
        merged = list(range(start, rel.arity))
    for lp in left_positions:
        column = left_columns[lp]
        left_columns[lp] = ScopeColumn(
            column.name, column.table, kind in ("right_outer", "full_outer")
        )
    for rp in right_positions:
        column = right_columns[rp]
        right_columns[rp] = ScopeColumn(column.name, column.table, kind != "right_outer")
    if kind == "right_outer":
        merged = [shift + rp for rp in right_positions]
    elif kind != "full_outer":
        merged = list(left_positions)
    extra = [ScopeColumn(name) for name in names] if kind == "full_outer" else []
    rest_left = [p for p in _star(left.scope) if p not in left_positions]
    rest_right = [shift + p for p in _star(right.scope) if p not in right_positions]
    scope = Scope(
        [*left_columns, *right_columns, *extra],
        parent=left.scope.parent,
        star=[*merged, *rest_left, *rest_right],
        tables=left.scope.tables | right.scope.tables,
    )
    return Frame(rel, scope)


# ON conditions ----------------------------------------------------------------------------


def _conjuncts(scalar: plan_pb2.Scalar) -> list[plan_pb2.Scalar]:
    if scalar.WhichOneof("kind") == "call" and scalar.call.function == "and":
        return [part for arg in scalar.call.args for part in _conjuncts(arg)]
    return [scalar]


def _columns_used(scalar: plan_pb2.Scalar) -> set[int]:
    kind = scalar.WhichOneof("kind")
    if kind == "column":
        return {scalar.column}
    if kind == "call":
        return set().union(*(_columns_used(a) for a in scalar.call.args))
    if kind == "case":
        parts = (scalar.case.cond, scalar.case.then, scalar.case.otherwise)
        return set().union(*(_columns_used(p) for p in parts))
    if kind == "cast":
        return _columns_used(scalar.cast.input)
    return set()


def _shifted(scalar: plan_pb2.Scalar, delta: int) -> plan_pb2.Scalar:
    copy = plan_pb2.Scalar()
    copy.CopyFrom(scalar)
    _shift_in_place(copy, delta)
    return copy


def _shift_in_place(scalar: plan_pb2.Scalar, delta: int) -> None:
    kind = scalar.WhichOneof("kind")
    if kind == "column":
        scalar.column += delta
    elif kind == "call":
        for arg in scalar.call.args:
            _shift_in_place(arg, delta)
    elif kind == "case":
        for part in (scalar.case.cond, scalar.case.then, scalar.case.otherwise):
            _shift_in_place(part, delta)
    elif kind == "cast":
        _shift_in_place(scalar.cast.input, delta)


def _typed(scalar: plan_pb2.Scalar, types: Sequence[ScalarType]) -> Typed:
    return Typed(scalar, scalar_type(scalar, list(types)))


def _on_join(
    planner: QueryPlanner,
    left: Frame,
    right: Frame,
    on: exp.Expr,
    kind: pb.JoinKind,
    where: int,
) -> Frame:
    if contains_subquery(on):
        if kind != "inner":
            raise not_supported("subqueries in the ON condition of an outer join", position(on))
        frame = _combine(left, right, r.join(left.rel, right.rel))
        condition = Lowerer(frame, planner, "JOIN/ON").condition(on, "JOIN/ON")
        frame.rel = r.filter_(frame.rel, [condition])
        return frame
    probe = _combine(left, right, r.join(left.rel, right.rel))
    condition = Lowerer(probe, planner, "JOIN/ON").condition(on, "JOIN/ON")
    left_arity = left.rel.arity
    combined_types = probe.rel.types
    left_keys: list[Typed] = []
    right_keys: list[Typed] = []
    residual: list[plan_pb2.Scalar] = []
    for part in _conjuncts(condition.scalar):
        if part.WhichOneof("kind") == "literal" and part.literal.bool_value is True:
            continue
        key = _as_key(part, left_arity)
        if key is None:
            residual.append(part)
            continue
        lk, rk = key
        left_keys.append(_typed(lk, left.rel.types))
        right_keys.append(_typed(_shifted(rk, -left_arity), right.rel.types))
    right_rel, left_rel = right.rel, left.rel
    if kind in ("left_outer", "right_outer"):
        pushed_side = (
            range(left_arity, len(combined_types)) if kind == "left_outer" else range(left_arity)
        )
        pushable = [
            p for p in residual if _columns_used(p) and _columns_used(p) <= set(pushed_side)
        ]
        residual = [p for p in residual if p not in pushable]
        if kind == "left_outer":
            right_rel = r.filter_(
                right_rel, [_typed(_shifted(p, -left_arity), right_rel.types) for p in pushable]
            )
        else:
            left_rel = r.filter_(left_rel, [_typed(p, left_rel.types) for p in pushable])
    if kind == "inner" or not residual:
        rel = r.join(left_rel, right_rel, left_keys, right_keys, kind)
        rel = r.filter_(rel, [_typed(p, rel.types) for p in residual])
    else:
        rel = _outer_join_with_residual(
            planner, left_rel, right_rel, left_keys, right_keys, residual, kind
        )
    return _combine(left, right, rel)


def _as_key(
    part: plan_pb2.Scalar, left_arity: int
) -> tuple[plan_pb2.Scalar, plan_pb2.Scalar] | None:
    """``(left expression, right expression)`` when ``part`` equates one side with the other."""
    if part.WhichOneof("kind") != "call" or part.call.function != "eq":
        return None
    a, b = part.call.args
    used_a, used_b = _columns_used(a), _columns_used(b)
    if not used_a or not used_b:
        return None
    if max(used_a) < left_arity <= min(used_b):
        return a, b
    if max(used_b) < left_arity <= min(used_a):
        return b, a
    return None


def _unmatched(side: r.Rel, matched_rows: r.Rel) -> r.Rel:
    """The rows of ``side`` (with their multiplicities) that are not among ``matched_rows``."""
    matched = r.distinct(matched_rows)
    hits = r.join(
        side,
        matched,
        r.null_safe_keys(side, range(side.arity)),
        r.null_safe_keys(matched, range(matched.arity)),
    )
    return r.union([side, r.negate(r.project(hits, range(side.arity)))])


def _nulls(types: Sequence[ScalarType]) -> list[Typed]:
    return [t.null(column_type) for column_type in types]


def _outer_join_with_residual(
    planner: QueryPlanner,
    left: r.Rel,
    right: r.Rel,
    left_keys: list[Typed],
    right_keys: list[Typed],
    residual: list[plan_pb2.Scalar],
    kind: pb.JoinKind,
) -> r.Rel:
    left_binding, right_binding, inner_binding = (planner.new_binding() for _ in range(3))
    shared_left = r.local_get(left_binding, left.types)
    shared_right = r.local_get(right_binding, right.types)
    joined = r.join(shared_left, shared_right, left_keys, right_keys)
    inner = r.filter_(joined, [_typed(p, joined.types) for p in residual])
    matched = r.local_get(inner_binding, inner.types)
    nl, nr = left.arity, right.arity
    parts = [matched]
    if kind in ("left_outer", "full_outer"):
        lonely = _unmatched(shared_left, r.project(matched, range(nl)))
        parts.append(r.map_(lonely, _nulls(right.types)))
    if kind in ("right_outer", "full_outer"):
        lonely = _unmatched(shared_right, r.project(matched, range(nl, nl + nr)))
        padded = r.map_(lonely, _nulls(left.types))
        parts.append(r.project(padded, [*range(nr, nr + nl), *range(nr)]))
    output_types = tuple(
        column_type.with_nullable(True) if kind != "inner" else column_type
        for column_type in (*left.types, *right.types)
    )
    body = r.union(parts)
    body = r.Rel(body.node, output_types)
    return r.let(left_binding, left, r.let(right_binding, right, r.let(inner_binding, inner, body)))
