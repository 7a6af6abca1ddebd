"""Catalog items as the catalog stores and checks them.

An item is a ``tidemark.v1.CatalogItem``. The catalog keeps each one as a :class:`Row`: its
canonical encoding (deterministic protobuf bytes, so that a retraction matches the stored row
byte for byte), its key and the decoded message. This module holds what can be said about one
item on its own: its kind, key, namespace, container and references, and whether it is well
formed. Rules that involve other items live in :mod:`services.catalog.validation`.

Namespaces (where a name must be unique):

- databases: globally, by ``name.database``;
- schemas: within their database, by ``(name.database, name.schema)``;
- tables, sources, views, materialized views and indexes: one shared namespace per
  ``(name.database, name.schema)``, by ``name.item`` (as relations and indexes share one in
  PostgreSQL);
- clusters: globally, by ``name.item``;
- roles: globally, by ``name.item``;
- id allocators: by ``IdAllocator.name`` (which is also their key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tidemark.catalog_items import describe, item_key
from tidemark.columnar import RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.global_id import validate_global_id
from tidemark.v1 import catalog_pb2, common_pb2

Kind = Literal[
    "database",
    "schema",
    "table",
    "source",
    "view",
    "materialized_view",
    "index",
    "cluster",
    "id_allocator",
    "secret",
    "connection",
    "role",
]

RELATION_KINDS: frozenset[str] = frozenset({"table", "source", "view", "materialized_view"})
# Kinds whose names live in a schema's shared namespace.
SCHEMA_MEMBER_KINDS: frozenset[str] = RELATION_KINDS | {"index", "secret", "connection"}

# Each allocator hands out the GlobalIds with one prefix.
ALLOCATOR_PREFIXES: dict[str, str] = {"user": "u", "system": "s"}
PREFIX_ALLOCATORS: dict[str, str] = {prefix: name for name, prefix in ALLOCATOR_PREFIXES.items()}

MAX_NAME_LENGTH = 255

NameKey = tuple[str, ...]
"""A namespace entry: ``("database", db)``, ``("schema", db, schema)``,
``("item", db, schema, name)`` or ``("cluster", name)``."""


def kind_of(item: catalog_pb2.CatalogItem) -> Kind:
    kind = item.WhichOneof("body")
    if kind is None:
        raise InvalidArgument(f"catalog item {item.id or '(no id)'} has no body (kind)")
    return kind


def encode(item: catalog_pb2.CatalogItem) -> bytes:
    """The canonical bytes of ``item`` (maps in key order), as stored and compared."""
    return item.SerializeToString(deterministic=True)


@dataclass(frozen=True)
class Row:
    """One stored item: canonical bytes, key and the decoded message (never mutated)."""

    data: bytes
    key: str
    item: catalog_pb2.CatalogItem

    @property
    def kind(self) -> Kind:
        return kind_of(self.item)

    @staticmethod
    def of(item: catalog_pb2.CatalogItem) -> Row:
        """The row for ``item`` (a private copy, so later changes to ``item`` do not leak in)."""
        copy = catalog_pb2.CatalogItem()
        copy.CopyFrom(item)
        return Row(encode(copy), item_key(copy), copy)

    @staticmethod
    def decode(data: bytes) -> Row:
        """The row stored as ``data``, which must be canonical."""
        item = catalog_pb2.CatalogItem.FromString(data)
        return Row(data, item_key(item), item)


def namespace_key(item: catalog_pb2.CatalogItem) -> NameKey | None:
    """Where the item's name must be unique; ``None`` for allocators (unique by key)."""
    name = item.name
    kind = kind_of(item)
    if kind == "database":
        return ("database", name.database)
    if kind == "schema":
        return ("schema", name.database, name.schema)
    if kind in SCHEMA_MEMBER_KINDS:
        return ("item", name.database, name.schema, name.item)
    if kind == "cluster":
        return ("cluster", name.item)
    if kind == "role":
        return ("role", name.item)
    return None


def container_key(item: catalog_pb2.CatalogItem) -> NameKey | None:
    """The namespace key of the item's container (a schema's database, a relation's or an
    index's schema), which must exist as long as the item does."""
    kind = kind_of(item)
    if kind == "schema":
        return ("database", item.name.database)
    if kind in SCHEMA_MEMBER_KINDS:
        return ("schema", item.name.database, item.name.schema)
    return None


def references(item: catalog_pb2.CatalogItem) -> list[tuple[str, frozenset[str], str]]:
    """Ids the body names, each with the kinds it may refer to and what it is for."""
    kind = kind_of(item)
    if kind == "index":
        return [
            (item.index.on_id, frozenset(RELATION_KINDS), "indexed relation"),
            (item.index.cluster_id, frozenset({"cluster"}), "cluster"),
        ]
    if kind == "materialized_view":
        return [(item.materialized_view.cluster_id, frozenset({"cluster"}), "cluster")]
    if kind == "connection" and item.connection.postgres.password_secret_id:
        return [(item.connection.postgres.password_secret_id, frozenset({"secret"}), "password")]
    if kind == "source" and item.source.postgres.connection_id:
        return [(item.source.postgres.connection_id, frozenset({"connection"}), "connection")]
    return []


def global_id_number(global_id: str) -> tuple[str, int]:
    """``("u", 12)`` for ``"u12"``; the id must be well formed."""
    return global_id[0], int(global_id[1:])


