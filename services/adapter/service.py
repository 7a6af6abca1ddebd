"""The adapter process: its parts wired together, and its gRPC face (``Adapter.Execute``,
``Adapter.Subscribe``).

A statement's failure is data (``StatementResult.error`` with an SQLSTATE); it stops the batch
and marks an open transaction failed, and the call itself succeeds. Failures of the backend
services become SQL errors too (08006 when one stayed unavailable through the clients'
retries). Only a malformed session is a gRPC error (INVALID_ARGUMENT), and so is a session the
adapters did not sign for the caller (``session_signing``). Nothing a client sends
makes the adapter answer with a stack trace: unexpected exceptions are logged with the request
id, and the client gets XX000 naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc.aio
from prometheus_client import Counter

from services.adapter.authentication import (
    DEFAULT_SUPERUSER,
    TRUST,
    CallAuthenticator,
    Metadata,
    Principal,
)
from services.adapter.backends import Backends
from services.adapter.catalog_cache import CatalogCache
from services.adapter.copying.encoding import encode_rows
from services.adapter.copying.runner import CopyOutput
from services.adapter.ddl import DdlRunner
from services.adapter.ddl_roles import bootstrap_superuser
from services.adapter.ddl_statements import DdlStatements
from services.adapter.executor import SessionState, StatementExecutor
from services.adapter.holds import CollectionHolds
from services.adapter.planning import Planner
from services.adapter.privileges import check_query
from services.adapter.progress import STATEMENT_TEXT_CHARS, RunningStatements
from services.adapter.reads import QueryReader
from services.adapter.results import (
    INTERNAL_ERROR,
    QUERY_CANCELED,
    Outcome,
    error_from_backend,
    sql_error,
)
from services.adapter.session import Settings
from services.adapter.session_signing import SessionSigner
from services.adapter.sql import parse
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from services.adapter.statistics import CollectionStatistics
from services.adapter.subscribe import Subscriptions
from services.adapter.table_ticker import TableTicker
from services.adapter.timestamps import Timestamps
from services.adapter.transactions import Transaction
from services.adapter.writes import TableWriter
from tidemark import timelines
from tidemark.clients.catalog import CatalogChange
from tidemark.errors import InvalidArgument, TidemarkError
from tidemark.logging import get_logger
from tidemark.rpc import Service, current_request_id
from tidemark.v1 import adapter_pb2, adapter_pb2_grpc

log = get_logger("services.adapter")

Context = grpc.aio.ServicerContext[object, object]

SUCCESSFUL = "00000"
# A COPY FROM STDIN is held in memory whole before it is decoded and written as one write.
MAX_COPY_IN_BYTES = 1 << 30
STATEMENTS = Counter(
    "tidemark_adapter_statements",
    "SQL statements run, by SQLSTATE (00000: succeeded; 57014: cancelled or timed out; "
    "53200: over its memory budget; ...)",
    ["sqlstate"],
)


@dataclass(frozen=True)
class AdapterSettings:
    holder: str = "adapter"
    history_ms: int = 900_000
    peek_wait_ms: int = 30_000
    subscribe_tick_seconds: float = 1.0
    table_tick_seconds: float = 1.0
    renew_seconds: float = 10.0
    catalog_timeline: str = timelines.CATALOG
    data_timeline: str = timelines.DATA
    # Who callers are (authentication.py): "trust" or "password".
    auth: str = TRUST
    # The superuser every adapter makes sure exists at start (empty: none).
    bootstrap_superuser: str = DEFAULT_SUPERUSER
    # Its password, when it is created (empty: none, it logs in only where trusted).
    bootstrap_superuser_password: str = ""


class Adapter:
    """Everything one adapter process runs, over its backends."""

    def __init__(self, backends: Backends, settings: AdapterSettings) -> None:
        self.backends = backends
        self.settings = settings
        self.holds = CollectionHolds(
            backends.storage,
            settings.holder,
            history_ms=settings.history_ms,
            renew_every=settings.renew_seconds,
            read_ts=self._data_read_ts,
        )
        self.timestamps = Timestamps(
            backends.oracle,
            backends.storage,
            self.holds,
            data_timeline=settings.data_timeline,
            catalog_timeline=settings.catalog_timeline,
        )
        self.cache = CatalogCache(backends.catalog, self.timestamps.catalog_read_ts)
        self.cache.add_listener(self._on_catalog_changes)
        self.planner = Planner(CollectionStatistics(backends.storage))
        self.reader = QueryReader(
            backends, self.timestamps, self.holds, wait_ms=settings.peek_wait_ms
        )
        self.writer = TableWriter(self.timestamps, backends.storage, self.holds)
        ddl = DdlStatements(
            DdlRunner(self.cache, backends.catalog, self.timestamps, backends.storage, self.holds),
            self.planner.definition,
        )
        self.executor = StatementExecutor(
            self.cache, self.timestamps, self.planner, self.reader, self.writer, ddl
        )
        self.subscriptions = Subscriptions(
            backends,
            self.timestamps,
            self.holds,
            self.reader,
            tick_seconds=settings.subscribe_tick_seconds,
        )
        self.ticker = TableTicker(self.timestamps, self.cache, settings.table_tick_seconds)
        self.authenticator = CallAuthenticator(
            settings.auth, self.cache.latest, settings.bootstrap_superuser
        )
        self._background: set[asyncio.Task[None]] = set()
        self.statements = RunningStatements()
        """Execute calls that named themselves, for StatementProgress."""

    async def _data_read_ts(self) -> int:
        return await self.timestamps.read_ts()

    async def start(self) -> None:
        await self.cache.start(await self.timestamps.catalog_read_ts())
        self.holds.start()
        if self.settings.bootstrap_superuser:
            await self.executor.ddl.runner.run(
                bootstrap_superuser(
                    self.settings.bootstrap_superuser, self.settings.bootstrap_superuser_password
                )
            )
        self.ticker.start()
        log.info(
            "adapter_started", catalog_frontier=self.cache.frontier, holder=self.settings.holder
        )

    def readiness(self) -> str | None:
        """Why the adapter cannot serve right now, or ``None`` when it can: its copy of the
        catalog is current (``start`` loaded it before the server started, and it keeps
        following the catalog)."""
        failure = self.cache.failure
        if failure is not None:
            return f"the adapter's copy of the catalog is not current: {failure.message}"
        return None

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self.ticker.close()
        await self.holds.close()
        await self.cache.close()

    def _on_catalog_changes(self, changes: list[CatalogChange]) -> None:
        """Release capabilities on collections the catalog no longer has."""
        dropped = {
            change.item.id
            for change in changes
            if change.diff < 0
            and change.item.id
            and self.cache.latest().get(change.item.id) is None
        }
        held = set(self.holds.held_ids())
        for collection_id in dropped & held:
            task = asyncio.create_task(self.holds.release(collection_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # -- Execute --------------------------------------------------------------------------

    def authenticate(self, metadata: Metadata | None) -> Principal:
        """The role a gRPC call acts as (SqlError 28P01 / 28000 when it may not)."""
        return self.authenticator.from_metadata(metadata)

    async def execute(
        self, request: adapter_pb2.ExecuteRequest, metadata: Metadata | None = None
    ) -> adapter_pb2.ExecuteResponse:
        try:
            principal = self.authenticate(metadata)
        except SqlError as exc:
            return adapter_pb2.ExecuteResponse(
                results=[adapter_pb2.StatementResult(error=sql_error(exc))],
                session=request.session,
            )
        session = _session_state(request.session, principal)
        results: list[adapter_pb2.StatementResult] = []
        try:
            statements = parse(request.sql)
        except SqlError as exc:
            statements = []
            results.append(adapter_pb2.StatementResult(error=sql_error(exc)))
            _mark_failed(session)
        with self.statements.running(request.statement_id, principal.name) as activity:
            for statement in statements:
                if activity is not None:
                    activity.statement = statement.text[:STATEMENT_TEXT_CHARS]
                result = await self.run_statement(statement, session)
                results.append(result)
                if result.HasField("error"):
                    break
        return adapter_pb2.ExecuteResponse(results=results, session=_session_proto(session))

    async def statement_progress(
        self, request: adapter_pb2.StatementProgressRequest, metadata: Metadata | None = None
    ) -> adapter_pb2.StatementProgressResponse:
        """How far the caller's Execute named ``statement_id`` has come (``running`` false
        for an id none of the caller's calls is running here, or a caller who does not
        authenticate)."""
        try:
            principal = self.authenticate(metadata)
        except SqlError:
            return adapter_pb2.StatementProgressResponse(running=False)
        return await self.statements.progress(request.statement_id, principal.name)

    async def run_statement(
        self, statement: ast.AnyStatement, session: SessionState
    ) -> adapter_pb2.StatementResult:
        """One parsed statement of a session kept by the caller (Execute, pgwire); a failure
        is the result's error and marks an open transaction failed."""
        try:
            outcome = await self._run_one(statement, session)
        except SqlError as exc:
            _mark_failed(session)
            return adapter_pb2.StatementResult(error=sql_error(exc.at(statement.position)))
        return outcome.to_proto()

    # -- COPY -----------------------------------------------------------------------------

    async def copy_in(
        self,
        requests: AsyncIterator[adapter_pb2.CopyInRequest],
        metadata: Metadata | None = None,
    ) -> adapter_pb2.CopyInResponse:
        first = await anext(requests, None)
        if first is None:
            raise InvalidArgument("CopyIn needs a first message with the session and the SQL")
        try:
            principal = self.authenticate(metadata)
        except SqlError as exc:
            return adapter_pb2.CopyInResponse(
                result=adapter_pb2.StatementResult(error=sql_error(exc)), session=first.session
            )
        session = _session_state(first.session, principal)
        chunks = [first.data]
        size = len(first.data)
        async for request in requests:
            size += len(request.data)
            if size > MAX_COPY_IN_BYTES:
                raise InvalidArgument(
                    f"COPY FROM STDIN takes at most {MAX_COPY_IN_BYTES >> 20} MiB per statement; "
                    "split the input, or COPY FROM a file or s3:// location"
                )
            chunks.append(request.data)
        session.copy_data = b"".join(chunks)
        try:
            statement = _single(parse(first.sql), ast.CopyFrom, "CopyIn", "COPY ... FROM STDIN")
            if statement.location is not None:
                raise SqlError("42601", "CopyIn takes COPY ... FROM STDIN", statement.position)
            outcome = await self._run_one(statement, session)
            result = outcome.to_proto()
        except SqlError as exc:
            result = adapter_pb2.StatementResult(error=sql_error(exc))
            _mark_failed(session)
        return adapter_pb2.CopyInResponse(result=result, session=_session_proto(session))

    async def copy_out(
        self, request: adapter_pb2.CopyOutRequest, metadata: Metadata | None = None
    ) -> AsyncIterator[adapter_pb2.CopyOutResponse]:
        try:
            session = _session_state(request.session, self.authenticate(metadata))
            statement = _single(parse(request.sql), ast.CopyTo, "CopyOut", "COPY ... TO STDOUT")
            output = await self.copy_to(statement, session)
        except SqlError as exc:
            error = adapter_pb2.StatementResult(error=sql_error(exc))
            yield adapter_pb2.CopyOutResponse(result=error)
            return
        yield adapter_pb2.CopyOutResponse(
            header=adapter_pb2.CopyOutHeader(
                columns=[adapter_pb2.SqlColumn(name=n, type="text") for n in output.names],
                format=output.format.kind,
            )
        )
        for chunk in encode_rows(output.rows, output.names, output.format):
            yield adapter_pb2.CopyOutResponse(data=chunk)
        yield adapter_pb2.CopyOutResponse(
            result=adapter_pb2.StatementResult(
                tag=f"COPY {len(output.rows)}", timestamp=output.timestamp
            )
        )

    async def copy_to(self, statement: ast.CopyTo, session: SessionState) -> CopyOutput:
        """The statement's rows, with Execute's timeout and error handling."""
        result: list[CopyOutput] = []

        async def run() -> Outcome:
            result.append(await self.executor.copy_to(statement, session))
            return Outcome("COPY")

        await self._guard(statement, session, run)
        return result[0]

    async def _run_one(self, statement: ast.AnyStatement, session: SessionState) -> Outcome:
        try:
            outcome = await self._run_guarded(statement, session)
        except SqlError as exc:
            STATEMENTS.labels(exc.code).inc()
            raise
        STATEMENTS.labels(SUCCESSFUL).inc()
        return outcome

    async def _run_guarded(self, statement: ast.AnyStatement, session: SessionState) -> Outcome:
        return await self._guard(statement, session, lambda: self.executor.run(statement, session))

    async def _guard(
        self,
        statement: ast.AnyStatement,
        session: SessionState,
        work: Callable[[], Awaitable[Outcome]],
    ) -> Outcome:
        """Runs a statement's work under its timeout, turning every failure into SqlError."""
        timeout_ms = session.settings.statement_timeout_ms
        try:
            if timeout_ms:
                async with asyncio.timeout(timeout_ms / 1000):
                    return await work()
            return await work()
        except TimeoutError:
            raise SqlError(
                QUERY_CANCELED, "canceling statement due to statement timeout", statement.position
            ) from None
        except SqlError:
            raise
        except TidemarkError as exc:
            raise error_from_backend(exc) from None
        except Exception as exc:
            request_id = current_request_id() or "unknown"
            log.exception("statement_failed", statement=statement.text[:200], error=str(exc))
            raise SqlError(
                INTERNAL_ERROR,
                f"internal error while running the statement (logged with request id "
                f"{request_id}): {type(exc).__name__}",
                statement.position,
            ) from None

    # -- Subscribe ------------------------------------------------------------------------

    async def subscribe(
        self, request: adapter_pb2.SubscribeSqlRequest, metadata: Metadata | None = None
    ) -> AsyncIterator[adapter_pb2.SubscribeSqlResponse]:
        settings = Settings.from_session(request.session)
        try:
            settings.check()
        except SqlError as exc:
            raise InvalidArgument(f"malformed session: {exc.message}") from None
        try:
            principal = self.authenticate(metadata)
        except SqlError as exc:
            yield adapter_pb2.SubscribeSqlResponse(error=sql_error(exc))
            return
        async for message in self.subscribe_sql(request.sql, settings, principal):
            yield message

    async def subscribe_sql(
        self, sql: str, settings: Settings, principal: Principal
    ) -> AsyncIterator[adapter_pb2.SubscribeSqlResponse]:
        """A subscription's messages (header, changes, progress; or one error)."""
        try:
            statements = parse(sql)
            statement = _single_subscription(statements)
            state = await self.executor.catalog_state()
            # ORDER BY / LIMIT become part of the plan: a subscription maintains its top k.
            planned = self.planner.query(statement.query, state, settings, finishing=False)
            check_query(state, principal, planned, settings.cluster, statement.position)
            as_of = await self.timestamps.as_of_or_now(statement.as_of, statement.position)
            stream = self.subscriptions.stream(planned, state, settings.cluster, as_of)
            async for message in stream:
                yield message
        except SqlError as exc:
            yield adapter_pb2.SubscribeSqlResponse(error=sql_error(exc))
        except TidemarkError as exc:
            yield adapter_pb2.SubscribeSqlResponse(error=sql_error(error_from_backend(exc)))
        except Exception as exc:
            request_id = current_request_id() or "unknown"
            log.exception("subscribe_failed", sql=sql[:200], error=str(exc))
            yield adapter_pb2.SubscribeSqlResponse(
                error=adapter_pb2.SqlError(
                    code=INTERNAL_ERROR,
                    message=f"internal error in the subscription (logged with request id "
                    f"{request_id}): {type(exc).__name__}",
                )
            )


