"""Key-partitioned updates staged in the blob store, from a Spark job to the resident tasks.

Bulk hydration computes each stateful operator's input with Spark; the executors store it
here as Arrow IPC objects: each Spark partition's rows as one object that every task reads,
keeping the rows its shard owns (:func:`piece_key`), or, for a computed key, each shard's
share, routed by Spark's shuffle, as one object that the resident task of that shard reads
(:func:`object_key`). Only the objects' keys pass through the driver.

Objects live under ``hydration/<dataflow digest>/<run>/``, a prefix no part of any collection
uses; the driver deletes a run's prefix once its tasks have loaded it (or the run failed).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from services.compute.dataflow.batch import Row
from services.compute.dataflow.operators.linear import Normalize

PREFIX = "hydration/"


def run_prefix(dataflow_id: str) -> str:
    """A fresh prefix for one hydration of ``dataflow_id`` (dataflow ids may hold characters
    keys may not, so a digest names it)."""
    digest = hashlib.sha256(dataflow_id.encode()).hexdigest()[:24]
    return f"{PREFIX}{digest}/{secrets.token_hex(8)}/"


def object_key(prefix: str, tag: int, shard: int) -> str:
    return f"{prefix}t{tag}/s{shard}.arrows"


def piece_key(prefix: str, tag: int, piece: int) -> str:
    """The object holding one Spark partition's rows of input ``tag``, every shard's."""
    return f"{prefix}t{tag}/p{piece}.arrows"


def encode(tables: Sequence[pa.Table]) -> bytes:
    """One IPC stream holding ``tables`` (of one schema) in order. Not compressed: the
    staged rows are read once, soon, and Spark's shuffle compresses what it moves."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)
    return bytes(sink.getvalue())


def concatenated(streams: Sequence[bytes]) -> bytes:
    """Several encoded streams as one object, without decoding them: each behind its
    length."""
    return b"".join(len(stream).to_bytes(8, "little") + stream for stream in streams)


def decode(data: bytes) -> pa.Table:
    """The rows of a :func:`concatenated` object, as one table."""
    tables = []
    view = memoryview(data)
    position = 0
    while position < len(view):
        length = int.from_bytes(view[position : position + 8], "little")
        position += 8
        piece = pa.py_buffer(view[position : position + length])
        with pa.ipc.open_stream(pa.BufferReader(piece)) as reader:
            tables.append(reader.read_all())
        position += length
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]


def rows_and_diffs(table: pa.Table, normalize: Normalize) -> tuple[list[Row], list[int]]:
    """The rows (every column but the last, as the engine holds values) and the diffs (the
    last column) of a staged table."""
    width = table.num_columns - 1
    columns = [table.column(i).to_pylist() for i in range(width)]
    rows: list[Row] = list(zip(*columns, strict=True)) if columns else [()] * table.num_rows
    if normalize.float_columns:
        rows = [normalize.row(row) for row in rows]
    return rows, table.column(width).to_pylist()


def put_all(blob_url: str, objects: Mapping[str, bytes], environment: Mapping[str, str]) -> None:
    os.environ.update(environment)
    asyncio.run(_put_all(blob_url, objects))


def get_all(blob_url: str, keys: Sequence[str], environment: Mapping[str, str]) -> list[bytes]:
    os.environ.update(environment)
    fetched: list[bytes] = []
    # The objects come back through a list, not as the main coroutine's result: leaving
    # ``asyncio.run`` in the main thread, Python 3.11 formats the repr of its SIGINT handler,
    # which holds the finished main task and so its result (1.3 s for 160 MB of bytes).
    asyncio.run(_get_all(blob_url, keys, fetched))
    return fetched


async def delete_prefix(blob_url: str, prefix: str) -> int:
    """Deletes every object under ``prefix``; how many there were."""
    from tidemark.blob import open_blob

    async with await open_blob(blob_url) as blob:
        keys = await blob.list(prefix)
        await asyncio.gather(*(blob.delete(key) for key in keys))
    return len(keys)


async def _put_all(blob_url: str, objects: Mapping[str, bytes]) -> None:
    from tidemark.blob import open_blob

    async with await open_blob(blob_url) as blob:
        await asyncio.gather(*(blob.put(key, data) for key, data in objects.items()))


async def _get_all(blob_url: str, keys: Iterable[str], into: list[bytes]) -> None:
    from tidemark.blob import open_blob

    chosen = list(keys)
    async with await open_blob(blob_url) as blob:
        into.extend(await asyncio.gather(*(blob.get_existing(key) for key in chosen)))
