"""What CREATE SECRET, CREATE CONNECTION and CREATE SOURCE ... FROM POSTGRES draft.

A PostgreSQL source is checked against its upstream before anything is created: the
publication must exist, each table must have REPLICA IDENTITY FULL and every column a type
Tidemark has. The source item holds the source's progress (``lsn``: the upstream LSN every
subsource is complete up to); each upstream table gets a subsource, a read-only relation that
depends on the source.
"""

from __future__ import annotations

import asyncio

from services.adapter.catalog_cache import CatalogState
from services.adapter.catalog_names import qualify_new, resolve
from services.adapter.ddl import (
    OWNER,
    CatalogDraft,
    CollectionMaker,
    DdlOutcome,
    check_new_relation_name,
)
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import dotted
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.sources.postgres.upstream import (
    ConnectionParams,
    UpstreamError,
    UpstreamTable,
    publication_tables,
)
from tidemark.v1 import catalog_pb2

INVALID_PARAMETER = "22023"
DEFAULT_PORT = 5432
PROGRESS_SCHEMA = RelationSchema([Column("lsn", ColumnType.INT64, nullable=False)])


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
            owner=OWNER,
            secret=catalog_pb2.Secret(value=statement.value),
        )
    )
    return DdlOutcome("CREATE SECRET")


def create_connection(
    statement: ast.CreateConnection, settings: Settings, draft: CatalogDraft
) -> DdlOutcome:
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
    draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=name,
            owner=OWNER,
            depends_on=depends,
            connection=catalog_pb2.Connection(postgres=postgres),
        )
    )
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
    tag = "CREATE SOURCE"
    name = qualify_new(state, settings, statement.name, statement.position)
    skipped = check_new_relation_name(
        state, name, statement.if_not_exists, statement.position, "source"
    )
    if skipped is not None:
        return DdlOutcome(tag, [skipped])
    connection = resolve(state, settings, statement.connection, ("connection",), statement.position)
    params = connection_params(state, connection)
    wanted = (
        None if statement.tables is None else [".".join(ref.upstream) for ref in statement.tables]
    )
    try:
        tables = await asyncio.to_thread(publication_tables, params, statement.publication, wanted)
    except UpstreamError as error:
        if error.hint is not None:
            raise SqlError(
                error.sqlstate, error.message, statement.position, hint=error.hint
            ) from None
        raise SqlError(error.sqlstate, error.message, statement.position) from None
    subsource_names = _subsource_names(statement, tables)
    for subsource_name in subsource_names:
        sub_name = catalog_pb2.QualifiedName(
            database=name.database, schema=name.schema, item=subsource_name
        )
        check_new_relation_name(state, sub_name, False, statement.position, "source")
    if len(set(subsource_names)) != len(subsource_names):
        raise SqlError(
            "42710",
            "two upstream tables would get the same subsource name; give one an alias "
            "(FOR TABLES (schema.t AS other_name))",
            statement.position,
        )
    source_id = await maker.make(draft, PROGRESS_SCHEMA)
    spec = catalog_pb2.PostgresSource(
        connection_id=connection.id,
        publication=statement.publication,
        slot=f"tidemark_{source_id}",
    )
    subsources = []
    for table, subsource_name in zip(tables, subsource_names, strict=True):
        sub_id = await maker.make(draft, table.schema)
        reference = catalog_pb2.PostgresTable(
            upstream_schema=table.namespace, upstream_name=table.name, upstream_oid=table.oid
        )
        sub_spec = catalog_pb2.PostgresSource()
        sub_spec.table.CopyFrom(reference)
        reference.subsource_id = sub_id
        spec.tables.append(reference)
        subsources.append(
            catalog_pb2.CatalogItem(
                id=sub_id,
                name=catalog_pb2.QualifiedName(
                    database=name.database, schema=name.schema, item=subsource_name
                ),
                owner=OWNER,
                depends_on=[source_id],
                source=catalog_pb2.Source(
                    format=catalog_pb2.SOURCE_FORMAT_POSTGRES,
                    schema=table.schema.to_proto(),
                    collection_id=sub_id,
                    postgres=sub_spec,
                ),
            )
        )
    draft.create(
        catalog_pb2.CatalogItem(
            id=source_id,
            name=name,
            owner=OWNER,
            depends_on=[connection.id],
            source=catalog_pb2.Source(
                format=catalog_pb2.SOURCE_FORMAT_POSTGRES,
                schema=PROGRESS_SCHEMA.to_proto(),
                collection_id=source_id,
                postgres=spec,
            ),
        )
    )
    for subsource in subsources:
        draft.create(subsource)
    listed = ", ".join(subsource_names)
    return DdlOutcome(tag, [f"source {dotted(statement.name)} replicates into: {listed}"])


def _subsource_names(statement: ast.CreatePostgresSource, tables: list[UpstreamTable]) -> list[str]:
    if statement.tables is None:
        return [t.name for t in tables]
    return [ref.alias or ref.upstream[-1] for ref in statement.tables]
