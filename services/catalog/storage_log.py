"""The catalog log on the storage service: one collection, ``s1``.

Each row is ``(key, kind, item)``: the item's key and kind in plain text (so that ``Describe``
and filtered reads are legible) and its canonical bytes, which are what the catalog compares.

The read capability is the log's critical one (holder :data:`LOG_HOLDER`; no lease, shared by
every catalog process): the since of the catalog's own history must never depend on a process
being alive, or a storage outage longer than the lease followed by a re-acquired write
capability (whose fresh read twin is dropped) would let it run away and the catalog could never
start again. The write capability is leased: this process renews it in the background and
re-acquires it when the service reports it gone (a crash or a long outage outlived its
lease); a re-acquired write capability starts at the current upper.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence

import pyarrow as pa

from services.catalog.items import Row, kind_of
from services.catalog.log import CatalogLog, LogFrontiers, LogReport, LogUpdate
from tidemark.cdc import CdcReader, Message, Updates
from tidemark.clients.catalog import CatalogUpperMismatch
from tidemark.clients.storage import Capability, StorageClient
from tidemark.columnar import ColumnType, RelationSchema, table_from_updates
from tidemark.columnar import Row as StorageRow
from tidemark.errors import (
    AlreadyExists,
    FailedPrecondition,
    Internal,
    PermissionDenied,
    TidemarkError,
)
from tidemark.frontier import Antichain
from tidemark.lattice import U64
from tidemark.logging import get_logger
from tidemark.rpc.identity import Identity
from tidemark.tasks import cancel_and_wait

logger = get_logger("tidemark.catalog.storage")

CATALOG_SCHEMA = RelationSchema.of(
    ("key", ColumnType.TEXT), ("kind", ColumnType.TEXT), ("item", ColumnType.BYTES)
)
MIN_RENEW_SECONDS = 0.5
LOG_HOLDER = "catalog-log"
"""The holder of the catalog log's critical read capability (not ``CATALOG_HOLDER``, whose
holds follow the catalog's items)."""


def _bound(frontier: Antichain[int], what: str) -> int:
    elements = frontier.elements
    if len(elements) != 1:
        raise Internal(
            f"the catalog collection's {what} is {{}}: its contents are gone (every read "
            "capability lapsed) or it was closed"
        )
    return elements[0]


def default_holder() -> str:
    return f"catalog {socket.gethostname()} pid {os.getpid()}"