# --- well-formedness of one item ---------------------------------------------------------

_NAME_FIELDS: dict[str, tuple[bool, bool, bool]] = {
    # kind: whether (database, schema, item) are required; the others must be empty.
    "database": (True, False, False),
    "schema": (True, True, False),
    "cluster": (False, False, True),
    "role": (False, False, True),
    "id_allocator": (False, False, False),
    **{kind: (True, True, True) for kind in SCHEMA_MEMBER_KINDS},
}


def _check_name_part(what: str, value: str, label: str) -> None:
    if not value:
        raise InvalidArgument(f"{label}: name.{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            f"{label}: name.{what} is {len(value)} characters; the limit is {MAX_NAME_LENGTH}"
        )
    if not value.isprintable():
        raise InvalidArgument(f"{label}: name.{what} {value!r} has unprintable characters")


def check_item(item: catalog_pb2.CatalogItem) -> None:
    """Raise ``InvalidArgument`` unless ``item`` is well formed on its own."""
    kind = kind_of(item)
    label = describe(item)
    if kind == "id_allocator":
        if item.id:
            raise InvalidArgument(f"{label}: an id allocator has no id, got {item.id!r}")
        if item.id_allocator.name not in ALLOCATOR_PREFIXES:
            raise InvalidArgument(
                f"unknown id allocator {item.id_allocator.name!r}; the allocators are "
                f"{', '.join(sorted(ALLOCATOR_PREFIXES))}"
            )
        if item.depends_on:
            raise InvalidArgument(f"{label} cannot depend on anything")
    else:
        if not item.id:
            raise InvalidArgument(f"{label}: the item has no id")
        validate_global_id(item.id)
    required = _NAME_FIELDS[kind]
    for what, needed in zip(("database", "schema", "item"), required, strict=True):
        value = getattr(item.name, what)
        if needed:
            _check_name_part(what, value, label)
        elif value:
            raise InvalidArgument(f"{label}: a {kind.replace('_', ' ')} has no name.{what}")
    seen: set[str] = set()
    for dependency in item.depends_on:
        validate_global_id(dependency)
        if dependency == item.id:
            raise InvalidArgument(f"{label} depends on itself")
        if dependency in seen:
            raise InvalidArgument(f"{label} lists dependency {dependency} twice")
        seen.add(dependency)
    for ref, _, what in references(item):
        if not ref:
            raise InvalidArgument(f"{label}: the {what} is missing")
        validate_global_id(ref)
        if ref not in seen:
            raise InvalidArgument(f"{label}: its {what} {ref} must be listed in depends_on")
    _check_body(kind, item, label)


def _check_optional_id(value: str, what: str, label: str) -> None:
    if value:
        try:
            validate_global_id(value)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{label}: {what}: {exc.message}") from exc


def _check_schema(schema: common_pb2.RelationSchema, label: str) -> None:
    if not schema.columns:
        raise InvalidArgument(f"{label}: the relation schema has no columns")
    try:
        RelationSchema.from_proto(schema)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{label}: {exc.message}") from exc


def _check_body(kind: Kind, item: catalog_pb2.CatalogItem, label: str) -> None:
    if kind == "table":
        _check_schema(item.table.schema, label)
        _check_optional_id(item.table.collection_id, "collection_id", label)
    elif kind == "source":
        if item.source.format == catalog_pb2.SOURCE_FORMAT_UNSPECIFIED:
            raise InvalidArgument(f"{label}: the source format is missing")
        _check_schema(item.source.schema, label)
        _check_optional_id(item.source.collection_id, "collection_id", label)
        role = item.source.role
        if role != catalog_pb2.SOURCE_ROLE_PRIMARY and (
            not item.source.primary_id or item.source.primary_id not in item.depends_on
        ):
            raise InvalidArgument(
                f"{label}: a subsource or progress relation names its source in primary_id "
                "and depends on it"
            )
    elif kind == "view":
        if not item.view.sql:
            raise InvalidArgument(f"{label}: the view has no SQL text")
        _check_schema(item.view.schema, label)
    elif kind == "materialized_view":
        if not item.materialized_view.sql:
            raise InvalidArgument(f"{label}: the materialized view has no SQL text")
        _check_schema(item.materialized_view.schema, label)
        _check_optional_id(
            item.materialized_view.output_collection_id, "output_collection_id", label
        )
    elif kind == "index":
        if any(not column for column in item.index.key_columns):
            raise InvalidArgument(f"{label}: an index key column has no name")
    elif kind == "connection":
        if item.connection.WhichOneof("kind") is None:
            raise InvalidArgument(f"{label}: the connection has no kind")
        postgres = item.connection.postgres
        if not postgres.host or not postgres.database or not 0 < postgres.port < 65536:
            raise InvalidArgument(f"{label}: a PostgreSQL connection needs host, port, database")
    elif kind == "cluster":
        if not item.cluster.size:
            raise InvalidArgument(f"{label}: the cluster has no size")
    elif kind == "role" and item.role.HasField("password"):
        verifier = item.role.password
        if len(verifier.stored_key) != 32 or len(verifier.server_key) != 32:
            raise InvalidArgument(f"{label}: a SCRAM-SHA-256 verifier holds 32-byte keys")
        if not verifier.salt or verifier.iterations < 4096:
            raise InvalidArgument(f"{label}: a SCRAM verifier needs a salt and 4096+ iterations")
