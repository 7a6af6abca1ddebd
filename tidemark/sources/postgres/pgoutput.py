"""Decoding PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

Each message is one byte naming its kind, then big-endian fields, as the PostgreSQL
documentation's "Logical Replication Message Formats" lays out. Column values arrive in text
format (we never ask for binary), as ``bytes`` or None (SQL NULL), or :data:`UNCHANGED` for a
TOASTed value an UPDATE did not change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias


class _Unchanged:
    """The value of a TOASTed column an UPDATE left as it was (tuple kind 'u')."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()

Value: TypeAlias = bytes | _Unchanged | None
TupleData: TypeAlias = tuple[Value, ...]

# PostgreSQL epoch (2000-01-01) in microseconds after the Unix epoch.
_PG_EPOCH_US = 946_684_800_000_000


class DecodeError(ValueError):
    """A message that is not valid pgoutput."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    # Unix microseconds.
    commit_time_us: int
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    # Part of the replica identity key.
    is_key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    # 'd' default (primary key), 'n' nothing, 'f' full, 'i' index.
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True)
class Update:
    relation_oid: int
    # The old row ('O', with REPLICA IDENTITY FULL) or its key ('K'), when sent.
    old: TupleData | None
    old_is_key: bool
    new: TupleData


@dataclass(frozen=True)
class Delete:
    relation_oid: int
    old: TupleData
    old_is_key: bool


@dataclass(frozen=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class LogicalMessage:
    """A message written with ``pg_logical_emit_message`` (sent with ``messages 'true'``)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Other:
    """Origin and Type: nothing a source needs."""

    kind: str


Message: TypeAlias = (
    Begin | Commit | Relation | Insert | Update | Delete | Truncate | LogicalMessage | Other
)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, size: int) -> memoryview:
        end = self.at + size
        if end > len(self.data):
            raise DecodeError(f"message ends after {len(self.data)} bytes, needed {end}")
        part = self.data[self.at : end]
        self.at = end
        return part

    def u8(self) -> int:
        return int(self.take(1)[0])

    def i16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def i32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def u32(self) -> int:
        value: int = struct.unpack(">I", self.take(4))[0]
        return value

    def i64(self) -> int:
        value: int = struct.unpack(">q", self.take(8))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack(">Q", self.take(8))[0]
        return value

    def string(self) -> str:
        end = bytes(self.data[self.at :]).find(b"\x00")
        if end < 0:
            raise DecodeError("unterminated string")
        text = bytes(self.data[self.at : self.at + end]).decode("utf-8")
        self.at += end + 1
        return text

    def tuple_data(self) -> TupleData:
        count = self.i16()
        values: list[Value] = []
        for _ in range(count):
            kind = chr(self.u8())
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind in ("t", "b"):
                values.append(bytes(self.take(self.i32())))
            else:
                raise DecodeError(f"unknown tuple value kind {kind!r}")
        return tuple(values)

    def done(self) -> None:
        if self.at != len(self.data):
            raise DecodeError(f"{len(self.data) - self.at} bytes left after the message")


def decode(data: bytes) -> Message:
    """One pgoutput message from its bytes."""
    if not data:
        raise DecodeError("empty message")
    reader = _Reader(data)
    kind = chr(reader.u8())
    message: Message
    if kind == "B":
        message = Begin(reader.u64(), _unix_us(reader.i64()), reader.u32())
    elif kind == "C":
        message = Commit(reader.u8(), reader.u64(), reader.u64(), _unix_us(reader.i64()))
    elif kind == "R":
        message = _relation(reader)
    elif kind == "I":
        oid = reader.u32()
        if chr(reader.u8()) != "N":
            raise DecodeError("Insert without its new tuple")
        message = Insert(oid, reader.tuple_data())
    elif kind == "U":
        message = _update(reader)
    elif kind == "D":
        oid = reader.u32()
        marker = chr(reader.u8())
        if marker not in ("K", "O"):
            raise DecodeError(f"Delete with tuple marker {marker!r}")
        message = Delete(oid, reader.tuple_data(), marker == "K")
    elif kind == "T":
        count = reader.i32()
        options = reader.u8()
        oids = tuple(reader.u32() for _ in range(count))
        message = Truncate(oids, bool(options & 1), bool(options & 2))
    elif kind == "M":
        flags = reader.u8()
        lsn = reader.u64()
        prefix = reader.string()
        message = LogicalMessage(bool(flags & 1), lsn, prefix, bytes(reader.take(reader.i32())))
    elif kind in ("O", "Y"):
        return Other(kind)
    else:
        raise DecodeError(f"unknown pgoutput message kind {kind!r}")
    reader.done()
    return message


def _unix_us(pg_us: int) -> int:
    return pg_us + _PG_EPOCH_US


def _relation(reader: _Reader) -> Relation:
    oid = reader.u32()
    namespace = reader.string()
    name = reader.string()
    identity = chr(reader.u8())
    count = reader.i16()
    columns = []
    for _ in range(count):
        flags = reader.u8()
        column_name = reader.string()
        columns.append(RelationColumn(column_name, reader.u32(), reader.i32(), bool(flags & 1)))
    return Relation(oid, namespace, name, identity, tuple(columns))


def _update(reader: _Reader) -> Update:
    oid = reader.u32()
    marker = chr(reader.u8())
    old: TupleData | None = None
    old_is_key = False
    if marker in ("K", "O"):
        old = reader.tuple_data()
        old_is_key = marker == "K"
        marker = chr(reader.u8())
    if marker != "N":
        raise DecodeError(f"Update with tuple marker {marker!r}")
    return Update(oid, old, old_is_key, reader.tuple_data())
