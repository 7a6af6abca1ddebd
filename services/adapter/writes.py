"""Appending a statement's or a transaction's writes to a table.

A write lands at ``w = WriteTs(data)``: the rows are appended at time ``w`` with
``new_upper = w + 1`` and ``expected_upper`` = the table's upper ``U`` (which must be at most
``w``), through this adapter's write capability. If the upper moved, the append fails without
effect: look again, and if the upper passed ``w`` take a new ``w``. ``ApplyWrite(w)`` happens
before the reply, so every later read anywhere sees the write.

A write that depends on reads made at ``r`` (UPDATE, DELETE, INSERT ... SELECT, a
read-then-write transaction) is valid only if what it read is unchanged at ``w - 1``:

- the written table: it must hold no update in ``(r, U)``, and the append's
  ``expected_upper = U`` makes sure nothing lands in ``[U, w)`` either;
- every other collection read: its upper is moved to at least ``w`` (so its contents at
  ``w - 1`` are final), and it must hold no update in ``(r, w)``.

"No update" is checked with the batch list first (no batch with rows in that interval); a
batch that may hold some (e.g. one merged by compaction across ``r``) is settled by comparing
the contents at both times. A change, or history compacted past ``r``, is a serialization
failure (SQLSTATE 40001): the client retries the transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

import pyarrow as pa

from services.adapter.holds import CollectionHolds
from services.adapter.results import SERIALIZATION_FAILURE
from services.adapter.sql.errors import SqlError
from services.adapter.timestamps import Timestamps
from tidemark.clients.storage import StorageClient
from tidemark.columnar import RelationSchema, Row, table_from_updates
from tidemark.columnar.updates import frontier_bound, with_time
from tidemark.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from tidemark.logging import get_logger

log = get_logger("services.adapter.writes")

# Lost races before a write gives up (each one means another writer got in first).
MAX_ATTEMPTS = 200

UpperWaiter = Callable[[str, int], Awaitable[None]]
"""Waits until a collection the adapter does not advance itself (a source) reaches an upper."""


@dataclass(frozen=True)
class ReadSet:
    """What a write depended on: the data time of its reads, and the storage collections
    whose contents those reads were computed from, split by who advances them."""

    read_ts: int
    tables: frozenset[str]
    others: frozenset[str] = frozenset()

    @property
    def collections(self) -> frozenset[str]:
        return self.tables | self.others


class SerializationFailure(SqlError):
    def __init__(self, message: str) -> None:
        super().__init__(
            SERIALIZATION_FAILURE,
            f"could not serialize access due to concurrent update: {message}",
            hint="the transaction had no effect; retry it",
        )


class TableWriter:
    """Appends rows to tables; see the module docstring."""

    def __init__(
        self,
        timestamps: Timestamps,
        storage: StorageClient,
        holds: CollectionHolds,
        wait_for_upper: UpperWaiter | None = None,
    ) -> None:
        self.timestamps = timestamps
        self.storage = storage
        self.holds = holds
        self.wait_for_upper = wait_for_upper

    async def write(
        self,
        table_id: str,
        schema: RelationSchema,
        rows: Collection[tuple[Row, int]],
        reads: ReadSet | None = None,
    ) -> int:
        """Append ``rows`` (``(row, diff)``) to the table; returns the write timestamp."""
        try:
            updates = table_from_updates(schema, [(row, 0, diff) for row, diff in rows])
        except InvalidArgument as exc:
            raise SqlError("22023", f"cannot store the rows: {exc.message}") from None
        return await self.write_updates(table_id, updates, reads)

    async def write_updates(
        self, table_id: str, updates: pa.Table, reads: ReadSet | None = None
    ) -> int:
        """Append an update batch of the table's schema (its times are replaced by the write
        timestamp) as one write; returns the write timestamp."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            w = await self.timestamps.write_ts()
            upper = await self._upper_at_most(table_id, w)
            if upper is None:
                continue  # the upper passed w: take a newer timestamp
            if reads is not None:
                await self._validate(table_id, upper, w, reads)
            capability = await self.holds.write(table_id)
            async with self.holds.append_lock(table_id):
                try:
                    result = await self.storage.append_table(
                        capability, with_time(updates, w), w + 1, expected_upper=upper
                    )
                except PermissionDenied:
                    self.holds.forget(table_id)  # the lease lapsed: acquire afresh
                    continue
                except FailedPrecondition as exc:
                    log.debug("write_lost_race", table=table_id, attempt=attempt, error=exc.message)
                    continue
            self.timestamps.saw_upper(table_id, result.upper)
            await self.timestamps.apply_write(w)
            return w
        raise SqlError(
            SERIALIZATION_FAILURE,
            f"gave up writing to {table_id} after {MAX_ATTEMPTS} lost races with other writers",
            hint="retry the statement",
        )

    async def _upper_at_most(self, table_id: str, w: int) -> int | None:
        """The table's current upper if it is at most ``w``, else ``None``."""
        upper = await self.timestamps.upper(table_id)
        if upper is None:
            raise SqlError("42P01", f"table {table_id} has been dropped")
        return upper if upper <= w else None

    # -- validation of read-then-write ----------------------------------------------------

    async def _validate(self, table_id: str, upper: int, w: int, reads: ReadSet) -> None:
        r = reads.read_ts
        checks = []
        if table_id in reads.collections and upper - 1 > r:
            checks.append(self._unchanged(table_id, r, upper - 1))
        for other in reads.collections - {table_id}:
            checks.append(self._settled_and_unchanged(other, r, w, other in reads.tables))
        if checks:
            await asyncio.gather(*checks)

    async def _settled_and_unchanged(self, collection_id: str, r: int, w: int, table: bool) -> None:
        if table:
            await self.timestamps.advance_table(collection_id, w)
        elif self.wait_for_upper is not None:
            await self.wait_for_upper(collection_id, w)
        await self._unchanged(collection_id, r, w - 1)

    async def _unchanged(self, collection_id: str, r: int, t: int) -> None:
        """Raise ``SerializationFailure`` unless the collection is the same at ``t`` as at
        ``r`` (``r < t``, both complete)."""
        info = await self.storage.describe(collection_id)
        suspects = [
            batch
            for batch in info.batches
            if batch.rows > 0
            and (frontier_bound(batch.lower) or 0) <= t
            and (frontier_bound(batch.upper) is None or (frontier_bound(batch.upper) or 0) > r + 1)
        ]
        if not suspects:
            return
        capability = await self.holds.read(collection_id)
        try:
            before, after = await asyncio.gather(
                self.storage.snapshot(capability, r), self.storage.snapshot(capability, t)
            )
        except FailedPrecondition as exc:
            raise SerializationFailure(
                f"the history of {collection_id} at {r} is no longer available ({exc.message})"
            ) from None
        if before.version() != after.version():
            raise SerializationFailure(f"{collection_id} changed after {r}")
