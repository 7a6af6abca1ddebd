"""Batches in the blob store: one immutable Parquet object per batch, under a key no other
write will ever use, so a retried or concurrent write can never overwrite one.

Keys are made by :mod:`tidemark.part_keys`: their wall-clock milliseconds let the orphan
sweep tell an abandoned blob from one whose append is still in flight. Decoded tables are
cached: a blob never changes, so a cached copy is never stale.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from services.storage.state import StoredBatch
from tidemark.blob import Blob
from tidemark.columnar import from_parquet, to_parquet
from tidemark.errors import NotFound
from tidemark.part_keys import new_part_key, part_prefix
from tidemark.retry import RetryPolicy, retry_unavailable

# Encoding or decoding this many rows is worth a hop to a worker thread.
_THREAD_ROWS = 20_000


@dataclass(frozen=True)
class WrittenBatch:
    key: str
    rows: int
    bytes: int
    written_ms: int


@dataclass(frozen=True)
class EncodedBatch:
    """A batch ready to be stored: its key is chosen and its Parquet bytes are made."""

    table: pa.Table
    data: bytes
    written: WrittenBatch
    """What the batch will be once stored."""


class TableCache:
    """Least-recently-used decoded tables, bounded by their Arrow buffer sizes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> pa.Table | None:
        entry = self._tables.get(key)
        if entry is None:
            return None
        self._tables.move_to_end(key)
        return entry[0]

    def put(self, key: str, table: pa.Table) -> None:
        size = table.get_total_buffer_size()
        if size > self.max_bytes or key in self._tables:
            return
        self._tables[key] = (table, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, evicted) = self._tables.popitem(last=False)
            self._bytes -= evicted

    def discard(self, key: str) -> None:
        entry = self._tables.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]


class BatchStore:
    def __init__(
        self,
        blob: Blob,
        *,
        cache_bytes: int = 256 << 20,
        clock: Callable[[], int],
        retry: RetryPolicy | None = None,
    ) -> None:
        self.blob = blob
        self.cache = TableCache(cache_bytes)
        self.clock = clock
        self.retry = retry or RetryPolicy()

    async def write(self, collection_id: str, table: pa.Table) -> WrittenBatch:
        """Store ``table`` under a fresh key. Durable once this returns."""
        return await self.store(await self.encode(collection_id, table))

    async def encode(self, collection_id: str, table: pa.Table) -> EncodedBatch:
        """``table`` as the Parquet bytes of a new batch, under a fresh key (nothing stored)."""
        if table.num_rows >= _THREAD_ROWS:
            data = await asyncio.to_thread(to_parquet, table)
        else:
            data = to_parquet(table)
        now = self.clock()
        key = new_part_key(collection_id, now)
        return EncodedBatch(table, data, WrittenBatch(key, table.num_rows, len(data), now))

    async def store(self, batch: EncodedBatch) -> WrittenBatch:
        """Put an encoded batch in the blob store. Durable once this returns."""
        key, data = batch.written.key, batch.data
        await retry_unavailable(lambda: self.blob.put(key, data), self.retry, "the blob store")
        self.cache.put(key, batch.table)
        return batch.written

    def cached(self, key: str) -> pa.Table | None:
        """The batch stored under ``key`` if its table is in memory (written or read by this
        process and not evicted since), without waiting for anything."""
        return self.cache.get(key)

    async def read(self, key: str, schema: pa.Schema) -> pa.Table:
        """The batch stored under ``key``; ``NotFound`` if it is gone (garbage collected)."""
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        data = await retry_unavailable(lambda: self.blob.get(key), self.retry, "the blob store")
        if data is None:
            raise NotFound(f"batch {key} is no longer in the blob store")
        if len(data) > (1 << 20):
            table = await asyncio.to_thread(from_parquet, data, schema)
        else:
            table = from_parquet(data, schema)
        self.cache.put(key, table)
        return table

    def cached_batch(self, batch: StoredBatch) -> pa.Table | None:
        """:meth:`cached` of a whole batch: ``None`` unless every part is in memory."""
        tables = [self.cache.get(key) for key in batch.keys]
        if any(table is None for table in tables):
            return None
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)  # type: ignore[arg-type]

    async def read_batch(self, batch: StoredBatch, schema: pa.Schema) -> pa.Table:
        """Every part of ``batch`` as one table; ``NotFound`` if one is gone."""
        if not batch.more_parts:
            return await self.read(batch.key, schema)
        tables = await asyncio.gather(*(self.read(key, schema) for key in batch.keys))
        return pa.concat_tables(tables)

    async def delete(self, key: str) -> None:
        self.cache.discard(key)
        await retry_unavailable(lambda: self.blob.delete(key), self.retry, "the blob store")

    async def keys(self, collection_id: str) -> list[str]:
        prefix = part_prefix(collection_id)
        return await retry_unavailable(lambda: self.blob.list(prefix), self.retry, "the blob store")
