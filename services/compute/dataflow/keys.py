"""Stable key encoding and shard assignment.

Stateful operators are partitioned by key across P workers (the P resident Spark tasks), so
every process must agree on which worker owns a key. Values that are equal under the contract
hash (and encode, :func:`encode_key`) equally: -0.0 and 0.0, every NaN, and decimals that
differ only in trailing zeros (1.5 and 1.50).

The shard is a 64-bit hash of the key, computed two ways that agree: over one Python
key (:func:`shard_of`, every update the tasks exchange) and over whole Arrow columns at once
(:func:`shards_of`, every row hydration stages). The hash follows the same rules; its value
hashes are stable across processes (Python's own ``hash`` is salted for text, bytes and
dates, so those are hashed from ``crc32`` of their bytes and from their ordinals). Numbers,
dates and timestamps are hashed from their 64-bit values with numpy; text, bytes and decimals
from each distinct value of a column (a dictionary encoding) in Python. Values are mixed and
combined as :mod:`.columnar` combines its key hashes.
"""

from __future__ import annotations

import datetime
import struct
import zlib
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from services.compute.dataflow.columnar import (
    MASK,
    HashInput,
    _mix,
    combined_hashes,
    distinct_hashes,
    one_array,
    value_hashes,
)
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


# Value hashes: a type tag xor-ed in before mixing keeps 1, True, 1.0 and "1" apart.
_SEED = 0x9E3779B97F4A7C15
_PRIME = 0x100000001B3
_NULL_HASH = 0x6A09E667F3BCC909
_BOOL, _INT, _FLOAT, _TEXT, _BYTES, _DECIMAL, _DATE, _TIMESTAMP, _BIG_INT, _DECIMAL_NAN = (
    (tag << 56) | 0x5BE0CD19137E2179 & ((1 << 56) - 1) for tag in range(1, 11)
)
_NAN_BITS = struct.unpack("<Q", struct.pack("<d", float("nan")))[0]
_EPOCH_DAYS = datetime.date(1970, 1, 1).toordinal()
_EPOCH_MICROS = _EPOCH_DAYS * 86_400 * 1_000_000
_INT64 = range(-(1 << 63), 1 << 63)


def stable_hash(value: Any) -> int:
    """One key value's 64-bit hash, the same in every process; as :func:`column_hashes`
    computes it for a column."""
    if value is None:
        return _NULL_HASH
    cls = value.__class__
    if cls is bool:
        return _mix(_BOOL ^ value)
    if cls is int:
        if value in _INT64:
            return _mix(_INT ^ (value & MASK))
        return _mix(_BIG_INT ^ (hash(value) & MASK))  # ints hash by value, unsalted
    if cls is float:
        if value != value:
            return _mix(_FLOAT ^ _NAN_BITS)
        bits: int = struct.unpack("<Q", struct.pack("<d", value + 0.0))[0]
        return _mix(_FLOAT ^ bits)
    if cls is str:
        return _bytes_hash(_TEXT, value.encode("utf-8", "surrogatepass"))
    if cls is bytes:
        return _bytes_hash(_BYTES, value)
    if cls is Decimal:
        # Decimal's own hash is numeric (equal for 1.5 and 1.50) and unsalted; a NaN's is not.
        if value.is_nan():
            return _mix(_DECIMAL_NAN)
        return _mix(_DECIMAL ^ (hash(value) & MASK))
    if cls is datetime.datetime:
        micros = (
            value.toordinal() * 86_400 + value.hour * 3600 + value.minute * 60 + value.second
        ) * 1_000_000 + value.microsecond
        return _mix(_TIMESTAMP ^ (micros & MASK))
    if cls is datetime.date:
        return _mix(_DATE ^ value.toordinal())
    raise TypeError(f"cannot hash a key value of type {cls.__name__}")


def _bytes_hash(tag: int, data: bytes) -> int:
    return _mix(tag ^ (len(data) << 32) ^ zlib.crc32(data))


def key_hash(key: Sequence[Any]) -> int:
    """A key's 64-bit hash, as :func:`key_hashes` computes it for each row of key columns."""
    h = _SEED
    for value in key:
        h = _mix(((h * _PRIME) & MASK) ^ stable_hash(value))
    return h


def shard_of(key: Sequence[Any], shards: int) -> int:
    """Which of ``shards`` workers owns ``key``: the same answer in every process."""
    if shards == 1:
        return 0
    return key_hash(key) % shards


def shards_of(columns: Sequence[pa.Array | pa.ChunkedArray], rows: int, shards: int) -> np.ndarray:
    """:func:`shard_of` of each row's key, the key's values being the ``columns`` (``rows``
    of them) as Python reads them (``to_pylist``)."""
    if shards == 1:
        return np.zeros(rows, dtype=np.int64)
    hashes = key_hashes(columns, rows)
    if shards & (shards - 1) == 0:  # a power of two: the low bits, without a division
        hashes &= np.uint64(shards - 1)
        return hashes.view(np.int64)
    return (hashes % np.uint64(shards)).astype(np.int64)


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray], rows: int) -> np.ndarray:
    """:func:`key_hash` of each row of the key ``columns``."""
    sources = [hash_input(column) for column in columns]
    return combined_hashes(sources, rows, [range(len(sources))])[0]


def column_hashes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`stable_hash` of every value of ``column``."""
    return value_hashes(hash_input(column))


def hash_input(column: pa.Array | pa.ChunkedArray) -> HashInput:
    """``column`` made ready for :func:`stable_hash` of each of its values: numbers, dates
    and timestamps as their 64-bit values and type tag (mixed by numpy), the rest hashed in
    Python once per distinct value."""
    column = one_array(column)
    kind = column.type
    nulls = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    if pa.types.is_boolean(kind):
        return HashInput(_filled(column, False).astype(np.uint64), False, _BOOL, nulls)
    if pa.types.is_signed_integer(kind) or (
        pa.types.is_unsigned_integer(kind) and kind.bit_width < 64
    ):
        values = _filled(pc.cast(column, pa.int64()), 0).view(np.uint64)
        return HashInput(values, False, _INT, nulls)
    if pa.types.is_floating(kind):
        floats = _filled(pc.cast(column, pa.float64()), 0.0)
        bits = np.where(np.isnan(floats), np.uint64(_NAN_BITS), (floats + 0.0).view(np.uint64))
        return HashInput(bits.astype(np.uint64, copy=False), False, _FLOAT, nulls)
    if pa.types.is_date32(kind):
        days = _filled(column.view(pa.int32()), 0).astype(np.int64) + _EPOCH_DAYS
        return HashInput(days.view(np.uint64), False, _DATE, nulls)
    if pa.types.is_timestamp(kind) and kind.tz is None and kind.unit == "us":
        micros = _filled(column.view(pa.int64()), 0) + np.int64(_EPOCH_MICROS)
        return HashInput(micros.view(np.uint64), False, _TIMESTAMP, nulls)
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_decimal(kind)
    ):
        # Hashed in Python, once per distinct value: keys repeat (a join's foreign keys).
        return HashInput(distinct_hashes(column, stable_hash, _NULL_HASH), True)
    # The rest one value at a time, exactly as the tasks read them.
    hashes = np.fromiter(
        (stable_hash(value) for value in column.to_pylist()), dtype=np.uint64, count=len(column)
    )
    return HashInput(hashes, True)


def _filled(column: pa.Array, fill: Any) -> np.ndarray:
    if column.null_count:
        column = column.fill_null(fill)
    values: np.ndarray = column.to_numpy(zero_copy_only=False)
    return values
