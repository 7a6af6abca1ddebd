"""Exactly-once ingestion of a :class:`~tidemark.sources.reader.SourceReader` into storage.

Storage compares and appends one collection at a time; a source writes several (one per
subsource, and its progress collection). The *binding protocol* makes the set of appends
exactly once all the same:

- **Binding first.** For each batch ``(previous, offset]`` the loop takes a write timestamp
  ``t`` from the oracle (the very first batch: the time the collections start at, see
  :meth:`Ingestion._record`) and appends, at ``t``, the progress collection's change (retract the
  old binding row, insert ``(offset, previous, t)``) with ``expected_upper``. That commit
  *defines* what time ``t`` holds: the batch, in every subsource.
- **Then the data.** Each subsource gets the batch's changes for it at ``t`` (an empty
  append for one without changes), with ``expected_upper``, moving its upper to ``t + 1``.
  Then the oracle's ``ApplyWrite(t)`` makes ``t`` readable, and the reader hears
  ``confirm(offset)``.
- **Recovery.** After a crash the latest binding row says ``(previous, offset]`` is bound to
  ``t``. Each subsource whose upper is still at or below ``t`` lacks exactly that batch (the
  next batch starts only after every subsource has the current one), which the reader
  re-derives (``replay``) and which is appended at ``t`` with ``expected_upper`` — a second
  process doing the same loses the compare, so nothing is doubled. Ingestion then resumes
  after ``offset``.
- **Time moves on without data.** Without a batch, all uppers (progress first) move to a
  fresh oracle write timestamp plus one as soon as the oracle's read timestamp reaches them
  (polled every ``read_poll_interval``: a write elsewhere was applied, and a read of the
  source at the new read timestamp would wait), and every ``advance_interval`` regardless.
  A read of a quiet source so waits about one poll, never for the next batch. Not before
  the first batch is recorded: a new source's first batch is its initial data (a snapshot),
  bound to the time its collections start at, and reads wait for it rather than see the
  source empty.

Any lost compare (another process wrote), lost lease or reader error ends :meth:`run` with an
exception; the caller starts over with a new reader, and recovery puts everything right.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import Capability, CollectionInfo, StorageClient
from tidemark.columnar import Row, frontier_bound, table_from_updates
from tidemark.errors import FailedPrecondition, NotFound, TidemarkError
from tidemark.logging import get_logger
from tidemark.sources.progress import Binding
from tidemark.sources.reader import Changes, SourceBatch, SourceReader

log = get_logger("tidemark.sources.ingest")

DEFAULT_ADVANCE_INTERVAL = 1.0
DEFAULT_READ_POLL_INTERVAL = 0.05


class CollectionClosed(FailedPrecondition):
    """A collection of the source is closed for writes (dropped)."""


@dataclass(frozen=True)
class IngestTargets:
    """Where a source's data goes: its progress collection and, per subsource name the
    reader uses, a collection (``outputs``); ``silent`` collections belong to the source but
    receive no data (a primary source item without data of its own), only upper moves."""

    progress: str
    outputs: Mapping[str, str]
    silent: tuple[str, ...] = ()

    def collections(self) -> list[str]:
        return [self.progress, *self.outputs.values(), *self.silent]


@dataclass
class IngestStats:
    batches: int = 0
    rows: int = 0
    advances: int = 0
    replayed: int = 0
    """Subsource appends made by recovery."""
    last_offset: bytes | None = None


BatchObserver = Callable[[SourceBatch, int], None]
"""Called after each batch is recorded, with the batch and its data time."""


class Ingestion:
    """One source's ingestion (see the module docstring); :meth:`run` until cancelled."""

    def __init__(
        self,
        *,
        name: str,
        reader: SourceReader,
        targets: IngestTargets,
        storage: StorageClient,
        oracle: OracleClient,
        timeline: str,
        holder: str,
        advance_interval: float = DEFAULT_ADVANCE_INTERVAL,
        read_poll_interval: float = DEFAULT_READ_POLL_INTERVAL,
        read_ts: Callable[[], Awaitable[int]] | None = None,
        lease_renew_every: float = 10.0,
        on_batch: BatchObserver | None = None,
    ) -> None:
        self.name = name
        self.reader = reader
        self.targets = targets
        self.storage = storage
        self.oracle = oracle
        self.timeline = timeline
        self.holder = holder
        self.advance_interval = advance_interval
        self.read_poll_interval = read_poll_interval
        self._read_ts = read_ts or (lambda: oracle.read_ts(timeline))
        self._advanced_at = time.monotonic()
        self.lease_renew_every = lease_renew_every
        self.on_batch = on_batch
        self.stats = IngestStats()
        self._write: dict[str, Capability] = {}
        self._held: list[Capability] = []
        """Every capability this run acquired and has not dropped yet."""
        self._upper: dict[str, int] = {}
        self._binding: Binding | None = None
        unknown = set(targets.outputs) - set(reader.schemas())
        if unknown:
            raise ValueError(f"source {name}: the reader makes no subsources {sorted(unknown)}")

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        """Recover, then ingest until cancelled or until something fails (raised)."""
        try:
            progress_read = await self._acquire()
            async with self.storage.keep_alive(
                list(self._write.values()), every=self.lease_renew_every
            ):
                await self._recover(progress_read)
                await self._drop(progress_read)
                resume = self._binding.offset if self._binding is not None else None
                await self.reader.start(resume)
                await self._ingest()
        finally:
            for capability in list(self._held):
                await self._drop(capability)
            self._write.clear()

    async def _acquire(self) -> Capability:
        """Write capabilities on every collection; the progress collection's read one."""
        progress_read: Capability | None = None
        for collection_id in self.targets.collections():
            pair = await self.storage.acquire(collection_id, self.holder)
            self._held.extend(c for c in (pair.read, pair.write) if c.usable)
            if not pair.write.usable:
                raise CollectionClosed(f"collection {collection_id} is closed for writes")
            self._write[collection_id] = pair.write
            if collection_id == self.targets.progress and pair.read.usable:
                progress_read = pair.read
            elif pair.read.usable:
                await self._drop(pair.read)
        if progress_read is None:
            raise CollectionClosed(f"progress collection {self.targets.progress} is unreadable")
        return progress_read

    async def _drop(self, capability: Capability) -> None:
        if capability in self._held:
            self._held.remove(capability)
        try:
            await self.storage.drop(capability)
        except (NotFound, TidemarkError) as exc:
            log.debug("source_capability_drop_failed", source=self.name, error=str(exc))

    # -- recovery -------------------------------------------------------------------------

    async def _recover(self, progress_read: Capability) -> None:
        progress_info = None
        for collection_id in self.targets.collections():
            info = await self.storage.describe(collection_id)
            upper = frontier_bound(info.upper)
            if upper is None:
                raise CollectionClosed(f"collection {collection_id} is closed for writes")
            self._upper[collection_id] = upper
            if collection_id == self.targets.progress:
                progress_info = info
        assert progress_info is not None
        self._binding = await self._read_binding(progress_read, progress_info)
        binding = self._binding
        if binding is None:
            log.info("source_recovered", source=self.name, binding=None)
            return
        lagging = {
            name: collection_id
            for name, collection_id in self.targets.outputs.items()
            if self._upper[collection_id] <= binding.bound_at
        }
        silent = [c for c in self.targets.silent if self._upper[c] <= binding.bound_at]
        if lagging:
            changes = await self.reader.replay(binding.previous, binding.offset)
            await asyncio.gather(
                *(
                    self._append(
                        c, _timed(changes.get(name, []), binding.bound_at), binding.bound_at
                    )
                    for name, c in lagging.items()
                )
            )
            self.stats.replayed += len(lagging)
        await asyncio.gather(*(self._append(c, [], binding.bound_at) for c in silent))
        if lagging or silent:
            await self.oracle.apply_write(self.timeline, binding.bound_at)
        log.info(
            "source_recovered",
            source=self.name,
            offset=self.reader.position(binding.offset),
            bound_at=binding.bound_at,
            replayed=sorted(lagging),
        )
        await self.reader.confirm(binding.offset)

    async def _read_binding(self, capability: Capability, info: CollectionInfo) -> Binding | None:
        upper = frontier_bound(info.upper)
        since = frontier_bound(info.since)
        assert upper is not None
        if since is None or since >= upper:
            # Nothing readable: a new collection (its since is its upper), or one whose
            # history ran away, which would lose the binding.
            if info.rows == 0:
                return None
            raise FailedPrecondition(
                f"source {self.name}: progress collection {info.collection_id} cannot be "
                f"read at {upper - 1} (since {since}), its binding is lost"
            )
        snapshot = await self.storage.snapshot(capability, upper - 1)
        rows = [row for row, count in snapshot.version().items() for _ in range(count)]
        if not rows:
            return None
        if len(rows) != 1:
            raise FailedPrecondition(
                f"source {self.name}: the progress collection holds {len(rows)} rows, not one"
            )
        return Binding.from_row(rows[0])

    # -- the loop -------------------------------------------------------------------------

    async def _ingest(self) -> None:
        batches = aiter(self.reader.batches())
        pending: asyncio.Task[SourceBatch] | None = None
        ended = False
        try:
            while True:
                if pending is None and not ended:
                    pending = asyncio.ensure_future(anext(batches))
                if pending is not None:
                    done, _ = await asyncio.wait({pending}, timeout=self._wait_seconds())
                else:
                    done = set()
                    await asyncio.sleep(self._wait_seconds())
                if not done:
                    # Not before the first batch (a snapshot, maybe): a read of a new source
                    # waits for its initial data rather than seeing it empty.
                    if self._binding is not None and await self._advance_due():
                        await self._advance()
                    continue
                assert pending is not None
                try:
                    batch = pending.result()
                except StopAsyncIteration:
                    log.info("source_upstream_ended", source=self.name)
                    ended = True  # keep time moving for readers
                    continue
                finally:
                    pending = None
                await self._record(batch)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    def _wait_seconds(self) -> float:
        if self.read_poll_interval > 0:
            return min(self.read_poll_interval, self.advance_interval)
        return self.advance_interval

    async def _advance_due(self) -> bool:
        """Whether to move the uppers now: ``advance_interval`` has passed since they last
        moved, or a read is waiting (the oracle's read timestamp has reached the uppers: a
        write elsewhere, e.g. to a table, was applied since)."""
        if time.monotonic() - self._advanced_at >= self.advance_interval:
            return True
        if self.read_poll_interval <= 0:
            return False
        return await self._read_ts() >= min(self._upper.values())

    async def _record(self, batch: SourceBatch) -> None:
        previous = self._binding
        first = previous is None
        if first:
            # The first batch (a snapshot, maybe) lands at the time the collections start
            # at: no read can have seen them there yet (their uppers have not passed it), so
            # no read ever sees the source without its initial data.
            t = max(self._upper.values())
        else:
            t = await self.oracle.write_ts(self.timeline)
        binding = Binding(
            batch.offset,
            previous.offset if previous is not None else None,
            t,
            self.reader.position(batch.offset),
        )
        progress_changes: list[tuple[Row, int, int]] = [(binding.row(), t, 1)]
        if previous is not None:
            progress_changes.append((previous.row(), t, -1))
        # The binding's commit defines what t holds; the data follows.
        await self._append(self.targets.progress, progress_changes, t)
        self._binding = binding
        appends = [
            self._append(c, _timed(batch.changes.get(name, []), t), t)
            for name, c in self.targets.outputs.items()
        ]
        appends += [self._append(c, [], t) for c in self.targets.silent]
        await asyncio.gather(*appends)
        await self.oracle.apply_write(self.timeline, t)
        await self.reader.confirm(batch.offset)
        self.stats.batches += 1
        self.stats.rows += batch.row_count()
        self.stats.last_offset = batch.offset
        if self.on_batch is not None:
            self.on_batch(batch, t)
        if first:
            await self._advance()  # reads that waited for the snapshot need no more

    async def _advance(self) -> None:
        """Every upper to a fresh write timestamp plus one, progress first."""
        self._advanced_at = time.monotonic()
        t = await self.oracle.write_ts(self.timeline)
        await self._append(self.targets.progress, [], t)
        others = [c for c in self.targets.collections() if c != self.targets.progress]
        await asyncio.gather(*(self._append(c, [], t) for c in others))
        self.stats.advances += 1

    async def _append(
        self, collection_id: str, updates: list[tuple[Row, int, int]], t: int
    ) -> None:
        """``updates`` (all at ``t``) and the upper to ``t + 1``, if the upper is still
        where this process left it (``FailedPrecondition`` otherwise)."""
        expected = self._upper[collection_id]
        if expected > t:
            raise FailedPrecondition(
                f"collection {collection_id}'s upper {expected} is already past time {t}"
            )
        started = time.monotonic()
        table = table_from_updates(await self.storage.schema(collection_id), updates)
        result = await self.storage.append_table(
            self._write[collection_id], table, t + 1, expected_upper=expected
        )
        upper = frontier_bound(result.upper)
        self._upper[collection_id] = t + 1 if upper is None else upper
        log.debug(
            "source_append",
            source=self.name,
            collection=collection_id,
            rows=len(updates),
            seconds=round(time.monotonic() - started, 4),
        )


