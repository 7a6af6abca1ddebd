"""The query planner: SELECT, set operations, VALUES and WITH lowered to plan relations.

A query is planned clause by clause in SQL's logical order: FROM (joins), WHERE, GROUP BY
and aggregates, HAVING, the select list, DISTINCT, ORDER BY, LIMIT/OFFSET. Views are inlined
(their stored plan replaces the name), CTEs are Let bindings. ORDER BY, LIMIT and OFFSET stay
pending in :class:`Planned`; a subquery applies them with TopK (:meth:`finish_inner`), the
outermost query hands them to the adapter.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.aggregates import aggregate, collect_aggregates, group_key_nodes
from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.correlation import Correlation, CorrelationGrew, OuterResolver
from services.adapter.sql.errors import (
    AMBIGUOUS_COLUMN,
    SYNTAX_ERROR,
    SqlError,
    not_supported,
)
from services.adapter.sql.expressions import (
    Lowerer,
    Substitution,
    contains_subquery,
    is_aggregate,
)
from services.adapter.sql.joins import INVALID_COLUMN_REFERENCE, plan_from
from services.adapter.sql.names import QualifiedName, identifier, position
from services.adapter.sql.planned import Planned
from services.adapter.sql.scope import Frame, Scope, ScopeColumn
from services.adapter.sql.typed import Typed
from services.adapter.sql.windows import collect_windows, named_windows, plan_windows
from services.adapter.sql.windows import output_name as window_output_name
from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

INVALID_ROW_COUNT = "2201W"
_UNSUPPORTED_SELECT_PARTS = {
    "qualify": "QUALIFY",
    "laterals": "LATERAL",
    "locks": "FOR UPDATE/SHARE",
    "into": "SELECT INTO",
    "sample": "TABLESAMPLE",
    "connect": "CONNECT BY",
    "prewhere": "PREWHERE",
    "cluster": "CLUSTER BY",
    "distribute": "DISTRIBUTE BY",
    "sort": "SORT BY",
    "match": "MATCH_RECOGNIZE",
    "kind": "SELECT AS",
}


@dataclass(frozen=True)
class CteBinding:
    binding: int
    types: r.Types
    names: list[str]


def _scalar_key(value: Typed) -> bytes:
    return value.scalar.SerializeToString(deterministic=True)


class QueryPlanner:
    """Plans the queries of one statement against one catalog snapshot."""

    def __init__(self, catalog: CatalogView, settings: Mapping[str, str]) -> None:
        self.catalog = catalog
        self.settings = settings
        self.depends_on: set[str] = set()
        self._bindings = itertools.count(1)
        self._ctes: list[dict[str, CteBinding]] = []

    def new_binding(self) -> int:
        return next(self._bindings)

    # Names ------------------------------------------------------------------------------

    def table(self, name: QualifiedName, where: int) -> tuple[r.Rel, list[str]]:
        """The relation a name in FROM denotes: a CTE, or a catalog relation (a view's stored
        plan inlined, a table, source or materialized view read from its collection)."""
        if len(name) == 1:
            for ctes in reversed(self._ctes):
                found = ctes.get(name[0])
                if found is not None:
                    return r.local_get(found.binding, found.types), list(found.names)
        bound = self.catalog.resolve(name, self.settings, where)
        self.depends_on.add(bound.id)
        types = tuple(ScalarType.of_column(c) for c in bound.schema.columns)
        if bound.plan is not None:
            return r.Rel(bound.plan.root, types), bound.schema.names
        assert bound.collection_id is not None
        return r.get(bound.collection_id, bound.schema), bound.schema.names

    # Queries ----------------------------------------------------------------------------

    def plan_subquery(self, node: exp.Expr, outer: Scope | None) -> Planned:
        return self.finish_inner(self.plan_node(node, outer))

    def plan_correlated(
        self, node: exp.Expr, frame: Frame, resolve_outer: OuterResolver
    ) -> tuple[Planned, Correlation | None]:
        """A subquery in an expression over ``frame``: planned over the distinct values of
        the outer columns it reads, when it reads any (see correlation.py)."""
        correlation = Correlation(resolve_outer, frame.rel.types, self.new_binding())
        while True:
            attempt = Correlation(
                correlation.outer,
                correlation.outer_types,
                correlation.binding,
                list(correlation.positions),
            )
            try:
                planned = self.finish_inner(self.plan_node(node, None, attempt))
            except CorrelationGrew as grown:
                if grown.correlation is not attempt:
                    raise
                correlation = attempt
                continue
            return planned, (attempt if attempt.width else None)

    def finish_inner(self, planned: Planned) -> Planned:
        """Applies pending LIMIT/OFFSET with TopK and drops ORDER BY-only columns (a
        subquery's order means nothing else)."""
        rel = planned.rel
        one_row = planned.at_most_one_row
        if planned.limit is not None or planned.offset:
            per = range(planned.correlation_width)
            rel = r.top_k(rel, planned.order, planned.limit, planned.offset, per)
            one_row = one_row or (planned.limit is not None and planned.limit <= 1)
        rel = r.project(rel, range(planned.visible))
        return Planned(
            rel,
            planned.names[: planned.visible],
            planned.visible,
            planned.unknowns,
            [],
            at_most_one_row=one_row,
            correlation_width=planned.correlation_width,
        )

    def plan_node(
        self, node: exp.Expr, outer: Scope | None, correlation: Correlation | None = None
    ) -> Planned:
        """A query with its ORDER BY/LIMIT/OFFSET still pending."""
        with_clause = node.args.get("with_") or node.args.get("with")
        if with_clause is None:
            return self._plan_body(node, outer, correlation)
        if with_clause.args.get("recursive"):
            raise not_supported("WITH RECURSIVE", position(with_clause))
        ctes: dict[str, CteBinding] = {}
        values: list[tuple[int, r.Rel]] = []
        self._ctes.append(ctes)
        try:
            for cte in with_clause.expressions:
                alias, renames = _cte_alias(cte)
                if alias in ctes:
                    raise SqlError(
                        "42712",
                        f'WITH query name "{alias}" specified more than once',
                        position(cte),
                    )
                planned = self.plan_subquery(cte.this, outer)
                names = _renamed(planned.names, renames, alias, position(cte))
                binding = self.new_binding()
                ctes[alias] = CteBinding(binding, planned.rel.types, names)
                values.append((binding, planned.rel))
            body = self._plan_body(node, outer, correlation)
        finally:
            self._ctes.pop()
        rel = body.rel
        for binding, value in reversed(values):
            rel = r.let(binding, value, rel)
        body.rel = rel
        return body

    def _plan_body(
        self, node: exp.Expr, outer: Scope | None, correlation: Correlation | None = None
    ) -> Planned:
        if isinstance(node, exp.Select):
            return self._plan_select(node, outer, correlation)
        if isinstance(node, exp.Union | exp.Except | exp.Intersect):
            return self._plan_set_operation(node, outer, correlation)
        if isinstance(node, exp.Values):
            return self._with_modifiers(self.plan_values(node, outer), node)
        if isinstance(node, exp.Subquery):
            inner = self.plan_node(node.this, outer, correlation)
            if not any(node.args.get(k) for k in ("order", "limit", "offset")):
                return inner
            return self._with_modifiers(self.finish_inner(inner), node)
        raise not_supported(f"{node.key.upper()} as a query", position(node))

    # VALUES -----------------------------------------------------------------------------

    def values_cells(
        self, node: exp.Values, outer: Scope | None
    ) -> tuple[list[Frame], list[list[Typed]]]:
        """Each VALUES row lowered over its own one-row frame (untyped literals kept)."""
        rows = [
            row.expressions if isinstance(row, exp.Tuple) else [row] for row in node.expressions
        ]
        width = len(rows[0])
        frames: list[Frame] = []
        cells: list[list[Typed]] = []
        for row, row_node in zip(rows, node.expressions, strict=True):
            if len(row) != width:
                raise SqlError(
                    SYNTAX_ERROR, "VALUES lists must all be the same length", position(row_node)
                )
            frame = Frame(r.one_row(), Scope([ScopeColumn("")], parent=outer))
            lowerer = Lowerer(frame, self, "VALUES")
            cells.append([lowerer.lower(cell) for cell in row])
            frames.append(frame)
        return frames, cells

    def plan_values(self, node: exp.Values, outer: Scope | None) -> Planned:
        frames, cells = self.values_cells(node, outer)
        width = len(cells[0])
        where = position(node)
        types = [t.common_type([row[i] for row in cells], "VALUES", where) for i in range(width)]
        converted = [
            [t.convert(cell, types[i], where) for i, cell in enumerate(row)] for row in cells
        ]
        names = [f"column{i + 1}" for i in range(width)]
        unknowns: list[Typed | None] = [
            cells[0][i] if len(cells) == 1 and cells[0][i].is_unknown else None
            for i in range(width)
        ]
        simple = all(f.rel.arity == 1 for f in frames)
        if simple and all(t.is_literal(cell) for row in converted for cell in row):
            rel = r.constant(types, [[t.literal_value(c) for c in row] for row in converted])
        else:
            parts = []
            for frame, row in zip(frames, converted, strict=True):
                start = frame.rel.arity
                mapped = r.map_(frame.rel, row)
                parts.append(r.project(mapped, range(start, mapped.arity)))
            rel = r.union(parts)
        return Planned(rel, names, width, unknowns, [], at_most_one_row=len(cells) == 1)

    # SELECT -----------------------------------------------------------------------------

    def _plan_select(
        self, select: exp.Select, outer: Scope | None, correlation: Correlation | None = None
    ) -> Planned:
        for part, label in _UNSUPPORTED_SELECT_PARTS.items():
            value = select.args.get(part)
            if value:
                node = value[0] if isinstance(value, list) else value
                where = position(node) if isinstance(node, exp.Expr) else 0
                raise not_supported(label, where or position(select))
        distinct = select.args.get("distinct")
        if distinct is not None and distinct.args.get("on") is not None:
            raise not_supported("DISTINCT ON", position(distinct.args["on"]))
        frame = plan_from(self, select, outer if correlation is None else None)
        width = 0
        if correlation is not None:
            # Outer names resolve through the correlation; once it has columns, they lead.
            width = correlation.width
            if width:
                frame = Frame(
                    correlation.with_values(frame.rel), frame.scope.behind(width, correlation)
                )
            else:
                frame = Frame(frame.rel, frame.scope.behind(0, correlation))
        where_clause = select.args.get("where")
        if where_clause is not None:
            # Conditions without subqueries filter first, so that a subquery's outer values
            # (and its join back) come from the rows that pass them.
            parts = _conjuncts(where_clause.this)
            plain = [part for part in parts if not contains_subquery(part)]
            nested = [part for part in parts if contains_subquery(part)]
            for group in (plain, nested):
                if group:
                    lowerer = Lowerer(frame, self, "WHERE")
                    conditions = [lowerer.condition(part, "WHERE") for part in group]
                    frame.rel = r.filter_(frame.rel, conditions)
        outputs = list(select.expressions)
        having = select.args.get("having")
        order = select.args.get("order")
        ordered = list(order.expressions) if order is not None else []
        aggregates = collect_aggregates(
            [*outputs, having.this if having is not None else None, *(o.this for o in ordered)]
        )
        grouped = bool(select.args.get("group")) or bool(aggregates) or having is not None
        substitution: Substitution | None = None
        star_scope = frame.scope
        if grouped:
            keys = group_key_nodes(select, outputs, frame.scope)
            result = aggregate(
                frame, self, keys, aggregates, bool(select.args.get("group")), correlation
            )
            frame, substitution = result.frame, result.grouping
            if having is not None:
                condition = Lowerer(frame, self, "HAVING", substitution).condition(
                    having.this, "HAVING"
                )
                frame.rel = r.filter_(frame.rel, [condition])
        windows = collect_windows([*outputs, *(o.this for o in ordered)])
        if windows and width:
            raise not_supported("window functions in a correlated subquery", position(select))
        if windows:
            substitution = plan_windows(frame, self, windows, named_windows(select), substitution)
        lowerer = Lowerer(frame, self, "SELECT", substitution)
        items, names = self._select_list(outputs, lowerer, star_scope, grouped)
        order_keys, hidden = self._order_by(ordered, items, names, lowerer)
        if distinct is not None and hidden:
            raise SqlError(
                INVALID_COLUMN_REFERENCE,
                "for SELECT DISTINCT, ORDER BY expressions must appear in select list",
                position(order),
            )
        unknowns: list[Typed | None] = [item if item.is_unknown else None for item in items]
        if width:
            # The outer values lead every row of a correlated subquery.
            items = [frame.column(i) for i in range(width)] + items
            names = [""] * width + names
            unknowns = [*(None for _ in range(width)), *unknowns]
            order_keys = [_shifted_key(key, width) for key in order_keys]
        rel = project_values(frame, [t.resolve(item) for item in [*items, *hidden]])
        if distinct is not None:
            rel = r.distinct(rel)
        limit, offset = _limit_offset(select)
        no_from = select.args.get("from_") is None and select.args.get("from") is None
        global_aggregate = grouped and not select.args.get("group")
        return Planned(
            rel,
            [*names, *(f"?order{i}?" for i in range(len(hidden)))],
            len(items),
            unknowns,
            order_keys,
            limit,
            offset,
            at_most_one_row=global_aggregate or no_from,
            correlation_width=width,
        )

    def _select_list(
        self,
        outputs: Sequence[exp.Expr],
        lowerer: Lowerer,
        star_scope: Scope,
        grouped: bool,
    ) -> tuple[list[Typed], list[str]]:
        items: list[Typed] = []
        names: list[str] = []
        for node in outputs:
            star_table = _star_table(node)
            if star_table is not None:
                table = star_table or None
                positions = star_scope.star_positions(table, position(node))
                for index in positions:
                    column = star_scope.columns[index]
                    if grouped:
                        reference = _column_node(column, node)
                        items.append(lowerer.lower(reference))
                    else:
                        items.append(lowerer.frame.column(index))
                    names.append(column.name)
                continue
            if isinstance(node, exp.Alias):
                items.append(lowerer.lower(node.this))
                names.append(identifier(node.args["alias"]))
            else:
                items.append(lowerer.lower(node))
                names.append(output_name(node))
        if not items:
            raise not_supported("SELECT with no columns", position(outputs[0]) if outputs else 0)
        return items, names

    def _order_by(
        self,
        ordered: Sequence[exp.Expr],
        items: list[Typed],
        names: list[str],
        lowerer: Lowerer,
    ) -> tuple[list[plan_pb2.SortKey], list[Typed]]:
        keys: list[plan_pb2.SortKey] = []
        hidden: list[Typed] = []
        known = {_scalar_key(t.resolve(item)): i for i, item in reversed(list(enumerate(items)))}
        for entry in ordered:
            node = entry.this
            where = position(entry)
            index = _output_reference(node, names, items, where)
            if index is None:
                value = t.resolve(lowerer.lower(node))
                key = _scalar_key(value)
                if key in known:
                    index = known[key]
                else:
                    index = len(items) + len(hidden)
                    known[key] = index
                    hidden.append(value)
            value_type = (
                items[index].type if index < len(items) else hidden[index - len(items)].type
            )
            if value_type.kind is ColumnType.JSON:
                raise not_supported("ordering by jsonb values", where)
            keys.append(_sort_key(entry, index))
        return keys, hidden

    # Set operations ---------------------------------------------------------------------

    def _plan_set_operation(
        self, node: exp.Expr, outer: Scope | None, correlation: Correlation | None = None
    ) -> Planned:
        where = position(node)
        operator = node.key.upper()
        left = self.finish_inner(self.plan_node(node.this, outer, correlation))
        right = self.finish_inner(self.plan_node(node.expression, outer, correlation))
        if left.visible != right.visible:
            raise SqlError(
                SYNTAX_ERROR, f"each {operator} query must have the same number of columns", where
            )
        targets = []
        for i in range(left.visible):
            pair = [_branch_column(left, i), _branch_column(right, i)]
            targets.append(t.common_type(pair, operator, where))
        lrel, rrel = _conform(left, targets, where), _conform(right, targets, where)
        distinct = bool(node.args.get("distinct"))
        if isinstance(node, exp.Union):
            rel = r.union([lrel, rrel])
        elif isinstance(node, exp.Except):
            rel = r.threshold(r.union([r.distinct(lrel) if distinct else lrel, r.negate(rrel)]))
        else:
            binding = self.new_binding()
            shared = r.local_get(binding, lrel.types)
            only_left = r.threshold(r.union([shared, r.negate(rrel)]))
            rel = r.let(binding, lrel, r.union([shared, r.negate(only_left)]))
        if distinct and not isinstance(node, exp.Except):
            rel = r.distinct(rel)
        planned = Planned(
            rel,
            left.names,
            left.visible,
            [None] * left.visible,
            [],
            correlation_width=left.correlation_width,
        )
        if planned.correlation_width and node.args.get("order"):
            raise not_supported("ORDER BY on a set operation in a correlated subquery", where)
        return self._with_modifiers(planned, node)

    def _with_modifiers(self, planned: Planned, node: exp.Expr) -> Planned:
        """ORDER BY/LIMIT/OFFSET on a set operation or VALUES: by output column only."""
        order = node.args.get("order")
        keys: list[plan_pb2.SortKey] = []
        for entry in order.expressions if order is not None else []:
            index = _output_reference(entry.this, planned.names, None, position(entry))
            if index is None:
                raise not_supported(
                    f"ORDER BY {entry.this.sql(dialect='postgres')} on {node.key.upper()} "
                    "(only result column names or numbers)",
                    position(entry),
                )
            keys.append(_sort_key(entry, index))
        limit, offset = _limit_offset(node)
        planned.order = keys
        planned.limit, planned.offset = limit, offset
        return planned


# Helpers ----------------------------------------------------------------------------------


def _cte_alias(cte: exp.Expr) -> tuple[str, list[str]]:
    alias = cte.args.get("alias")
    if not isinstance(alias, exp.TableAlias) or alias.this is None:
        raise SqlError(SYNTAX_ERROR, "a WITH query needs a name", position(cte))
    return identifier(alias.this), [identifier(c) for c in alias.columns]


def _renamed(names: list[str], renames: list[str], alias: str, where: int) -> list[str]:
    if len(renames) > len(names):
        raise SqlError(
            INVALID_COLUMN_REFERENCE,
            f'WITH query "{alias}" has {len(names)} columns available but {len(renames)} '
            "columns specified",
            where,
        )
    return [*renames, *names[len(renames) :]]


def _star_table(node: exp.Expr) -> str | None:
    """ "" for ``*``, the table for ``t.*``, None for anything else."""
    if isinstance(node, exp.Star):
        return ""
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
        return identifier(node.args["table"]) if node.args.get("table") else ""
    return None


def _column_node(column: ScopeColumn, origin: exp.Expr) -> exp.Column:
    name = exp.Identifier(this=column.name, quoted=True)
    name.meta["start"] = position(origin) - 1 if position(origin) else 0
    table = exp.Identifier(this=column.table, quoted=True) if column.table else None
    return exp.Column(this=name, table=table)


def project_values(frame: Frame, values: Sequence[Typed]) -> r.Rel:
    """``frame``'s relation reduced to ``values`` (plain columns are projected, the rest
    computed by one Map)."""
    computed = [v for v in values if v.scalar.WhichOneof("kind") != "column"]
    start = frame.rel.arity
    rel = r.map_(frame.rel, computed)
    positions, next_computed = [], start
    for value in values:
        if value.scalar.WhichOneof("kind") == "column":
            positions.append(value.scalar.column)
        else:
            positions.append(next_computed)
            next_computed += 1
    return r.project(rel, positions)


def output_name(node: exp.Expr) -> str:
    """The name PostgreSQL gives a select item without an alias."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column):
        return identifier(node.this)
    if isinstance(node, exp.Window):
        return window_output_name(node)
    if isinstance(node, exp.Cast):
        inner = output_name(node.this)
        if inner != "?column?":
            return inner
        return str(node.args["to"].sql(dialect="postgres")).lower()
    if isinstance(node, exp.Filter):
        return output_name(node.this)
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, exp.Subquery):
        inner = node.this
        if isinstance(inner, exp.Select) and inner.expressions:
            first = inner.expressions[0]
            if isinstance(first, exp.Alias):
                return identifier(first.args["alias"])
            return output_name(first)
        return "?column?"
    if isinstance(node, exp.Extract):
        return "extract"
    if isinstance(node, exp.Substring):
        return "substring"
    if isinstance(node, exp.Anonymous):
        return identifier(node.this) if isinstance(node.this, str) else str(node.name).lower()
    if is_aggregate(node) or isinstance(node, exp.Func):
        return str(node.key)
    return "?column?"


def _output_reference(
    node: exp.Expr, names: Sequence[str], items: Sequence[Typed] | None, where: int
) -> int | None:
    """ORDER BY 2 or ORDER BY name: the output column meant, if any."""
    if isinstance(node, exp.Literal) and not node.is_string:
        text = str(node.this)
        index = int(text) if text.isdigit() else 0
        if not 1 <= index <= len(names):
            raise SqlError(
                INVALID_COLUMN_REFERENCE, f"ORDER BY position {text} is not in select list", where
            )
        return index - 1
    if (
        isinstance(node, exp.Column)
        and not node.args.get("table")
        and not isinstance(node.this, exp.Star)
    ):
        name = identifier(node.this)
        matches = [i for i, n in enumerate(names) if n == name]
        if len(matches) > 1 and items is not None:
            distinct = {_scalar_key(t.resolve(items[i])) for i in matches}
            if len(distinct) > 1:
                raise SqlError(AMBIGUOUS_COLUMN, f'ORDER BY "{name}" is ambiguous', where)
        if matches:
            return matches[0]
    return None


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The parts of ``a AND b AND ...`` (through parentheses), or ``[node]``."""
    inner = node
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.And):
        return [*_conjuncts(inner.this), *_conjuncts(inner.expression)]
    return [node]


