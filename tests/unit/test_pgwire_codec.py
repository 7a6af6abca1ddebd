"""The pgwire codec, parameters, values and SCRAM against the documented formats: the
PostgreSQL frontend/backend protocol's message layouts (protocol-message-formats), numeric's
binary form (numeric_send) and RFC 7677's SCRAM-SHA-256 example."""

from __future__ import annotations

import asyncio
import base64
import datetime
import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.adapter.pgwire import codec, pgtypes
from services.adapter.pgwire.auth import AuthFailed, ScramExchange, ScramVerifier
from services.adapter.pgwire.codec import Field, Notice, ProtocolError
from services.adapter.pgwire.params import (
    parameter_count,
    placeholders,
    split_statements,
    substitute,
)
from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2


def _stream(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def _read_startup(data: bytes) -> codec.StartupPacket:
    return asyncio.run(_startup(data))


async def _startup(data: bytes) -> codec.StartupPacket:
    return await codec.read_startup(_stream(data))


async def _message(data: bytes) -> tuple[int, bytes]:
    return await codec.read_message(_stream(data))


def test_startup_message_sslrequest_and_cancelrequest() -> None:
    # StartupMessage: Int32 length, Int32 196608, then name/value strings and a final NUL.
    body = struct.pack("!i", 196608) + b"user\0ann\0database\0db\0\0"
    packet = _read_startup(struct.pack("!i", len(body) + 4) + body)
    assert packet == codec.Startup({"user": "ann", "database": "db"})
    # SSLRequest: Int32(8) Int32(80877103); CancelRequest: Int32(16) Int32(80877102) pid key.
    assert _read_startup(struct.pack("!ii", 8, 80877103)) == codec.SslRequest()
    assert _read_startup(struct.pack("!iiii", 16, 80877102, 7, -3)) == codec.CancelRequest(7, -3)
    with pytest.raises(ProtocolError):
        _read_startup(struct.pack("!ii", 8, 2 << 16))  # protocol 2.0
    with pytest.raises(ProtocolError):
        _read_startup(struct.pack("!i", 1 << 30))
    with pytest.raises(ProtocolError):
        _read_startup(struct.pack("!i", 20) + struct.pack("!i", 196608) + b"user")  # truncated
    with pytest.raises(EOFError):
        _read_startup(b"")


def test_frontend_messages_are_framed_and_checked() -> None:
    assert asyncio.run(_message(b"Q\0\0\0\x0dSELECT 1\0")) == (ord("Q"), b"SELECT 1\0")
    for bad in (b"Z\0\0\0\4", b"Q\0\0\0\3", b"Q" + struct.pack("!i", (64 << 20) + 5)):
        with pytest.raises(ProtocolError):
            asyncio.run(_message(bad))
    with pytest.raises(ProtocolError):
        asyncio.run(_message(b"Q\0\0\0\x10SEL"))


def test_parse_bind_describe_execute_close_bodies() -> None:
    # Parse: String name, String query, Int16 count, Int32 OIDs.
    parse = codec.decode_parse(b"s1\0SELECT $1\0" + struct.pack("!hI", 1, 20))
    assert parse == codec.Parse("s1", "SELECT $1", [20])
    # Bind: portal, statement, Int16 format count + codes, Int16 value count + (Int32 len,
    # bytes | -1 for NULL), Int16 result format count + codes.
    body = (
        b"p\0s1\0"
        + struct.pack("!hh", 1, 1)
        + struct.pack("!h", 2)
        + struct.pack("!i", 8)
        + struct.pack("!q", 42)
        + struct.pack("!i", -1)
        + struct.pack("!hh", 1, 1)
    )
    bind = codec.decode_bind(body)
    assert bind.portal == "p" and bind.statement == "s1"
    assert bind.params == [struct.pack("!q", 42), None]
    assert bind.param_format(1) == 1 and bind.result_format(5) == 1
    with pytest.raises(ProtocolError):
        codec.decode_bind(b"p\0s1\0" + struct.pack("!hh", 1, 7) + struct.pack("!hh", 0, 0))
    with pytest.raises(ProtocolError):
        codec.decode_bind(b"p\0s1\0" + struct.pack("!hh", 0, 1) + struct.pack("!i", 100))
    assert codec.decode_describe(b"Pname\0") == codec.Describe("P", "name")
    assert codec.decode_execute(b"\0" + struct.pack("!i", 10)) == codec.Execute("", 10)
    assert codec.decode_close(b"S\0") == codec.Close("S", "")
    with pytest.raises(ProtocolError):
        codec.decode_describe(b"X\0")


def test_backend_messages_match_the_documented_layouts() -> None:
    assert codec.ready_for_query("T") == b"Z\0\0\0\5T"
    assert codec.authentication_ok() == b"R\0\0\0\x08\0\0\0\0"
    assert codec.parse_complete() == b"1\0\0\0\4" and codec.bind_complete() == b"2\0\0\0\4"
    assert codec.portal_suspended() == b"s\0\0\0\4" and codec.no_data() == b"n\0\0\0\4"
    assert codec.backend_key_data(5, 6) == b"K\0\0\0\x0c\0\0\0\5\0\0\0\6"
    assert codec.command_complete("SELECT 1") == b"C\0\0\0\x0dSELECT 1\0"
    description = codec.row_description([Field("a", 20, 8), Field("n", 1700, -1, 655366, 1)])
    assert description == (
        b"T"
        + struct.pack("!i", 4 + 2 + 2 * (2 + 18))
        + struct.pack("!h", 2)
        + b"a\0"
        + struct.pack("!ihihih", 0, 0, 20, 8, -1, 0)
        + b"n\0"
        + struct.pack("!ihihih", 0, 0, 1700, -1, 655366, 1)
    )
    assert codec.data_row([b"1", None]) == b"D" + struct.pack("!ihi", 15, 2, 1) + b"1" + (
        b"\xff\xff\xff\xff"
    )
    assert codec.parameter_description([20, 25]) == b"t" + struct.pack("!ihII", 14, 2, 20, 25)
    assert codec.copy_in_response(2) == b"G" + struct.pack("!ibhhh", 11, 0, 2, 0, 0)
    error = codec.error_response(Notice("42P01", "no", position=8, hint="look"))
    assert error[0:1] == b"E"
    assert codec.decode_fields(error[5:]) == {
        "S": "ERROR",
        "V": "ERROR",
        "C": "42P01",
        "M": "no",
        "H": "look",
        "P": "8",
    }


def test_placeholders_skip_quotes_comments_and_dollar_strings() -> None:
    sql = "SELECT $1, '$2', \"$3\", $$ $4 $$, $tag$ $5 $tag$ -- $6\n, /* $7 */ E'\\' $8', $9"
    assert [n for _, _, n in placeholders(sql)] == [1, 9]
    assert parameter_count("SELECT $2 + $1") == 2
    assert split_statements("SELECT ';'; SELECT 2 ;  ") == [(0, "SELECT ';'"), (11, " SELECT 2 ")]
    text, positions = substitute("SELECT $1, x FROM t WHERE y = $2", ["'it''s'", "10"])
    assert text == "SELECT 'it''s', x FROM t WHERE y = 10"
    assert positions.original(text.index("x") + 1) == "SELECT $1, x".index("x") + 1
    assert (
        positions.original(text.index("10") + 1)
        == "SELECT $1, x FROM t WHERE y = $2".index("$2") + 1
    )


def test_parameters_become_safe_literals() -> None:
    assert pgtypes.sql_literal("x'; DROP TABLE t; --", 0) == "'x''; DROP TABLE t; --'"
    assert pgtypes.sql_literal(-5, pgtypes.INT8) == "(-5)"
    assert pgtypes.sql_literal(None, pgtypes.INT8) == "CAST(NULL AS bigint)"
    assert pgtypes.sql_literal(b"\x01\xff", pgtypes.BYTEA) == "CAST('\\x01ff' AS bytea)"
    assert pgtypes.sql_literal(datetime.date(2024, 1, 2), 0) == "DATE '2024-01-02'"
    assert pgtypes.decode_param(struct.pack("!q", -7), pgtypes.INT8, 1, 1) == -7
    assert pgtypes.decode_param(b"t", pgtypes.BOOL, 0, 1) is True
    with pytest.raises(SqlError) as failure:
        pgtypes.decode_param(b"abc", pgtypes.INT4, 0, 2)
    assert failure.value.code == "22P02" and "$2" in failure.value.message
    with pytest.raises(SqlError):
        pgtypes.sql_literal("a\0b", 0)


def test_numeric_binary_follows_numeric_send() -> None:
    # 12345.678: base-10000 digits 1, 2345, 6780; weight 1; dscale 3.
    assert pgtypes.numeric_binary(Decimal("12345.678")) == struct.pack(
        "!hhHhHHH", 3, 1, 0, 3, 1, 2345, 6780
    )
    assert pgtypes.numeric_binary(Decimal("-0.0012")) == struct.pack("!hhHhH", 1, -1, 0x4000, 4, 12)
    assert pgtypes.numeric_binary(Decimal("0.00")) == struct.pack("!hhHh", 0, 0, 0, 2)
    for text in ("0", "1", "-1.5", "100000000", "0.000001", "98765432109876543210.0123456789"):
        value = Decimal(text)
        assert pgtypes.numeric_from_binary(pgtypes.numeric_binary(value)) == value


def test_values_in_text_and_binary() -> None:
    assert pgtypes.float_text(1.0) == "1" and pgtypes.float_text(0.1) == "0.1"
    assert pgtypes.float_text(1e20) == "1e+20" and pgtypes.float_text(float("inf")) == "Infinity"
    assert pgtypes.encode_text(adapter_pb2.SqlValue(bytes_value=b"\x00a")) == b"\\x0061"
    assert pgtypes.encode_text(adapter_pb2.SqlValue()) is None
    date = adapter_pb2.SqlValue(text_value="2000-01-02")
    assert pgtypes.encode_binary(date, pgtypes.DATE) == struct.pack("!i", 1)
    stamp = adapter_pb2.SqlValue(text_value="2000-01-01 00:00:01.5")
    assert pgtypes.encode_binary(stamp, pgtypes.TIMESTAMP) == struct.pack("!q", 1_500_000)
    assert pgtypes.encode_binary(adapter_pb2.SqlValue(text_value="{}"), pgtypes.JSONB) == b"\x01{}"
    assert pgtypes.pg_type("numeric(10,2)").modifier == (10 << 16 | 2) + 4
    assert [pgtypes.pg_type(t).oid for t in ("boolean", "bigint", "double precision", "text")] == [
        16,
        20,
        701,
        25,
    ]


def test_scram_sha_256_matches_rfc_7677() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    exchange = ScramExchange(ScramVerifier.from_password("pencil", salt))
    exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    # The RFC's server nonce, in place of the random one.
    exchange._nonce = nonce
    exchange._server_first = f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = (f"c=biws,r={nonce},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").encode()
    assert exchange.final(final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    wrong = ScramExchange(ScramVerifier.from_password("pen", salt))
    wrong.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    wrong._nonce = nonce
    wrong._server_first = exchange._server_first
    with pytest.raises(AuthFailed) as failure:
        wrong.final(final)
    assert failure.value.code == "28P01"
    with pytest.raises(AuthFailed):
        ScramExchange(None).first(b"p=tls-server-end-point,,n=user,r=abc")


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200))
def test_decoders_take_any_bytes_without_crashing(body: bytes) -> None:
    decoders = (
        codec.decode_query,
        codec.decode_parse,
        codec.decode_bind,
        codec.decode_describe,
        codec.decode_execute,
        codec.decode_close,
        codec.decode_sasl_initial,
        codec.decode_startup,
    )
    for decode in decoders:
        try:
            decode(body)
        except ProtocolError:
            pass


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=40),
    oid=st.sampled_from(sorted(pgtypes.CAST_NAMES)),
    fmt=st.sampled_from([0, 1]),
)
def test_any_parameter_bytes_are_a_value_or_a_sql_error(data: bytes, oid: int, fmt: int) -> None:
    try:
        value = pgtypes.decode_param(data, oid, fmt, 1)
    except SqlError as exc:
        assert exc.code in ("22P02", "22P03")
        return
    try:
        literal = pgtypes.sql_literal(value, oid)
    except SqlError as exc:
        assert exc.code == "22021"
        return
    # A literal never ends its string early: the quotes in it pair up.
    assert literal.count("'") % 2 == 0
