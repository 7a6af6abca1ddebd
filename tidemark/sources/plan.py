"""What the catalog says about each source that the sources process ingests.

A source is a *primary* catalog item (``Source.role`` = ``SOURCE_ROLE_PRIMARY``) that names
the ingestion (its format and spec), plus the items that point at it through
``Source.primary_id``: one per subsource (``SOURCE_ROLE_SUBSOURCE``, naming the upstream
relation in ``upstream_name``) and one progress relation (``SOURCE_ROLE_PROGRESS``). A primary
with an ``upstream_name`` holds that relation's data itself (``LOAD GENERATOR COUNTER``); one
without receives no data, only upper moves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from tidemark.catalog_items import collection_of
from tidemark.sources.ingest import IngestTargets
from tidemark.v1 import catalog_pb2

INGESTED_FORMATS = frozenset(
    {catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR, catalog_pb2.SOURCE_FORMAT_POSTGRES}
)
"""Source formats the sources process runs an ingestion for by default (CDCv2 is fed from
outside); the sources process passes the formats it has readers for."""


@dataclass(frozen=True)
class SourcePlan:
    primary: catalog_pb2.CatalogItem
    members: tuple[catalog_pb2.CatalogItem, ...]
    """The subsources and the progress item, by id."""
    dependencies: tuple[catalog_pb2.CatalogItem, ...] = ()
    """The items the primary depends on (a connection, its secrets), by id: what a reader
    may need to reach the upstream."""

    @property
    def id(self) -> str:
        return self.primary.id

    @property
    def format(self) -> int:
        return int(self.primary.source.format)

    def progress(self) -> catalog_pb2.CatalogItem | None:
        for item in self.members:
            if item.source.role == catalog_pb2.SOURCE_ROLE_PROGRESS:
                return item
        return None

    def subsources(self) -> list[catalog_pb2.CatalogItem]:
        return [m for m in self.members if m.source.role == catalog_pb2.SOURCE_ROLE_SUBSOURCE]

    def complete(self) -> bool:
        """Whether the catalog holds the progress item (created in the same append as the
        primary, so a plan without it is one being dropped or a broken one)."""
        return self.progress() is not None

    def targets(self) -> IngestTargets:
        progress = self.progress()
        if progress is None:
            raise ValueError(f"source {self.id} has no progress relation")
        outputs: dict[str, str] = {}
        silent: list[str] = []
        for item in (self.primary, *self.subsources()):
            if item.source.upstream_name:
                outputs[item.source.upstream_name] = collection_of(item)
            else:
                silent.append(collection_of(item))
        return IngestTargets(collection_of(progress), outputs, tuple(silent))

    def key(self) -> bytes:
        """Equal for plans that ingest the same way (a changed plan restarts its task)."""
        parts = [self.primary, *self.members, *self.dependencies]
        return b"|".join(p.SerializeToString(deterministic=True) for p in parts)

    def name(self) -> str:
        n = self.primary.name
        return ".".join(p for p in (n.database, n.schema, n.item) if p)


def source_plans(
    items: Iterable[catalog_pb2.CatalogItem], formats: Collection[int] = INGESTED_FORMATS
) -> dict[str, SourcePlan]:
    """The sources among ``items`` whose format is one of ``formats``, by primary id."""
    primaries: dict[str, catalog_pb2.CatalogItem] = {}
    members: dict[str, list[catalog_pb2.CatalogItem]] = {}
    by_id: dict[str, catalog_pb2.CatalogItem] = {}
    for item in items:
        if item.id:
            by_id[item.id] = item
        if item.WhichOneof("body") != "source":
            continue
        if item.source.role == catalog_pb2.SOURCE_ROLE_PRIMARY:
            if item.source.format in formats:
                primaries[item.id] = item
        elif item.source.primary_id:
            members.setdefault(item.source.primary_id, []).append(item)
    return {
        id_: SourcePlan(
            primary,
            tuple(sorted(members.get(id_, []), key=lambda i: i.id)),
            _dependencies(primary, by_id),
        )
        for id_, primary in primaries.items()
    }


def _dependencies(
    primary: catalog_pb2.CatalogItem, by_id: dict[str, catalog_pb2.CatalogItem]
) -> tuple[catalog_pb2.CatalogItem, ...]:
    """What ``primary`` depends on, and what those depend on in turn (a connection's
    secrets), in id order."""
    found: dict[str, catalog_pb2.CatalogItem] = {}
    pending = list(primary.depends_on)
    while pending:
        id_ = pending.pop()
        item = by_id.get(id_)
        if item is None or id_ in found:
            continue
        found[id_] = item
        pending.extend(item.depends_on)
    return tuple(found[id_] for id_ in sorted(found))
