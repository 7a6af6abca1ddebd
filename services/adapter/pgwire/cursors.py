"""Statements the wire front end runs itself, around the adapter's: ``DECLARE``/``FETCH``/
``CLOSE`` cursors (over a query or a SUBSCRIBE) and ``COPY (SUBSCRIBE ...) TO STDOUT``.

A SUBSCRIBE cursor reads the adapter's subscription on a task of its own into a queue; ``FETCH n``
waits (up to its ``timeout``, forever without one) for the first change, then takes what has
already arrived, at most n, as Materialize does. Rows are ``mz_timestamp, mz_diff, columns...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.adapter.pgwire.outcome import Result
from services.adapter.session import Settings
from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2

if TYPE_CHECKING:
    from services.adapter.pgwire.connection import Connection

SYNTAX_ERROR = "42601"

DECLARE = re.compile(
    r"\s*DECLARE\s+(\"[^\"]+\"|\w+)\s+(?:(?:NO\s+)?SCROLL\s+)?CURSOR\s+(?:(WITH|WITHOUT)\s+HOLD\s+)?"
    r"FOR\s+(.*?)\s*;?\s*\Z",
    re.IGNORECASE | re.DOTALL,
)
FETCH = re.compile(
    r"\s*FETCH\s+(?:(FORWARD|NEXT)\s+)?(ALL|\d+)?\s*(?:(?:FROM|IN)\s+)?(\"[^\"]+\"|\w+)"
    r"(?:\s+WITH\s*\(\s*timeout\s*=?\s*'([^']*)'\s*\))?\s*;?\s*\Z",
    re.IGNORECASE | re.DOTALL,
)
CLOSE = re.compile(r"\s*CLOSE\s+(ALL|\"[^\"]+\"|\w+)\s*;?\s*\Z", re.IGNORECASE)
COPY_SUBSCRIBE = re.compile(
    r"\s*COPY\s*\(\s*(SUBSCRIBE\b.*)\)\s*TO\s+STDOUT\s*;?\s*\Z", re.IGNORECASE | re.DOTALL
)
SUBSCRIBE = re.compile(r"\s*SUBSCRIBE\b", re.IGNORECASE)

INVALID_CURSOR_NAME = "34000"
DUPLICATE_CURSOR = "42P03"
NO_ACTIVE_TRANSACTION = "25P01"
SUBSCRIBE_COLUMNS = [
    adapter_pb2.SqlColumn(name="mz_timestamp", type="numeric(20,0)", nullable=False),
    adapter_pb2.SqlColumn(name="mz_diff", type="bigint", nullable=False),
]


def identifier(text: str) -> str:
    return text[1:-1] if text.startswith('"') else text.lower()


_OPTIONS = re.compile(r"\A(.*?)\s+WITH\s*\(([^()]*)\)\s*;?\s*\Z", re.IGNORECASE | re.DOTALL)
_OPTION = re.compile(r"\s*(\w+)\s*(?:=\s*'?(\w+)'?)?\s*")
PROGRESSED_COLUMN = adapter_pb2.SqlColumn(name="mz_progressed", type="boolean", nullable=False)


@dataclass(frozen=True)
class SubscribeShape:
    """How a subscription's messages become rows, Materialize's way: ``mz_timestamp``,
    (``mz_progressed`` with ``WITH (PROGRESS)``), ``mz_diff``, then the columns.
    ``SNAPSHOT = false`` leaves out the contents as of the start."""

    sql: str
    progress: bool = False
    snapshot: bool = True

    @classmethod
    def parse(cls, text: str) -> SubscribeShape:
        match = _OPTIONS.match(text)
        if match is None:
            return cls(text)
        values = {"progress": False, "snapshot": True}
        for option in match[2].split(","):
            parsed = _OPTION.fullmatch(option)
            if parsed is None or parsed[1].lower() not in values:
                raise SqlError("0A000", f"SUBSCRIBE option {option.strip()!r} is not supported")
            word = (parsed[2] or "true").lower()
            if word not in ("true", "false", "on", "off"):
                raise SqlError("22023", f"SUBSCRIBE option {parsed[1]} takes true or false")
            values[parsed[1].lower()] = word in ("true", "on")
        return cls(match[1], values["progress"], values["snapshot"])

    def columns(self, header: adapter_pb2.SubscribeHeader) -> list[adapter_pb2.SqlColumn]:
        timestamp, diff = SUBSCRIBE_COLUMNS
        if self.progress:
            return [timestamp, PROGRESSED_COLUMN, diff, *header.columns]
        return [timestamp, diff, *header.columns]

    def rows(
        self, message: adapter_pb2.SubscribeSqlResponse, as_of: int, width: int
    ) -> list[adapter_pb2.SqlRow]:
        """The rows one message of the subscription stands for."""
        if message.HasField("changes"):
            return [
                self._row(change.timestamp, change.diff, list(change.row.values))
                for change in message.changes.changes
                if self.snapshot or change.timestamp > as_of
            ]
        if message.HasField("progress") and self.progress:
            elements = message.progress.elements
            timestamp = adapter_pb2.SqlValue(text_value=str(min(elements))) if elements else None
            nulls = [adapter_pb2.SqlValue() for _ in range(width)]
            values = [timestamp or adapter_pb2.SqlValue(), adapter_pb2.SqlValue(bool_value=True)]
            return [adapter_pb2.SqlRow(values=[*values, adapter_pb2.SqlValue(), *nulls])]
        return []

    def _row(
        self, timestamp: int, diff: int, values: list[adapter_pb2.SqlValue]
    ) -> adapter_pb2.SqlRow:
        head = [adapter_pb2.SqlValue(text_value=str(timestamp))]
        if self.progress:
            head.append(adapter_pb2.SqlValue(bool_value=False))
        head.append(adapter_pb2.SqlValue(int_value=diff))
        return adapter_pb2.SqlRow(values=[*head, *values])


@dataclass
class Cursor:
    columns: list[adapter_pb2.SqlColumn]
    rows: list[adapter_pb2.SqlRow] = field(default_factory=list)
    queue: asyncio.Queue[adapter_pb2.SqlRow | SqlError] | None = None
    task: asyncio.Task[None] | None = None
    # WITH HOLD: the cursor outlives its transaction (until CLOSE or the connection ends).
    hold: bool = False

    async def fetch(self, count: int | None, timeout_ms: int | None) -> list[adapter_pb2.SqlRow]:
        if self.queue is None:
            taken = self.rows if count is None else self.rows[:count]
            self.rows = [] if count is None else self.rows[count:]
            return taken
        out: list[adapter_pb2.SqlRow] = []
        if self.queue.empty():
            try:
                if timeout_ms is None:
                    first = await self.queue.get()
                else:
                    async with asyncio.timeout(timeout_ms / 1000):
                        first = await self.queue.get()
            except TimeoutError:
                return out
            self.queue.put_nowait(first) if isinstance(first, SqlError) else out.append(first)
        while not self.queue.empty() and (count is None or len(out) < count):
            item = self.queue.get_nowait()
            if isinstance(item, SqlError):
                if out:
                    self.queue.put_nowait(item)
                    break
                raise item
            out.append(item)
        return out

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


async def subscription_cursor(
    stream: AsyncIterator[adapter_pb2.SubscribeSqlResponse], shape: SubscribeShape
) -> Cursor:
    """A cursor over a subscription: waits for its header (or its error), then reads on."""
    first = await anext(stream, None)
    if first is None:
        raise SqlError("XX000", "the subscription ended before its header")
    if first.HasField("error"):
        raise _error(first.error)
    columns = shape.columns(first.header)
    as_of, width = first.header.as_of, len(first.header.columns)
    queue: asyncio.Queue[adapter_pb2.SqlRow | SqlError] = asyncio.Queue()

    async def pump() -> None:
        async for message in stream:
            for row in shape.rows(message, as_of, width):
                queue.put_nowait(row)
            if message.HasField("error"):
                queue.put_nowait(_error(message.error))
                return

    task = asyncio.create_task(pump(), name="pgwire-subscribe-cursor")
    return Cursor(columns, queue=queue, task=task)


def _error(error: adapter_pb2.SqlError) -> SqlError:
    return SqlError(error.code, error.message, error.position, hint=error.hint)


_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?)?\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000}


def fetch_timeout_ms(text: str | None) -> int | None:
    """FETCH's ``WITH (timeout = '1s')``: milliseconds (``None``: wait for a row)."""
    if text is None:
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        raise SqlError("22023", f"invalid FETCH timeout {text!r}")
    unit = (match[2] or "s").lower()
    scale = 1 if unit.startswith("ms") or unit.startswith("milli") else _UNIT_MS[unit[0]]
    return round(float(match[1]) * scale)


