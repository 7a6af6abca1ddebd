"""Columnar batches: the bulk of an arrangement as Arrow data sorted by a 64-bit key hash.

A hydrated arrangement starts as one :class:`ColumnarBatch` built from the staged Arrow table
with vectorised work (hash the key columns, sort, consolidate), instead of a Python dict
entry per row. A read of a key binary-searches the batch's sorted hashes, converts only the
rows in that hash's range to Python values and keeps those whose key equals the one asked for
(two keys may share a hash). The arrangement then moves the key's rows into its dict of
recently used keys and marks them dead in the batch, so every key lives in exactly one place.

Hashes must agree between the two ways they are computed: over Arrow columns when a batch is
built (:func:`column_hashes`) and over a Python key when it is read (:func:`key_hash`). Equal
keys hash equally under the engine's rules: NULL is one value, every NaN is one value,
-0.0 == 0.0, and decimals equal but for trailing zeros are equal. Integers, booleans and
floats are hashed from their 64-bit values (floats normalised first); every other type from
Python's own ``hash`` of the engine's value (``Decimal``, ``str``, ...), which already follows
those rules and is stable within the process that holds the batch.

A batch can move to disk as an Arrow IPC file, memory-mapped back: its reads then cost page
faults rather than heap (``services.compute.dataflow.spill``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from services.compute.dataflow.batch import Key, KeyFunction, Row
from services.compute.dataflow.ordering import NAN

MASK = (1 << 64) - 1
_SEED = 0x9E3779B97F4A7C15
_PRIME = 0x100000001B3
_NULL_HASH = 0x6A09E667F3BCC909
_NAN_BITS = struct.unpack("<Q", struct.pack("<d", NAN))[0]
_CONVERT_ROWS = 65_536
"""Rows converted to Python values at a time when a whole batch is read."""

_HASH_COLUMN = "__tidemark_key_hash"
_DIFF_COLUMN = "__tidemark_diff"


def _mix(z: int) -> int:
    """The splitmix64 finaliser: spreads nearby integers over the 64-bit range."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_SHIFT_1, _SHIFT_2, _SHIFT_3 = np.uint64(30), np.uint64(27), np.uint64(31)
_SEED_TIMES_PRIME = np.uint64((_SEED * _PRIME) & MASK)
_PRIME_ARRAY = np.uint64(_PRIME)
_HASH_CHUNK = 32_768
"""Rows hashed at a time: a chunk's few arrays stay in the CPU's cache through the dozens
of numpy passes that mixing and combining take, where whole columns of millions of rows go
through memory on every pass (3.5x faster over 5·10^6 rows of three int64 columns)."""


def _mix_in_place(z: np.ndarray, scratch: np.ndarray) -> None:
    """:func:`_mix` of every element of ``z``, in place (``scratch``: same length)."""
    np.right_shift(z, _SHIFT_1, out=scratch)
    z ^= scratch
    z *= _MIX_1
    np.right_shift(z, _SHIFT_2, out=scratch)
    z ^= scratch
    z *= _MIX_2
    np.right_shift(z, _SHIFT_3, out=scratch)
    z ^= scratch


class HashInput(NamedTuple):
    """One column made ready for hashing: per row either the 64 bits its value hash mixes
    (``tag`` xor-ed in first, NULLs where ``nulls`` is set) or, ``mixed``, the value hash
    itself (hashed in Python per distinct value, NULLs included)."""

    values: np.ndarray
    mixed: bool
    tag: int = 0
    nulls: np.ndarray | None = None


def _value_hashes_into(
    source: HashInput, start: int, stop: int, out: np.ndarray, scratch: np.ndarray
) -> np.ndarray:
    """The value hashes of rows ``[start, stop)`` of ``source``: a slice of it when it holds
    them already, else mixed into ``out``."""
    values = source.values[start:stop]
    if source.mixed:
        return values
    if source.tag:
        np.bitwise_xor(values, np.uint64(source.tag), out=out)
    else:
        out[:] = values
    _mix_in_place(out, scratch)
    if source.nulls is not None:
        np.putmask(out, source.nulls[start:stop], np.uint64(_NULL_HASH))
    return out


