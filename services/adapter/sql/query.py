"""Entry points for planning queries: ``plan_query``, ``plan_view`` and ``explain_query``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.errors import (
    DUPLICATE_COLUMN,
    RESERVED_NAME,
    SYNTAX_ERROR,
    SqlError,
)
from services.adapter.sql.planned import (
    Finishing,
    OutputColumn,
    Planned,
    PlannedQuery,
    SortSpec,
)
from services.adapter.sql.relations import unique_names
from services.adapter.sql.select import QueryPlanner
from services.adapter.sql.statements import Query
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar.schema import RESERVED_COLUMNS
from tidemark.errors import InvalidArgument
from tidemark.logging import get_logger
from tidemark.plan import builders as pb
from tidemark.plan import check_plan, explain
from tidemark.plan.optimize import NO_STATISTICS, Statistics, optimize
from tidemark.plan.scalar_types import ScalarType
from tidemark.plan.walk import collections_read
from tidemark.v1 import plan_pb2

log = get_logger("services.adapter.sql.query")

INTERNAL_ERROR = "XX000"


def plan_query(
    query: Query | exp.Expr,
    catalog: CatalogView,
    settings: Mapping[str, str],
    *,
    finishing: bool = True,
    stats: Statistics = NO_STATISTICS,
) -> PlannedQuery:
    """Lowers a query to a plan over storage collections, optimized (``stats`` steers join
    order).

    With ``finishing`` (a SELECT's result), the outermost ORDER BY, LIMIT and OFFSET are left
    to the adapter in ``PlannedQuery.finishing``. Without it (views, SUBSCRIBE, indexes), they
    become a TopK in the plan and ``finishing`` is trivial. Raises SqlError.
    """
    ast = query.ast if isinstance(query, Query) else query
    planner = QueryPlanner(catalog, settings)
    try:
        planned = planner.plan_node(ast, None)
        if not finishing:
            planned = planner.finish_inner(planned)
        return _finish(planned, planner.depends_on, stats)
    except SqlError as exc:
        # Errors with no better place point at the query.
        raise exc.at(query.position if isinstance(query, Query) else 0) from None


def plan_with(
    planner: QueryPlanner, planned: Planned, stats: Statistics = NO_STATISTICS
) -> PlannedQuery:
    """A PlannedQuery of a relation a planner built (DML uses this)."""
    return _finish(planner.finish_inner(planned), planner.depends_on, stats)


def _optimized(plan: plan_pb2.Plan, stats: Statistics) -> tuple[plan_pb2.Plan, tuple[str, ...]]:
    """The optimized plan; the plan as it was should the optimizer ever produce one that
    does not check (a bug, logged, never an answer changed)."""
    result = optimize(plan, stats)
    try:
        check_plan(result.plan)
    except InvalidArgument as exc:
        log.error("optimizer_built_invalid_plan", error=exc.message)
        return plan, ()
    return result.plan, tuple(result.changed_by)


def _finish(planned: Planned, depends_on: set[str], stats: Statistics) -> PlannedQuery:
    plan = pb.plan(planned.rel.node)
    try:
        derived = check_plan(plan)
    except InvalidArgument as exc:
        raise SqlError(
            INTERNAL_ERROR, f"internal error: the planner built an invalid plan: {exc.message}"
        ) from exc
    names = unique_names(planned.names)
    schema = RelationSchema(
        ScalarType.of_column(column).column(name)
        for column, name in zip(derived.columns, names, strict=True)
    )
    plan.output_schema.CopyFrom(schema.to_proto())
    columns = tuple(
        OutputColumn(planned.names[i], ScalarType.of_column(derived.columns[i]))
        for i in range(planned.visible)
    )
    order = tuple(
        SortSpec(key.column, key.descending, key.descending != key.nulls_flipped)
        for key in planned.order
    )
    finishing = Finishing(order, planned.limit, planned.offset, tuple(range(planned.visible)))
    optimized, changed_by = _optimized(plan, stats)
    return PlannedQuery(
        plan=optimized,
        columns=columns,
        depends_on=frozenset(depends_on),
        collections=frozenset(collections_read(optimized)),
        finishing=finishing,
        raw_plan=plan,
        changed_by=changed_by,
    )


def plan_view(
    query: Query | exp.Expr,
    catalog: CatalogView,
    settings: Mapping[str, str],
    column_names: Sequence[str] | None = None,
    stats: Statistics = NO_STATISTICS,
) -> PlannedQuery:
    """A view's (or materialized view's, or index's) plan: ORDER BY/LIMIT inside the plan,
    and column names that can be a relation's (``CREATE VIEW v (a, b)`` renames). 42701 for
    duplicate names, 42939 for the reserved ``time``/``diff``."""
    planned = plan_query(query, catalog, settings, finishing=False, stats=stats)
    names = [c.name for c in planned.columns]
    if column_names is not None:
        if len(column_names) > len(names):
            raise SqlError(SYNTAX_ERROR, "CREATE VIEW specifies more column names than columns")
        names = [*column_names, *names[len(column_names) :]]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SqlError(DUPLICATE_COLUMN, f'column "{name}" specified more than once')
        if name in RESERVED_COLUMNS:
            raise SqlError(RESERVED_NAME, f'column name "{name}" is reserved; rename it with AS')
        seen.add(name)
    schema = RelationSchema(
        Column(
            name, column.type.kind, column.type.nullable, column.type.precision, column.type.scale
        )
        for name, column in zip(names, planned.columns, strict=True)
    )
    plan, raw = (_renamed(p, schema) for p in (planned.plan, planned.unoptimized))
    columns = tuple(
        OutputColumn(name, column.type) for name, column in zip(names, planned.columns, strict=True)
    )
    return PlannedQuery(
        plan,
        columns,
        planned.depends_on,
        planned.collections,
        planned.finishing,
        raw,
        planned.changed_by,
    )


def _renamed(plan: plan_pb2.Plan, schema: RelationSchema) -> plan_pb2.Plan:
    result = plan_pb2.Plan()
    result.CopyFrom(plan)
    result.output_schema.CopyFrom(schema.to_proto())
    return result


def view_schema(planned: PlannedQuery) -> RelationSchema:
    return RelationSchema.from_proto(planned.plan.output_schema)


def explain_query(planned: PlannedQuery, *, raw: bool = False) -> str:
    """EXPLAIN's text: the plan (optimized, or as planned with ``raw``), and what the adapter
    does to its rows."""
    lines = [explain(planned.unoptimized if raw else planned.plan)]
    finishing = planned.finishing
    if not finishing.is_trivial:
        parts = []
        if finishing.order_by:
            keys = ", ".join(
                f"#{k.column}{' desc' if k.descending else ''}"
                f"{' nulls first' if k.nulls_first else ' nulls last'}"
                for k in finishing.order_by
            )
            parts.append(f"order_by=[{keys}]")
        if finishing.limit is not None:
            parts.append(f"limit={finishing.limit}")
        if finishing.offset:
            parts.append(f"offset={finishing.offset}")
        if len(finishing.project) != len(planned.plan.output_schema.columns):
            parts.append(f"project=[{', '.join(f'#{c}' for c in finishing.project)}]")
        lines.insert(0, "Finish " + " ".join(parts))
    return "\n".join(lines)
