"""SHOW: catalog objects, a relation's columns, session settings."""

from __future__ import annotations

from services.adapter.results import Outcome, sql_type_name, text_outcome
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2, catalog_pb2

INVALID_SCHEMA_NAME = "3F000"

_KINDS: dict[str, tuple[str, ...]] = {
    "tables": ("table",),
    "views": ("view",),
    "materialized views": ("materialized_view",),
    "indexes": ("index",),
    "sources": ("source",),
    "secrets": ("secret",),
    "connections": ("connection",),
    "subsources": ("source",),
}


def _current_schema(view: CatalogView, settings: Settings) -> tuple[str, str]:
    database = settings.database
    for schema in settings.search_path:
        if view.schema(database, schema) is not None:
            return database, schema
    raise SqlError(
        INVALID_SCHEMA_NAME,
        f"no schema of the search path ({', '.join(settings.search_path)}) exists",
    )


def _cluster_names(view: CatalogView) -> dict[str, str]:
    return {c.id: c.name.item for c in view.clusters()}


def show_objects(statement: ast.ShowObjects, view: CatalogView, settings: Settings) -> Outcome:
    kind = statement.kind
    tag = "SHOW {rows}"
    if kind == "databases":
        return text_outcome(tag, ["name"], [(d.name.database,) for d in view.databases()])
    if kind == "schemas":
        database = statement.within[-1] if statement.within else settings.database
        if view.database(database) is None:
            raise SqlError("3D000", f'database "{database}" does not exist', statement.position)
        return text_outcome(tag, ["name"], [(s.name.schema,) for s in view.schemas(database)])
    if kind == "clusters":
        rows = [
            (c.name.item, c.cluster.size, str(c.cluster.replication_factor))
            for c in view.clusters()
        ]
        return text_outcome(tag, ["name", "size", "replication_factor"], rows)
    if statement.within is not None:
        database, schema = view.schema_of(statement.within, settings.values, statement.position)
    else:
        database, schema = _current_schema(view, settings)
    items = view.objects_in(database, schema, _KINDS[kind])
    clusters = _cluster_names(view)
    if kind == "indexes":
        return _show_indexes(statement, view, settings, items, clusters)
    if kind == "materialized views":
        mv_rows = [
            (i.name.item, clusters.get(i.materialized_view.cluster_id, "?"))
            for i in items
            if statement.in_cluster is None
            or clusters.get(i.materialized_view.cluster_id) == statement.in_cluster
        ]
        return text_outcome(tag, ["name", "cluster"], mv_rows)
    if kind == "subsources":
        return _show_subsources(statement, view, settings, items)
    if kind == "sources":
        return text_outcome(tag, ["name", "type"], [(i.name.item, source_type(i)) for i in items])
    if kind == "connections":
        kinds = [(i.name.item, i.connection.WhichOneof("kind") or "?") for i in items]
        return text_outcome(tag, ["name", "type"], kinds)
    # SHOW SECRETS lists names only: a secret's value is never shown.
    return text_outcome(tag, ["name"], [(i.name.item,) for i in items])


_SOURCE_FORMATS = {
    catalog_pb2.SOURCE_FORMAT_CDCV2: "cdcv2",
    catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR: "load-generator",
    catalog_pb2.SOURCE_FORMAT_POSTGRES: "postgres",
}


def source_type(item: catalog_pb2.CatalogItem) -> str:
    """SHOW SOURCES' ``type``, as Materialize names them: the format for a source,
    ``subsource`` or ``progress`` for its other relations."""
    role = item.source.role
    if role == catalog_pb2.SOURCE_ROLE_SUBSOURCE:
        return "subsource"
    if role == catalog_pb2.SOURCE_ROLE_PROGRESS:
        return "progress"
    return _SOURCE_FORMATS.get(item.source.format, "source")


def _show_subsources(
    statement: ast.ShowObjects,
    view: CatalogView,
    settings: Settings,
    items: list[catalog_pb2.CatalogItem],
) -> Outcome:
    """Materialize's SHOW SUBSOURCES [ON source]: the subsources and progress relations, of
    the current (or named) schema or of one source."""
    if statement.on is not None:
        source = view.resolve(statement.on, settings.values, statement.position)
        items = [
            i
            for i in view.dependents(source.id)
            if i.WhichOneof("body") == "source" and i.source.primary_id == source.id
        ]
    rows = [
        (i.name.item, source_type(i))
        for i in items
        if i.source.role != catalog_pb2.SOURCE_ROLE_PRIMARY
    ]
    return text_outcome("SHOW {rows}", ["name", "type"], sorted(rows))


def _show_indexes(
    statement: ast.ShowObjects,
    view: CatalogView,
    settings: Settings,
    items: list[catalog_pb2.CatalogItem],
    clusters: dict[str, str],
) -> Outcome:
    if statement.on is not None:
        relation = view.resolve(statement.on, settings.values, statement.position)
        items = view.indexes_on(relation.id)
    rows = []
    for item in items:
        cluster = clusters.get(item.index.cluster_id, "?")
        if statement.in_cluster is not None and cluster != statement.in_cluster:
            continue
        on = view.by_id(item.index.on_id)
        rows.append(
            (
                item.name.item,
                on.name.item if on is not None else item.index.on_id,
                cluster,
                ", ".join(item.index.key_columns),
            )
        )
    return text_outcome("SHOW {rows}", ["name", "on", "cluster", "key"], rows)


def show_columns(statement: ast.ShowColumns, view: CatalogView, settings: Settings) -> Outcome:
    relation = view.resolve(statement.relation, settings.values, statement.position)
    rows = [
        (column.name, "true" if column.nullable else "false", sql_type_name(column))
        for column in relation.schema.columns
    ]
    return text_outcome("SHOW {rows}", ["name", "nullable", "type"], rows)


def show_setting(statement: ast.ShowSetting, settings: Settings) -> Outcome:
    if statement.name == "all":
        return text_outcome("SHOW {rows}", ["name", "setting", "description"], settings.all())
    value = settings.get(statement.name)
    column = adapter_pb2.SqlColumn(name=statement.name, type="text", nullable=False)
    row = adapter_pb2.SqlRow(values=[adapter_pb2.SqlValue(text_value=value)])
    return Outcome("SHOW", [column], [row])
