"""SQL for the adapter: parsing statements, resolving names against a catalog snapshot, and
planning queries and DML into the plan IR (``tidemark/v1/plan.proto``).

::

    statements = parse(sql)
    catalog = CatalogView(snapshot.items)
    planned = plan_query(statement.query, catalog, session_settings)
    # planned.plan -> compute; planned.finishing -> applied to the rows by the adapter

Every problem with a statement is a :class:`SqlError` carrying its SQLSTATE and position.
"""

from services.adapter.sql.catalog_view import (
    DEFAULT_CLUSTER,
    DEFAULT_DATABASE,
    DEFAULT_SCHEMA,
    BoundRelation,
    CatalogView,
    search_path,
    session_database,
)
from services.adapter.sql.ddl import key_positions, relation_schema
from services.adapter.sql.dml import ChangePlan, InsertPlan, plan_delete, plan_insert, plan_update
from services.adapter.sql.errors import SqlError
from services.adapter.sql.parser import parse
from services.adapter.sql.planned import Finishing, OutputColumn, PlannedQuery, SortSpec
from services.adapter.sql.query import explain_query, plan_query, plan_view, view_schema
from services.adapter.sql.types import SqlType, parse_type_name, type_name

__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_DATABASE",
    "DEFAULT_SCHEMA",
    "BoundRelation",
    "CatalogView",
    "ChangePlan",
    "Finishing",
    "InsertPlan",
    "OutputColumn",
    "PlannedQuery",
    "SortSpec",
    "SqlError",
    "SqlType",
    "explain_query",
    "key_positions",
    "parse",
    "parse_type_name",
    "plan_delete",
    "plan_insert",
    "plan_query",
    "plan_update",
    "plan_view",
    "relation_schema",
    "search_path",
    "session_database",
    "type_name",
    "view_schema",
]
