"""One client connection: startup and authentication, then the simple and extended query
protocols over the adapter's statement execution (``Adapter.run_statement``, ``copy_to``,
``subscribe_sql``) with this connection's ``SessionState`` kept here, server-side.

Each Query, Describe and Execute runs as a task, so a CancelRequest carrying this connection's
key cancels exactly the statement running (57014). After an error in the extended protocol
the messages up to the next Sync are skipped, as the protocol says. A protocol violation
(``codec.ProtocolError``) gets one 08P01 ErrorResponse and the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from services.adapter.executor import SessionState
from services.adapter.pgwire import codec, cursors, inference, pgtypes, streams
from services.adapter.pgwire.auth import AuthFailed
from services.adapter.pgwire.codec import Bind, Notice, ProtocolError
from services.adapter.pgwire.outcome import Result
from services.adapter.pgwire.params import (
    PositionMap,
    parameter_count,
    split_statements,
    substitute,
)
from services.adapter.pgwire.shims import CatalogShims
from services.adapter.privileges import Privileges
from services.adapter.results import INTERNAL_ERROR, PROTOCOL_VIOLATION, QUERY_CANCELED
from services.adapter.session import Settings
from services.adapter.sql import parse
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from tidemark.logging import get_logger
from tidemark.v1 import adapter_pb2

if TYPE_CHECKING:
    from services.adapter.pgwire.server import PgServer

log = get_logger("services.adapter.pgwire")

T = TypeVar("T")
FLUSH_BYTES = 64 << 10
CLIENT_CHECK_SECONDS = 1.0
DUPLICATE_PREPARED_STATEMENT = "42P05"
INVALID_SQL_STATEMENT_NAME = "26000"
INVALID_CURSOR_NAME = "34000"
UNDEFINED_DATABASE = "3D000"
SYNTAX_ERROR = "42601"
DEALLOCATE = re.compile(
    r"\s*DEALLOCATE\s+(?:PREPARE\s+)?(ALL|\"[^\"]+\"|\w+)\s*;?\s*\Z", re.IGNORECASE
)
# Statements whose first word says they return rows (after any comments).
RETURNS_ROWS = re.compile(
    r"(?:\s|--[^\n]*\n|/\*.*?\*/)*(?:\(|SELECT\b|WITH\b|SHOW\b|EXPLAIN\b|FETCH\b|VALUES\b|TABLE\b)",
    re.IGNORECASE | re.DOTALL,
)
ROW_STATEMENTS = (ast.Select, ast.ShowObjects, ast.ShowColumns, ast.ShowSetting, ast.Explain)
# Parameters reported to the client at startup and whenever SET changes them.
REPORTED = {
    "application_name": "application_name",
    "client_encoding": "client_encoding",
    "datestyle": "DateStyle",
    "timezone": "TimeZone",
}


@dataclass
class Prepared:
    sql: str
    param_types: list[int]


@dataclass
class Portal:
    sql: str
    positions: PositionMap
    bind: Bind
    result: Result | None = None
    sent: int = 0


class Connection:
    def __init__(
        self,
        server: PgServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        process_id: int,
        secret_key: int,
    ) -> None:
        self.server = server
        self.adapter = server.adapter
        self.reader = reader
        self.writer = writer
        self.process_id = process_id
        self.secret_key = secret_key
        self.session = SessionState(Settings({}))
        self.shims = CatalogShims(self.adapter, self)
        self.user = ""
        self.superuser = False
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.cursors: dict[str, cursors.Cursor] = {}
        self._out = bytearray()
        self._running: asyncio.Task[object] | None = None
        self._cancel_requested = False
        self._skip_to_sync = False
        self._reported: dict[str, str] = {}

    # -- the connection's life ------------------------------------------------------------

    async def run(self) -> None:
        try:
            if await self._startup():
                await self._serve()
        except ProtocolError as exc:
            self.send(codec.error_response(Notice(PROTOCOL_VIOLATION, str(exc), "FATAL")))
        except AuthFailed as exc:
            self.send(codec.error_response(Notice(exc.code, exc.message, "FATAL")))
        except SqlError as exc:
            self.send(codec.error_response(_notice(exc, "FATAL")))
        except (EOFError, ConnectionError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await self.flush()
            for cursor in self.cursors.values():
                await cursor.close()
            log.info("pgwire_connection_closed", process_id=self.process_id, user=self.user)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    def cancel(self) -> None:
        """A CancelRequest with this connection's key: cancel the running statement."""
        if self._running is not None and not self._running.done():
            self._cancel_requested = True
            self._running.cancel()

    def send(self, data: bytes) -> None:
        self._out += data

    async def flush(self) -> None:
        if self._out:
            self.writer.write(bytes(self._out))
            self._out.clear()
        await self.writer.drain()

    async def maybe_flush(self) -> None:
        if len(self._out) >= FLUSH_BYTES:
            await self.flush()

    # -- startup --------------------------------------------------------------------------

    async def _startup(self) -> bool:
        while True:
            packet = await codec.read_startup(self.reader)
            if isinstance(packet, codec.SslRequest):
                context = self.server.tls
                self.writer.write(b"S" if context is not None else b"N")
                await self.writer.drain()
                if context is not None:
                    await self.writer.start_tls(context)
                continue
            if isinstance(packet, codec.GssEncRequest):
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            if isinstance(packet, codec.CancelRequest):
                self.server.cancel(packet.process_id, packet.secret_key)
                return False
            break
        parameters = packet.parameters
        self.user = parameters.get("user", "")
        if not self.user:
            raise AuthFailed("28000", "no PostgreSQL user name specified in startup packet")
        await self._authenticate()
        self.session.principal = self.server.authenticator.principal(self.user)
        state = await self.adapter.executor.catalog_state()
        self.superuser = Privileges.of(state, self.session.principal).superuser
        await self._apply_startup_settings(parameters)
        self.send(codec.authentication_ok())
        for name, value in self._parameters().items():
            self.send(codec.parameter_status(name, value))
            self._reported[name] = value
        self.send(codec.backend_key_data(self.process_id, self.secret_key))
        self.send(codec.ready_for_query(self._status()))
        await self.flush()
        return True

    async def _authenticate(self) -> None:
        peer = self.writer.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) else "127.0.0.1"
        authenticator = self.server.authenticator
        if authenticator.method(str(host)) == "trust":
            # No password, but (as PostgreSQL's trust) a role that exists and may log in.
            if self.user not in authenticator.administrators:
                self.adapter.authenticator.check_login(self.user)
            return
        exchange = authenticator.exchange(self.user)
        self.send(codec.authentication_sasl(["SCRAM-SHA-256"]))
        await self.flush()
        mechanism, first = codec.decode_sasl_initial(await self._password_message())
        if mechanism != "SCRAM-SHA-256":
            raise AuthFailed("28000", f"unsupported SASL mechanism {mechanism!r}")
        self.send(codec.authentication_sasl_continue(exchange.first(first)))
        await self.flush()
        self.send(codec.authentication_sasl_final(exchange.final(await self._password_message())))

    async def _password_message(self) -> bytes:
        kind, body = await codec.read_message(self.reader)
        if kind != ord("p"):
            raise ProtocolError(f"expected a password message, got {chr(kind)!r}")
        return body

    async def _apply_startup_settings(self, parameters: dict[str, str]) -> None:
        settings = self.session.settings
        for name, value in parameters.items():
            if name in ("user", "database", "options", "replication"):
                continue
            with contextlib.suppress(SqlError):
                settings.set(name, value)
        for option in _options(parameters.get("options", "")):
            key, _, value = option.partition("=")
            with contextlib.suppress(SqlError):
                settings.set(key.replace("-", "_"), value)
        database = parameters.get("database") or self.user
        if database != settings.database:
            # Any role may connect to any database (PostgreSQL grants CONNECT to PUBLIC by
            # default); what it may use there is checked statement by statement.
            view = await self.shims.catalog_view()
            if view.database(database) is None:
                raise SqlError(UNDEFINED_DATABASE, f'database "{database}" does not exist')
            settings.set("database", database)

    def _parameters(self) -> dict[str, str]:
        settings = self.session.settings
        values = {
            "server_version": self.server.server_version,
            "server_encoding": "UTF8",
            "standard_conforming_strings": "on",
            "integer_datetimes": "on",
            "IntervalStyle": "postgres",
            "is_superuser": "on" if self.superuser else "off",
            "session_authorization": self.user,
        }
        for key, name in REPORTED.items():
            values[name] = settings.get(key)
        return values

    def _status(self) -> str:
        transaction = self.session.transaction
        if transaction is None:
            return "I"
        return "E" if transaction.failed else "T"

    # -- the message loop -----------------------------------------------------------------

    async def _serve(self) -> None:
        while True:
            kind, body = await codec.read_message(self.reader)
            if kind == ord("X"):
                return
            if kind == ord("Q"):
                self._skip_to_sync = False
                await self._simple_query(codec.decode_query(body))
                self.send(codec.ready_for_query(self._status()))
                await self.flush()
                continue
            if kind == ord("S"):
                self._skip_to_sync = False
                self._close_unnamed_portal()
                self.send(codec.ready_for_query(self._status()))
                await self.flush()
                continue
            if kind == ord("H"):
                await self.flush()
                continue
            if kind in (ord("d"), ord("c"), ord("f")):
                continue  # COPY messages outside a COPY are ignored, as PostgreSQL does
            if kind == ord("p"):
                raise ProtocolError("unexpected password message")
            if self._skip_to_sync:
                continue
            try:
                await self._extended(kind, body)
            except SqlError as exc:
                self._fail(exc)
                self._skip_to_sync = True
            await self.maybe_flush()

    def _fail(self, exc: SqlError) -> None:
        if self.session.transaction is not None:
            self.session.transaction.failed = True
        self.send(codec.error_response(_notice(exc)))

    async def _cancellable(self, work: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            try:
                return await work()
            except (SqlError, ProtocolError, EOFError, ConnectionError):
                raise
            except Exception as exc:
                # Nothing a client sends gets it a stack trace or a dropped connection.
                log.exception("pgwire_statement_failed", error=str(exc))
                raise SqlError(
                    INTERNAL_ERROR, f"internal error in the wire front end: {type(exc).__name__}"
                ) from None

        task: asyncio.Task[T] = asyncio.create_task(wrapped())
        self._running = task  # type: ignore[assignment]
        self._cancel_requested = False
        try:
            # A statement may wait a long time (FETCH on a quiet subscription, COPY (SUBSCRIBE
            # ...)); a client that went away in the meantime ends it.
            while not task.done():
                await asyncio.wait({task}, timeout=CLIENT_CHECK_SECONDS)
                if not task.done() and (self.reader.at_eof() or self.writer.is_closing()):
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise EOFError
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._running = None
        if task.cancelled():
            cancelled, self._cancel_requested = self._cancel_requested, False
            if cancelled:
                raise SqlError(QUERY_CANCELED, "canceling statement due to user request")
            raise asyncio.CancelledError
        return task.result()

    # -- simple query ---------------------------------------------------------------------

    async def _simple_query(self, sql: str) -> None:
        pieces = split_statements(sql)
        if not pieces:
            self.send(codec.empty_query_response())
            return
        for offset, text in pieces:
            try:
                result = await self._cancellable(lambda text=text: self.run_text(text, None))  # type: ignore[misc]
            except SqlError as exc:
                self._fail(exc.at(exc.position + offset) if exc.position else exc)
                return
            self._send_result(result, None, 0)
            await self.maybe_flush()

    def _send_result(self, result: Result, bind: Bind | None, start: int) -> None:
        for notice in result.notices:
            self.send(codec.notice_response(_adapter_notice(notice)))
        if result.empty:
            self.send(codec.empty_query_response())
            return
        if result.columns is not None and bind is None:
            self.send(codec.row_description(_fields(result.columns, None)))
        if result.columns is not None:
            oids = [pgtypes.pg_type(c.type).oid for c in result.columns]
            formats = [bind.result_format(i) if bind else 0 for i in range(len(oids))]
            for row in result.rows[start:]:
                self.send(codec.data_row(_encode_row(row, oids, formats)))
        self.send(codec.command_complete(result.tag))
        self._report_changes()

    def _report_changes(self) -> None:
        for name, value in self._parameters().items():
            if self._reported.get(name) != value:
                self.send(codec.parameter_status(name, value))
                self._reported[name] = value

    # -- extended query -------------------------------------------------------------------

    async def _extended(self, kind: int, body: bytes) -> None:
        if kind == ord("P"):
            parse_message = codec.decode_parse(body)
            name = parse_message.name
            if name and name in self.statements:
                raise SqlError(
                    DUPLICATE_PREPARED_STATEMENT, f'prepared statement "{name}" already exists'
                )
            if len(split_statements(parse_message.query)) > 1:
                raise SqlError(
                    SYNTAX_ERROR, "cannot insert multiple commands into a prepared statement"
                )
            count = max(len(parse_message.param_types), parameter_count(parse_message.query))
            types = parse_message.param_types + [0] * (count - len(parse_message.param_types))
            self.statements[name] = Prepared(parse_message.query, types)
            self.send(codec.parse_complete())
        elif kind == ord("B"):
            bind = codec.decode_bind(body)
            prepared = self._statement(bind.statement)
            if len(bind.params) != len(prepared.param_types):
                raise SqlError(
                    PROTOCOL_VIOLATION,
                    f"bind message supplies {len(bind.params)} parameters, but prepared "
                    f'statement "{bind.statement}" requires {len(prepared.param_types)}',
                )
            if bind.portal and bind.portal in self.portals:
                raise SqlError("42P03", f'portal "{bind.portal}" already exists')
            literals = [
                pgtypes.sql_literal(
                    pgtypes.decode_param(value, oid, bind.param_format(i), i + 1), oid
                )
                for i, (value, oid) in enumerate(
                    zip(bind.params, prepared.param_types, strict=True)
                )
            ]
            sql, positions = substitute(prepared.sql, literals)
            self.portals[bind.portal] = Portal(sql, positions, bind)
            self.send(codec.bind_complete())
        elif kind == ord("D"):
            describe = codec.decode_describe(body)
            if describe.kind == "S":
                await self._describe_statement(self._statement(describe.name))
            elif describe.name not in self.portals and describe.name in self.cursors:
                # A DECLAREd cursor is also a portal of that name (psycopg's named cursors
                # describe it so).
                columns = self.cursors[describe.name].columns
                self.send(codec.row_description(_fields(columns, None)))
            else:
                await self._describe_portal(self._portal(describe.name))
        elif kind == ord("E"):
            execute = codec.decode_execute(body)
            await self._execute_portal(self._portal(execute.portal), execute.max_rows)
        elif kind == ord("C"):
            close = codec.decode_close(body)
            if close.kind == "S":
                self.statements.pop(close.name, None)
            else:
                self.portals.pop(close.name, None)
            self.send(codec.close_complete())
        else:
            raise ProtocolError(f"unexpected message type {chr(kind)!r}")

    def _statement(self, name: str) -> Prepared:
        prepared = self.statements.get(name)
        if prepared is None:
            raise SqlError(
                INVALID_SQL_STATEMENT_NAME, f'prepared statement "{name}" does not exist'
            )
        return prepared

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise SqlError(INVALID_CURSOR_NAME, f'portal "{name}" does not exist')
        return portal

    def _close_unnamed_portal(self) -> None:
        self.portals.pop("", None)

    async def _describe_statement(self, prepared: Prepared) -> None:
        if not all(prepared.param_types):
            view = await self.shims.catalog_view()
            settings = self.session.settings.values
            # What Describe reports is what Bind's values are then read as.
            prepared.param_types = inference.infer(
                prepared.sql, prepared.param_types, view, settings
            )
        self.send(codec.parameter_description(prepared.param_types))
        nulls = [pgtypes.sql_literal(None, oid) for oid in prepared.param_types]
        sql, _ = substitute(prepared.sql, nulls)
        columns = await self._cancellable(lambda: self._columns_of(sql))
        if columns is None:
            self.send(codec.no_data())
        else:
            self.send(codec.row_description(_fields(columns, None)))

    async def _describe_portal(self, portal: Portal) -> None:
        # A query runs now (once) and its columns come from the result: no second parse just
        # to learn its shape (clients send Execute right after). Anything else (writes, DDL,
        # COPY and SUBSCRIBE, which talk to the client) waits for Execute and has no rows.
        if portal.result is None and RETURNS_ROWS.match(portal.sql):
            await self._run_portal(portal)
        result = portal.result
        if result is None or result.columns is None:
            self.send(codec.no_data())
        else:
            self.send(codec.row_description(_fields(result.columns, portal.bind)))

    async def _run_portal(self, portal: Portal) -> None:
        try:
            portal.result = await self._cancellable(lambda: self.run_text(portal.sql, portal.bind))
        except SqlError as exc:
            raise exc.at(portal.positions.original(exc.position)) if exc.position else exc from None

    async def _execute_portal(self, portal: Portal, max_rows: int) -> None:
        if portal.result is None:
            await self._run_portal(portal)
        result = portal.result
        assert result is not None
        if result.columns is None or result.empty:
            if portal.sent == 0:
                self._send_result(result, portal.bind, 0)
                portal.sent = 1
            return
        rows = result.rows
        start = portal.sent
        end = len(rows) if max_rows <= 0 else min(len(rows), portal.sent + max_rows)
        oids = [pgtypes.pg_type(c.type).oid for c in result.columns]
        formats = [portal.bind.result_format(i) for i in range(len(oids))]
        if portal.sent == 0:
            for notice in result.notices:
                self.send(codec.notice_response(_adapter_notice(notice)))
        for row in rows[portal.sent : end]:
            self.send(codec.data_row(_encode_row(row, oids, formats)))
            await self.maybe_flush()
        portal.sent = end
        # As PostgreSQL: reaching the row limit suspends the portal, even on its last row;
        # the next Execute then completes it.
        if max_rows > 0 and end - start == max_rows:
            self.send(codec.portal_suspended())
            return
        tag = result.tag
        if tag.startswith("SELECT ") or tag.startswith("FETCH "):
            tag = f"{tag.split()[0]} {len(rows)}"
        self.send(codec.command_complete(tag))
        self._report_changes()

    # -- running one statement ------------------------------------------------------------

    async def _returns_rows(self, text: str) -> bool:
        if self.shims.recognises(text) or cursors.FETCH.match(text):
            return True
        if (
            cursors.DECLARE.match(text)
            or cursors.CLOSE.match(text)
            or cursors.SUBSCRIBE.match(text)
        ):
            return False
        try:
            statements = parse(text)
        except SqlError:
            return False
        return len(statements) == 1 and isinstance(statements[0], ROW_STATEMENTS)

    async def _columns_of(self, text: str) -> list[adapter_pb2.SqlColumn] | None:
        """The columns a statement returns, without running it (Describe of a statement)."""
        if not await self._returns_rows(text):
            return None
        statements = [] if self.shims.recognises(text) else parse(text)
        if statements and isinstance(statements[0], ast.Select):
            return await self.shims.query_columns(statements[0], self.session.settings)
        fetch = cursors.FETCH.match(text)
        if fetch:
            cursor = self.cursors.get(cursors.identifier(fetch[3]))
            return cursor.columns if cursor else None
        result = await self.run_text(text, None)
        return result.columns

    async def run_text(self, text: str, bind: Bind | None) -> Result:
        """Runs one statement's text (COPY and SUBSCRIBE talk to the client here)."""
        if not text.strip() or not text.strip().strip(";").strip():
            return Result("", empty=True)
        shimmed = await self.shims.answer(text, self.session)
        if shimmed is not None:
            return shimmed
        if match := DEALLOCATE.match(text):
            # psycopg deallocates its prepared statements so when it has too many.
            if match[1].upper() == "ALL":
                self.statements = {"": self.statements[""]} if "" in self.statements else {}
            elif self.statements.pop(cursors.identifier(match[1]), None) is None:
                raise SqlError(
                    INVALID_SQL_STATEMENT_NAME, f'prepared statement "{match[1]}" does not exist'
                )
            return Result("DEALLOCATE ALL" if match[1].upper() == "ALL" else "DEALLOCATE")
        if match := cursors.DECLARE.match(text):
            return await cursors.declare(self, match)
        if match := cursors.FETCH.match(text):
            return await cursors.fetch(self, match)
        if match := cursors.CLOSE.match(text):
            return await cursors.close(self, match)
        if match := cursors.COPY_SUBSCRIBE.match(text):
            return await streams.copy_subscribe(self, match[1])
        if cursors.SUBSCRIBE.match(text):
            return await streams.copy_subscribe(self, text)
        statements = parse(text)
        if not statements:
            return Result("", empty=True)
        statement = statements[0]
        if isinstance(statement, ast.CopyFrom) and statement.location is None:
            return await streams.copy_in(self, statement)
        if isinstance(statement, ast.CopyTo):
            return await streams.copy_out(self, statement)
        outcome = await self.adapter.run_statement(statement, self.session)
        self.end_of_transaction()
        if outcome.HasField("error"):
            error = outcome.error
            raise SqlError(error.code, error.message, error.position, hint=error.hint)
        columns = (
            list(outcome.columns)
            if outcome.columns or isinstance(statement, ROW_STATEMENTS)
            else None
        )
        return Result(outcome.tag, columns, list(outcome.rows), list(outcome.notices))

    def check_not_failed(self) -> None:
        if self.session.transaction is not None and self.session.transaction.failed:
            raise SqlError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )

    def end_of_transaction(self) -> None:
        """Cursors live until their transaction ends, unless declared WITH HOLD."""
        if self.session.transaction is None and self.cursors:
            for name, cursor in list(self.cursors.items()):
                if not cursor.hold:
                    del self.cursors[name]
                    asyncio.get_running_loop().create_task(cursor.close())


