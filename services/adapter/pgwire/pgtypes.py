"""Tidemark's SQL types as PostgreSQL types: OIDs, sizes, type modifiers, and values in the text
and binary formats, both ways (results out, parameters in).

Result values come as ``adapter.proto`` SqlValues (numeric, date, timestamp and jsonb as their
text). Parameters become SQL literals (``params``), so they are read back here from either
format into Python values first.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import struct
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext

from services.adapter.sql.errors import SqlError
from tidemark.v1 import adapter_pb2

BOOL = 16
BYTEA = 17
CHAR = 18
NAME = 19
INT8 = 20
INT2 = 21
INT4 = 23
TEXT = 25
OID = 26
JSON = 114
FLOAT4 = 700
FLOAT8 = 701
UNKNOWN = 705
BPCHAR = 1042
VARCHAR = 1043
DATE = 1082
TIMESTAMP = 1114
TIMESTAMPTZ = 1184
NUMERIC = 1700
JSONB = 3802

INVALID_TEXT_REPRESENTATION = "22P02"
INVALID_BINARY_REPRESENTATION = "22P03"
POSTGRES_EPOCH = datetime.datetime(2000, 1, 1)
POSTGRES_EPOCH_DATE = datetime.date(2000, 1, 1)


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str
    size: int
    modifier: int = -1


_BY_NAME = {
    "boolean": PgType(BOOL, "boolean", 1),
    "bigint": PgType(INT8, "bigint", 8),
    "double precision": PgType(FLOAT8, "double precision", 8),
    "text": PgType(TEXT, "text", -1),
    "bytea": PgType(BYTEA, "bytea", -1),
    "date": PgType(DATE, "date", 4),
    "timestamp": PgType(TIMESTAMP, "timestamp without time zone", 8),
    "jsonb": PgType(JSONB, "jsonb", -1),
    "numeric": PgType(NUMERIC, "numeric", -1),
}
_NUMERIC = re.compile(r"numeric\((\d+),\s*(\d+)\)")

# The Tidemark type a parameter of a PostgreSQL type is read as (its CAST target).
CAST_NAMES = {
    BOOL: "boolean",
    INT2: "bigint",
    INT4: "bigint",
    INT8: "bigint",
    OID: "bigint",
    FLOAT4: "double precision",
    FLOAT8: "double precision",
    NUMERIC: "numeric",
    TEXT: "text",
    VARCHAR: "text",
    BPCHAR: "text",
    NAME: "text",
    CHAR: "text",
    BYTEA: "bytea",
    DATE: "date",
    TIMESTAMP: "timestamp",
    TIMESTAMPTZ: "timestamp",
    JSON: "jsonb",
    JSONB: "jsonb",
}


def pg_type(sql_type: str) -> PgType:
    """The PostgreSQL type of a Tidemark result column (``SqlColumn.type``)."""
    known = _BY_NAME.get(sql_type)
    if known is not None:
        return known
    match = _NUMERIC.fullmatch(sql_type)
    if match:
        precision, scale = int(match[1]), int(match[2])
        return PgType(NUMERIC, "numeric", -1, ((precision << 16) | scale) + 4)
    return _BY_NAME["text"]


def format_type(sql_type: str) -> str:
    """``pg_catalog.format_type`` of a column's type."""
    if _NUMERIC.fullmatch(sql_type):
        return sql_type
    return pg_type(sql_type).name


# -- results --------------------------------------------------------------------------------


