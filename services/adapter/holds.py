"""The storage capabilities this adapter process holds.

Reading a collection (a storage snapshot, or a one-shot peek on compute) needs a read
capability, and writing a table or advancing its upper a write capability. Each adapter process
acquires its own pair per collection the first time it needs one (``AcquireCapabilities``),
renews their leases in the background, and moves its read capabilities forward to keep
``history`` behind the current read timestamp, so that ``AS OF`` can read that far back while
storage compacts older times. A dropped collection's capabilities are released.

Appends to one collection through this process go one at a time (``append_lock``): an append
retried with its idempotency token is recognised only if it was the capability's last one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemark.clients.storage import Capability, CapabilityPair, StorageClient, renewal_wait
from tidemark.columnar.updates import frontier_bound
from tidemark.errors import FailedPrecondition, NotFound, PermissionDenied, TidemarkError
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait

log = get_logger("services.adapter.holds")


@dataclass
class _Held:
    read: Capability
    write: Capability


class CollectionGone(NotFound):
    """The collection has been dropped (its frontiers are closed)."""


class HistoryLost(CollectionGone):
    """The collection is still open for writes, but its since ran away to ``{}``: it cannot
    be read at any time (its history is lost; see ``ALTER MATERIALIZED VIEW … REBUILD``)."""


class CollectionHolds:
    """Read and write capabilities per collection, for this process (``holder``)."""

    def __init__(
        self,
        storage: StorageClient,
        holder: str,
        *,
        history_ms: int,
        renew_every: float = 10.0,
        read_ts: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.storage = storage
        self.holder = holder
        self.history_ms = history_ms
        self.renew_every = renew_every
        self._lease_ms = 0  # storage's lease length, once a renewal has said it
        # Set when a capability is taken before any renewal has said the lease's length.
        self._lease_unknown = asyncio.Event()
        self._read_ts = read_ts
        self._held: dict[str, _Held] = {}
        self._acquiring: dict[str, asyncio.Lock] = {}
        self._append_locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # -- capabilities ---------------------------------------------------------------------

    async def _pair(self, collection_id: str) -> _Held:
        held = self._held.get(collection_id)
        if held is not None:
            return held
        lock = self._acquiring.setdefault(collection_id, asyncio.Lock())
        async with lock:
            held = self._held.get(collection_id)
            if held is not None:
                return held
            pair = await self.storage.acquire(collection_id, self.holder)
            if not pair.read.usable and not pair.write.usable:
                # Under mTLS this process gets no write capability on a view's output (its
                # cluster is the writer): an upper still open tells a lost history apart.
                if await self._upper_open(collection_id):
                    raise HistoryLost(
                        f"collection {collection_id} has lost its history (since {{}})"
                    )
                raise CollectionGone(f"collection {collection_id} has been dropped")
            held = _Held(pair.read, pair.write)
            self._keep(collection_id, held)
            return held

    async def _upper_open(self, collection_id: str) -> bool:
        try:
            return not (await self.storage.describe(collection_id)).upper.is_empty()
        except NotFound:
            return False

    async def read(self, collection_id: str) -> Capability:
        """This process's read capability on ``collection_id``."""
        held = await self._pair(collection_id)
        if not held.read.usable:
            if held.write.usable:
                raise HistoryLost(f"collection {collection_id} has lost its history (since {{}})")
            raise CollectionGone(f"collection {collection_id} can no longer be read")
        return held.read

    async def write(self, collection_id: str) -> Capability:
        """This process's write capability on ``collection_id``."""
        held = await self._pair(collection_id)
        if not held.write.usable:
            raise FailedPrecondition(f"collection {collection_id} is closed for writes")
        return held.write

    def adopt(self, pair: CapabilityPair) -> None:
        """Keep the capabilities ``Create`` returned for a new collection."""
        self._keep(pair.read.collection_id, _Held(pair.read, pair.write))

    def _keep(self, collection_id: str, held: _Held) -> None:
        self._held[collection_id] = held
        if not self._lease_ms:
            self._lease_unknown.set()

    def forget(self, collection_id: str) -> None:
        """Stop using the collection's capabilities (storage no longer knows them)."""
        self._held.pop(collection_id, None)

    def append_lock(self, collection_id: str) -> asyncio.Lock:
        return self._append_locks.setdefault(collection_id, asyncio.Lock())

    def held_ids(self) -> list[str]:
        return list(self._held)

    async def release(self, collection_id: str) -> None:
        """Drop this process's capabilities on the collection (it was dropped)."""
        held = self._held.pop(collection_id, None)
        self._append_locks.pop(collection_id, None)
        if held is None:
            return
        for capability in (held.read, held.write):
            if capability.usable:
                with contextlib.suppress(TidemarkError):
                    await self.storage.drop(capability)

    # -- background upkeep ----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._upkeep(), name="adapter-holds")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _upkeep(self) -> None:
        while True:
            await self._until_renewal()
            try:
                await self.renew()
                await self.downgrade_reads()
            except asyncio.CancelledError:
                raise
            except TidemarkError as exc:
                log.warning("capability_upkeep_failed", error=exc.message)
            except Exception as exc:
                log.exception("capability_upkeep_crashed", error=str(exc))

    async def _until_renewal(self) -> None:
        """Waits for the next renewal: ``renewal_wait`` once storage has said its lease's
        length; until then, only until a capability is taken, which is renewed at once to
        learn it (storage's lease may be shorter than ``renew_every``: waiting that long
        first could let the new capability expire)."""
        wait = renewal_wait(self.renew_every, self._lease_ms)
        if self._lease_ms:
            await asyncio.sleep(wait)
            return
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # arrives just as the event is set, and close() would then wait on a loop that goes on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._lease_unknown.wait()
        self._lease_unknown.clear()

    async def renew(self) -> None:
        capabilities = [
            capability
            for held in self._held.values()
            for capability in (held.read, held.write)
            if capability.usable
        ]
        if not capabilities:
            return
        result = await self.storage.renew(capabilities)
        self._lease_ms = result.lease_ms or self._lease_ms
        for collection_id, _ in result.missing:
            # Expired or dropped: acquire afresh next time it is needed.
            self._held.pop(collection_id, None)

    async def downgrade_reads(self) -> None:
        """Move read capabilities up to ``history`` behind the current read timestamp."""
        if self._read_ts is None:
            return
        target = await self._read_ts() - self.history_ms
        # Move a hold only once it lags by a good step: one call per step, not per pass.
        slack = min(60_000, self.history_ms // 10)
        for collection_id, held in list(self._held.items()):
            current = frontier_bound(held.read.frontier)
            if current is None or current >= target - slack or not held.read.usable:
                continue
            try:
                held.read = await self.storage.downgrade(held.read, target)
            except (PermissionDenied, NotFound):
                self._held.pop(collection_id, None)
            except TidemarkError as exc:
                log.warning(
                    "read_hold_downgrade_failed", collection=collection_id, error=exc.message
                )
