"""The storage service in Python terms: collections, capabilities, appends and reads.

:class:`StorageCore` puts the pieces together (shard states in consensus, batches in the blob
store, the watch, compaction, garbage collection) and implements each API call; the gRPC
servicer (:mod:`services.storage.service`) only translates messages. Several processes may
serve the same consensus and blob store: everything they decide goes through compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from services.storage import metrics, operations
from services.storage.batches import BatchStore, EncodedBatch
from services.storage.compaction import Compactor
from services.storage.garbage import GarbageCollector
from services.storage.maintenance import Maintenance
from services.storage.operations import (
    AppendOutcome,
    AppendRequest,
    Operation,
    Policy,
    check_append,
    check_holder,
    check_token,
    expire_leases,
    require_capability,
)
from services.storage.reads import Reader, overlapping
from services.storage.shaping import compile_shape
from services.storage.shards import ShardStore, Versioned, wall_clock_ms
from services.storage.state import (
    CapabilityKind,
    CapabilityRecord,
    PartRef,
    ShardState,
    StoredBatch,
    frontier_text,
)
from services.storage.subscriptions import Event, SubscribeSpec, Subscriptions
from services.storage.watch import ShardWatch
from tidemark.blob import Blob
from tidemark.cdc import CdcReader
from tidemark.cdc.proto import from_proto as cdc_from_proto
from tidemark.columnar import (
    RelationSchema,
    conform,
    consolidate,
    from_ipc,
    frontier_bound,
    table_from_updates,
    time_range,
    updates_from_table,
)
from tidemark.consensus import Consensus
from tidemark.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TidemarkError,
)
from tidemark.frontier import Antichain
from tidemark.global_id import validate_global_id
from tidemark.lattice import U64
from tidemark.logging import get_logger
from tidemark.part_keys import part_of, part_prefix, written_ms
from tidemark.retry import RetryPolicy
from tidemark.v1 import common_pb2, storage_pb2

log = get_logger("storage")

# Consolidating this many rows is worth a hop to a worker thread (the event loop keeps serving).
THREAD_ROWS = 20_000


@dataclass(frozen=True)
class StorageSettings:
    prefix: str = "storage/"
    """Consensus keys live under ``{prefix}shards/``."""
    lease_ms: int = 60_000
    max_capabilities: int = 2_000
    retired_grace_ms: int = 60_000
    orphan_grace_ms: int = 600_000
    maintenance_interval_s: float = 2.0
    orphan_sweep_interval_s: float = 60.0
    cache_bytes: int = 256 << 20
    max_rows_per_message: int = 65_536
    backend_retry_s: float = 5.0

    @property
    def policy(self) -> Policy:
        return Policy(
            lease_ms=self.lease_ms,
            max_capabilities=self.max_capabilities,
            max_blob_age_ms=self.orphan_grace_ms // 2,
        )


@dataclass(frozen=True)
class SnapshotResult:
    table: pa.Table
    as_of: int
    since: Antichain[int]
    upper: Antichain[int]


@dataclass(frozen=True)
class PartsListing:
    """The batches a reader at ``as_of`` loads itself, from the state ``versioned``."""

    versioned: Versioned
    as_of: int
    batches: list[StoredBatch]
    blob_url: str


@dataclass(frozen=True)
class IngestResult:
    upper: Antichain[int]
    intervals: int
    updates: int


def new_capability_id() -> str:
    """128 random bits, hex."""
    return secrets.token_hex(16)


class StorageCore:
    def __init__(
        self,
        consensus: Consensus,
        blob: Blob,
        settings: StorageSettings | None = None,
        *,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.settings = settings or StorageSettings()
        self.blob_url = blob.url
        self.policy = self.settings.policy
        self.clock = clock
        retry = RetryPolicy(self.settings.backend_retry_s)
        self.shards = ShardStore(
            consensus,
            prefix=self.settings.prefix,
            clock=clock,
            retry=retry,
            on_commit=self._committed,
        )
        self.watch = ShardWatch(self.shards)
        self.batches = BatchStore(
            blob, cache_bytes=self.settings.cache_bytes, clock=clock, retry=retry
        )
        self.reader = Reader(self.shards, self.batches)
        self.compactor = Compactor(self.shards, self.batches, self.policy)
        self.garbage = GarbageCollector(
            self.shards,
            self.batches,
            retired_grace_ms=self.settings.retired_grace_ms,
            orphan_grace_ms=self.settings.orphan_grace_ms,
            clock=clock,
        )
        self.maintenance = Maintenance(
            self.shards,
            self.compactor,
            self.garbage,
            interval_s=self.settings.maintenance_interval_s,
            orphan_sweep_interval_s=self.settings.orphan_sweep_interval_s,
            clock=clock,
        )
        self.subscriptions = Subscriptions(self.shards, self.watch, self.reader, self.policy, clock)

    def start(self) -> None:
        """Start the background maintenance pass."""
        self.maintenance.start()

    async def close(self) -> None:
        await self.maintenance.close()
        await self.compactor.close()
        await self.watch.close()
        await self.shards.close()

    def _committed(self, collection_id: str, versioned: Versioned) -> None:
        self.watch.offer(collection_id, versioned)
        metrics.COLLECTIONS.record(versioned.state)

    async def _current(self, collection_id: str) -> ShardState:
        """The collection's current state, with expired capabilities already left out."""
        versioned = await self.shards.require(validate_global_id(collection_id))
        return expire_leases(versioned.state, self.clock())

    # -- collections ------------------------------------------------------------------------

    async def create(
        self,
        collection_id: str,
        schema: RelationSchema,
        *,
        initial_frontier: int = 0,
        holder: str = "",
        critical_holder: str = "",
        tenant: str = "",
        writer: str = "",
        owner: str = "",
    ) -> tuple[CapabilityRecord, CapabilityRecord]:
        validate_global_id(collection_id)
        state, (read, write) = operations.initial_state(
            collection_id,
            schema,
            initial_frontier,
            new_capability_id(),
            new_capability_id(),
            holder,
            self.clock(),
            self.policy,
            critical_id=new_capability_id(),
            critical_holder=critical_holder,
            tenant=tenant,
            writer=writer,
            owner=owner,
        )
        await self.shards.create(collection_id, state)
        log.info("collection_created", collection=collection_id, frontier=initial_frontier)
        return read, write

    async def owned_state(self, collection_id: str) -> ShardState:
        """A state of the collection to decide access by (its tenant and writer never change,
        so the newest one this process has seen will do; else the current one)."""
        seen = self.shards.latest_seen(validate_global_id(collection_id))
        if seen is not None:
            return seen.state
        return (await self.shards.require(collection_id)).state

    async def current_state(self, collection_id: str) -> ShardState:
        """The collection's current state (its capabilities as they are now)."""
        return await self._current(collection_id)

    async def describe(self, collection_id: str) -> Versioned:
        """The current state (expired capabilities left out, as the next change will)."""
        versioned = await self.shards.require(validate_global_id(collection_id))
        state = expire_leases(versioned.state, self.clock())
        metrics.COLLECTIONS.record(state)
        return Versioned(versioned.version, state, versioned.data)

    async def list_collections(self) -> list[Versioned]:
        now = self.clock()
        found = [
            Versioned(v.version, expire_leases(v.state, now), v.data)
            for v in await self.shards.scan()
        ]
        for versioned in found:
            metrics.COLLECTIONS.record(versioned.state)
        return found

    # -- appends ----------------------------------------------------------------------------

    async def append(
        self,
        collection_id: str,
        capability_id: str,
        updates: pa.Table | None,
        new_upper: Antichain[int],
        *,
        token: str = "",
        expected_upper: Antichain[int] | None = None,
    ) -> AppendOutcome:
        """Append ``updates`` (any order, not necessarily consolidated) through the write
        capability, moving the upper to ``new_upper``."""
        validate_global_id(collection_id)
        check_token(token)
        request = AppendRequest(capability_id, new_upper, token, expected_upper)
        seen = self.shards.latest_seen(collection_id)
        state = await self._precheck(collection_id, seen, request)
        if isinstance(state, AppendOutcome):
            return state
        batch = None
        times = None
        if updates is not None:
            conformed = conform(updates, state.schema)
            # The times of the updates as sent: ones that cancel out must be in range too.
            times = time_range(conformed)
            if conformed.num_rows >= THREAD_ROWS:
                batch = await asyncio.to_thread(consolidate, conformed)
            elif conformed.num_rows:
                batch = consolidate(conformed)
        request = AppendRequest(capability_id, new_upper, token, expected_upper, times)
        # Check the times before writing anything, so a bad append leaves no blob behind.
        checked = await self._precheck(collection_id, None, request, state)
        if isinstance(checked, AppendOutcome):
            return checked
        written = None
        operation = operations.append(request, self.policy)
        if batch is not None and batch.num_rows:
            encoded = await self.batches.encode(collection_id, batch)
            written = encoded.written
            request = AppendRequest(
                capability_id,
                new_upper,
                token,
                expected_upper,
                times,
                written.key,
                written.rows,
                written.bytes,
                written.written_ms,
            )
            operation = await self._store_preparing(
                collection_id, encoded, operations.append(request, self.policy)
            )
        try:
            outcome = await self.shards.update(collection_id, operation)
        except (PermissionDenied, FailedPrecondition, InvalidArgument):
            # The append itself was refused, against a confirmed state: its blob is unused.
            # (After any other failure the outcome may be open; the orphan sweep decides.)
            await self._discard(written.key if written else None)
            raise
        if outcome.already_committed:
            await self._discard(written.key if written else None)
        else:
            self.compactor.request(collection_id)
            metrics.APPENDS.inc()
            if written is not None:
                metrics.APPENDED_BATCHES.inc()
                metrics.APPENDED_ROWS.inc(written.rows)
                metrics.APPENDED_BYTES.inc(written.bytes)
        return outcome

    async def append_parts(
        self,
        collection_id: str,
        capability_id: str,
        parts: Sequence[PartRef],
        new_upper: Antichain[int],
        *,
        times: tuple[int, int] | None,
        token: str = "",
        expected_upper: Antichain[int] | None = None,
    ) -> AppendOutcome:
        """Append the updates in ``parts``, Parquet parts the caller wrote to the blob store,
        as one batch (``times``: their least and greatest update time); otherwise as
        :meth:`append`. The parts are the caller's until committed: a refused append leaves
        them (the caller may retry with them; the orphan sweep deletes what nobody commits)."""
        validate_global_id(collection_id)
        check_token(token)
        born = await self._check_parts(collection_id, parts)
        if not parts:
            times = None
        elif times is None or times[0] > times[1]:
            raise InvalidArgument("an append of parts states the least and greatest update time")
        request = AppendRequest(capability_id, new_upper, token, expected_upper, times)
        if parts:
            request = replace(
                request,
                batch_key=parts[0].key,
                batch_rows=sum(p.rows for p in parts),
                batch_bytes=sum(p.size for p in parts),
                blob_written_ms=born,
                more_parts=tuple(parts[1:]),
            )
        outcome = await self.shards.update(collection_id, operations.append(request, self.policy))
        if outcome.batch_kept:
            # The parts are already a batch: this is a repeat of an append that took effect.
            return replace(outcome, already_committed=True, batch_kept=False)
        if not outcome.already_committed:
            self.compactor.request(collection_id)
            metrics.APPENDS.inc()
            if parts:
                metrics.APPENDED_BATCHES.inc()
                metrics.APPENDED_ROWS.inc(request.batch_rows)
                metrics.APPENDED_BYTES.inc(request.batch_bytes)
        return outcome

    async def _check_parts(self, collection_id: str, parts: Sequence[PartRef]) -> int:
        """When the oldest of ``parts`` was written; raises unless each is a distinct part of
        this collection present in the blob store."""
        born = []
        for part in parts:
            if part_of(part.key) != collection_id:
                raise InvalidArgument(
                    f"{part.key!r} is not a part key of collection {collection_id} "
                    f"({part_prefix(collection_id)}<13-digit ms>-<32 hex>.parquet)"
                )
            born.append(written_ms(part.key) or 0)
        if len({p.key for p in parts}) != len(parts):
            raise InvalidArgument("an append names the same part twice")
        if parts:
            present = set(await self.batches.keys(collection_id))
            missing = [p.key for p in parts if p.key not in present]
            if missing:
                raise InvalidArgument(
                    f"part {missing[0]!r} is not in the blob store ({len(missing)} missing)"
                )
        return min(born, default=0)

    async def _store_preparing(
        self, collection_id: str, batch: EncodedBatch, operation: Operation[AppendOutcome]
    ) -> Operation[AppendOutcome]:
        """Store ``batch``, and while the blob store works on it, prepare the commit
        (:meth:`ShardStore.prepare`): the next state is then ready when the blob is durable.
        Only the commit's compare-and-set, after the blob is stored, makes the batch part of
        the collection."""
        storing = asyncio.ensure_future(self.batches.store(batch))
        try:
            await asyncio.sleep(0)  # the put starts (a blob directory hands it to a thread)
            operation = self.shards.prepare(collection_id, operation)
        finally:
            await storing
        return operation

    async def _precheck(
        self,
        collection_id: str,
        seen: Versioned | None,
        request: AppendRequest,
        known: ShardState | None = None,
    ) -> ShardState | AppendOutcome:
        """``check_append`` against a state this process already has (cheap), confirming a
        refusal against the current state before passing it on: a stale state may not refuse
        what the current one allows. The compare-and-set checks everything again anyway."""
        state = known or (expire_leases(seen.state, self.clock()) if seen is not None else None)
        if state is not None:
            try:
                checked = check_append(state, request)
                return checked if isinstance(checked, AppendOutcome) else state
            except TidemarkError:
                pass
        state = await self._current(collection_id)
        checked = check_append(state, request)
        return checked if isinstance(checked, AppendOutcome) else state

    async def _discard(self, key: str | None) -> None:
        if key is not None:
            with contextlib.suppress(TidemarkError):
                await self.batches.delete(key)

    # -- reads ------------------------------------------------------------------------------

    async def snapshot(
        self,
        collection_id: str,
        capability_id: str,
        as_of: int | None = None,
        *,
        columns: Sequence[str] = (),
        row_filter: storage_pb2.RowFilter | None = None,
    ) -> SnapshotResult:
        """The collection at ``as_of`` (default: the capability's frontier), waiting until
        the upper has passed it."""
        versioned, time = await self._readable(
            collection_id,
            capability_id,
            as_of,
            check=lambda state: compile_shape(state.schema, columns, row_filter),
        )
        shape = compile_shape(versioned.state.schema, columns, row_filter)
        table = await self.reader.snapshot(versioned, time)
        state = versioned.state
        return SnapshotResult(shape.apply(table), time, state.since, state.upper)

    async def parts(
        self, collection_id: str, capability_id: str, as_of: int | None = None
    ) -> PartsListing:
        """The batches holding every update at or before ``as_of`` (default: the capability's
        frontier), from one state, once the upper has passed it: a reader that loads them
        itself and keeps the updates at times ``<= as_of`` sees the collection at ``as_of``.
        The listing stays readable for the retired-blob grace period even if compaction
        replaces the batches meanwhile."""
        versioned, time = await self._readable(collection_id, capability_id, as_of)
        batches = overlapping(versioned.state.batches, 0, time + 1)
        return PartsListing(versioned, time, batches, self.blob_url)

    async def _readable(
        self,
        collection_id: str,
        capability_id: str,
        as_of: int | None,
        *,
        check: Callable[[ShardState], object] | None = None,
    ) -> tuple[Versioned, int]:
        """A state of the collection whose upper has passed ``as_of`` (default: the read
        capability's frontier), checked to be readable there by ``capability_id``. ``check``
        raises for a request that is malformed, before any wait."""
        versioned = await self.shards.require(validate_global_id(collection_id))
        state = expire_leases(versioned.state, self.clock())
        record = require_capability(state, capability_id, CapabilityKind.READ)
        held = frontier_bound(record.frontier)
        assert held is not None
        time = held if as_of is None else as_of
        if time < held:
            raise FailedPrecondition(
                f"cannot read collection {collection_id} at {time}: the read capability is at "
                f"{frontier_text(record.frontier)} (since {frontier_text(state.since)})"
            )
        if check is not None:
            check(state)
        if state.upper.less_equal(time):
            async for newer in self.watch.states(collection_id, at_least=versioned.version):
                state = expire_leases(newer.state, self.clock())
                record = require_capability(state, capability_id, CapabilityKind.READ)
                if not state.upper.less_equal(time):
                    versioned = newer
                    break
        if (
            not record.critical
            and record.lease_expires_ms - self.clock() < self.policy.lease_ms // 2
        ):
            await self.shards.update(
                collection_id, operations.use(capability_id, CapabilityKind.READ, self.policy)
            )
        return versioned, time

    def subscribe(
        self, collection_id: str, capability_id: str, spec: SubscribeSpec
    ) -> AsyncIterator[Event]:
        validate_global_id(collection_id)
        return self.subscriptions.subscribe(collection_id, capability_id, spec)

    # -- capabilities -----------------------------------------------------------------------

    async def clone(
        self, collection_id: str, capability_id: str, holder: str = "", *, owner: str = ""
    ) -> CapabilityRecord:
        validate_global_id(collection_id)
        operation = operations.clone(
            capability_id, new_capability_id(), holder, self.policy, owner=owner
        )
        return await self.shards.update(collection_id, operation)

    async def downgrade(
        self, collection_id: str, capability_id: str, frontier: Antichain[int]
    ) -> CapabilityRecord:
        validate_global_id(collection_id)
        operation = operations.downgrade(capability_id, frontier, self.policy)
        return await self.shards.update(collection_id, operation)

    async def drop(self, collection_id: str, capability_id: str) -> None:
        validate_global_id(collection_id)
        await self.shards.update(collection_id, operations.drop(capability_id))

    async def acquire(
        self, collection_id: str, holder: str = "", *, with_write: bool = True, owner: str = ""
    ) -> tuple[CapabilityRecord, CapabilityRecord]:
        validate_global_id(collection_id)
        check_holder(holder)
        operation = operations.acquire(
            new_capability_id(),
            new_capability_id(),
            holder,
            self.policy,
            with_write=with_write,
            owner=owner,
        )
        return await self.shards.update(collection_id, operation)

    async def acquire_critical(self, collection_id: str, holder: str) -> CapabilityRecord:
        """``holder``'s critical read capability on the collection (the existing one, or a new
        one at the since)."""
        validate_global_id(collection_id)
        operation = operations.acquire_critical(new_capability_id(), holder, self.policy)
        return await self.shards.update(collection_id, operation)

    async def reset_history(self, collection_id: str, holder: str) -> CapabilityRecord:
        """Start the collection's history afresh at its upper (see ``ResetHistory``)."""
        validate_global_id(collection_id)
        record = await self.shards.update(
            collection_id, operations.reset_history(new_capability_id(), holder)
        )
        log.warning(
            "collection_history_reset",
            collection=collection_id,
            since=frontier_text(record.frontier),
            holder=holder,
        )
        return record

    async def renew(
        self, capabilities: Sequence[tuple[str, str]]
    ) -> tuple[list[tuple[str, CapabilityRecord]], list[tuple[str, str]]]:
        """Renew ``(collection_id, capability_id)`` pairs: the renewed records and the pairs
        that are not live capabilities (including those of unknown collections)."""
        by_collection: dict[str, list[str]] = {}
        for collection_id, capability_id in capabilities:
            by_collection.setdefault(collection_id, []).append(capability_id)
        renewed: list[tuple[str, CapabilityRecord]] = []
        missing: list[tuple[str, str]] = []
        for collection_id, ids in by_collection.items():
            try:
                validate_global_id(collection_id)
                records, gone = await self.shards.update(
                    collection_id, operations.renew(ids, self.policy)
                )
            except (InvalidArgument, NotFound):
                missing.extend((collection_id, i) for i in ids)
                continue
            renewed.extend((collection_id, record) for record in records)
            missing.extend((collection_id, i) for i in gone)
        return renewed, missing

    # -- CDC ingestion ----------------------------------------------------------------------

    async def ingest(
        self,
        collection_id: str,
        capability_id: str,
        messages: AsyncIterable[common_pb2.CdcMessage],
    ) -> IngestResult:
        """Append a CDCv2 stream through the write capability: each interval once it is
        complete. Updates before the capability's frontier are taken as already appended (a
        source replaying its history after a restart) and skipped."""
        state = await self._current(collection_id)
        record = require_capability(state, capability_id, CapabilityKind.WRITE)
        schema = state.schema
        reader: CdcReader[tuple[object, ...], int] = CdcReader(U64, record.frontier)

        def decode(data: bytes) -> list[tuple[tuple[object, ...], int, int]]:
            return updates_from_table(conform(from_ipc(data), schema))

        upper = record.frontier
        intervals = updates = 0
        async for proto in messages:
            if proto.WhichOneof("kind") == "updates" and proto.updates.updates:
                raise InvalidArgument(
                    "IngestCdc takes updates as Arrow IPC (Updates.arrow_ipc), not as opaque rows"
                )
            message = cdc_from_proto(proto, decode)
            for batch, frontier in reader.push(message):  # type: ignore[arg-type]
                table = table_from_updates(schema, batch)
                outcome = await self.append(
                    collection_id, capability_id, table, frontier, token=uuid.uuid4().hex
                )
                upper = outcome.upper
                intervals += 1
                updates += len(batch)
        return IngestResult(upper, intervals, updates)
