"""Update batches as bytes: Arrow IPC streams on the wire, Parquet files at rest."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.errors import InvalidArgument

# Fast to write and read, and compact; storage batches are written once and read many times.
# Spark's reader scans zstd parts as fast as snappy ones (TPC-H lineitem, measured alternating
# the two), and zstd's are about a fifth smaller. Not "lz4": Spark's reader rejects the LZ4
# pages Arrow writes.
PARQUET_COMPRESSION = "zstd"
# Decimals of up to 18 digits as INT32/INT64 rather than fixed-length big-endian bytes: Spark's
# vectorized reader and Arrow's both read them as plain integers, far faster (TPC-H Q6's scan
# by Spark took half the time), and the files are a little smaller. The decimal logical type
# (precision, scale) is kept, so readers see the same decimal column either way: parts written
# before this, with bytes, stay readable side by side with new ones.
DECIMALS_AS_INTEGERS = True
# Below this many rows compression saves a few bytes and costs more time than the rest of the
# write (setting up the codec): small batches are stored uncompressed.
COMPRESS_FROM_ROWS = 4096


def to_ipc(table: pa.Table, *, compress: bool = False) -> bytes:
    """One Arrow IPC stream holding ``table`` (schema included, even when empty); with
    ``compress``, its buffers LZ4-compressed (readers decompress them transparently)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4" if compress else None)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(data: bytes) -> pa.Table:
    """The table an Arrow IPC stream holds; ``InvalidArgument`` if it is not one."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(data)) as reader:
            return reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidArgument(f"not an Arrow IPC stream: {exc}") from None


THREADED_READ_BYTES = 1 << 20
"""A Parquet file larger than this is decoded by Arrow's thread pool (``from_parquet``)."""

ROW_GROUP_ROWS = 1 << 20
"""Rows per Parquet row group: a reader can take a part's row groups apart (Spark slices).
Smaller groups (2^17, 2^18 rows) scanned no faster by Spark and made larger files (a
dictionary per group); the parts source slices a part by this figure."""


def to_parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    if table.num_rows >= COMPRESS_FROM_ROWS:
        pq.write_table(
            table,
            sink,
            compression=PARQUET_COMPRESSION,
            row_group_size=ROW_GROUP_ROWS,
            store_decimal_as_integer=DECIMALS_AS_INTEGERS,
        )
    else:
        # A small file is written on the append's path and read back whole: dictionaries and
        # column statistics only cost time there (a fifth of the write) and bytes.
        pq.write_table(
            table,
            sink,
            compression="none",
            row_group_size=ROW_GROUP_ROWS,
            use_dictionary=False,
            write_statistics=False,
            store_decimal_as_integer=DECIMALS_AS_INTEGERS,
        )
    return bytes(sink.getvalue().to_pybytes())


def from_parquet(data: bytes, schema: pa.Schema | None = None) -> pa.Table:
    """The table a Parquet file holds, with ``schema`` if given (the file must match it)."""
    # Read as one file: pq.read_table goes through the dataset layer, which costs about 1 ms
    # more per file whatever its size (a 10-row part 1.22 -> 0.21 ms, 1,000 rows 1.37 -> 0.41
    # ms), and storage reads every part it compacts. Arrow's threads only pay off on large
    # files. A file whose schema is not the one asked for still goes through read_table,
    # which reconciles the two.
    with pq.ParquetFile(pa.BufferReader(data), pre_buffer=False) as source:
        if schema is None or source.schema_arrow.equals(schema):
            return source.read(use_threads=len(data) > THREADED_READ_BYTES)
    return pq.read_table(pa.BufferReader(data), schema=schema)
