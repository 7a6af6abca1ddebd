"""Running one statement of a session: the dispatch from statement kind to what runs it.

Each statement runs against the catalog as of ``c = ReadTs(catalog)`` (the local copy, once it
is complete past ``c``), reads at ``r = ReadTs(data)`` (or ``AS OF``, or the open transaction's
time) and writes at a fresh ``WriteTs(data)``. Transaction rules are in ``transactions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogCache, CatalogState
from services.adapter.catalog_names import resolve
from services.adapter.copying.options import copy_format
from services.adapter.copying.runner import CopyOutput, CopyRunner
from services.adapter.ddl import DdlOutcome
from services.adapter.ddl_statements import DdlStatements
from services.adapter.dml import DmlRunner
from services.adapter.finishing import apply_finishing
from services.adapter.planning import Planner
from services.adapter.privileges import (
    Privileges,
    check_buffered_write,
    check_query,
    visible_view,
)
from services.adapter.reads import QueryReader, plan_inputs
from services.adapter.rebuild import rebuild_materialized_view
from services.adapter.results import (
    ACTIVE_TRANSACTION,
    IN_FAILED_TRANSACTION,
    Outcome,
    expand,
    output_columns,
    select_tag,
    sql_row,
    text_outcome,
)
from services.adapter.session import ISOLATION_LEVELS, Settings
from services.adapter.show import show_columns, show_objects, show_setting
from services.adapter.sql import explain_query
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError, not_supported
from services.adapter.sql.planned import PlannedQuery
from services.adapter.timestamps import Timestamps
from services.adapter.transactions import Transaction
from services.adapter.writes import ReadSet, TableWriter
from tidemark.plan import explain

CATALOG_WAIT_SECONDS = 30.0
SYNTAX_ERROR = "42601"

DDL_STATEMENTS = (
    ast.CreateTable,
    ast.CreateSource,
    ast.CreateSecret,
    ast.CreateRole,
    ast.AlterRole,
    ast.Grant,
    ast.GrantRole,
    ast.AlterOwner,
    ast.CreateConnection,
    ast.CreatePostgresSource,
    ast.CreateView,
    ast.CreateIndex,
    ast.CreateCluster,
    ast.CreateDatabase,
    ast.CreateSchema,
    ast.Drop,
)


@dataclass
class SessionState:
    """What a statement may change about its session."""

    settings: Settings
    transaction: Transaction | None = None
    # The data a COPY FROM STDIN reads (sent with the Adapter.CopyIn call).
    copy_data: bytes | None = None
    # Who runs the statements: set from the call's credentials (gRPC) or the connection's
    # login (pgwire). Nobody, with no privileges, until then.
    principal: Principal = field(default_factory=lambda: Principal(""))


class StatementExecutor:
    def __init__(
        self,
        cache: CatalogCache,
        timestamps: Timestamps,
        planner: Planner,
        reader: QueryReader,
        writer: TableWriter,
        ddl: DdlStatements,
    ) -> None:
        self.cache = cache
        self.timestamps = timestamps
        self.planner = planner
        self.reader = reader
        self.writer = writer
        self.ddl = ddl
        self.dml = DmlRunner(
            self.catalog_state, self.read_timestamp, planner, reader, writer, timestamps
        )
        self.copy = CopyRunner(self.catalog_state, planner, writer)

    async def catalog_state(self) -> CatalogState:
        """The catalog as of the oracle's current catalog read timestamp."""
        return await self.cache.state_at(
            await self.timestamps.catalog_read_ts(), CATALOG_WAIT_SECONDS
        )

    async def run(self, statement: ast.AnyStatement, session: SessionState) -> Outcome:
        transaction = session.transaction
        if transaction is not None and transaction.failed:
            if isinstance(statement, ast.Commit | ast.Rollback):
                session.transaction = None
                return Outcome("ROLLBACK")
            raise SqlError(
                IN_FAILED_TRANSACTION,
                "current transaction is aborted, commands ignored until end of transaction block",
                statement.position,
            )
        if isinstance(statement, ast.Begin):
            return self._begin(statement, session)
        if isinstance(statement, ast.Commit):
            return await self._commit(session)
        if isinstance(statement, ast.Rollback):
            if session.transaction is None:
                return Outcome("ROLLBACK", notices=["there is no transaction in progress"])
            session.transaction = None
            return Outcome("ROLLBACK")
        if isinstance(statement, ast.SetVariable):
            return self._set(statement, session)
        if isinstance(statement, ast.ShowSetting):
            return show_setting(statement, session.settings)
        if isinstance(statement, DDL_STATEMENTS):
            if transaction is not None:
                raise SqlError(
                    ACTIVE_TRANSACTION,
                    f"{statement.text.split()[0].upper()} cannot run inside a transaction block",
                    statement.position,
                )
            return _ddl_outcome(await self.ddl.run(statement, session.settings, session.principal))
        if isinstance(statement, ast.RebuildMaterializedView):
            if transaction is not None:
                raise SqlError(
                    ACTIVE_TRANSACTION,
                    "ALTER MATERIALIZED VIEW cannot run inside a transaction block",
                    statement.position,
                )
            state = await self.catalog_state()
            item = resolve(
                state, session.settings, statement.name, ("materialized_view",), statement.position
            )
            Privileges.of(state, session.principal).require_owner(item, statement.position)
            holds = self.reader.holds
            tag = await rebuild_materialized_view(
                statement, state, session.settings, holds.storage, holds, self.timestamps
            )
            return Outcome(tag)
        if isinstance(statement, ast.ShowObjects):
            state = await self.catalog_state()
            view = visible_view(state, session.principal)
            return show_objects(statement, view, session.settings)
        if isinstance(statement, ast.ShowColumns):
            state = await self.catalog_state()
            view = visible_view(state, session.principal)
            return show_columns(statement, view, session.settings)
        if isinstance(statement, ast.Select):
            await self.planner.refresh_statistics()
            return await self._select(statement, session)
        if isinstance(statement, ast.Explain):
            await self.planner.refresh_statistics()
            return await self._explain(statement, session)
        if isinstance(statement, ast.Insert | ast.Update | ast.Delete):
            return await self.dml.run(
                statement, session.settings, session.transaction, session.principal
            )
        if isinstance(statement, ast.CopyFrom):
            return await self.copy.copy_from(
                statement,
                session.settings,
                session.transaction,
                session.copy_data,
                session.principal,
            )
        if isinstance(statement, ast.CopyTo):
            raise not_supported(
                "COPY TO STDOUT in Execute",
                statement.position,
                hint="use the Adapter.CopyOut call, which streams the data (tidemark sql: "
                "\\copy ... TO)",
            )
        if isinstance(statement, ast.Subscribe):
            raise not_supported(
                "SUBSCRIBE in Execute",
                statement.position,
                hint="use the Adapter.Subscribe call (tidemark sql does), which streams changes",
            )
        raise not_supported(type(statement).__name__, statement.position)

    # -- transactions ---------------------------------------------------------------------

    def _begin(self, statement: ast.Begin, session: SessionState) -> Outcome:
        if session.transaction is not None:
            return Outcome("BEGIN", notices=["there is already a transaction in progress"])
        transaction = Transaction()
        for mode in statement.modes:
            words = " ".join(mode.lower().split())
            if words == "read only":
                transaction.read_only = True
            elif words == "read write":
                transaction.read_only = False
            elif words.startswith("isolation level "):
                level = words.removeprefix("isolation level ")
                if level not in ISOLATION_LEVELS:
                    raise SqlError(
                        "22023",
                        f"isolation level {level!r} is not supported",
                        statement.position,
                        hint=f"use one of: {', '.join(ISOLATION_LEVELS)}",
                    )
            elif words not in ("deferrable", "not deferrable"):
                raise SqlError(SYNTAX_ERROR, f"unknown transaction mode {mode!r}")
        session.transaction = transaction
        return Outcome("BEGIN")

    async def _commit(self, session: SessionState) -> Outcome:
        transaction = session.transaction
        if transaction is None:
            return Outcome("COMMIT", notices=["there is no transaction in progress"])
        session.transaction = None
        write = transaction.write
        if write is None:
            return Outcome("COMMIT", timestamp=transaction.read_ts or 0)
        state = await self.catalog_state()
        target = state.get(write.table_id)
        if target is None:
            raise SqlError(
                "42P01",
                f'table "{write.table_name}" was dropped while the transaction was open; '
                "nothing was written",
            )
        # The session travels through the client: what it says it wrote is checked again
        # against who commits (only a table takes writes, and only with the privileges).
        check_buffered_write(state, session.principal, target, write.consolidated())
        reads = None
        if transaction.read_ts is not None:
            reads = ReadSet(
                transaction.read_ts,
                frozenset(transaction.reads),
                frozenset(transaction.read_sources),
            )
        w = await self.writer.write(write.table_id, write.schema, write.consolidated(), reads)
        return Outcome("COMMIT", timestamp=w)

    def _set(self, statement: ast.SetVariable, session: SessionState) -> Outcome:
        if statement.value is None:
            session.settings.reset(statement.name, statement.position)
        else:
            session.settings.set(statement.name, statement.value, statement.position)
        return Outcome("SET")

    # -- queries --------------------------------------------------------------------------

    async def read_timestamp(
        self, transaction: Transaction | None, as_of: int | None, position: int
    ) -> int:
        """The data time a read happens at."""
        if transaction is not None:
            if as_of is not None:
                raise not_supported("AS OF inside a transaction", position)
            transaction.check_can_read(position)
            if transaction.read_ts is not None:
                return transaction.read_ts
        return await self.timestamps.as_of_or_now(as_of, position)

    async def _select(self, statement: ast.Select, session: SessionState) -> Outcome:
        planned, rows, timestamp = await self._query(
            statement.query, statement.as_of, statement.position, session
        )
        return Outcome(
            select_tag(len(rows)),
            output_columns(planned),
            [sql_row(row) for row in rows],
            timestamp=timestamp,
        )

    async def copy_to(self, statement: ast.CopyTo, session: SessionState) -> CopyOutput:
        """The rows a COPY ... TO STDOUT writes, and how."""
        fmt = copy_format(statement.options, reading=False)
        if fmt.kind == "parquet":
            raise not_supported("COPY TO in FORMAT parquet", statement.position)
        planned, rows, timestamp = await self._query(
            statement.query, None, statement.query.position, session
        )
        return CopyOutput([c.name for c in planned.columns], rows, fmt, timestamp)

    async def _query(
        self, query: ast.Query, as_of: int | None, position: int, session: SessionState
    ) -> tuple[PlannedQuery, list[tuple[Any, ...]], int]:
        """A query's finished rows, read at the statement's time."""
        state = await self.catalog_state()
        planned = self.planner.query(query, state, session.settings)
        check_query(state, session.principal, planned, session.settings.cluster, position)
        timestamp = await self.read_timestamp(session.transaction, as_of, position)
        inputs = plan_inputs(planned.plan, state)
        result = await self.reader.read(
            planned.plan,
            state,
            timestamp,
            session.settings.cluster,
            inputs=inputs,
            match=planned.unoptimized,
            memory_budget_bytes=session.settings.statement_memory_bytes,
        )
        transaction = session.transaction
        if transaction is not None:
            transaction.read_ts = timestamp
            transaction.reads |= inputs.tables
            transaction.read_sources |= inputs.sources
        rows = apply_finishing(expand(result.rows), planned.finishing)
        return planned, rows, timestamp

    async def _explain(self, statement: ast.Explain, session: SessionState) -> Outcome:
        state = await self.catalog_state()
        planned = self.planner.query(statement.query, state, session.settings)
        Privileges.of(state, session.principal).require_read(planned.depends_on, statement.position)
        cluster = session.settings.cluster
        chosen = self.reader.choose_index(planned.unoptimized, state, cluster)
        if chosen is not None:
            name, peek = chosen
            how = f"Peek index {peek.dataflow_id} on cluster {name}"
            if peek.finishing is not None:
                how += " through:\n" + explain(peek.finishing)
        else:
            how = f"One-shot peek on cluster {cluster}"
        if statement.raw:
            return text_outcome("EXPLAIN", ["Raw Plan"], [(explain_query(planned, raw=True),)])
        text = f"{explain_query(planned)}\n\n{how}"
        if planned.changed_by:
            text += "\n\nOptimized by: " + ", ".join(planned.changed_by)
        return text_outcome("EXPLAIN", ["Optimized Plan"], [(text,)])


def _ddl_outcome(outcome: DdlOutcome) -> Outcome:
    return Outcome(outcome.tag, notices=outcome.notices)
