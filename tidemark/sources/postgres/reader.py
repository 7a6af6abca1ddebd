"""``PostgresReader``: a PostgreSQL publication as a :class:`SourceReader`.

Offsets are LSNs (8 bytes, big-endian). The first batch is the initial snapshot at the
replication slot's consistent point; every later batch holds whole upstream transactions and
ends at the last one's commit end LSN. ``confirm`` becomes the slot's flush LSN, so
PostgreSQL keeps exactly the WAL that ``replay`` may still need.

The replication protocol runs on a thread of its own (psycopg2 blocks). When the upstream
goes away (a restart, a dropped connection) the thread reconnects with backoff and resumes
after the last batch it handed over, which the slot still holds: nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Mapping

from tidemark.columnar import RelationSchema
from tidemark.logging import get_logger
from tidemark.sources.postgres.replication import Batch, Replication, format_lsn, is_disconnect
from tidemark.sources.postgres.upstream import ConnectionParams, UpstreamTable
from tidemark.sources.reader import Changes, SourceBatch, SourceReader, decode_u64, encode_u64

log = get_logger("tidemark.sources.postgres")

RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
# Batches handed over but not yet taken: the thread waits (and PostgreSQL buffers) beyond.
QUEUE_DEPTH = 4


class PostgresReader(SourceReader):
    def __init__(
        self,
        params: ConnectionParams,
        publication: str,
        slot: str,
        tables: list[UpstreamTable],
    ) -> None:
        self.replication = Replication(params, publication, slot, tables)
        self.tables = tables
        self._confirmed = 0
        self._stop = threading.Event()
        self._queue: queue.Queue[Batch | BaseException] = queue.Queue(QUEUE_DEPTH)
        self._thread: threading.Thread | None = None

    def schemas(self) -> Mapping[str, RelationSchema]:
        return {t.key: t.schema for t in self.tables}

    async def start(self, resume_offset: bytes | None) -> None:
        resume = None if resume_offset is None else decode_u64(resume_offset)
        self._thread = threading.Thread(
            target=self._run, args=(resume,), name="postgres-replication", daemon=True
        )
        self._thread.start()

    async def batches(self) -> AsyncIterator[SourceBatch]:
        while True:
            item = await asyncio.to_thread(self._take)
            if item is None:
                continue
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Batch)
            yield SourceBatch(encode_u64(item.offset), item.changes)

    async def replay(self, from_offset: bytes | None, to_offset: bytes) -> Changes:
        end = decode_u64(to_offset)
        if from_offset is None:
            batch = await asyncio.to_thread(self.replication.replay_snapshot, end)
        else:
            batch = await asyncio.to_thread(self.replication.replay, decode_u64(from_offset), end)
        return batch.changes

    async def confirm(self, offset: bytes) -> None:
        self._confirmed = max(self._confirmed, decode_u64(offset))

    async def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    # -- the replication thread -------------------------------------------------------------

    def _take(self) -> Batch | BaseException | None:
        try:
            return self._queue.get(timeout=0.5)
        except queue.Empty:
            return None

    def _hand_over(self, item: Batch | BaseException) -> bool:
        """Puts ``item`` on the queue, waiting for room; False once the reader is closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, resume: int | None) -> None:
        try:
            if resume is None:
                snapshot = self.replication.snapshot()
                log.info(
                    "postgres_snapshot",
                    slot=self.replication.slot,
                    lsn=format_lsn(snapshot.offset),
                    rows=snapshot.size,
                )
                if not self._hand_over(snapshot):
                    return
                resume = snapshot.offset
            self._follow(resume)
        except BaseException as error:  # handed to the ingestion, which starts over
            self._hand_over(error)

    def _follow(self, start: int) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                for batch in self.replication.stream(
                    start, lambda: self._confirmed, self._stop.is_set
                ):
                    failures = 0
                    if not self._hand_over(batch):
                        return
                    start = batch.offset
                return
            except Exception as error:
                if not is_disconnect(error):
                    raise
                failures += 1
                pause = min(RETRY_MAX_S, RETRY_INITIAL_S * 2 ** (failures - 1))
                log.warning(
                    "postgres_disconnected",
                    slot=self.replication.slot,
                    resume=format_lsn(start),
                    retry_in=pause,
                    error=str(error).strip(),
                )
                time.sleep(pause)
