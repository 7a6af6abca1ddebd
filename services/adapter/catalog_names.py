"""Names in DDL: where a new object goes, and which existing object a name means.

A name of one part is looked up in each schema of ``search_path`` (in the session's database)
and created in the first; two parts are ``schema.name`` in the session's database; three are
``database.schema.name``. Clusters and databases have one-part names.
"""

from __future__ import annotations

from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.session import Settings
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import QualifiedName, dotted
from tidemark.v1 import catalog_pb2

UNDEFINED_TABLE = "42P01"
UNDEFINED_OBJECT = "42704"
UNDEFINED_DATABASE = "3D000"
UNDEFINED_SCHEMA = "3F000"
WRONG_OBJECT_TYPE = "42809"
SYNTAX_ERROR = "42601"
INVALID_SCHEMA_NAME = "3F000"

RELATION_KINDS = ("table", "source", "view", "materialized_view")
KIND_NAMES = {
    "table": "table",
    "source": "source",
    "view": "view",
    "materialized_view": "materialized view",
    "index": "index",
    "cluster": "cluster",
    "database": "database",
    "schema": "schema",
}


def kind_name(item: catalog_pb2.CatalogItem) -> str:
    return KIND_NAMES.get(kind_of(item), kind_of(item))


def full_name(item: catalog_pb2.CatalogItem) -> str:
    parts = [p for p in (item.name.database, item.name.schema, item.name.item) if p]
    return ".".join(parts)


def _database(state: CatalogState, name: str, position: int) -> None:
    if not any(d.name.database == name for d in state.of_kind("database")):
        raise SqlError(UNDEFINED_DATABASE, f'database "{name}" does not exist', position)


def schema_exists(state: CatalogState, database: str, schema: str) -> bool:
    return any(
        s.name.database == database and s.name.schema == schema for s in state.of_kind("schema")
    )


def qualify_new(
    state: CatalogState, settings: Settings, name: QualifiedName, position: int = 0
) -> catalog_pb2.QualifiedName:
    """Where an object named ``name`` is created; its database and schema must exist."""
    if len(name) == 1:
        database = settings.database
        _database(state, database, position)
        schema = next((s for s in settings.search_path if schema_exists(state, database, s)), None)
        if schema is None:
            raise SqlError(
                INVALID_SCHEMA_NAME,
                f"no schema of the search path ({', '.join(settings.search_path) or 'empty'}) "
                f'exists in database "{database}" to create "{name[0]}" in',
                position,
            )
        return catalog_pb2.QualifiedName(database=database, schema=schema, item=name[0])
    if len(name) == 2:
        database, schema, item = settings.database, name[0], name[1]
    elif len(name) == 3:
        database, schema, item = name
    else:
        raise SqlError(SYNTAX_ERROR, f"improper qualified name: {dotted(name)}", position)
    _database(state, database, position)
    if not schema_exists(state, database, schema):
        raise SqlError(UNDEFINED_SCHEMA, f'schema "{schema}" does not exist', position)
    return catalog_pb2.QualifiedName(database=database, schema=schema, item=item)


def candidates(settings: Settings, name: QualifiedName) -> list[tuple[str, str, str]]:
    """The ``(database, schema, item)`` places ``name`` may refer to, in lookup order."""
    if len(name) == 1:
        return [(settings.database, schema, name[0]) for schema in settings.search_path]
    if len(name) == 2:
        return [(settings.database, name[0], name[1])]
    if len(name) == 3:
        return [(name[0], name[1], name[2])]
    return []


def find_in_schemas(
    state: CatalogState, settings: Settings, name: QualifiedName
) -> catalog_pb2.CatalogItem | None:
    """The relation or index ``name`` refers to, if any."""
    for database, schema, item in candidates(settings, name):
        found = state.in_schema(database, schema, item)
        if found is not None:
            return found
    return None


def resolve(
    state: CatalogState,
    settings: Settings,
    name: QualifiedName,
    kinds: tuple[str, ...],
    position: int = 0,
) -> catalog_pb2.CatalogItem:
    """The object of one of ``kinds`` that ``name`` refers to; 42P01/42704 if there is none,
    42809 if the name is another kind of object."""
    wanted = " or ".join(KIND_NAMES[k] for k in kinds)
    if len(name) > 3 or not name:
        raise SqlError(SYNTAX_ERROR, f"improper qualified name: {dotted(name)}", position)
    found = find_in_schemas(state, settings, name)
    if found is None:
        code = UNDEFINED_TABLE if set(kinds) & set(RELATION_KINDS) else UNDEFINED_OBJECT
        raise SqlError(code, f'{wanted} "{dotted(name)}" does not exist', position)
    if kind_of(found) not in kinds:
        raise SqlError(
            WRONG_OBJECT_TYPE,
            f'"{dotted(name)}" is a {kind_name(found)}, not a {wanted}',
            position,
        )
    return found


def resolve_cluster(state: CatalogState, name: str, position: int = 0) -> catalog_pb2.CatalogItem:
    cluster = state.cluster_named(name)
    if cluster is None:
        raise SqlError(UNDEFINED_OBJECT, f'unknown cluster "{name}"', position)
    return cluster
