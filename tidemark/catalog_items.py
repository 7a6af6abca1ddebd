"""How every process names and keys a catalog item (``tidemark.v1.CatalogItem``), so the
catalog, the adapter and compute agree on it."""

from __future__ import annotations

from collections.abc import Iterable

from tidemark.v1 import catalog_pb2

ALLOCATOR_KEY_PREFIX = "allocator:"


def item_key(item: catalog_pb2.CatalogItem) -> str:
    """The key the catalog holds at most one item under: the GlobalId, or for an allocator
    ``allocator:<name>``."""
    if item.WhichOneof("body") == "id_allocator":
        return allocator_key(item.id_allocator.name)
    return item.id


def allocator_key(name: str) -> str:
    """The key of the id allocator called ``name``."""
    return ALLOCATOR_KEY_PREFIX + name


def describe(item: catalog_pb2.CatalogItem) -> str:
    """How log lines and errors name an item, e.g. ``table db.public.t (u5)``."""
    kind = item.WhichOneof("body") or "item"
    if kind == "id_allocator":
        return f"id allocator {item.id_allocator.name!r}"
    parts = [part for part in (item.name.database, item.name.schema, item.name.item) if part]
    return f"{kind.replace('_', ' ')} {'.'.join(parts) or '(unnamed)'} ({item.id or 'no id'})"


def cluster_named(
    items: Iterable[catalog_pb2.CatalogItem], name: str
) -> catalog_pb2.CatalogItem | None:
    """The cluster called ``name`` among ``items``, if there is one."""
    for item in items:
        if item.WhichOneof("body") == "cluster" and item.name.item == name:
            return item
    return None


def role_named(
    items: Iterable[catalog_pb2.CatalogItem], name: str
) -> catalog_pb2.CatalogItem | None:
    """The role called ``name`` among ``items``, if there is one."""
    for item in items:
        if item.WhichOneof("body") == "role" and item.name.item == name:
            return item
    return None


CATALOG_HOLDER = "catalog"
"""The holder of the critical read capability each catalog object's collection carries
(``services/catalog/holds.py``); the adapter creates collections with it."""


def collection_of(item: catalog_pb2.CatalogItem) -> str:
    """The storage collection holding ``item``'s contents (tables, sources, materialized
    views); ``""`` for items without one."""
    kind = item.WhichOneof("body")
    if kind == "table":
        return item.table.collection_id or item.id
    if kind == "source":
        return item.source.collection_id or item.id
    if kind == "materialized_view":
        return item.materialized_view.output_collection_id or item.id
    return ""
