"""Name resolution against one catalog snapshot.

A :class:`CatalogView` wraps the items of a snapshot (``CatalogClient.snapshot_at(...).items``)
and answers what planning and SHOW need: which relation ``[db.][schema.]name`` denotes for a
session (its database and search_path), the items of a schema, the indexes of a relation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from services.adapter.sql.errors import (
    UNDEFINED_DATABASE,
    UNDEFINED_OBJECT,
    UNDEFINED_SCHEMA,
    UNDEFINED_TABLE,
    SqlError,
)
from services.adapter.sql.names import QualifiedName, dotted
from tidemark.columnar import RelationSchema
from tidemark.plan.catalog_relations import RELATION_KINDS, collection_of, relation_schema
from tidemark.v1 import catalog_pb2, plan_pb2

DEFAULT_DATABASE = "tidemark"
DEFAULT_SCHEMA = "public"
DEFAULT_CLUSTER = "default"

# The kinds sharing the per-schema namespace of relations.
ITEM_KINDS = (*RELATION_KINDS, "index", "secret", "connection")


def session_database(settings: Mapping[str, str]) -> str:
    return settings.get("database") or DEFAULT_DATABASE


def search_path(settings: Mapping[str, str]) -> list[str]:
    """The session's schemas to look unqualified names up in, in order."""
    text = settings.get("search_path")
    if text is None:
        return [DEFAULT_SCHEMA]
    schemas = []
    for part in text.split(","):
        name = part.strip()
        if name.startswith('"') and name.endswith('"') and len(name) >= 2:
            name = name[1:-1]
        else:
            name = name.lower()
        if name and name != "$user":
            schemas.append(name)
    return schemas


def places(
    name: QualifiedName, database: str, schemas: Sequence[str]
) -> list[tuple[str, str, str]]:
    """The ``(database, schema, item)`` places a name of one to three parts may denote, in
    lookup order: ``name`` in each of ``schemas`` of ``database``, ``schema.name`` in
    ``database``, or ``database.schema.name``."""
    if len(name) == 1:
        return [(database, schema, name[0]) for schema in schemas]
    if len(name) == 2:
        return [(database, name[0], name[1])]
    if len(name) == 3:
        return [(name[0], name[1], name[2])]
    return []


@dataclass(frozen=True)
class BoundRelation:
    """A relation a name resolved to. ``collection_id`` is set for tables, sources and
    materialized views (the storage collection holding their contents); ``plan`` for views
    (their stored plan, inlined where they are used)."""

    id: str
    kind: str
    name: QualifiedName
    schema: RelationSchema
    collection_id: str | None
    plan: plan_pb2.Plan | None
    item: catalog_pb2.CatalogItem


def item_kind(item: catalog_pb2.CatalogItem) -> str:
    return item.WhichOneof("body") or ""


def item_name(item: catalog_pb2.CatalogItem) -> QualifiedName:
    name = item.name
    return tuple(part for part in (name.database, name.schema, name.item) if part)


def contents_collection(item: catalog_pb2.CatalogItem) -> str | None:
    """The storage collection holding a table's, source's or materialized view's contents: the
    one it names, else the one with its own id (DDL gives it that one); ``None`` for the other
    kinds."""
    named = collection_of(item)
    return None if named is None else named or item.id


def bind(item: catalog_pb2.CatalogItem) -> BoundRelation:
    """The relation a table, source, view or materialized view item describes."""
    kind = item_kind(item)
    if kind not in RELATION_KINDS:
        raise SqlError("42809", f'"{dotted(item_name(item))}" is not a relation (it is a {kind})')
    plan = plan_pb2.Plan.FromString(item.view.plan) if kind == "view" else None
    return BoundRelation(
        id=item.id,
        kind=kind,
        name=item_name(item),
        schema=RelationSchema.from_proto(relation_schema(item)),
        collection_id=contents_collection(item),
        plan=plan,
        item=item,
    )