class StorageCatalogLog(CatalogLog):
    def __init__(
        self, client: StorageClient, collection_id: str, *, holder: str | None = None
    ) -> None:
        self.client = client
        self.collection_id = collection_id
        self.holder = holder or default_holder()
        self._read: Capability | None = None
        self._write: Capability | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._renew_every = 10.0

    # -- capabilities ----------------------------------------------------------------------
    @property
    def read(self) -> Capability:
        if self._read is None:
            raise Internal("the catalog log is not open")
        return self._read

    @property
    def write(self) -> Capability:
        if self._write is None:
            raise Internal("the catalog log is not open")
        return self._write

    async def open(self) -> LogFrontiers:
        try:
            pair = await self.client.create(
                self.collection_id,
                CATALOG_SCHEMA,
                initial_frontier=0,
                holder=self.holder,
                critical_holder=LOG_HOLDER,
                # Only the catalog writes its log (checked when mTLS is on).
                writer=Identity("catalog").uri,
            )
            logger.info("catalog_collection_created", collection=self.collection_id)
        except AlreadyExists:
            pair = await self.client.acquire(self.collection_id, self.holder)
        try:
            # A log made before critical holds gets one now, at its since (if that is left).
            hold = await self.client.acquire_critical(self.collection_id, LOG_HOLDER)
        except FailedPrecondition:
            hold = pair.read  # the since is {}: _take reports the lost contents
        if pair.read.usable and hold is not pair.read:
            with contextlib.suppress(TidemarkError):
                await self.client.drop(pair.read)  # the hold keeps the since
        self._take(hold, pair.write)
        lease_left = (pair.write.lease_expires_ms - time.time() * 1000) / 1000
        self._renew_every = max(MIN_RENEW_SECONDS, lease_left / 4)
        self._keeper = asyncio.create_task(self._keep_leases(), name="catalog-leases")
        return LogFrontiers(
            _bound(self.read.frontier, "since"), _bound(self.write.frontier, "upper")
        )

    def _take(self, read: Capability | None, write: Capability | None) -> None:
        for capability in (read, write):
            if capability is not None and not capability.usable:
                _bound(capability.frontier, "since" if capability is read else "upper")
        self._read = read or self._read
        self._write = write or self._write

    async def _reacquire(self, *, read: bool, write: bool) -> None:
        """Fresh capabilities in place of lost ones (the service hands out both kinds; the
        one still held is kept and the new twin dropped)."""
        pair = await self.client.acquire(self.collection_id, self.holder)
        for wanted, fresh in ((read, pair.read), (write, pair.write)):
            if not wanted and fresh.usable:
                with contextlib.suppress(TidemarkError):
                    await self.client.drop(fresh)
        self._take(pair.read if read else None, pair.write if write else None)
        logger.warning("catalog_capabilities_reacquired", read=read, write=write)

    async def _keep_leases(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            try:
                result = await self.client.renew([self.read, self.write])
                gone = {capability_id for _, capability_id in result.missing}
                if gone:
                    await self._reacquire(read=self.read.id in gone, write=self.write.id in gone)
            except TidemarkError as exc:
                logger.warning("catalog_lease_renewal_failed", error=exc.message)

    # -- the log ---------------------------------------------------------------------------
    async def upper(self) -> int:
        info = await self.client.describe(self.collection_id)
        return _bound(info.upper, "upper")

    async def compare_and_append(
        self, updates: Sequence[LogUpdate], expected_upper: int, new_upper: int
    ) -> None:
        rows = []
        for data, time_, diff in updates:
            row = Row.decode(data)
            rows.append(((row.key, kind_of(row.item), data), time_, diff))
        table = table_from_updates(CATALOG_SCHEMA, rows)
        for attempt in range(2):
            try:
                await self._append(table, expected_upper, new_upper)
                return
            except PermissionDenied:
                # The write capability lapsed (e.g. storage was away longer than its lease):
                # nothing was appended with it, so a fresh one may try again.
                if attempt:
                    raise
                await self._reacquire(read=False, write=True)

    async def _append(self, table: pa.Table, expected_upper: int, new_upper: int) -> None:
        write = self.write
        held = _bound(write.frontier, "upper")
        if held > expected_upper:
            raise CatalogUpperMismatch(expected_upper, await self.upper())
        if held < expected_upper:
            # Another catalog process appended since this capability's last use: move it up
            # to the upper the append expects (the append itself checks that upper).
            self._write = write = await self.client.downgrade(write, expected_upper)
        try:
            result = await self.client.append(
                write, table, new_upper, expected_upper=expected_upper
            )
        except FailedPrecondition:
            current = await self.upper()
            if current != expected_upper:
                raise CatalogUpperMismatch(expected_upper, current) from None
            raise
        self._write = Capability(
            write.collection_id,
            write.id,
            write.kind,
            result.upper,
            write.lease_expires_ms,
            write.holder,
        )

    async def follow(self, as_of: int, *, snapshot: bool) -> AsyncIterator[LogReport]:
        reader: CdcReader[bytes, int] = CdcReader(U64)
        try:
            async for message in self.client.subscribe(
                self.read, as_of=as_of, snapshot=snapshot, columns=["item"]
            ):
                reports = reader.push(_item_bytes(message))
                for updates, frontier in reports:
                    yield LogReport(list(updates), _bound(frontier, "upper"))
        except PermissionDenied:
            await self._reacquire(read=True, write=False)
            raise

    async def downgrade_since(self, since: int) -> None:
        read = self.read
        if _bound(read.frontier, "since") < since:
            self._read = await self.client.downgrade(read, since)

    async def close(self) -> None:
        # The capabilities are deliberately kept: dropping the only read capability would let
        # the collection's since become {} and its contents be discarded.
        if self._keeper is not None:
            await cancel_and_wait(self._keeper)
            self._keeper = None


def _item_bytes(message: Message[StorageRow, int]) -> Message[bytes, int]:
    """A CDC message with rows ``(item,)`` as one with the item bytes as data."""
    if isinstance(message, Updates):
        return Updates([(row[0], time_, diff) for row, time_, diff in message.updates])
    return message
