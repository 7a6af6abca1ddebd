"""CREATE SOURCE for sources the sources process ingests: the catalog items it drafts.

A source is several catalog items created in one append (``tidemark/sources/plan.py``):

- the source itself (``SOURCE_ROLE_PRIMARY``), which names the ingestion (format and spec);
  a single-relation upstream (``LOAD GENERATOR COUNTER``) records its data there too, as
  Materialize's counter source does;
- one subsource per upstream relation (``FOR ALL TABLES``), named after the relation, in the
  source's schema;
- the progress relation ``<source>_progress`` (or ``EXPOSE PROGRESS AS <name>``).

Each has its own storage collection, made with the catalog's durable hold like a table's.
Subsources and the progress relation depend on the source, and ``DROP SOURCE`` takes them
along (``ddl.drop_closure``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from services.adapter.catalog_names import full_name, qualify_new
from services.adapter.ddl import (
    CatalogDraft,
    CollectionMaker,
    DdlOutcome,
    check_new_relation_name,
)
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from tidemark.columnar import RelationSchema
from tidemark.sources.loadgen import LoadGeneratorSpec, generator_for
from tidemark.sources.loadgen.base import DEFAULT_TICK_INTERVAL_MS
from tidemark.sources.loadgen.registry import SINGLE_OUTPUT, spec_to_proto
from tidemark.sources.progress import PROGRESS_SCHEMA
from tidemark.v1 import catalog_pb2

INVALID_PARAMETER = "22023"
MAX_TPCH_SCALE_FACTOR = 0.25
"""About 1.5M line items: the sources process generates a table's initial data in memory
before its one (chunked) append."""
FEATURE_NOT_SUPPORTED = "0A000"


def load_generator_spec(statement: ast.CreateSource) -> LoadGeneratorSpec:
    """The spec the statement asks for; 22023 for options the generator does not take."""
    options = statement.load_generator
    assert options is not None
    generator = options.generator
    position = statement.position
    if options.max_cardinality is not None and generator != "COUNTER":
        raise SqlError(INVALID_PARAMETER, "MAX CARDINALITY applies to COUNTER only", position)
    if options.scale_factor is not None and generator != "TPCH":
        raise SqlError(INVALID_PARAMETER, "SCALE FACTOR applies to TPCH only", position)
    if options.scale_factor is not None and options.scale_factor > MAX_TPCH_SCALE_FACTOR:
        raise SqlError(
            INVALID_PARAMETER,
            f"SCALE FACTOR is at most {MAX_TPCH_SCALE_FACTOR}: a table's initial data is made "
            "in the sources process's memory",
            position,
        )
    if generator in SINGLE_OUTPUT and statement.for_all_tables:
        raise SqlError(
            INVALID_PARAMETER,
            f"LOAD GENERATOR {generator} has one relation, the source itself: "
            "FOR ALL TABLES does not apply",
            position,
        )
    if generator not in SINGLE_OUTPUT and not statement.for_all_tables:
        raise SqlError(
            FEATURE_NOT_SUPPORTED,
            f"LOAD GENERATOR {generator} makes several relations: add FOR ALL TABLES",
            position,
        )
    return LoadGeneratorSpec(
        generator=generator,
        tick_interval_ms=options.tick_interval_ms or DEFAULT_TICK_INTERVAL_MS,
        max_cardinality=options.max_cardinality or 0,
        scale_factor=options.scale_factor or 0.01,
        # Tick times derive from this, so replayed ticks carry the same timestamps.
        start_time_ms=int(time.time() * 1000),
        up_to=options.up_to or 0,
    )


async def create_ingested_source(
    statement: ast.CreateSource | ast.CreatePostgresSource,
    settings: Settings,
    draft: CatalogDraft,
    maker: CollectionMaker,
    *,
    source_format: int,
    relations: Mapping[str, RelationSchema],
    primary_relation: str | None,
    configure: catalog_pb2.Source,
    item_names: Mapping[str, str] | None = None,
    depends_on: Sequence[str] = (),
) -> DdlOutcome:
    """The items of a source whose upstream has ``relations`` (by upstream name):
    ``primary_relation`` is the one the source item itself holds (``None``: it holds none,
    every relation is a subsource). ``configure`` carries the format's spec fields, merged
    into the primary item; ``depends_on`` the ids the primary needs (a connection).
    ``item_names`` renames subsources (default: the upstream name)."""
    state = draft.state
    name = qualify_new(state, settings, statement.name, statement.position)
    skipped = check_new_relation_name(
        state, name, statement.if_not_exists, statement.position, "source"
    )
    if skipped is not None:
        return DdlOutcome("CREATE SOURCE", [skipped])
    progress_name = statement.progress_name or f"{name.item}_progress"
    renamed = item_names or {}
    members = [
        (renamed.get(upstream, upstream), upstream)
        for upstream in relations
        if upstream != primary_relation
    ]
    wanted = [name.item, progress_name, *(item for item, _ in members)]
    if len(set(wanted)) != len(wanted):
        raise SqlError(
            "42P07", f"source {name.item}: its relations' names clash: {wanted}", statement.position
        )
    for item_name in wanted[1:]:
        other = catalog_pb2.QualifiedName(
            database=name.database, schema=name.schema, item=item_name
        )
        check_new_relation_name(state, other, False, statement.position, "source")

    primary_schema = relations[primary_relation] if primary_relation else PROGRESS_SCHEMA
    primary_id = await maker.make(draft, primary_schema, tenant=name.database)
    primary = catalog_pb2.CatalogItem(
        id=primary_id, name=name, owner=draft.owner, depends_on=list(depends_on)
    )
    primary.source.MergeFrom(configure)
    primary.source.format = source_format  # type: ignore[assignment]
    primary.source.schema.CopyFrom(primary_schema.to_proto())
    primary.source.collection_id = primary_id
    primary.source.role = catalog_pb2.SOURCE_ROLE_PRIMARY
    primary.source.upstream_name = primary_relation or ""
    draft.create(primary)

    async def member(item_name: str, schema: RelationSchema, role: int, upstream: str) -> None:
        global_id = await maker.make(draft, schema, tenant=name.database)
        draft.create(
            catalog_pb2.CatalogItem(
                id=global_id,
                name=catalog_pb2.QualifiedName(
                    database=name.database, schema=name.schema, item=item_name
                ),
                owner=draft.owner,
                depends_on=[primary_id],
                source=catalog_pb2.Source(
                    format=source_format,  # type: ignore[arg-type]
                    schema=schema.to_proto(),
                    collection_id=global_id,
                    role=role,  # type: ignore[arg-type]
                    primary_id=primary_id,
                    upstream_name=upstream,
                ),
            )
        )

    for item_name, upstream in members:
        await member(item_name, relations[upstream], catalog_pb2.SOURCE_ROLE_SUBSOURCE, upstream)
    await member(progress_name, PROGRESS_SCHEMA, catalog_pb2.SOURCE_ROLE_PROGRESS, "")
    notices = []
    if statement.in_cluster is not None:
        notices.append(
            f"IN CLUSTER {statement.in_cluster} has no effect: every source is ingested by the "
            "sources process"
        )
    if members:
        listed = ", ".join(item for item, _ in members)
        notices.append(f"source {full_name(primary)} has subsources {listed}")
    return DdlOutcome("CREATE SOURCE", notices)


async def create_load_generator_source(
    statement: ast.CreateSource, settings: Settings, draft: CatalogDraft, maker: CollectionMaker
) -> DdlOutcome:
    spec = load_generator_spec(statement)
    relations = generator_for(spec).schemas()
    primary = next(iter(relations)) if spec.generator in SINGLE_OUTPUT else None
    return await create_ingested_source(
        statement,
        settings,
        draft,
        maker,
        source_format=catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR,
        relations=relations,
        primary_relation=primary,
        configure=catalog_pb2.Source(load_generator=spec_to_proto(spec)),
    )