def value_hashes(source: HashInput) -> np.ndarray:
    """The value hash of every row of ``source``, in a new array."""
    rows = len(source.values)
    out = np.empty(rows, dtype=np.uint64)
    width = min(rows, _HASH_CHUNK)
    buffer, scratch = np.empty(width, dtype=np.uint64), np.empty(width, dtype=np.uint64)
    for start in range(0, rows, _HASH_CHUNK):
        stop = min(rows, start + _HASH_CHUNK)
        size = stop - start
        out[start:stop] = _value_hashes_into(source, start, stop, buffer[:size], scratch[:size])
    return out


def combined_hashes(
    sources: Sequence[HashInput],
    rows: int,
    combinations: Sequence[Sequence[int]],
    outputs: Sequence[np.ndarray] | None = None,
) -> Sequence[np.ndarray]:
    """Per combination (positions in ``sources``), each row's hash of those columns'
    values in that order, as :func:`key_hash` combines a key's values (into ``outputs``
    when given, one array of ``rows`` per combination). A column in several combinations
    (a join key is also a column of the row) has its value hashes computed once, chunk by
    chunk."""
    if outputs is None:
        outputs = [np.empty(rows, dtype=np.uint64) for _ in combinations]
    needed = sorted({column for combination in combinations for column in combination})
    width = min(rows, _HASH_CHUNK)
    buffers = {column: np.empty(width, dtype=np.uint64) for column in needed}
    scratch_full = np.empty(width, dtype=np.uint64)
    for start in range(0, rows, _HASH_CHUNK):
        stop = min(rows, start + _HASH_CHUNK)
        size = stop - start
        scratch = scratch_full[:size]
        hashed = {
            column: _value_hashes_into(
                sources[column], start, stop, buffers[column][:size], scratch
            )
            for column in needed
        }
        for combination, output in zip(combinations, outputs, strict=True):
            acc = output[start:stop]
            if not combination:
                acc.fill(np.uint64(_SEED))
                continue
            np.bitwise_xor(hashed[combination[0]], _SEED_TIMES_PRIME, out=acc)
            _mix_in_place(acc, scratch)
            for column in combination[1:]:
                acc *= _PRIME_ARRAY
                acc ^= hashed[column]
                _mix_in_place(acc, scratch)
    return outputs


def value_hash(value: Any) -> int:
    """One key value's hash, as :func:`column_hashes` computes it for a column."""
    if value is None:
        return _NULL_HASH
    cls = value.__class__
    if cls is int or cls is bool:
        return _mix(int(value) & MASK)
    if cls is float:
        if value != value:
            return _mix(_NAN_BITS)
        bits: int = struct.unpack("<Q", struct.pack("<d", value + 0.0))[0]
        return _mix(bits)
    return _mix(hash(value) & MASK)


def key_hash(key: Key) -> int:
    """A key's hash, as :func:`key_hashes` computes it for each row of key columns."""
    h = _SEED
    for value in key:
        h = _mix(((h * _PRIME) & MASK) ^ value_hash(value))
    return h


def one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: its only chunk as it is (``combine_chunks`` would copy it,
    and each first use of fresh memory costs about as much as the hashing itself)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def hash_input(column: pa.Array | pa.ChunkedArray) -> HashInput:
    """``column`` made ready for :func:`value_hash` of each of its values."""
    column = one_array(column)
    kind = column.type
    nulls = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    if pa.types.is_uint64(kind):  # its values' bits are the Python ints' & MASK
        return HashInput(_numbers(column, 0).view(np.uint64), False, 0, nulls)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        ints = _numbers(pc.cast(column, pa.int64()), 0)
        return HashInput(ints.view(np.uint64), False, 0, nulls)
    if pa.types.is_floating(kind):
        floats = _numbers(pc.cast(column, pa.float64()), 0.0)
        bits = np.where(np.isnan(floats), np.uint64(_NAN_BITS), (floats + 0.0).view(np.uint64))
        return HashInput(bits.astype(np.uint64, copy=False), False, 0, nulls)
    return HashInput(distinct_hashes(column, value_hash, _NULL_HASH), True)


