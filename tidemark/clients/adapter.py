"""Client of the SQL adapter (``tidemark.v1.Adapter``).

::

    adapter = AdapterClient("127.0.0.1:6875")
    result = await adapter.execute("CREATE TABLE t (a bigint); INSERT INTO t VALUES (1)")
    for statement in result.results:
        print(statement.tag, statement.error)
    async for event in adapter.subscribe("SUBSCRIBE t"):
        ...  # SubscribeHeader, then Changes and Progress, or a SubscribeError

The adapter is stateless: a session's settings and open transaction travel in the ``Session``
message. The client keeps the last one it got back and sends it with the next call, so one
``AdapterClient`` behaves like one SQL session (``BEGIN`` in one call, ``COMMIT`` in a later one).
The adapter signs the sessions it hands out and refuses one that was edited or made up, so a
session starts empty and changes only through statements (``SET``); the constructor's
``settings`` are for servers that sign nothing, such as test fakes.

Values arrive decoded by their column's SQL type: ``bigint`` as ``int``, ``double precision``
as ``float``, ``numeric`` as ``Decimal``, ``date`` as ``datetime.date``, ``timestamp`` as
``datetime.datetime``, ``bytea`` as ``bytes``, ``text`` and ``jsonb`` as ``str`` (JSON text);
NULL is ``None``. A statement's SQL error (with its SQLSTATE) is data in its
:class:`StatementResult`, not an exception; exceptions are for transport problems.

:class:`BlockingAdapterClient` offers the same calls to synchronous code (the ``tidemark sql``
shell) by running an ``AdapterClient`` on an event loop in a background thread.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import queue
import threading
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import grpc.aio

from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, GrpcClient, call, stream
from tidemark.rpc.client import call_metadata
from tidemark.rpc.errors import error_from_rpc
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import adapter_pb2, adapter_pb2_grpc

T = TypeVar("T")

SqlPyValue: TypeAlias = (
    bool | int | float | decimal.Decimal | str | bytes | datetime.date | datetime.datetime | None
)
Row: TypeAlias = tuple[SqlPyValue, ...]

# Statements may run Spark jobs; a query that takes minutes is legitimate.
DEFAULT_EXECUTE_TIMEOUT = 600.0


# -- values -----------------------------------------------------------------------------------


def _base_type(type_name: str) -> str:
    """``numeric(10,2)`` -> ``numeric``; ``timestamp(3)`` -> ``timestamp``."""
    return type_name.split("(", 1)[0].strip().lower()


def _decode_text(text: str, type_name: str) -> SqlPyValue:
    base = _base_type(type_name)
    # Values that do not parse (e.g. 'infinity' dates) are shown as the adapter wrote them
    # rather than failing the whole result.
    try:
        if base in ("numeric", "decimal"):
            return decimal.Decimal(text)
        if base == "date":
            return datetime.date.fromisoformat(text)
        if base.startswith("timestamp"):
            return datetime.datetime.fromisoformat(text)
    except (ValueError, decimal.InvalidOperation):
        return text
    return text


def decode_value(value: adapter_pb2.SqlValue, type_name: str = "") -> SqlPyValue:
    """The Python value of one ``SqlValue`` of a column of SQL type ``type_name``."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "float_value":
        return value.float_value
    if kind == "bytes_value":
        return value.bytes_value
    return _decode_text(value.text_value, type_name)


def decode_row(row: adapter_pb2.SqlRow, columns: Sequence[Column]) -> Row:
    """One row as a tuple of Python values; columns beyond those described decode untyped."""
    return tuple(
        decode_value(value, columns[i].type if i < len(columns) else "")
        for i, value in enumerate(row.values)
    )


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    """The SQL type name: ``bigint``, ``numeric(10,2)``, ``text``, ..."""
    nullable: bool = True

    @classmethod
    def from_proto(cls, proto: adapter_pb2.SqlColumn) -> Column:
        return cls(proto.name, proto.type, proto.nullable)


@dataclass(frozen=True)
class StatementError:
    """A failed statement: its SQLSTATE ``code``, ``message``, 1-based character ``position``
    in the submitted SQL (0 when unknown) and an optional ``hint``."""

    code: str
    message: str
    position: int = 0
    hint: str = ""

    @classmethod
    def from_proto(cls, proto: adapter_pb2.SqlError) -> StatementError:
        return cls(proto.code, proto.message, proto.position, proto.hint)

    def __str__(self) -> str:
        return f"{self.message} (SQLSTATE {self.code})"


@dataclass(frozen=True)
class StatementResult:
    tag: str
    """The command tag: ``SELECT 3``, ``INSERT 0 2``, ``CREATE TABLE``, ..."""
    columns: list[Column] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    error: StatementError | None = None
    timestamp: int = 0
    """The timestamp the statement read or wrote at (0 when none)."""

    @classmethod
    def from_proto(cls, proto: adapter_pb2.StatementResult) -> StatementResult:
        columns = [Column.from_proto(c) for c in proto.columns]
        return cls(
            tag=proto.tag,
            columns=columns,
            rows=[decode_row(r, columns) for r in proto.rows],
            notices=list(proto.notices),
            error=StatementError.from_proto(proto.error) if proto.HasField("error") else None,
            timestamp=proto.timestamp,
        )