def _session_state(proto: adapter_pb2.Session, principal: Principal) -> SessionState:
    settings = Settings.from_session(proto)
    try:
        settings.check()
    except SqlError as exc:
        raise InvalidArgument(f"malformed session: {exc.message}") from None
    transaction = Transaction.decode(proto.transaction) if proto.transaction else None
    return SessionState(settings, transaction, principal=principal)


def _session_proto(session: SessionState) -> adapter_pb2.Session:
    return adapter_pb2.Session(
        settings=session.settings.values,
        transaction=session.transaction.encode() if session.transaction else b"",
    )


StatementT = TypeVar("StatementT")


def _single(
    statements: list[ast.AnyStatement], kind: type[StatementT], call: str, what: str
) -> StatementT:
    if len(statements) != 1 or not isinstance(statements[0], kind):
        raise SqlError("42601", f"{call} takes exactly one {what} statement")
    return statements[0]


def _mark_failed(session: SessionState) -> None:
    if session.transaction is not None:
        session.transaction.failed = True


def _single_subscription(statements: list[ast.AnyStatement]) -> ast.Subscribe | ast.Select:
    if len(statements) != 1:
        raise SqlError("42601", f"Subscribe takes exactly one statement, got {len(statements)}")
    statement = statements[0]
    if not isinstance(statement, ast.Subscribe | ast.Select):
        raise SqlError(
            "42601",
            "Subscribe takes SUBSCRIBE [TO] <relation | (query)> [AS OF t] or a query",
            statement.position,
        )
    return statement


