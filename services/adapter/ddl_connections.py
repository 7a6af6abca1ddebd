"""What CREATE SECRET, CREATE CONNECTION and CREATE SOURCE ... FROM POSTGRES draft.

A PostgreSQL source is checked against its upstream before anything is created: the
publication must exist, each table must have REPLICA IDENTITY FULL and every column a type
Tidemark has. Its items are those of every ingested source (``source_ddl``): the source,
one subsource per upstream table (named after it, or its alias) and ``<source>_progress``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from services.adapter.catalog_cache import CatalogState
from services.adapter.catalog_names import qualify_new, resolve
from services.adapter.ddl import (
    CatalogDraft,
    CollectionMaker,
    DdlOutcome,
    check_new_relation_name,
)
from services.adapter.session import Settings
from services.adapter.source_ddl import create_ingested_source
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from tidemark.logging import get_logger
from tidemark.sources.postgres.upstream import (
    ConnectionParams,
    UpstreamError,
    UpstreamTable,
    check_reachable,
    drop_slot,
    publication_tables,
)
from tidemark.v1 import catalog_pb2

log = get_logger("services.adapter.ddl_connections")

INVALID_PARAMETER = "22023"
DEFAULT_PORT = 5432


def create_secret(
    statement: ast.CreateSecret, settings: Settings, draft: CatalogDraft
) -> DdlOutcome:
    name = qualify_new(draft.state, settings, statement.name, statement.position)
    skipped = check_new_relation_name(
        draft.state, name, statement.if_not_exists, statement.position, "secret"
    )
    if skipped is not None:
        return DdlOutcome("CREATE SECRET", [skipped])
    draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=name,
            owner=draft.owner,
            secret=catalog_pb2.Secret(value=statement.value),
        )
    )
    return DdlOutcome("CREATE SECRET")


async def create_connection(
    statement: ast.CreateConnection, settings: Settings, draft: CatalogDraft
) -> DdlOutcome:
    """CREATE CONNECTION, once a session with the upstream could be opened (as Materialize
    validates a connection by default); 08001 otherwise, and nothing is created."""
    state = draft.state
    name = qualify_new(state, settings, statement.name, statement.position)
    skipped = check_new_relation_name(
        state, name, statement.if_not_exists, statement.position, "connection"
    )
    if skipped is not None:
        return DdlOutcome("CREATE CONNECTION", [skipped])
    options = dict(statement.options)
    port_text = options.get("port", str(DEFAULT_PORT))
    assert isinstance(port_text, str)
    port = int(port_text) if port_text.isdigit() else 0
    if not 0 < port < 65536:
        raise SqlError(INVALID_PARAMETER, f"PORT {port_text} is not a TCP port", statement.position)
    postgres = catalog_pb2.PostgresConnection(
        host=str(options["host"]),
        port=port,
        user=str(options["user"]),
        database=str(options["database"]),
    )
    depends: list[str] = []
    secret_name = options.get("password")
    if secret_name is not None:
        assert isinstance(secret_name, tuple)
        secret = resolve(state, settings, secret_name, ("secret",), statement.position)
        postgres.password_secret_id = secret.id
        depends.append(secret.id)
    item = catalog_pb2.CatalogItem(
        id="u1",
        name=name,
        owner=draft.owner,
        depends_on=depends,
        connection=catalog_pb2.Connection(postgres=postgres),
    )
    try:
        await asyncio.to_thread(check_reachable, connection_params(state, item))
    except UpstreamError as error:
        raise SqlError(error.sqlstate, error.message, statement.position) from None
    item.id = draft.allocate()
    draft.create(item)
    return DdlOutcome("CREATE CONNECTION")


def connection_params(state: CatalogState, connection: catalog_pb2.CatalogItem) -> ConnectionParams:
    """How to reach the upstream of ``connection``, its password read from its secret."""
    postgres = connection.connection.postgres
    password = ""
    if postgres.password_secret_id:
        secret = state.get(postgres.password_secret_id)
        if secret is not None:
            password = secret.secret.value.decode()
    return ConnectionParams(
        postgres.host, postgres.port, postgres.user, password, postgres.database
    )


async def create_postgres_source(
    statement: ast.CreatePostgresSource,
    settings: Settings,
    draft: CatalogDraft,
    maker: CollectionMaker,
) -> DdlOutcome:
    state = draft.state
    name = qualify_new(state, settings, statement.name, statement.position)
    skipped = check_new_relation_name(
        state, name, statement.if_not_exists, statement.position, "source"
    )
    if skipped is not None:
        return DdlOutcome("CREATE SOURCE", [skipped])
    connection = resolve(state, settings, statement.connection, ("connection",), statement.position)
    params = connection_params(state, connection)
    wanted = (
        None if statement.tables is None else [".".join(ref.upstream) for ref in statement.tables]
    )
    try:
        tables = await asyncio.to_thread(
            publication_tables,
            params,
            statement.publication,
            wanted,
            statement.schemas,
            [".".join(reference) for reference in statement.text_columns],
        )
    except UpstreamError as error:
        raise SqlError(
            error.sqlstate, error.message, statement.position, hint=error.hint or ""
        ) from None
    relations = {t.key: t.schema for t in tables}
    if len(relations) != len(tables):
        raise SqlError("42710", "an upstream table is listed twice", statement.position)
    names = dict(zip(relations, _subsource_names(statement, tables), strict=True))
    if len(set(names.values())) != len(names):
        raise SqlError(
            "42710",
            "two upstream tables would get the same subsource name; give one an alias "
            "(FOR TABLES (schema.t AS other_name))",
            statement.position,
        )
    # The slot is named after the source's name and creation time: unique upstream, and
    # only [a-z0-9_] as PostgreSQL requires.
    readable = "".join(c if c.isascii() and c.isalnum() else "_" for c in name.item.lower())
    # The unique part first: PostgreSQL cuts slot names at 63 characters.
    slot = f"tidemark_{time.time_ns()}_{readable}"
    spec = catalog_pb2.PostgresSource(
        connection_id=connection.id,
        publication=statement.publication,
        slot=slot[:63],
        tables=[
            catalog_pb2.PostgresTable(
                upstream_schema=t.namespace, upstream_name=t.name, upstream_oid=t.oid
            )
            for t in tables
        ],
    )
    return await create_ingested_source(
        statement,
        settings,
        draft,
        maker,
        source_format=catalog_pb2.SOURCE_FORMAT_POSTGRES,
        relations=relations,
        primary_relation=None,
        configure=catalog_pb2.Source(postgres=spec),
        item_names=names,
        depends_on=[connection.id],
    )


def _subsource_names(statement: ast.CreatePostgresSource, tables: list[UpstreamTable]) -> list[str]:
    if statement.tables is None:
        return [t.name for t in tables]
    return [ref.alias or ref.upstream[-1] for ref in statement.tables]


def slot_dropper(
    state: CatalogState, item: catalog_pb2.CatalogItem
) -> Callable[[], Awaitable[str | None]] | None:
    """For a dropped PostgreSQL source: what drops its replication slot upstream once the
    drop is committed (else the slot would keep WAL upstream forever). Best effort: an
    unreachable upstream gets a notice naming the slot to drop by hand."""
    if item.WhichOneof("body") != "source" or not item.source.postgres.slot:
        return None
    spec = item.source.postgres
    connection = state.get(spec.connection_id)
    if connection is None:
        return None
    params = connection_params(state, connection)

    async def run() -> str | None:
        try:
            await asyncio.to_thread(drop_slot, params, spec.slot)
        except UpstreamError as error:
            log.warning("postgres_slot_not_dropped", slot=spec.slot, error=error.message)
            return (
                f'could not drop replication slot "{spec.slot}" upstream ({error.message}); '
                f"drop it there: SELECT pg_drop_replication_slot('{spec.slot}')"
            )
        return None

    return run