@dataclass(frozen=True)
class ExecuteResult:
    results: list[StatementResult]
    session: adapter_pb2.Session

    @property
    def error(self) -> StatementError | None:
        """The error of the failed statement, if one failed (the ones after it did not run)."""
        return next((r.error for r in self.results if r.error is not None), None)


@dataclass(frozen=True)
class StatementProgress:
    """How far a running Execute has come (adapter.proto ``StatementProgressResponse``)."""

    statement: str
    elapsed_ms: int
    state: str
    """``""`` (not reading from compute), ``"waiting"`` (for ``waiting_for`` to hydrate, or a
    frontier) or ``"running"``."""
    waiting_for: list[str]
    parts_done: int
    parts_total: int
    rows_done: int
    rows_total: int

    @classmethod
    def from_proto(cls, proto: adapter_pb2.StatementProgressResponse) -> StatementProgress:
        return cls(
            proto.statement,
            proto.elapsed_ms,
            proto.state,
            list(proto.waiting_for),
            proto.parts_done,
            proto.parts_total,
            proto.rows_done,
            proto.rows_total,
        )


# -- subscriptions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SubscribeHeader:
    """Sent first: the columns of the changes' rows and the time the subscription starts at."""

    columns: list[Column]
    as_of: int


@dataclass(frozen=True)
class Change:
    """``row`` gained ``diff`` copies (lost them, if negative) at ``timestamp``."""

    timestamp: int
    diff: int
    row: Row


@dataclass(frozen=True)
class Changes:
    changes: list[Change]


@dataclass(frozen=True)
class Progress:
    """Every change before ``upper`` has been sent; ``None`` when the subscription is complete
    (the empty frontier)."""

    upper: int | None


@dataclass(frozen=True)
class SubscribeError:
    error: StatementError


SubscribeEvent: TypeAlias = SubscribeHeader | Changes | Progress | SubscribeError


def decode_subscribe_event(
    message: adapter_pb2.SubscribeSqlResponse, columns: Sequence[Column]
) -> SubscribeEvent | None:
    """The event a response carries (``None`` for an empty message); ``columns`` are the
    header's, which type the changes' rows."""
    kind = message.WhichOneof("message")
    if kind == "header":
        return SubscribeHeader(
            [Column.from_proto(c) for c in message.header.columns], message.header.as_of
        )
    if kind == "changes":
        return Changes(
            [
                Change(c.timestamp, c.diff, decode_row(c.row, columns))
                for c in message.changes.changes
            ]
        )
    if kind == "progress":
        elements = message.progress.elements
        return Progress(min(elements) if elements else None)
    if kind == "error":
        return SubscribeError(StatementError.from_proto(message.error))
    return None


# -- the client -------------------------------------------------------------------------------


USER_METADATA = "tidemark-user"
PASSWORD_METADATA = "tidemark-password"