USER_METADATA = "tidemark-user"


def call_user(context: Context) -> str:
    """The user a call is made as (metadata ``tidemark-user``; empty when absent)."""
    for key, value in context.invocation_metadata() or ():
        if key == USER_METADATA:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


class AdapterServicer(adapter_pb2_grpc.AdapterServicer):
    """The gRPC face; the only place sessions cross it, so the only place they are checked
    (on the way in) and signed (on the way out). pgwire keeps its sessions in the adapter."""

    def __init__(self, adapter: Adapter, signer: SessionSigner) -> None:
        self.adapter = adapter
        self.signer = signer

    def _accept(self, session: adapter_pb2.Session, context: Context) -> str:
        """The caller's user, once its ``session`` is known to be one the adapters signed for
        that user (``InvalidArgument`` before anything runs otherwise)."""
        user = call_user(context)
        self.signer.verify(session, user)
        return user

    async def Execute(
        self, request: adapter_pb2.ExecuteRequest, context: Context
    ) -> adapter_pb2.ExecuteResponse:
        user = self._accept(request.session, context)
        response = await self.adapter.execute(request, context.invocation_metadata())
        self.signer.sign(response.session, user)
        return response

    async def Subscribe(
        self, request: adapter_pb2.SubscribeSqlRequest, context: Context
    ) -> AsyncIterator[adapter_pb2.SubscribeSqlResponse]:
        self._accept(request.session, context)
        async for message in self.adapter.subscribe(request, context.invocation_metadata()):
            yield message

    async def CopyIn(
        self, request_iterator: AsyncIterator[adapter_pb2.CopyInRequest], context: Context
    ) -> adapter_pb2.CopyInResponse:
        first = await anext(request_iterator, None)
        if first is None:
            raise InvalidArgument("CopyIn needs a first message with the session and the SQL")
        user = self._accept(first.session, context)

        async def requests() -> AsyncIterator[adapter_pb2.CopyInRequest]:
            yield first
            async for request in request_iterator:
                yield request

        response = await self.adapter.copy_in(requests(), context.invocation_metadata())
        self.signer.sign(response.session, user)
        return response

    async def CopyOut(
        self, request: adapter_pb2.CopyOutRequest, context: Context
    ) -> AsyncIterator[adapter_pb2.CopyOutResponse]:
        self._accept(request.session, context)
        async for message in self.adapter.copy_out(request, context.invocation_metadata()):
            yield message

    async def StatementProgress(
        self, request: adapter_pb2.StatementProgressRequest, context: Context
    ) -> adapter_pb2.StatementProgressResponse:
        return await self.adapter.statement_progress(request, context.invocation_metadata())


def adapter_service(adapter: Adapter, signer: SessionSigner) -> Service[AdapterServicer]:
    return Service(
        adapter_pb2.DESCRIPTOR.services_by_name["Adapter"],
        AdapterServicer(adapter, signer),
        adapter_pb2_grpc.add_AdapterServicer_to_server,
    )
