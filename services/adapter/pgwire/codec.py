"""The PostgreSQL frontend/backend protocol (version 3.0) as bytes: reading the startup packet
and framed frontend messages off a stream, decoding their bodies, and building backend messages.

Every message after startup is ``type byte, int32 length (counting itself), body``; startup,
SSLRequest and CancelRequest have no type byte. Lengths are checked before anything is read, so
a client cannot make the server buffer more than ``MAX_MESSAGE_BYTES`` (``ProtocolError``, which
the connection answers with 08P01 and a close).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

PROTOCOL_3 = 196608  # 3 << 16
SSL_REQUEST = 80877103
CANCEL_REQUEST = 80877102
GSSENC_REQUEST = 80877104

MAX_STARTUP_BYTES = 10_000
MAX_MESSAGE_BYTES = 64 << 20
"""The largest frontend message accepted (a COPY data chunk, a Bind with large parameters)."""

FRONTEND_TYPES = frozenset(b"QPBDECSHXdcfp")


class ProtocolError(Exception):
    """The client broke the protocol; the connection answers 08P01 and closes."""


# -- reading --------------------------------------------------------------------------------


class Reader:
    """Bounds-checked reads from one message body."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise ProtocolError("message is shorter than its contents say")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def int16(self) -> int:
        value: int = struct.unpack("!h", self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack("!i", self._take(4))[0]
        return value

    def uint32(self) -> int:
        value: int = struct.unpack("!I", self._take(4))[0]
        return value

    def byte(self) -> int:
        return self._take(1)[0]

    def take(self, size: int) -> bytes:
        return self._take(size)

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.offset)
        if end < 0:
            raise ProtocolError("string is not NUL-terminated")
        raw = self.data[self.offset : end]
        self.offset = end + 1
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("string is not valid UTF-8") from None

    def rest(self) -> bytes:
        chunk = self.data[self.offset :]
        self.offset = len(self.data)
        return chunk

    def done(self) -> None:
        if self.offset != len(self.data):
            raise ProtocolError("message is longer than its contents")


@dataclass(frozen=True)
class Startup:
    parameters: dict[str, str]


@dataclass(frozen=True)
class SslRequest:
    pass


@dataclass(frozen=True)
class GssEncRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    process_id: int
    secret_key: int


StartupPacket = Startup | SslRequest | GssEncRequest | CancelRequest


