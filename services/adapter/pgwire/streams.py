"""COPY over the wire: FROM STDIN (CopyInResponse, then CopyData until CopyDone or CopyFail,
then the adapter's COPY with that data), TO STDOUT (CopyOutResponse, one CopyData per row,
CopyDone) and subscriptions streamed as COPY (SUBSCRIBE ...) TO STDOUT until they end or are
cancelled."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from services.adapter.copying.encoding import encode_rows
from services.adapter.pgwire import codec, cursors, pgtypes
from services.adapter.pgwire.codec import ProtocolError
from services.adapter.pgwire.outcome import Result
from services.adapter.results import QUERY_CANCELED
from services.adapter.service import MAX_COPY_IN_BYTES
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2

if TYPE_CHECKING:
    from services.adapter.pgwire.connection import Connection


async def copy_in(conn: Connection, statement: ast.CopyFrom) -> Result:
    if statement.columns is not None:
        width = len(statement.columns)
    else:
        view = await conn.shims.catalog_view()
        relation = view.resolve(statement.table, conn.session.settings.values, statement.position)
        width = len(relation.schema.columns)
    conn.send(codec.copy_in_response(width))
    await conn.flush()
    chunks: list[bytes] = []
    size = 0
    while True:
        kind, body = await codec.read_message(conn.reader)
        if kind == ord("d"):
            size += len(body)
            if size > MAX_COPY_IN_BYTES:
                raise SqlError(
                    "54000",
                    f"COPY FROM STDIN takes at most {MAX_COPY_IN_BYTES >> 20} MiB a statement",
                )
            chunks.append(body)
        elif kind == ord("c"):
            break
        elif kind == ord("f"):
            raise SqlError(
                QUERY_CANCELED, f"COPY from stdin failed: {codec.decode_copy_fail(body)}"
            )
        elif kind in (ord("H"), ord("S")):
            continue
        else:
            raise ProtocolError(f"unexpected message type {chr(kind)!r} during COPY FROM STDIN")
    conn.session.copy_data = b"".join(chunks)
    try:
        outcome = await conn.adapter.run_statement(statement, conn.session)
    finally:
        conn.session.copy_data = None
    if outcome.HasField("error"):
        error = outcome.error
        raise SqlError(error.code, error.message, error.position, hint=error.hint)
    return Result(outcome.tag, notices=list(outcome.notices))


async def copy_out(conn: Connection, statement: ast.CopyTo) -> Result:
    output = await conn.adapter.copy_to(statement, conn.session)
    conn.send(codec.copy_out_response(len(output.names)))
    # One CopyData per row, as PostgreSQL sends them (clients parse them one by one).
    for chunk in encode_rows([], output.names, output.format):
        conn.send(codec.copy_data(chunk))
    rows_only = dataclasses.replace(output.format, header=False)
    for row in output.rows:
        for chunk in encode_rows([row], output.names, rows_only):
            conn.send(codec.copy_data(chunk))
        await conn.maybe_flush()
    conn.send(codec.copy_done())
    return Result(f"COPY {len(output.rows)}")


async def copy_subscribe(conn: Connection, sql: str) -> Result:
    """A subscription streamed as COPY TO STDOUT text rows until it ends or is cancelled."""
    shape = cursors.SubscribeShape.parse(sql)
    stream = conn.adapter.subscribe_sql(
        shape.sql, Settings(conn.session.settings.values), conn.session.principal
    )
    try:
        cursor_columns: list[adapter_pb2.SqlColumn] | None = None
        count, as_of, width = 0, 0, 0
        async for message in stream:
            if message.HasField("error"):
                error = message.error
                raise SqlError(error.code, error.message, error.position, hint=error.hint)
            if message.HasField("header"):
                cursor_columns = shape.columns(message.header)
                as_of, width = message.header.as_of, len(message.header.columns)
                conn.send(codec.copy_out_response(len(cursor_columns)))
                await conn.flush()
                continue
            rows = shape.rows(message, as_of, width)
            for row in rows:
                conn.send(codec.copy_data(copy_line(row)))
            count += len(rows)
            if rows:
                await conn.flush()
        if cursor_columns is not None:
            conn.send(codec.copy_done())
        return Result(f"COPY {count}")
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            await closer()


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_line(row: adapter_pb2.SqlRow) -> bytes:
    fields = []
    for value in row.values:
        encoded = pgtypes.encode_text(value)
        fields.append("\\N" if encoded is None else encoded.decode().translate(_COPY_ESCAPES))
    return ("\t".join(fields) + "\n").encode()