def distinct_hashes(column: pa.Array, hash_of: Callable[[Any], int], null_hash: int) -> np.ndarray:
    """``hash_of`` of every value of ``column`` as Python reads it (``to_pylist``), called
    once per distinct value: keys repeat (a join's foreign keys), and a Python call per row
    is most of the cost of hashing millions of them. NULLs hash to ``null_hash``."""
    try:
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a type Arrow cannot encode
        return np.fromiter(
            (null_hash if value is None else hash_of(value) for value in column.to_pylist()),
            dtype=np.uint64,
            count=len(column),
        )
    distinct = np.fromiter(
        (hash_of(value) for value in encoded.dictionary.to_pylist()),
        dtype=np.uint64,
        count=len(encoded.dictionary),
    )
    if not len(distinct):  # every value NULL
        return np.full(len(column), np.uint64(null_hash), dtype=np.uint64)
    hashes: np.ndarray = distinct[_numbers(encoded.indices, 0)]
    if column.null_count:
        hashes[column.is_null().to_numpy(zero_copy_only=False)] = np.uint64(null_hash)
    return hashes


def column_hashes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`value_hash` of every value of ``column``, vectorised for numbers."""
    return value_hashes(hash_input(column))


def _numbers(column: pa.Array, fill: float) -> np.ndarray:
    """A numeric column's values, NULLs as ``fill`` (hashed over separately)."""
    if column.null_count:
        column = column.fill_null(fill)
    values: np.ndarray = column.to_numpy(zero_copy_only=False)
    return values


def table_hashes(table: pa.Table, combinations: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """:func:`combined_hashes` of ``table``'s columns, record batch by record batch: a table
    gathered from many parts is hashed where it lies rather than copied into one array per
    column first."""
    if not table.num_columns:  # rows of no values: every combination is empty
        return [np.full(table.num_rows, _SEED, dtype=np.uint64) for _ in combinations]
    outputs = [np.empty(table.num_rows, dtype=np.uint64) for _ in combinations]
    start = 0
    for batch in table.to_batches():
        stop = start + batch.num_rows
        sources = [hash_input(column) for column in batch.columns]
        combined_hashes(
            sources, batch.num_rows, combinations, [output[start:stop] for output in outputs]
        )
        start = stop
    return outputs


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray], rows: int) -> np.ndarray:
    """:func:`key_hash` of each row of the key ``columns`` (``rows`` of them)."""
    sources = [hash_input(column) for column in columns]
    return combined_hashes(sources, rows, [range(len(sources))])[0]


def python_rows(table: pa.Table, float_columns: Sequence[int]) -> list[Row]:
    """A table's rows as the engine holds them: every float NaN the engine's one NaN (decoding
    makes a new NaN object each time, and NaN never equals itself), -0.0 as 0.0."""
    columns = [column.to_pylist() for column in table.columns]
    rows: list[Row] = list(zip(*columns, strict=True)) if columns else [()] * table.num_rows
    if float_columns and rows:
        rows = [_normalised(row, float_columns) for row in rows]
    return rows


def _normalised(row: Row, float_columns: Sequence[int]) -> Row:
    fixed = None
    for column in float_columns:
        value = row[column]
        if value is not None and (value != value or value == 0.0):
            if fixed is None:
                fixed = list(row)
            fixed[column] = NAN if value != value else 0.0
    return row if fixed is None else tuple(fixed)


def float_columns_of(schema: pa.Schema) -> tuple[int, ...]:
    return tuple(i for i, field in enumerate(schema) if pa.types.is_floating(field.type))


RADIX_KEYS = 1 << 16
"""Distinct values up to which :func:`stable_order` sorts their ranks (16-bit: numpy's radix
sort) rather than the values."""


