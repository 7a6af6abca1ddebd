"""What each DDL statement drafts: the catalog items it creates or drops.

Every builder runs against the newest catalog state of an attempt (``CatalogDraft.state``) and
may run again after a lost race, so it checks everything afresh each time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.adapter import ddl_connections, ddl_grants, ddl_roles
from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.catalog_names import (
    catalog_view,
    full_name,
    in_schema,
    kind_name,
    qualify_new,
    require_database,
    resolve,
    resolve_cluster,
    schema_exists,
)
from services.adapter.ddl import (
    DUPLICATE_DATABASE,
    DUPLICATE_SCHEMA,
    CatalogDraft,
    CollectionMaker,
    DdlOutcome,
    DdlRunner,
    check_droppable,
    check_new_relation_name,
    drop_closure,
    resolve_drop_target,
    table_schema,
    unknown_object,
    view_writer,
)
from services.adapter.privileges import Privileges, check_role_unused
from services.adapter.results import DUPLICATE_OBJECT
from services.adapter.session import Settings
from services.adapter.source_ddl import create_load_generator_source
from services.adapter.sql import statements as ast
from services.adapter.sql.catalog_view import bind, contents_collection
from services.adapter.sql.ddl import key_positions
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import dotted
from tidemark.catalog_items import role_named
from tidemark.columnar import RelationSchema
from tidemark.plan.catalog_relations import RELATION_KINDS
from tidemark.v1 import catalog_pb2, plan_pb2

INVALID_PARAMETER = "22023"
DEFAULT_CLUSTER_SIZE = "local"


@dataclass(frozen=True)
class Definition:
    """A view's query, planned: the plan (views inlined, reading storage collections only),
    its output schema and the ids of the catalog items it names."""

    plan: plan_pb2.Plan
    schema: RelationSchema
    depends_on: tuple[str, ...]
    # Before optimization: what a view stores, so queries inline it as planned and indexes
    # on it match; a materialized view stores ``plan``, which its dataflow runs.
    raw_plan: plan_pb2.Plan | None = None


DefinitionPlanner = Callable[
    [ast.Query, CatalogState, Settings, tuple[str, ...] | None], Awaitable[Definition]
]


class DdlStatements:
    """``run(statement, settings)`` for every DDL statement."""

    def __init__(self, runner: DdlRunner, plan_definition: DefinitionPlanner) -> None:
        self.runner = runner
        self.plan_definition = plan_definition

    async def run(
        self, statement: ast.AnyStatement, settings: Settings, principal: Principal
    ) -> DdlOutcome:
        build = self._builder(statement, settings, principal)
        return await self.runner.run(build, principal.name)

    def _builder(
        self, statement: ast.AnyStatement, settings: Settings, principal: Principal
    ) -> Callable[[CatalogDraft, CollectionMaker], Awaitable[DdlOutcome]]:
        async def build(draft: CatalogDraft, maker: CollectionMaker) -> DdlOutcome:
            # Checked against each attempt's state: a lost race may have changed the grants.
            privileges = Privileges.of(draft.state, principal)
            _check_privileges(statement, settings, draft.state, privileges)
            if isinstance(statement, ast.Grant):
                return ddl_grants.grant(statement, settings, draft, privileges)
            if isinstance(statement, ast.GrantRole):
                return ddl_grants.grant_role(statement, draft, privileges)
            if isinstance(statement, ast.AlterOwner):
                return ddl_grants.alter_owner(statement, settings, draft, privileges)
            if isinstance(statement, ast.CreateSource) and statement.format == "LOAD GENERATOR":
                return await create_load_generator_source(statement, settings, draft, maker)
            if isinstance(statement, ast.CreateTable | ast.CreateSource):
                return await self._create_table(statement, settings, draft, maker)
            if isinstance(statement, ast.CreatePostgresSource):
                return await ddl_connections.create_postgres_source(
                    statement, settings, draft, maker
                )
            if isinstance(statement, ast.CreateSecret):
                return ddl_connections.create_secret(statement, settings, draft)
            if isinstance(statement, ast.CreateRole):
                return ddl_roles.create_role(statement, draft)
            if isinstance(statement, ast.AlterRole):
                return ddl_roles.alter_role(statement, draft)
            if isinstance(statement, ast.CreateConnection):
                return await ddl_connections.create_connection(statement, settings, draft)
            if isinstance(statement, ast.CreateView):
                return await self._create_view(statement, settings, draft, maker, privileges)
            if isinstance(statement, ast.CreateIndex):
                return self._create_index(statement, settings, draft, privileges)
            if isinstance(statement, ast.CreateCluster):
                return self._create_cluster(statement, draft)
            if isinstance(statement, ast.CreateDatabase):
                return self._create_database(statement, draft)
            if isinstance(statement, ast.CreateSchema):
                return self._create_schema(statement, settings, draft)
            if isinstance(statement, ast.Drop):
                return self._drop(statement, settings, draft, privileges)
            raise TypeError(f"not a DDL statement: {type(statement).__name__}")

        return build

    # -- relations ------------------------------------------------------------------------

    async def _create_table(
        self,
        statement: ast.CreateTable | ast.CreateSource,
        settings: Settings,
        draft: CatalogDraft,
        maker: CollectionMaker,
    ) -> DdlOutcome:
        """CREATE TABLE or CREATE SOURCE: a relation kept in a new storage collection."""
        is_source = isinstance(statement, ast.CreateSource)
        tag = "CREATE SOURCE" if is_source else "CREATE TABLE"
        name, skipped = _new_relation_name(
            draft.state, settings, statement, "source" if is_source else "table"
        )
        if skipped is not None:
            return DdlOutcome(tag, [skipped])
        schema = table_schema(statement.columns)
        global_id = await maker.make(draft, schema, tenant=name.database)
        item = catalog_pb2.CatalogItem(id=global_id, name=name, owner=draft.owner)
        body = item.source if is_source else item.table
        body.schema.CopyFrom(schema.to_proto())
        body.collection_id = global_id
        if is_source:
            item.source.format = catalog_pb2.SOURCE_FORMAT_CDCV2
        draft.create(item)
        if not is_source:
            return DdlOutcome(tag)
        return DdlOutcome(
            tag,
            [
                f"source {full_name(draft.added(global_id))} records into storage "
                f"collection {global_id}; feed it CDCv2 through Storage.IngestCdc with a write "
                f"capability from AcquireCapabilities({global_id})"
            ],
        )

    async def _create_view(
        self,
        statement: ast.CreateView,
        settings: Settings,
        draft: CatalogDraft,
        maker: CollectionMaker,
        privileges: Privileges,
    ) -> DdlOutcome:
        state = draft.state
        kind = "materialized_view" if statement.materialized else "view"
        tag = "CREATE MATERIALIZED VIEW" if statement.materialized else "CREATE VIEW"
        name, skipped = _new_relation_name(state, settings, statement, kind)
        if skipped is not None:
            return DdlOutcome(tag, [skipped])
        definition = await self.plan_definition(
            statement.query, state, settings, statement.column_names
        )
        # The creator owns the view: it must be able to read what the view reads.
        privileges.require_read(definition.depends_on, statement.position)
        plan_bytes = definition.plan.SerializeToString(deterministic=True)
        if not statement.materialized:
            raw = definition.raw_plan if definition.raw_plan is not None else definition.plan
            plan_bytes = raw.SerializeToString(deterministic=True)
            draft.create(
                catalog_pb2.CatalogItem(
                    id=draft.allocate(),
                    name=name,
                    owner=draft.owner,
                    depends_on=list(definition.depends_on),
                    view=catalog_pb2.View(
                        sql=statement.text,
                        schema=definition.schema.to_proto(),
                        plan=plan_bytes,
                    ),
                )
            )
            return DdlOutcome(tag)
        cluster_name = statement.in_cluster or settings.cluster
        cluster = resolve_cluster(state, cluster_name, statement.position)
        privileges.require(cluster, "USAGE", statement.position)
        privileges.require(cluster, "CREATE", statement.position)
        global_id = await maker.make(
            draft,
            definition.schema,
            tenant=name.database,
            writer=view_writer(name.database, cluster.name.item),
        )
        depends = [d for d in definition.depends_on if d != cluster.id] + [cluster.id]
        draft.create(
            catalog_pb2.CatalogItem(
                id=global_id,
                name=name,
                owner=draft.owner,
                depends_on=depends,
                materialized_view=catalog_pb2.MaterializedView(
                    sql=statement.text,
                    schema=definition.schema.to_proto(),
                    plan=plan_bytes,
                    cluster_id=cluster.id,
                    output_collection_id=global_id,
                ),
            )
        )
        return DdlOutcome(tag)

    def _create_index(
        self,
        statement: ast.CreateIndex,
        settings: Settings,
        draft: CatalogDraft,
        privileges: Privileges,
    ) -> DdlOutcome:
        state = draft.state
        relation = resolve(state, settings, statement.on, RELATION_KINDS, statement.position)
        # As in PostgreSQL, only the relation's owner indexes it.
        privileges.require_owner(relation, statement.position)
        key_positions(bind(relation), statement.columns, statement.position)
        index_name = statement.name or _default_index_name(state, relation, statement.columns)
        name = catalog_pb2.QualifiedName(
            database=relation.name.database, schema=relation.name.schema, item=index_name
        )
        skipped = check_new_relation_name(
            state, name, statement.if_not_exists, statement.position, "index"
        )
        if skipped is not None:
            return DdlOutcome("CREATE INDEX", [skipped])
        cluster = resolve_cluster(
            state, statement.in_cluster or settings.cluster, statement.position
        )
        privileges.require(cluster, "USAGE", statement.position)
        privileges.require(cluster, "CREATE", statement.position)
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=name,
                owner=draft.owner,
                depends_on=[relation.id, cluster.id],
                index=catalog_pb2.Index(
                    on_id=relation.id, key_columns=list(statement.columns), cluster_id=cluster.id
                ),
            )
        )
        return DdlOutcome("CREATE INDEX")

    # -- clusters, databases, schemas ------------------------------------------------------

    def _create_cluster(self, statement: ast.CreateCluster, draft: CatalogDraft) -> DdlOutcome:
        state = draft.state
        if state.cluster_named(statement.name) is not None:
            if statement.if_not_exists:
                return DdlOutcome(
                    "CREATE CLUSTER", [f'cluster "{statement.name}" already exists, skipping']
                )
            raise SqlError(
                DUPLICATE_OBJECT, f'cluster "{statement.name}" already exists', statement.position
            )
        options = dict(statement.options)
        size = options.pop("size", DEFAULT_CLUSTER_SIZE)
        factor_text = options.pop("replication_factor", "1")
        try:
            factor = int(factor_text)
        except ValueError:
            factor = -1
        if factor < 1:
            raise SqlError(
                INVALID_PARAMETER,
                f"REPLICATION FACTOR must be a positive integer, got {factor_text!r}",
                statement.position,
            )
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=catalog_pb2.QualifiedName(item=statement.name),
                owner=draft.owner,
                cluster=catalog_pb2.Cluster(
                    size=size or DEFAULT_CLUSTER_SIZE, replication_factor=factor, config=options
                ),
            )
        )
        return DdlOutcome(
            "CREATE CLUSTER",
            [
                f'cluster "{statement.name}" is recorded in the catalog; its materialized views '
                f"and indexes run once an operator starts a compute process for it "
                f"(python -m services.compute --cluster {statement.name} ...) and adds it to the "
                f"adapters' --compute list ({statement.name}=HOST:PORT)"
            ],
        )

    def _create_database(self, statement: ast.CreateDatabase, draft: CatalogDraft) -> DdlOutcome:
        state = draft.state
        if catalog_view(state).database(statement.name) is not None:
            if statement.if_not_exists:
                return DdlOutcome(
                    "CREATE DATABASE", [f'database "{statement.name}" already exists, skipping']
                )
            raise SqlError(
                DUPLICATE_DATABASE,
                f'database "{statement.name}" already exists',
                statement.position,
            )
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=catalog_pb2.QualifiedName(database=statement.name),
                owner=draft.owner,
                database=catalog_pb2.Database(),
            )
        )
        # As in PostgreSQL, a new database comes with a schema "public".
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=catalog_pb2.QualifiedName(database=statement.name, schema="public"),
                owner=draft.owner,
                schema=catalog_pb2.Schema(),
            )
        )
        return DdlOutcome("CREATE DATABASE")

    def _create_schema(
        self, statement: ast.CreateSchema, settings: Settings, draft: CatalogDraft
    ) -> DdlOutcome:
        state = draft.state
        if len(statement.name) == 1:
            database, schema = settings.database, statement.name[0]
        else:
            database, schema = statement.name[0], statement.name[1]
        require_database(state, database, statement.position)
        if schema_exists(state, database, schema):
            if statement.if_not_exists:
                return DdlOutcome("CREATE SCHEMA", [f'schema "{schema}" already exists, skipping'])
            raise SqlError(
                DUPLICATE_SCHEMA, f'schema "{schema}" already exists', statement.position
            )
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=catalog_pb2.QualifiedName(database=database, schema=schema),
                owner=draft.owner,
                schema=catalog_pb2.Schema(),
            )
        )
        return DdlOutcome("CREATE SCHEMA")

    # -- drops ----------------------------------------------------------------------------

    def _drop(
        self,
        statement: ast.Drop,
        settings: Settings,
        draft: CatalogDraft,
        privileges: Privileges,
    ) -> DdlOutcome:
        state = draft.state
        tag = f"DROP {statement.kind.upper()}"
        notices: list[str] = []
        targets: list[catalog_pb2.CatalogItem] = []
        for name in statement.names:
            item = resolve_drop_target(state, settings, statement, name)
            if item is None:
                if statement.if_exists:
                    notices.append(f'{statement.kind} "{dotted(name)}" does not exist, skipping')
                    continue
                raise unknown_object(statement, name)
            check_droppable(item, statement.position, state)
            if kind_of(item) == "role":
                privileges.require_role_admin("drop role", [item], statement.position)
                check_role_unused(state, item, statement.position)
            else:
                privileges.require_owner(item, statement.position)
            targets.append(item)
        if not targets:
            return DdlOutcome(tag, notices)
        dropped = drop_closure(state, targets, statement.cascade, statement.position)
        target_ids = {t.id for t in targets}
        for item in dropped:
            draft.drop(item)
            if item.id not in target_ids:
                notices.append(f"drop cascades to {kind_name(item)} {full_name(item)}")
        ddl_grants.forget_memberships(draft, dropped)
        collections = [c for c in (contents_collection(i) for i in dropped) if c is not None]
        hooks = [ddl_connections.slot_dropper(state, i) for i in dropped]
        return DdlOutcome(
            tag,
            notices,
            dropped_collections=collections,
            after_commit=[h for h in hooks if h is not None],
        )


_CREATED_IN_SCHEMA = (
    ast.CreateTable,
    ast.CreateSource,
    ast.CreatePostgresSource,
    ast.CreateSecret,
    ast.CreateConnection,
    ast.CreateView,
)


def _check_privileges(
    statement: ast.AnyStatement, settings: Settings, state: CatalogState, privileges: Privileges
) -> None:
    """What a DDL statement needs beyond what its builder checks on what it resolves."""
    position = statement.position
    if isinstance(statement, _CREATED_IN_SCHEMA):
        name = qualify_new(state, settings, statement.name, position)
        privileges.require_create_in(name.database, name.schema, position)
    # A connection's secret and a source's connection are used only by their owners.
    if isinstance(statement, ast.CreatePostgresSource):
        connection = resolve(state, settings, statement.connection, ("connection",), position)
        privileges.require_owner(connection, position)
    elif isinstance(statement, ast.CreateConnection):
        secret_name = dict(statement.options).get("password")
        if isinstance(secret_name, tuple):
            secret = resolve(state, settings, secret_name, ("secret",), position)
            privileges.require_owner(secret, position)
    elif isinstance(statement, ast.CreateSchema):
        database = settings.database if len(statement.name) == 1 else statement.name[0]
        found = catalog_view(state).database(database)
        if found is not None:
            privileges.require(found, "CREATE", position)
    elif isinstance(statement, ast.CreateDatabase):
        privileges.require_superuser("create database", position)
    elif isinstance(statement, ast.CreateCluster):
        privileges.require_superuser("create cluster", position)
    elif isinstance(statement, ast.CreateRole | ast.AlterRole):
        options = statement.options
        if options.superuser or (
            isinstance(statement, ast.AlterRole) and options.superuser is not None
        ):
            privileges.require_superuser("grant or take away SUPERUSER", position)
        if isinstance(statement, ast.CreateRole):
            privileges.require_role_admin("create role", [], position)
            return
        own_password = (
            statement.name == privileges.principal.name
            and options.login is None
            and options.superuser is None
            and options.createrole is None
        )
        if not own_password:
            target = role_named(state, statement.name)
            privileges.require_role_admin("alter role", [target], position)


def _new_relation_name(
    state: CatalogState,
    settings: Settings,
    statement: ast.CreateTable | ast.CreateSource | ast.CreateView,
    kind: str,
) -> tuple[catalog_pb2.QualifiedName, str | None]:
    """Where the statement creates its relation, and the notice skipping it when the name is
    taken and ``IF NOT EXISTS`` was given (42P07 without it)."""
    name = qualify_new(state, settings, statement.name, statement.position)
    position = statement.position
    return name, check_new_relation_name(state, name, statement.if_not_exists, position, kind)


def _default_index_name(
    state: CatalogState, relation: catalog_pb2.CatalogItem, columns: tuple[str, ...]
) -> str:
    """``<relation>_<columns>_idx``, numbered if that is taken (as PostgreSQL does)."""
    base = "_".join([relation.name.item, *columns, "idx"])
    candidate = base
    number = 1
    while in_schema(state, relation.name.database, relation.name.schema, candidate) is not None:
        candidate = f"{base}{number}"
        number += 1
    return candidate
