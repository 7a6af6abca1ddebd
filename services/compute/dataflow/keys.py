"""Stable key encoding and shard assignment.

Stateful operators are partitioned by key across P workers (later: P resident Spark tasks),
so every process must agree on which worker owns a key. Python's ``hash()`` is salted per
process for text, so the shard is ``crc32`` of a canonical byte encoding instead. Values that
are equal under the contract encode equally: -0.0 and 0.0, every NaN, and decimals that differ
only in trailing zeros (1.5 and 1.50).
"""

from __future__ import annotations

import datetime
import struct
import zlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from services.compute.dataflow.functions.decimals import EXACT

_NULL = b"\x00"
_FALSE = b"\x01\x00"
_TRUE = b"\x01\x01"
_NAN_BYTES = b"\x03" + struct.pack(">d", float("nan"))


def _length_prefixed(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack(">I", len(payload)) + payload


def encode_value(value: Any) -> bytes:
    """One value's canonical bytes: a type tag, then a payload that equal values share."""
    if value is None:
        return _NULL
    cls = value.__class__
    if cls is bool:
        return _TRUE if value else _FALSE
    if cls is int:
        return _length_prefixed(
            b"\x02", value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        )
    if cls is float:
        if value != value:
            return _NAN_BYTES
        return b"\x03" + struct.pack(">d", value if value else 0.0)
    if cls is str:
        return _length_prefixed(b"\x05", value.encode("utf-8", "surrogatepass"))
    if cls is bytes:
        return _length_prefixed(b"\x06", value)
    if cls is Decimal:
        text = "0" if value.is_zero() else str(value.normalize(EXACT))
        return _length_prefixed(b"\x04", text.encode("ascii"))
    if cls is datetime.datetime:
        micros = (
            value.toordinal() * 86_400 + value.hour * 3600 + value.minute * 60 + value.second
        ) * 1_000_000 + value.microsecond
        return b"\x08" + struct.pack(">q", micros)
    if cls is datetime.date:
        return b"\x07" + struct.pack(">i", value.toordinal())
    raise TypeError(f"cannot encode a key value of type {cls.__name__}")


def encode_key(key: Sequence[Any]) -> bytes:
    """The canonical bytes of a key (a tuple of values)."""
    return b"".join([encode_value(value) for value in key])


def shard_of(key: Sequence[Any], shards: int) -> int:
    """Which of ``shards`` workers owns ``key``: the same answer in every process."""
    if shards == 1:
        return 0
    return zlib.crc32(encode_key(key)) % shards
