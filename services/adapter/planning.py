"""The SQL planner (``services.adapter.sql``) applied to the adapter's copy of the catalog.

Name resolution needs a ``CatalogView`` of the catalog state a statement runs against; one is
built per state and shared by every statement run against it (``catalog_names.catalog_view``).
"""

from __future__ import annotations

from services.adapter.catalog_cache import CatalogState
from services.adapter.catalog_names import catalog_view
from services.adapter.ddl_statements import Definition
from services.adapter.session import Settings
from services.adapter.sql import CatalogView, PlannedQuery, plan_query, plan_view, view_schema
from services.adapter.sql import statements as ast
from services.adapter.sql.dml import ChangePlan, InsertPlan, plan_delete, plan_insert, plan_update
from services.adapter.statistics import CollectionStatistics
from tidemark.plan.optimize import NO_STATISTICS, Statistics


class Planner:
    """Plans statements against a catalog state. ``stats`` (row counts of collections, kept
    fresh by the adapter) steers the optimizer's join order."""

    def __init__(self, statistics: CollectionStatistics | None = None) -> None:
        self.statistics = statistics

    @property
    def stats(self) -> Statistics:
        return self.statistics.current if self.statistics is not None else NO_STATISTICS

    async def refresh_statistics(self) -> None:
        """Brings the row counts up to date (cheap when they are recent)."""
        if self.statistics is not None:
            await self.statistics.fresh()

    def view(self, state: CatalogState) -> CatalogView:
        return catalog_view(state)

    def query(
        self, query: ast.Query, state: CatalogState, settings: Settings, *, finishing: bool = True
    ) -> PlannedQuery:
        return plan_query(
            query, self.view(state), settings.values, finishing=finishing, stats=self.stats
        )

    def insert(self, statement: ast.Insert, state: CatalogState, settings: Settings) -> InsertPlan:
        return plan_insert(statement, self.view(state), settings.values)

    def update(self, statement: ast.Update, state: CatalogState, settings: Settings) -> ChangePlan:
        return plan_update(statement, self.view(state), settings.values)

    def delete(self, statement: ast.Delete, state: CatalogState, settings: Settings) -> ChangePlan:
        return plan_delete(statement, self.view(state), settings.values)

    async def definition(
        self,
        query: ast.Query,
        state: CatalogState,
        settings: Settings,
        column_names: tuple[str, ...] | None,
    ) -> Definition:
        """A view's plan, for CREATE [MATERIALIZED] VIEW."""
        await self.refresh_statistics()
        planned = plan_view(query, self.view(state), settings.values, column_names, self.stats)
        return Definition(
            planned.plan,
            view_schema(planned),
            tuple(sorted(planned.depends_on)),
            planned.unoptimized,
        )