def stable_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")``, sooner when the values repeat: a join side's
    rows share a few keys (10^7 orders, 1,000 customers), so each value's rank among the
    distinct values (found by hashing, not sorting) fits 16 bits, which numpy sorts by
    radix in linear time, against a merge sort of the 64-bit values (5x, measured at
    5·10^6 rows)."""
    if len(values) < RADIX_KEYS:
        return np.argsort(values, kind="stable")
    column = pa.array(values)
    distinct = pc.unique(column)
    if len(distinct) > RADIX_KEYS:
        return np.argsort(values, kind="stable")
    ranked = pa.array(np.sort(distinct.to_numpy()))
    ranks = pc.index_in(column, value_set=ranked).to_numpy().astype(np.uint16)
    order: np.ndarray = np.argsort(ranks, kind="stable")
    return order


_PREFIX_BITS = 16
"""The fewest leading bits of a row's hash :func:`arranged_order` packs beside its key's rank
and its position; with more distinct keys than leave room for them it sorts as before."""


def key_ranks(hashes: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct values of ``hashes`` in increasing order and each row's rank among them
    (found by hashing, not sorting: one dictionary encoding, then the few distinct values
    sorted); ``None`` when there are more than ``limit``."""
    encoded = pc.dictionary_encode(pa.array(hashes))
    distinct = encoded.dictionary.to_numpy()
    if len(distinct) > limit:
        return None
    by_value = np.argsort(distinct)
    rank_of = np.empty(len(distinct), dtype=np.int32)
    rank_of[by_value] = np.arange(len(distinct), dtype=np.int32)
    ranks: np.ndarray = rank_of[encoded.indices.to_numpy()]
    return distinct[by_value], ranks