# -- DECLARE, FETCH and CLOSE on a connection ----------------------------------------


async def declare(conn: Connection, match: re.Match[str]) -> Result:
    name = identifier(match[1])
    hold = (match[2] or "").upper() == "WITH"
    if conn.session.transaction is None and not hold:
        raise SqlError(
            NO_ACTIVE_TRANSACTION,
            "DECLARE CURSOR can only be used in transaction blocks",
        )
    conn.check_not_failed()
    if name in conn.cursors:
        raise SqlError(DUPLICATE_CURSOR, f'cursor "{name}" already exists')
    query = match[3]
    if SUBSCRIBE.match(query):
        shape = SubscribeShape.parse(query)
        stream = conn.adapter.subscribe_sql(
            shape.sql, Settings(conn.session.settings.values), conn.session.principal
        )
        cursor = await subscription_cursor(stream, shape)
    else:
        result = await conn.run_text(query, None)
        if result.columns is None:
            raise SqlError(SYNTAX_ERROR, "DECLARE CURSOR takes a query")
        cursor = Cursor(result.columns, list(result.rows))
    cursor.hold = hold
    conn.cursors[name] = cursor
    return Result("DECLARE CURSOR")


async def fetch(conn: Connection, match: re.Match[str]) -> Result:
    conn.check_not_failed()
    name = identifier(match[3])
    cursor = conn.cursors.get(name)
    if cursor is None:
        raise SqlError(INVALID_CURSOR_NAME, f'cursor "{name}" does not exist')
    amount = match[2]
    count = None if amount is not None and amount.upper() == "ALL" else int(amount or 1)
    rows = await cursor.fetch(count, fetch_timeout_ms(match[4]))
    return Result(f"FETCH {len(rows)}", cursor.columns, rows)


async def close(conn: Connection, match: re.Match[str]) -> Result:
    target = match[1]
    names = list(conn.cursors) if target.upper() == "ALL" else [identifier(target)]
    for name in names:
        cursor = conn.cursors.pop(name, None)
        if cursor is None:
            raise SqlError(INVALID_CURSOR_NAME, f'cursor "{name}" does not exist')
        await cursor.close()
    return Result("CLOSE CURSOR" if target.upper() != "ALL" else "CLOSE CURSOR ALL")