class CatalogView:
    """The items of one catalog snapshot, indexed by id and by name."""

    def __init__(self, items: Iterable[catalog_pb2.CatalogItem]) -> None:
        self.items: list[catalog_pb2.CatalogItem] = [
            item for item in items if item_kind(item) != "id_allocator"
        ]
        self._by_id = {item.id: item for item in self.items}
        self._databases: dict[str, catalog_pb2.CatalogItem] = {}
        self._schemas: dict[tuple[str, str], catalog_pb2.CatalogItem] = {}
        self._clusters: dict[str, catalog_pb2.CatalogItem] = {}
        self._objects: dict[tuple[str, str, str], catalog_pb2.CatalogItem] = {}
        for item in self.items:
            kind, name = item_kind(item), item.name
            if kind == "database":
                self._databases[name.database] = item
            elif kind == "schema":
                self._schemas[(name.database, name.schema)] = item
            elif kind == "cluster":
                self._clusters[name.item] = item
            elif kind in ITEM_KINDS:
                self._objects[(name.database, name.schema, name.item)] = item

    def by_id(self, global_id: str) -> catalog_pb2.CatalogItem | None:
        return self._by_id.get(global_id)

    def database(self, name: str) -> catalog_pb2.CatalogItem | None:
        return self._databases.get(name)

    def schema(self, database: str, name: str) -> catalog_pb2.CatalogItem | None:
        return self._schemas.get((database, name))

    def cluster(self, name: str) -> catalog_pb2.CatalogItem | None:
        return self._clusters.get(name)

    def clusters(self) -> list[catalog_pb2.CatalogItem]:
        return sorted(self._clusters.values(), key=lambda item: item.name.item)

    def databases(self) -> list[catalog_pb2.CatalogItem]:
        return sorted(self._databases.values(), key=lambda item: item.name.database)

    def schemas(self, database: str) -> list[catalog_pb2.CatalogItem]:
        found = [item for (db, _), item in self._schemas.items() if db == database]
        return sorted(found, key=lambda item: item.name.schema)

    def schema_of(
        self, name: QualifiedName, settings: Mapping[str, str], position: int = 0
    ) -> tuple[str, str]:
        """The (database, schema) a schema name (``schema`` or ``db.schema``) denotes; 3D000
        or 3F000 when it does not exist."""
        database = name[0] if len(name) == 2 else session_database(settings)
        self._require_database(database, position)
        if self.schema(database, name[-1]) is None:
            raise SqlError(UNDEFINED_SCHEMA, f'schema "{dotted(name)}" does not exist', position)
        return database, name[-1]

    def _require_database(self, database: str, position: int) -> None:
        if self.database(database) is None:
            raise SqlError(UNDEFINED_DATABASE, f'database "{database}" does not exist', position)

    def candidates(
        self, name: QualifiedName, settings: Mapping[str, str], position: int = 0
    ) -> list[tuple[str, str, str]]:
        """The (database, schema, item) keys an item name may denote, in lookup order (see
        ``places``). Raises 3D000/3F000 for a qualified name whose database or schema does not
        exist."""
        found = places(name, session_database(settings), search_path(settings))
        if len(name) > 1:
            database, schema, _ = found[0]
            self._require_database(database, position)
            if self.schema(database, schema) is None:
                raise SqlError(
                    UNDEFINED_SCHEMA, f'schema "{database}.{schema}" does not exist', position
                )
        return found

    def first_item(self, keys: Iterable[tuple[str, str, str]]) -> catalog_pb2.CatalogItem | None:
        """The relation or index at the first of ``keys`` that holds one."""
        for key in keys:
            item = self._objects.get(key)
            if item is not None:
                return item
        return None

    def find_item(
        self,
        name: QualifiedName,
        settings: Mapping[str, str],
        kinds: Iterable[str] = ITEM_KINDS,
        position: int = 0,
    ) -> catalog_pb2.CatalogItem | None:
        """The item of one of ``kinds`` that ``name`` denotes, or None."""
        item = self.first_item(self.candidates(name, settings, position))
        return item if item is not None and item_kind(item) in set(kinds) else None

    def resolve(
        self, name: QualifiedName, settings: Mapping[str, str], position: int = 0
    ) -> BoundRelation:
        """The table, source, view or materialized view ``name`` denotes (42P01 if none)."""
        item = self.first_item(self.candidates(name, settings, position))
        if item is None:
            raise SqlError(UNDEFINED_TABLE, f'relation "{dotted(name)}" does not exist', position)
        if item_kind(item) not in RELATION_KINDS:
            raise SqlError("42809", f'"{dotted(name)}" is an index, not a relation', position)
        return bind(item)

    def resolve_cluster(self, name: str, position: int = 0) -> catalog_pb2.CatalogItem:
        cluster = self.cluster(name)
        if cluster is None:
            raise SqlError(UNDEFINED_OBJECT, f'unknown cluster "{name}"', position)
        return cluster

    def objects_in(
        self, database: str, schema: str, kinds: Iterable[str]
    ) -> list[catalog_pb2.CatalogItem]:
        """The items of ``kinds`` in one schema, by name."""
        wanted = set(kinds)
        found = [
            item
            for (db, sc, _), item in self._objects.items()
            if db == database and sc == schema and item_kind(item) in wanted
        ]
        return sorted(found, key=lambda item: item.name.item)

    def indexes_on(self, relation_id: str) -> list[catalog_pb2.CatalogItem]:
        found = [
            item
            for item in self._objects.values()
            if item_kind(item) == "index" and item.index.on_id == relation_id
        ]
        return sorted(found, key=lambda item: (item.name.schema, item.name.item))

    def dependents(self, global_id: str) -> list[catalog_pb2.CatalogItem]:
        """The items that list ``global_id`` in their depends_on."""
        return [item for item in self.items if global_id in item.depends_on]