def arranged_order(
    hashes: np.ndarray, row_hashes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order of the rows by key hash, then row hash (rows equal in both in any order),
    with the key hashes and the row hashes in that order.

    One sort of 64-bit words, each the key hash's rank among the distinct key hashes, the
    leading bits of the row hash and the row's position, from high to low: numpy sorts plain
    integers several times faster than it argsorts them (a vectorised quicksort, 30 ms
    against 210 ms for 5·10^6 rows), the position comes back out of the low bits, and the
    key hashes in order are each distinct hash repeated as often as its rank occurs. Rows
    whose packed bits tie but whose whole row hashes are out of order (they differ past the
    bits kept) are sorted again among themselves by the whole hash."""
    rows = len(hashes)
    if rows == 0:
        return np.zeros(0, dtype=np.int64), hashes.copy(), row_hashes.copy()
    index_bits = max(1, (rows - 1).bit_length())
    ranked = key_ranks(hashes, 1 << max(0, 64 - _PREFIX_BITS - index_bits))
    if ranked is None:
        by_row = np.argsort(row_hashes)
        order = by_row[stable_order(hashes[by_row])]
        return order, hashes[order], row_hashes[order]
    distinct, ranks = ranked
    rank_bits = (len(distinct) - 1).bit_length()
    packed = _packed(row_hashes, ranks, rank_bits, index_bits)
    packed.sort()
    np.bitwise_and(packed, np.uint64((1 << index_bits) - 1), out=packed)
    order = packed.view(np.int64)
    sorted_keys = np.repeat(distinct, np.bincount(ranks, minlength=len(distinct)))
    sorted_rows = row_hashes[order]
    same_key = sorted_keys[1:] == sorted_keys[:-1]
    if (same_key & (sorted_rows[1:] < sorted_rows[:-1])).any():
        # Runs of rows whose packed bits tied (same key, same leading row-hash bits).
        prefixes = sorted_rows >> np.uint64(rank_bits + index_bits)
        ties = same_key & (prefixes[1:] == prefixes[:-1])
        in_run = np.zeros(rows, dtype=bool)
        in_run[1:] |= ties
        in_run[:-1] |= ties
        positions = np.flatnonzero(in_run)
        starts = np.ones(rows, dtype=bool)
        starts[1:] = ~ties
        runs = np.cumsum(starts[positions])
        resorted = positions[np.lexsort((sorted_rows[positions], runs))]
        order[positions] = order[resorted]
        sorted_rows[positions] = sorted_rows[resorted]
    return order, sorted_keys, sorted_rows


def _packed(
    row_hashes: np.ndarray, ranks: np.ndarray, rank_bits: int, index_bits: int
) -> np.ndarray:
    """Per row: its rank in the top ``rank_bits``, its position in the low ``index_bits``,
    the leading bits of its row hash between. Built chunk by chunk into the one array, so
    that no whole-column temporaries are made (each first use of fresh memory costs about
    as much as the arithmetic)."""
    rows = len(row_hashes)
    packed = np.empty(rows, dtype=np.uint64)
    width = min(rows, _HASH_CHUNK)
    offsets = np.arange(width, dtype=np.uint64)
    scratch_full = np.empty(width, dtype=np.uint64)
    hash_shift, index_shift = np.uint64(rank_bits + index_bits), np.uint64(index_bits)
    rank_shift = np.uint64(64 - rank_bits)
    for start in range(0, rows, _HASH_CHUNK):
        stop = min(rows, start + _HASH_CHUNK)
        out, scratch = packed[start:stop], scratch_full[: stop - start]
        np.right_shift(row_hashes[start:stop], hash_shift, out=out)
        out <<= index_shift
        np.add(offsets[: stop - start], np.uint64(start), out=scratch)
        out |= scratch
        if rank_bits:
            scratch[:] = ranks[start:stop]
            scratch <<= rank_shift
            out |= scratch
    return packed


def _in_order(diffs: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``diffs[order]``, without the gather when every multiplicity is the same (a snapshot's
    rows are all inserted once)."""
    if len(diffs) and diffs.min() == diffs.max():
        return np.full(len(order), diffs[0], dtype=np.int64)
    ordered: np.ndarray = diffs[order]
    return ordered


class ColumnarBatch:
    """Rows with their multiplicities, consolidated, sorted by key hash; rows read out of the
    batch are marked dead rather than removed (the arrays are immutable)."""

    __slots__ = (
        "_alive",
        "_float_columns",
        "_key_of",
        "_path",
        "diffs",
        "hashes",
        "keys",
        "live_rows",
        "table",
    )

    def __init__(
        self,
        table: pa.Table,
        hashes: np.ndarray,
        diffs: np.ndarray,
        key_of: KeyFunction,
        float_columns: Sequence[int],
    ) -> None:
        self.table = table
        self.hashes = hashes
        self.diffs = diffs
        self._key_of = key_of
        self._float_columns = tuple(float_columns)
        self._alive: np.ndarray | None = None
        self._path: str | None = None
        self.live_rows: int = table.num_rows
        """Rows not yet read out (each a distinct row: the batch is consolidated)."""
        self.keys: int = int(np.count_nonzero(hashes[1:] != hashes[:-1])) + 1 if len(hashes) else 0
        """Keys not yet read out, counted by distinct hash (two keys sharing a 64-bit hash
        count once)."""

    @classmethod
    def build(
        cls,
        table: pa.Table,
        diffs: np.ndarray,
        hashes: np.ndarray,
        key_of: KeyFunction,
        row_hashes: np.ndarray | None = None,
    ) -> ColumnarBatch:
        """The batch of ``table``'s rows with multiplicities ``diffs`` whose keys hash to
        ``hashes`` (and whole rows to ``row_hashes``, computed here when not given): sorted
        by key hash, equal rows summed, rows summing to zero dropped.
        Equal rows are found by a second hash over whole rows (equal rows hash equally), so
        only rows whose (key hash, row hash) pair repeats are compared as Python values."""
        float_columns = float_columns_of(table.schema)
        diffs = np.asarray(diffs, dtype=np.int64)
        if row_hashes is None:
            (row_hashes,) = table_hashes(table, [range(table.num_columns)])
        order, sorted_keys, sorted_rows = arranged_order(hashes, row_hashes)
        sorted_diffs = _in_order(diffs, order)
        keep = sorted_diffs != 0
        repeats = (sorted_keys[1:] == sorted_keys[:-1]) & (sorted_rows[1:] == sorted_rows[:-1])
        if repeats.any():
            candidates = np.zeros(len(order), dtype=bool)
            candidates[1:] |= repeats
            candidates[:-1] |= repeats
            positions = np.flatnonzero(candidates)
            rows = python_rows(table.take(pa.array(order[positions])), float_columns)
            first: dict[Row, int] = {}
            totals: dict[Row, int] = {}
            for position, row, diff in zip(
                positions.tolist(), rows, sorted_diffs[positions].tolist(), strict=True
            ):
                if row in first:
                    keep[position] = False
                else:
                    first[row] = position
                totals[row] = totals.get(row, 0) + diff
            for row, position in first.items():
                sorted_diffs[position] = totals[row]
                keep[position] = totals[row] != 0
        if keep.all():  # the usual case: no copies
            return cls(
                table.take(pa.array(order)),
                sorted_keys,
                sorted_diffs,
                key_of,
                float_columns,
            )
        return cls(
            table.take(pa.array(order[keep])),
            sorted_keys[keep],
            sorted_diffs[keep],
            key_of,
            float_columns,
        )

    # -- reads -----------------------------------------------------------------------------

    def key_range(self, hashed: int) -> tuple[int, int]:
        """The positions of the rows whose key hashes to ``hashed``."""
        target = np.uint64(hashed)
        hashes = self.hashes
        return int(hashes.searchsorted(target, "left")), int(hashes.searchsorted(target, "right"))

    def live_in(self, lo: int, hi: int) -> int:
        """How many rows in ``[lo, hi)`` have not been read out."""
        if self._alive is None:
            return hi - lo
        return int(np.count_nonzero(self._alive[lo:hi]))

    def _find(self, key: Key, hashed: int) -> tuple[list[int], dict[Row, int]] | None:
        lo, hi = self.key_range(hashed)
        if lo == hi:
            return None
        alive = self._alive
        if alive is not None and not alive[lo:hi].any():
            return None
        rows = python_rows(self.table.slice(lo, hi - lo), self._float_columns)
        diffs = self.diffs[lo:hi].tolist()
        key_of = self._key_of
        positions: list[int] = []
        found: dict[Row, int] = {}
        for offset, row in enumerate(rows):
            if (alive is None or alive[lo + offset]) and key_of(row) == key:
                positions.append(lo + offset)
                found[row] = diffs[offset]
        return (positions, found) if positions else None

    def take(self, key: Key, hashed: int) -> dict[Row, int] | None:
        """The rows under ``key`` (hashing to ``hashed``), marked dead here; None when
        there are none."""
        found = self._find(key, hashed)
        if found is None:
            return None
        positions, rows = found
        if self._alive is None:
            self._alive = np.ones(len(self.hashes), dtype=bool)
        self._alive[positions] = False
        self.live_rows -= len(positions)
        self.keys -= 1
        return rows

    def items(self, key_of: KeyFunction | None = None) -> Iterator[tuple[Key, dict[Row, int]]]:
        """Every live key and its rows (for tests and diagnostics)."""
        key_of = key_of or self._key_of
        grouped: dict[Key, dict[Row, int]] = {}
        for start in range(0, self.table.num_rows, _CONVERT_ROWS):
            piece = self.table.slice(start, _CONVERT_ROWS)
            rows = python_rows(piece, self._float_columns)
            diffs = self.diffs[start : start + _CONVERT_ROWS].tolist()
            for offset, row in enumerate(rows):
                if self._alive is None or self._alive[start + offset]:
                    grouped.setdefault(key_of(row), {})[row] = diffs[offset]
        yield from grouped.items()

    # -- memory and disk -------------------------------------------------------------------

    @property
    def on_disk(self) -> bool:
        return self._path is not None

    @property
    def nbytes(self) -> int:
        """The bytes of its rows, hashes and multiplicities (in memory, or in its file once on
        disk; the dead marks, a byte a row, are not counted)."""
        return int(self.table.nbytes + self.hashes.nbytes + self.diffs.nbytes)

    def to_disk(self, directory: str | None) -> int:
        """Writes the batch to an Arrow IPC file in ``directory`` and memory-maps it back in
        place of the arrays in memory (the dead marks stay in memory); returns the bytes
        moved out of the heap."""
        held = self.nbytes
        fd, path = tempfile.mkstemp(prefix="tidemark-state-", suffix=".arrow", dir=directory)
        os.close(fd)
        whole = self.table.append_column(_HASH_COLUMN, pa.array(self.hashes)).append_column(
            _DIFF_COLUMN, pa.array(self.diffs)
        )
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, whole.schema) as writer:
                writer.write_table(whole)
            # The mapping stays open for as long as the arrays read from it are referenced.
            mapped = pa.ipc.open_file(pa.memory_map(path)).read_all()
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        width = self.table.num_columns
        self.table = mapped.select(list(range(width)))
        self.hashes = _zero_copy(mapped.column(width))
        self.diffs = _zero_copy(mapped.column(width + 1))
        self._path = path
        return held

    @property
    def file_bytes(self) -> int:
        return 0 if self._path is None else os.path.getsize(self._path)

    def close(self) -> None:
        """Deletes its file, if it has one (the mapping stays valid until the arrays go)."""
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            self._path = None