def _timed(changes: list[tuple[Row, int]], t: int) -> list[tuple[Row, int, int]]:
    return [(row, t, diff) for row, diff in changes]


def changes_equal(a: Changes, b: Changes) -> bool:
    """Whether two change sets hold the same multiset of ``(row, diff)`` per subsource
    (after summing diffs), for tests of ``replay``."""
    return _summed(a) == _summed(b)


def _summed(changes: Changes) -> dict[str, dict[Row, int]]:
    out: dict[str, dict[Row, int]] = {}
    for name, pairs in changes.items():
        counts: dict[Row, int] = {}
        for row, diff in pairs:
            counts[row] = counts.get(row, 0) + diff
        kept = {row: count for row, count in counts.items() if count}
        if kept:
            out[name] = kept
    return out


class SharedReadTs:
    """The oracle's read timestamp for many ingestions polling it: one oracle call per
    ``max_age`` seconds, however many ask (a value at most that old only delays an advance
    by as much)."""

    def __init__(self, oracle: OracleClient, timeline: str, max_age: float) -> None:
        self.oracle = oracle
        self.timeline = timeline
        self.max_age = max_age
        self._value = 0
        self._at = -float("inf")
        self._lock = asyncio.Lock()

    async def __call__(self) -> int:
        if time.monotonic() - self._at < self.max_age:
            return self._value
        async with self._lock:
            if time.monotonic() - self._at >= self.max_age:
                self._value = await self.oracle.read_ts(self.timeline)
                self._at = time.monotonic()
            return self._value
