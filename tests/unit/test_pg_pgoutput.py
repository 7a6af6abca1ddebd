"""pgoutput decoding, from messages assembled byte by byte after PostgreSQL's documented
"Logical Replication Message Formats"."""

from __future__ import annotations

import struct

import pytest

from tidemark.sources.postgres.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DecodeError,
    Delete,
    Insert,
    LogicalMessage,
    Other,
    Relation,
    RelationColumn,
    Truncate,
    Update,
    decode,
)

PG_EPOCH_US = 946_684_800_000_000


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def tuple_data(*values: bytes | str | None) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack(">i", len(value)) + value
    return out


def test_begin() -> None:
    data = b"B" + struct.pack(">QqI", 0x16B3748, 10_000_000, 731)
    assert decode(data) == Begin(0x16B3748, 10_000_000 + PG_EPOCH_US, 731)


def test_commit() -> None:
    data = b"C" + struct.pack(">BQQq", 0, 0x100, 0x180, 5)
    assert decode(data) == Commit(0, 0x100, 0x180, 5 + PG_EPOCH_US)


def test_relation() -> None:
    data = (
        b"R"
        + struct.pack(">I", 16384)
        + cstr("public")
        + cstr("orders")
        + b"d"
        + struct.pack(">h", 2)
        + b"\x01"
        + cstr("id")
        + struct.pack(">Ii", 20, -1)
        + b"\x00"
        + cstr("amount")
        + struct.pack(">Ii", 1700, (10 << 16 | 2) + 4)
    )
    assert decode(data) == Relation(
        16384,
        "public",
        "orders",
        "d",
        (
            RelationColumn("id", 20, -1, True),
            RelationColumn("amount", 1700, (10 << 16 | 2) + 4, False),
        ),
    )


def test_insert_with_null_and_text() -> None:
    data = b"I" + struct.pack(">I", 16384) + b"N" + tuple_data(b"42", None, "é".encode())
    assert decode(data) == Insert(16384, (b"42", None, "é".encode()))


def test_update_without_old_tuple() -> None:
    data = b"U" + struct.pack(">I", 7) + b"N" + tuple_data(b"1", "u")
    assert decode(data) == Update(7, None, False, (b"1", UNCHANGED))


def test_update_with_key_and_with_full_old_row() -> None:
    keyed = b"U" + struct.pack(">I", 7) + b"K" + tuple_data(b"1", None)
    keyed += b"N" + tuple_data(b"2", b"x")
    assert decode(keyed) == Update(7, (b"1", None), True, (b"2", b"x"))
    full = b"U" + struct.pack(">I", 7) + b"O" + tuple_data(b"1", b"a")
    full += b"N" + tuple_data(b"1", b"b")
    assert decode(full) == Update(7, (b"1", b"a"), False, (b"1", b"b"))


def test_delete() -> None:
    assert decode(b"D" + struct.pack(">I", 9) + b"O" + tuple_data(b"5", b"v")) == Delete(
        9, (b"5", b"v"), False
    )
    assert decode(b"D" + struct.pack(">I", 9) + b"K" + tuple_data(b"5", None)) == Delete(
        9, (b"5", None), True
    )


def test_truncate() -> None:
    data = b"T" + struct.pack(">iB", 2, 3) + struct.pack(">II", 10, 11)
    assert decode(data) == Truncate((10, 11), True, True)


def test_logical_message() -> None:
    data = b"M" + struct.pack(">BQ", 1, 0x42) + cstr("tidemark") + struct.pack(">i", 3) + b"abc"
    assert decode(data) == LogicalMessage(True, 0x42, "tidemark", b"abc")


def test_origin_and_type_are_skipped() -> None:
    assert decode(b"O" + struct.pack(">Q", 5) + cstr("node")) == Other("O")
    assert decode(b"Y" + struct.pack(">I", 1) + cstr("public") + cstr("mood")) == Other("Y")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"Z",
        b"B\x00\x00",
        b"I" + struct.pack(">I", 1) + b"X",
        b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"q",
        b"C" + struct.pack(">BQQq", 0, 1, 2, 3) + b"extra",
        b"R" + struct.pack(">I", 1) + b"public",
    ],
)
def test_malformed_messages_are_rejected(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(data)