def _options(text: str) -> list[str]:
    """``-c name=value`` pairs of the startup ``options`` parameter."""
    words = text.split()
    out: list[str] = []
    for index, word in enumerate(words):
        if word == "-c" and index + 1 < len(words):
            out.append(words[index + 1])
        elif word.startswith("-c") and len(word) > 2:
            out.append(word[2:])
        elif word.startswith("--") and "=" in word:
            out.append(word[2:])
    return out


# The adapter's notices that PostgreSQL sends as warnings with a SQLSTATE of their own.
_WARNINGS = {
    "there is already a transaction in progress": "25001",
    "there is no transaction in progress": "25P01",
}


def _adapter_notice(text: str) -> Notice:
    code = _WARNINGS.get(text)
    return Notice(code, text, "WARNING") if code else Notice("00000", text, "NOTICE")


def _notice(exc: SqlError, severity: str = "ERROR") -> Notice:
    return Notice(exc.code, exc.message, severity, position=exc.position, hint=exc.hint or "")


def _fields(columns: list[adapter_pb2.SqlColumn], bind: Bind | None) -> list[codec.Field]:
    fields = []
    for index, column in enumerate(columns):
        pg = pgtypes.pg_type(column.type)
        fmt = bind.result_format(index) if bind is not None else 0
        fields.append(codec.Field(column.name, pg.oid, pg.size, pg.modifier, fmt))
    return fields


def _encode_row(row: adapter_pb2.SqlRow, oids: list[int], formats: list[int]) -> list[bytes | None]:
    return [
        pgtypes.encode_binary(value, oids[i]) if formats[i] == 1 else pgtypes.encode_text(value)
        for i, value in enumerate(row.values)
    ]