async def _read_exactly(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise EOFError from None
        raise ProtocolError("connection closed in the middle of a message") from None


async def read_startup(reader: asyncio.StreamReader) -> StartupPacket:
    (length,) = struct.unpack("!i", await _read_exactly(reader, 4))
    if length < 8 or length > MAX_STARTUP_BYTES:
        raise ProtocolError(f"invalid startup packet length {length}")
    return decode_startup(await _read_exactly(reader, length - 4))


def decode_startup(body: bytes) -> StartupPacket:
    r = Reader(body)
    code = r.int32()
    if code == SSL_REQUEST:
        r.done()
        return SslRequest()
    if code == GSSENC_REQUEST:
        r.done()
        return GssEncRequest()
    if code == CANCEL_REQUEST:
        request = CancelRequest(r.int32(), r.int32())
        r.done()
        return request
    if code >> 16 != 3:
        raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
    parameters: dict[str, str] = {}
    while True:
        name = r.cstring()
        if not name:
            break
        parameters[name] = r.cstring()
    r.done()
    return Startup(parameters)


async def read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frontend message: its type byte and body. ``EOFError`` on a clean close."""
    header = await _read_exactly(reader, 5)
    kind = header[0]
    (length,) = struct.unpack("!i", header[1:])
    if kind not in FRONTEND_TYPES:
        raise ProtocolError(f"invalid frontend message type {kind}")
    if length < 4 or length - 4 > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"invalid message length {length}")
    return kind, await _read_exactly(reader, length - 4)


# -- frontend messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Parse:
    name: str
    query: str
    param_types: list[int]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    param_formats: list[int]
    params: list[bytes | None]
    result_formats: list[int]

    def param_format(self, index: int) -> int:
        return _format_at(self.param_formats, index)

    def result_format(self, index: int) -> int:
        return _format_at(self.result_formats, index)


def _format_at(formats: Sequence[int], index: int) -> int:
    """A format code list means: none, all text; one, for all; else one per item."""
    if not formats:
        return 0
    if len(formats) == 1:
        return formats[0]
    return formats[index]


@dataclass(frozen=True)
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True)
class Close:
    kind: str
    name: str


def decode_query(body: bytes) -> str:
    r = Reader(body)
    query = r.cstring()
    r.done()
    return query


def decode_parse(body: bytes) -> Parse:
    r = Reader(body)
    name, query = r.cstring(), r.cstring()
    count = r.int16()
    if count < 0:
        raise ProtocolError("negative parameter count")
    types = [r.uint32() for _ in range(count)]
    r.done()
    return Parse(name, query, types)


def decode_bind(body: bytes) -> Bind:
    r = Reader(body)
    portal, statement = r.cstring(), r.cstring()
    formats = [r.int16() for _ in range(_count(r))]
    params: list[bytes | None] = []
    for _ in range(_count(r)):
        size = r.int32()
        if size < -1:
            raise ProtocolError(f"invalid parameter length {size}")
        params.append(None if size == -1 else r.take(size))
    result_formats = [r.int16() for _ in range(_count(r))]
    r.done()
    for code in (*formats, *result_formats):
        if code not in (0, 1):
            raise ProtocolError(f"invalid format code {code}")
    if len(formats) not in (0, 1, len(params)):
        raise ProtocolError("parameter format codes do not match the parameters")
    return Bind(portal, statement, formats, params, result_formats)


def _count(r: Reader) -> int:
    count = r.int16()
    if count < 0:
        raise ProtocolError("negative count")
    return count


def decode_describe(body: bytes) -> Describe:
    r = Reader(body)
    kind = chr(r.byte())
    name = r.cstring()
    r.done()
    if kind not in "SP":
        raise ProtocolError(f"invalid Describe target {kind!r}")
    return Describe(kind, name)


def decode_close(body: bytes) -> Close:
    r = Reader(body)
    kind = chr(r.byte())
    name = r.cstring()
    r.done()
    if kind not in "SP":
        raise ProtocolError(f"invalid Close target {kind!r}")
    return Close(kind, name)


def decode_execute(body: bytes) -> Execute:
    r = Reader(body)
    portal = r.cstring()
    max_rows = r.int32()
    r.done()
    return Execute(portal, max(0, max_rows))


def decode_copy_fail(body: bytes) -> str:
    return decode_query(body)


def decode_sasl_initial(body: bytes) -> tuple[str, bytes]:
    r = Reader(body)
    mechanism = r.cstring()
    size = r.int32()
    data = b"" if size == -1 else r.take(size)
    r.done()
    return mechanism, data


# -- backend messages -----------------------------------------------------------------------


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def authentication_ok() -> bytes:
    return message(b"R", struct.pack("!i", 0))


def authentication_cleartext() -> bytes:
    return message(b"R", struct.pack("!i", 3))


def authentication_sasl(mechanisms: Sequence[str]) -> bytes:
    return message(b"R", struct.pack("!i", 10) + b"".join(cstr(m) for m in mechanisms) + b"\0")


def authentication_sasl_continue(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 11) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(process_id: int, secret_key: int) -> bytes:
    return message(b"K", struct.pack("!ii", process_id, secret_key))


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode())


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int
    type_modifier: int = -1
    format: int = 0
    table_oid: int = 0
    column: int = 0


def row_description(fields: Sequence[Field]) -> bytes:
    body = [struct.pack("!h", len(fields))]
    for f in fields:
        body.append(cstr(f.name))
        body.append(
            struct.pack(
                "!ihihih", f.table_oid, f.column, f.type_oid, f.type_size, f.type_modifier, f.format
            )
        )
    return message(b"T", b"".join(body))


def data_row(values: Sequence[bytes | None]) -> bytes:
    body = [struct.pack("!h", len(values))]
    for value in values:
        if value is None:
            body.append(b"\xff\xff\xff\xff")
        else:
            body.append(struct.pack("!i", len(value)))
            body.append(value)
    return message(b"D", b"".join(body))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def empty_query_response() -> bytes:
    return message(b"I")


def parse_complete() -> bytes:
    return message(b"1")


def bind_complete() -> bytes:
    return message(b"2")


def close_complete() -> bytes:
    return message(b"3")


def no_data() -> bytes:
    return message(b"n")


def portal_suspended() -> bytes:
    return message(b"s")


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(
        b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids)
    )


def copy_in_response(columns: int, fmt: int = 0) -> bytes:
    return message(b"G", struct.pack("!bh", fmt, columns) + struct.pack("!h", fmt) * columns)


def copy_out_response(columns: int, fmt: int = 0) -> bytes:
    return message(b"H", struct.pack("!bh", fmt, columns) + struct.pack("!h", fmt) * columns)


def copy_data(data: bytes) -> bytes:
    return message(b"d", data)


def copy_done() -> bytes:
    return message(b"c")


@dataclass(frozen=True)
class Notice:
    """The fields of an ErrorResponse or NoticeResponse."""

    code: str
    message: str
    severity: str = "ERROR"
    position: int = 0
    hint: str = ""
    detail: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def fields(self) -> bytes:
        parts = [
            b"S" + cstr(self.severity),
            b"V" + cstr(self.severity),
            b"C" + cstr(self.code),
            b"M" + cstr(self.message),
        ]
        if self.detail:
            parts.append(b"D" + cstr(self.detail))
        if self.hint:
            parts.append(b"H" + cstr(self.hint))
        if self.position:
            parts.append(b"P" + cstr(str(self.position)))
        return b"".join(parts) + b"\0"


def error_response(notice: Notice) -> bytes:
    return message(b"E", notice.fields())


def notice_response(notice: Notice) -> bytes:
    return message(b"N", notice.fields())


def decode_fields(body: bytes) -> dict[str, str]:
    """The fields of an ErrorResponse or NoticeResponse body (for tests and diagnostics)."""
    r = Reader(body)
    fields: dict[str, str] = {}
    while True:
        code = r.byte()
        if code == 0:
            break
        fields[chr(code)] = r.cstring()
    r.done()
    return fields