class AdapterClient(GrpcClient):
    """One SQL session against an adapter. ``execute`` calls finish within ``timeout`` seconds
    and are retried only on a determinate UNAVAILABLE (the adapter did nothing); a
    subscription lasts until the caller stops iterating. ``user`` and ``password`` travel in
    every call's metadata (``tidemark-user``, ``tidemark-password``); without a user the
    adapter decides (under ``auth = trust``: its bootstrap superuser)."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_EXECUTE_TIMEOUT,
        retry: RetryPolicy = CLIENT_RETRY,
        settings: dict[str, str] | None = None,
        tls: TlsSettings | None = None,
        user: str = "",
        password: str = "",
    ) -> None:
        super().__init__(address, timeout=timeout, retry=retry, tls=tls)
        self.stub = adapter_pb2_grpc.AdapterStub(self.channel)
        self.session = adapter_pb2.Session(settings=settings or {})
        credentials: list[tuple[str, str]] = []
        if user:
            credentials.append((USER_METADATA, user))
        if password:
            credentials.append((PASSWORD_METADATA, password))
        self.credentials: tuple[tuple[str, str], ...] = tuple(credentials)

    async def execute(
        self, sql: str, session: adapter_pb2.Session | None = None, *, statement_id: str = ""
    ) -> ExecuteResult:
        """Runs the statements of ``sql`` in ``session`` (default: this client's). The session
        the adapter returns becomes this client's session. ``statement_id`` names the call
        for :meth:`statement_progress` while it runs."""
        request = adapter_pb2.ExecuteRequest(
            session=self.session if session is None else session,
            sql=sql,
            statement_id=statement_id,
        )
        response = await call(
            self.stub.Execute,
            request,
            timeout=self.timeout,
            retry=self.retry,
            metadata=self.credentials,
        )
        self.session = response.session
        return ExecuteResult(
            [StatementResult.from_proto(r) for r in response.results], response.session
        )

    async def statement_progress(
        self,
        statement_id: str,
        *,
        timeout: float = 5.0,  # noqa: ASYNC109 (the gRPC deadline)
    ) -> StatementProgress | None:
        """How far the Execute call named ``statement_id`` (made by this client's user) has
        come, or ``None`` when no such call is running on the adapter."""
        response = await call(
            self.stub.StatementProgress,
            adapter_pb2.StatementProgressRequest(statement_id=statement_id),
            timeout=timeout,
            retry=self.retry,
            metadata=self.credentials,
            repeatable=True,
        )
        return StatementProgress.from_proto(response) if response.running else None

    async def subscribe(
        self, sql: str, session: adapter_pb2.Session | None = None
    ) -> AsyncIterator[SubscribeEvent]:
        """The events of ``SUBSCRIBE ...`` (or a bare query, subscribed to). Stop iterating
        to cancel the subscription."""
        request = adapter_pb2.SubscribeSqlRequest(
            session=self.session if session is None else session, sql=sql
        )
        columns: list[Column] = []
        async for message in stream(self.stub.Subscribe, request, metadata=self.credentials):
            event = decode_subscribe_event(message, columns)
            if isinstance(event, SubscribeHeader):
                columns = event.columns
            if event is not None:
                yield event

    async def copy_in(
        self,
        sql: str,
        data: Iterable[bytes] | AsyncIterable[bytes],
        session: adapter_pb2.Session | None = None,
    ) -> StatementResult:
        """Runs ``COPY ... FROM STDIN`` with ``data`` as its input (chunks cut anywhere). Not
        retried: the write may have happened when the call is cut."""
        opening = adapter_pb2.CopyInRequest(
            session=self.session if session is None else session, sql=sql
        )

        async def requests() -> AsyncIterator[adapter_pb2.CopyInRequest]:
            yield opening
            if isinstance(data, AsyncIterable):
                async for chunk in data:
                    yield adapter_pb2.CopyInRequest(data=chunk)
            else:
                for chunk in data:
                    yield adapter_pb2.CopyInRequest(data=chunk)

        try:
            response = await self.stub.CopyIn(
                requests(), timeout=self.timeout, metadata=call_metadata(None, self.credentials)
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        self.session = response.session
        return StatementResult.from_proto(response.result)

    async def copy_out(
        self, sql: str, session: adapter_pb2.Session | None = None
    ) -> AsyncIterator[bytes | StatementResult]:
        """The chunks of ``COPY ... TO STDOUT``'s output, then its result (with the error, if
        it failed)."""
        request = adapter_pb2.CopyOutRequest(
            session=self.session if session is None else session, sql=sql
        )
        async for message in stream(
            self.stub.CopyOut, request, timeout=self.timeout, metadata=self.credentials
        ):
            kind = message.WhichOneof("message")
            if kind == "data":
                yield message.data
            elif kind == "result":
                yield StatementResult.from_proto(message.result)


class BlockingAdapterClient:
    """:class:`AdapterClient` for synchronous callers. Its event loop runs in a daemon thread;
    a ``KeyboardInterrupt`` in the caller cancels the call in flight and propagates."""

    def __init__(self, address: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client: AdapterClient = self._run(self._make_client(address, options))

    @staticmethod
    async def _make_client(address: str, options: dict[str, Any]) -> AdapterClient:
        # The channel must be created on the loop that will use it.
        return AdapterClient(address, **options)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    @property
    def address(self) -> str:
        return self._client.address

    @property
    def session(self) -> adapter_pb2.Session:
        return self._client.session

    def execute(self, sql: str, *, statement_id: str = "") -> ExecuteResult:
        return self._run(self._client.execute(sql, statement_id=statement_id))

    def statement_progress(self, statement_id: str) -> StatementProgress | None:
        """May be called from another thread while :meth:`execute` runs."""
        return self._run(self._client.statement_progress(statement_id))

    def copy_in(self, sql: str, data: Iterable[bytes]) -> StatementResult:
        return self._run(self._client.copy_in(sql, data))

    def copy_out(self, sql: str) -> tuple[list[bytes], StatementResult]:
        """The output's chunks and the statement's result."""

        async def collect() -> tuple[list[bytes], StatementResult]:
            chunks: list[bytes] = []
            result = StatementResult("")
            async for item in self._client.copy_out(sql):
                if isinstance(item, bytes):
                    chunks.append(item)
                else:
                    result = item
            return chunks, result

        return self._run(collect())

    def subscribe(self, sql: str) -> Iterator[SubscribeEvent]:
        """The subscription's events as they arrive. Closing the iterator (or an exception in
        the consumer, such as ``KeyboardInterrupt``) cancels the subscription."""
        events: queue.Queue[tuple[str, Any]] = queue.Queue()

        async def pump() -> None:
            try:
                async for event in self._client.subscribe(sql):
                    events.put(("event", event))
                events.put(("end", None))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                events.put(("raise", exc))

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                kind, payload = events.get()
                if kind == "end":
                    return
                if kind == "raise":
                    raise payload
                yield payload
        finally:
            future.cancel()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BlockingAdapterClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
