"""Names in DDL: where a new object goes, and which existing object a name means.

A name of one part is looked up in each schema of ``search_path`` (in the session's database)
and created in the first; two parts are ``schema.name`` in the session's database; three are
``database.schema.name``. Clusters and databases have one-part names.
"""

from __future__ import annotations

from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.session import Settings
from services.adapter.sql.catalog_view import CatalogView, item_name, places
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import QualifiedName, dotted
from tidemark.plan.catalog_relations import RELATION_KINDS
from tidemark.v1 import catalog_pb2

UNDEFINED_TABLE = "42P01"
UNDEFINED_OBJECT = "42704"
UNDEFINED_DATABASE = "3D000"
UNDEFINED_SCHEMA = "3F000"
WRONG_OBJECT_TYPE = "42809"
SYNTAX_ERROR = "42601"
INVALID_SCHEMA_NAME = "3F000"

_VIEW = "catalog_view"
KIND_NAMES = {
    "table": "table",
    "source": "source",
    "view": "view",
    "materialized_view": "materialized view",
    "index": "index",
    "cluster": "cluster",
    "database": "database",
    "schema": "schema",
    "secret": "secret",
    "connection": "connection",
    "role": "role",
}


def kind_name(item: catalog_pb2.CatalogItem) -> str:
    return KIND_NAMES.get(kind_of(item), kind_of(item))


def full_name(item: catalog_pb2.CatalogItem) -> str:
    return dotted(item_name(item))


def catalog_view(state: CatalogState) -> CatalogView:
    """The planner's name lookup over ``state``, built once per state and shared by every
    statement run against it."""
    view = state.memo.get(_VIEW)
    if not isinstance(view, CatalogView):
        view = CatalogView(state)
        state.memo[_VIEW] = view
    return view


def require_database(state: CatalogState, name: str, position: int) -> None:
    if catalog_view(state).database(name) is None:
        raise SqlError(UNDEFINED_DATABASE, f'database "{name}" does not exist', position)


def schema_exists(state: CatalogState, database: str, schema: str) -> bool:
    return catalog_view(state).schema(database, schema) is not None


def qualify_new(
    state: CatalogState, settings: Settings, name: QualifiedName, position: int = 0
) -> catalog_pb2.QualifiedName:
    """Where an object named ``name`` is created; its database and schema must exist."""
    if len(name) == 1:
        database = settings.database
        require_database(state, database, position)
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
    require_database(state, database, position)
    if not schema_exists(state, database, schema):
        raise SqlError(UNDEFINED_SCHEMA, f'schema "{schema}" does not exist', position)
    return catalog_pb2.QualifiedName(database=database, schema=schema, item=item)


def in_schema(
    state: CatalogState, database: str, schema: str, name: str
) -> catalog_pb2.CatalogItem | None:
    """The relation or index called ``name`` in ``database.schema`` (one namespace)."""
    return catalog_view(state).first_item([(database, schema, name)])


def find_in_schemas(
    state: CatalogState, settings: Settings, name: QualifiedName
) -> catalog_pb2.CatalogItem | None:
    """The relation or index ``name`` refers to, if any."""
    return catalog_view(state).first_item(places(name, settings.database, settings.search_path))


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
    return catalog_view(state).resolve_cluster(name, position)
