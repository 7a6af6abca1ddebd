"""``PostgresReader``: a PostgreSQL publication as a :class:`SourceReader`.

Offsets are ``(lsn, part)`` (:mod:`tidemark.sources.postgres.offsets`). The first batches are
the initial snapshot at the replication slot's consistent point, in parts; every later batch
holds whole upstream transactions and ends at the last one's commit end LSN. ``confirm``
becomes the slot's flush LSN, so PostgreSQL keeps exactly the WAL that ``replay`` may still
need.

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
from tidemark.sources.postgres import offsets
from tidemark.sources.postgres.offsets import FINAL_PART, STREAM_PART, decode_offset, encode_offset
from tidemark.sources.postgres.replication import Batch, Replication, format_lsn, is_disconnect
from tidemark.sources.postgres.upstream import ConnectionParams, UpstreamTable
from tidemark.sources.reader import Changes, SourceBatch, SourceReader

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
        self._queue: queue.Queue[SourceBatch | BaseException] = queue.Queue(QUEUE_DEPTH)
        self._thread: threading.Thread | None = None

    def schemas(self) -> Mapping[str, RelationSchema]:
        return {t.key: t.schema for t in self.tables}

    def position(self, offset: bytes) -> int:
        return decode_offset(offset)[0]

    async def start(self, resume_offset: bytes | None) -> None:
        resume = None if resume_offset is None else decode_offset(resume_offset)
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
            yield item

    async def replay(self, from_offset: bytes | None, to_offset: bytes) -> Changes:
        lsn, part = decode_offset(to_offset)
        if part != STREAM_PART:
            snapshot = await asyncio.to_thread(self.replication.replay_snapshot, lsn)
            parts = self._parts(snapshot)
            return parts[offsets.part_index(part, len(parts))]
        assert from_offset is not None, "the first batch is the snapshot"
        start = decode_offset(from_offset)[0]
        batch = await asyncio.to_thread(self.replication.replay, start, lsn)
        return batch.changes

    async def confirm(self, offset: bytes) -> None:
        self._confirmed = max(self._confirmed, decode_offset(offset)[0])

    async def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    # -- the replication thread -------------------------------------------------------------

    def _take(self) -> SourceBatch | BaseException | None:
        try:
            return self._queue.get(timeout=0.5)
        except queue.Empty:
            return None

    def _hand_over(self, item: SourceBatch | BaseException) -> bool:
        """Puts ``item`` on the queue, waiting for room; False once the reader is closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def _parts(self, snapshot: Batch) -> list[offsets.Part]:
        return offsets.snapshot_parts(snapshot, [t.key for t in self.tables])

    def _run(self, resume: tuple[int, int] | None) -> None:
        try:
            snapshot: Batch | None
            if resume is None:
                snapshot = self.replication.snapshot()
                start, done = snapshot.offset, 0
            else:
                start, done = resume
                # Mid-snapshot: make the snapshot's remaining parts (from a rebuilt one).
                snapshot = (
                    self.replication.replay_snapshot(start)
                    if done not in (STREAM_PART, FINAL_PART)
                    else None
                )
            if snapshot is not None:
                parts = self._parts(snapshot)
                log.info(
                    "postgres_snapshot",
                    slot=self.replication.slot,
                    lsn=format_lsn(snapshot.offset),
                    rows=snapshot.size,
                    parts=len(parts),
                    resumed_after_part=done,
                )
                marks = offsets.part_offsets(snapshot.offset, len(parts))
                for mark, part in list(zip(marks, parts, strict=True))[done:]:
                    if not self._hand_over(SourceBatch(mark, part)):
                        return
            self._follow(start)
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
                    if not self._hand_over(SourceBatch(encode_offset(batch.offset), batch.changes)):
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