def _zero_copy(column: pa.ChunkedArray) -> np.ndarray:
    chunk = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    result: np.ndarray = chunk.to_numpy(zero_copy_only=True)
    return result


def build_keyed(
    table: pa.Table,
    diffs: np.ndarray,
    key_of: KeyFunction,
    key_columns: Sequence[int] | None,
    drop_null_keys: bool,
) -> ColumnarBatch | None:
    """The batch of ``table``'s rows arranged by ``key_of``. With ``key_columns`` (the key is
    those columns as they are) the keys are hashed from the columns, vectorised; otherwise
    each row's key is computed in Python. ``drop_null_keys`` leaves out rows whose key holds a
    NULL (a join never matches them). None when no row is left."""
    diffs = np.asarray(diffs, dtype=np.int64)
    chunks = table.column(0).num_chunks if table.num_columns else 0
    if chunks > 1 and table.num_rows < chunks * _HASH_CHUNK:
        # A staged table comes in thousands of small record batches: one array per column
        # makes hashing and taking cheaper than batch by batch. Parts read by a task come
        # in a few large chunks, which are not worth copying.
        table = table.combine_chunks()
    if key_columns is not None:
        if drop_null_keys and key_columns:
            nulls = np.zeros(table.num_rows, dtype=bool)
            for column in key_columns:
                if table.column(column).null_count:
                    nulls |= table.column(column).is_null().to_numpy(zero_copy_only=False)
            if nulls.any():
                table = table.filter(pa.array(~nulls))
                diffs = diffs[~nulls]
        # The key's columns are columns of the row too: each hashed once for both. The
        # table stays in its chunks (one per part read): hashing goes batch by batch and
        # the build's take gathers from the chunks into one array per column.
        hashes, row_hashes = table_hashes(table, [key_columns, range(table.num_columns)])
    else:
        keys = [key_of(row) for row in python_rows(table, float_columns_of(table.schema))]
        if drop_null_keys:
            kept = np.fromiter((None not in key for key in keys), dtype=bool, count=len(keys))
            if not kept.all():
                table = table.filter(pa.array(kept))
                diffs = diffs[kept]
                keys = [key for key in keys if None not in key]
        hashes = np.fromiter((key_hash(key) for key in keys), dtype=np.uint64, count=len(keys))
        row_hashes = None
    if table.num_rows == 0:
        return None
    batch = ColumnarBatch.build(table, diffs, hashes, key_of, row_hashes)
    return batch if batch.live_rows else None