def float_text(value: float) -> str:
    """float8out: the shortest text that reads back exactly, exponent outside 1e-4..1e15."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    digits = repr(value)
    mantissa, _, exponent = digits.partition("e")
    number = Decimal(digits)
    exp10 = number.adjusted()
    if -4 <= exp10 < 15:
        text = format(number, "f")
        return text[:-2] if text.endswith(".0") else text
    if not exponent:
        mantissa_dec = number.scaleb(-exp10)
        mantissa = format(mantissa_dec.normalize(), "f")
    mantissa = mantissa.removesuffix(".0")
    return f"{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"


def encode_text(value: adapter_pb2.SqlValue) -> bytes | None:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "bool_value":
        return b"t" if value.bool_value else b"f"
    if kind == "int_value":
        return str(value.int_value).encode()
    if kind == "float_value":
        return float_text(value.float_value).encode()
    if kind == "bytes_value":
        return b"\\x" + value.bytes_value.hex().encode()
    return value.text_value.encode()


def encode_binary(value: adapter_pb2.SqlValue, oid: int) -> bytes | None:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "bool_value":
        return b"\x01" if value.bool_value else b"\x00"
    if kind == "int_value":
        return struct.pack("!q", value.int_value)
    if kind == "float_value":
        return struct.pack("!d", value.float_value)
    if kind == "bytes_value":
        return value.bytes_value
    text = value.text_value
    if oid == NUMERIC:
        return numeric_binary(Decimal(text))
    if oid == DATE:
        days = (datetime.date.fromisoformat(text) - POSTGRES_EPOCH_DATE).days
        return struct.pack("!i", days)
    if oid == TIMESTAMP:
        delta = datetime.datetime.fromisoformat(text) - POSTGRES_EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return struct.pack("!q", micros)
    if oid == JSONB:
        return b"\x01" + text.encode()
    return text.encode()


def numeric_binary(value: Decimal) -> bytes:
    """numeric_send: base-10000 digits with weight, sign and display scale."""
    if value.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if value.is_infinite():
        return struct.pack("!hhHh", 0, 0, 0xD000 if value > 0 else 0xF000, 0)
    sign = 0x4000 if value < 0 else 0
    exponent = value.as_tuple().exponent
    dscale = max(0, -exponent) if isinstance(exponent, int) else 0
    whole, _, fraction = format(value.copy_abs(), "f").partition(".")
    whole = whole.lstrip("0")
    whole = whole.rjust((len(whole) + 3) // 4 * 4, "0")
    fraction = fraction.ljust((len(fraction) + 3) // 4 * 4, "0")
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
        sign = 0
    head = struct.pack("!hhHh", len(groups), weight, sign, dscale)
    return head + b"".join(struct.pack("!H", g) for g in groups)


def numeric_from_binary(data: bytes) -> Decimal:
    if len(data) < 8:
        raise ValueError("short numeric")
    count, weight, sign, dscale = struct.unpack("!hhHh", data[:8])
    if count < 0 or len(data) != 8 + 2 * count:
        raise ValueError("numeric digit count does not match its length")
    if sign == 0xC000:
        return Decimal("NaN")
    groups = struct.unpack(f"!{count}H", data[8:])
    if any(g > 9999 for g in groups):
        raise ValueError("numeric digit out of range")
    digits = 0
    for group in groups:
        digits = digits * 10000 + group
    with localcontext() as context:
        # numeric holds up to 131072 digits before the point; be exact, not 28 digits.
        context.prec = 200_000
        total = Decimal(digits).scaleb(4 * (weight - count + 1))
        if sign == 0x4000:
            total = -total
        return total.quantize(Decimal(1).scaleb(-dscale)) if dscale >= 0 else total


# -- parameters -----------------------------------------------------------------------------

ParamValue = bool | int | float | Decimal | str | bytes | datetime.date | datetime.datetime | None


def decode_param(data: bytes | None, oid: int, fmt: int, index: int) -> ParamValue:
    """A Bind parameter's value, read as its type says (``index`` is 1-based, for errors)."""
    if data is None:
        return None
    try:
        if fmt == 1:
            return _from_binary(data, oid)
        return _from_text(data.decode(), oid)
    except (ValueError, OverflowError, InvalidOperation, UnicodeDecodeError, struct.error) as exc:
        code = INVALID_BINARY_REPRESENTATION if fmt == 1 else INVALID_TEXT_REPRESENTATION
        raise SqlError(code, f"invalid value for parameter ${index}: {exc}") from None


_TRUE = {"t", "true", "y", "yes", "on", "1"}
_FALSE = {"f", "false", "n", "no", "off", "0"}


def _from_text(text: str, oid: int) -> ParamValue:
    if oid == BOOL:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(f'"{text}" is not a boolean')
    if oid in (INT2, INT4, INT8, OID):
        return int(text.strip())
    if oid in (FLOAT4, FLOAT8):
        return float(text.strip())
    if oid == NUMERIC:
        return Decimal(text.strip())
    if oid == BYTEA:
        if text.startswith("\\x"):
            return bytes.fromhex(text[2:])
        return text.encode()
    if oid == DATE:
        return datetime.date.fromisoformat(text.strip())
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        return datetime.datetime.fromisoformat(text.strip()).replace(tzinfo=None)
    if oid in (JSON, JSONB):
        json.loads(text)
        return text
    return text


def _from_binary(data: bytes, oid: int) -> ParamValue:
    if oid == BOOL:
        if len(data) != 1:
            raise ValueError("a binary boolean is one byte")
        return data != b"\x00"
    if oid == INT2:
        return int(struct.unpack("!h", data)[0])
    if oid in (INT4,):
        return int(struct.unpack("!i", data)[0])
    if oid == OID:
        return int(struct.unpack("!I", data)[0])
    if oid == INT8:
        return int(struct.unpack("!q", data)[0])
    if oid == FLOAT4:
        return float(struct.unpack("!f", data)[0])
    if oid == FLOAT8:
        return float(struct.unpack("!d", data)[0])
    if oid == NUMERIC:
        return numeric_from_binary(data)
    if oid == BYTEA:
        return data
    if oid == DATE:
        (days,) = struct.unpack("!i", data)
        return POSTGRES_EPOCH_DATE + datetime.timedelta(days=days)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        (micros,) = struct.unpack("!q", data)
        return POSTGRES_EPOCH + datetime.timedelta(microseconds=micros)
    if oid == JSONB:
        if not data or data[0] != 1:
            raise ValueError("unsupported jsonb version")
        text = data[1:].decode()
        json.loads(text)
        return text
    if oid == JSON:
        text = data.decode()
        json.loads(text)
        return text
    return data.decode()


def quote_string(text: str) -> str:
    """A standard-conforming string literal: quotes doubled, backslashes literal."""
    if "\0" in text:
        raise SqlError("22021", "a parameter contains a NUL character")
    return "'" + text.replace("'", "''") + "'"


def sql_literal(value: ParamValue, oid: int) -> str:
    """A parameter as the SQL literal that stands for it in the statement's text."""
    cast = CAST_NAMES.get(oid)
    if value is None:
        return f"CAST(NULL AS {cast})" if cast else "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"({value})" if value < 0 else str(value)
    if isinstance(value, float):
        return f"CAST({quote_string(float_text(value))} AS double precision)"
    if isinstance(value, Decimal):
        if not value.is_finite():
            return f"CAST({quote_string(str(value))} AS numeric)"
        text = format(value, "f")
        return f"({text})" if text.startswith("-") else text
    if isinstance(value, bytes):
        return f"CAST('\\x{value.hex()}' AS bytea)"
    if isinstance(value, datetime.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if cast == "jsonb":
        return f"CAST({quote_string(value)} AS jsonb)"
    return quote_string(value)