def _shifted_key(key: plan_pb2.SortKey, offset: int) -> plan_pb2.SortKey:
    return pb.sort_key(key.column + offset, key.descending, key.nulls_flipped)


def _sort_key(entry: exp.Expr, index: int) -> plan_pb2.SortKey:
    descending = bool(entry.args.get("desc"))
    nulls_first = entry.args.get("nulls_first")
    first = descending if nulls_first is None else bool(nulls_first)
    return pb.sort_key(index, descending, first != descending)


def _row_count(node: exp.Expr | None, what: str) -> int | None:
    if node is None or isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Var) and node.name.upper() == "ALL":
        return None
    value = node
    negative = False
    if isinstance(value, exp.Neg):
        negative, value = True, value.this
    if isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit():
        if negative and int(value.this) != 0:
            raise SqlError(INVALID_ROW_COUNT, f"{what} must not be negative", position(node))
        return int(value.this)
    raise not_supported(f"{what} that is not an integer constant", position(node))


def _limit_offset(node: exp.Expr) -> tuple[int | None, int]:
    limit_clause = node.args.get("limit")
    limit: int | None = None
    if isinstance(limit_clause, exp.Fetch):
        options = limit_clause.args.get("limit_options")
        if options is not None and (options.args.get("with_ties") or options.args.get("percent")):
            raise not_supported("FETCH ... WITH TIES or PERCENT", position(limit_clause))
        count = limit_clause.args.get("count")
        limit = 1 if count is None else _row_count(count, "FETCH FIRST")
    elif limit_clause is not None:
        limit = _row_count(limit_clause.expression, "LIMIT")
    offset_clause = node.args.get("offset")
    offset = 0
    if offset_clause is not None:
        offset = _row_count(offset_clause.expression, "OFFSET") or 0
    return limit, offset


def _branch_column(planned: Planned, index: int) -> Typed:
    unknown = planned.unknowns[index] if index < len(planned.unknowns) else None
    return unknown if unknown is not None else t.column(index, planned.rel.types[index])


def _conform(planned: Planned, targets: Sequence[ScalarType], where: int) -> r.Rel:
    """A set operation branch with its columns converted to the common types."""
    values = [
        t.convert(_branch_column(planned, i), target, where) for i, target in enumerate(targets)
    ]
    if all(v.scalar.WhichOneof("kind") == "column" for v in values):
        return planned.rel
    frame = Frame(planned.rel, Scope([ScopeColumn("") for _ in planned.rel.types]))
    return project_values(frame, values)
