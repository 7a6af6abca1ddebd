"""The durable state of one collection (shard), as immutable values, and its encoding.

One consensus key holds it (a ``tidemark.v1.ShardState`` protobuf). Every change is a new
value written by compare-and-set, so the value in hand is a snapshot that nothing else
mutates; operations (:mod:`services.storage.operations`) compute the next value from it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache

from tidemark.cdc.proto import frontier_from_proto, frontier_to_proto
from tidemark.columnar import RelationSchema
from tidemark.frontier import Antichain, u64_frontier
from tidemark.lattice import U64
from tidemark.v1 import storage_pb2, storage_state_pb2

MINIMUM = Antichain.minimum(U64)
CLOSED = u64_frontier()


class CapabilityKind(enum.Enum):
    READ = storage_pb2.CAPABILITY_KIND_READ
    WRITE = storage_pb2.CAPABILITY_KIND_WRITE

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class PartRef:
    """One Parquet part of a batch: its key in the blob store, rows and bytes."""

    key: str
    rows: int
    size: int


@dataclass(frozen=True)
class StoredBatch:
    """Every update whose time lies in ``[lower, upper)``; times before ``since`` were
    advanced to it when the batch was written (``{0}``: none were). Its updates are in one
    Parquet part (``key``), or, for a batch whose parts were written elsewhere, in ``key``
    and ``more_parts``. ``rows`` and ``size`` count every part. The first part's key names
    the batch."""

    key: str
    lower: Antichain[int]
    upper: Antichain[int]
    since: Antichain[int] = MINIMUM
    rows: int = 0
    size: int = 0
    """Bytes of the blobs."""
    more_parts: tuple[PartRef, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys of every part, the first one first."""
        return (self.key, *(p.key for p in self.more_parts))

    @property
    def parts(self) -> tuple[PartRef, ...]:
        """Every part with its own rows and bytes."""
        first = PartRef(
            self.key,
            self.rows - sum(p.rows for p in self.more_parts),
            self.size - sum(p.size for p in self.more_parts),
        )
        return (first, *self.more_parts)

    @cached_property
    def field_bytes(self) -> bytes:
        """This record as one entry of ``ShardState.batches`` on the wire (see
        :meth:`ShardState.encode`)."""
        return _entry(batches=[self.to_proto()])

    def to_proto(self) -> storage_state_pb2.StoredBatch:
        return storage_state_pb2.StoredBatch(
            key=self.key,
            lower=frontier_to_proto(self.lower),
            upper=frontier_to_proto(self.upper),
            since=frontier_to_proto(self.since),
            rows=self.rows,
            bytes=self.size,
            more_parts=[
                storage_state_pb2.PartRef(key=p.key, rows=p.rows, bytes=p.size)
                for p in self.more_parts
            ],
        )

    @classmethod
    def from_proto(cls, proto: storage_state_pb2.StoredBatch) -> StoredBatch:
        return cls(
            proto.key,
            frontier_from_proto(proto.lower),
            frontier_from_proto(proto.upper),
            frontier_from_proto(proto.since),
            proto.rows,
            proto.bytes,
            tuple(PartRef(p.key, p.rows, p.bytes) for p in proto.more_parts),
        )


@dataclass(frozen=True)
class CapabilityRecord:
    """A live capability. For write capabilities, ``last_token``/``token_upper`` remember the
    last append, so that a retry of it is recognised. A ``critical`` (read) capability has no
    lease (``lease_expires_ms`` is 0): it is an owner's durable hold on the since, which only
    an explicit downgrade moves and only an explicit drop releases."""

    id: str
    kind: CapabilityKind
    frontier: Antichain[int]
    lease_expires_ms: int
    holder: str = ""
    last_token: str = ""
    token_upper: Antichain[int] = field(default_factory=lambda: CLOSED)
    critical: bool = False
    owner: str = ""
    """The identity that acquired it (mTLS on; empty otherwise)."""

    def expired(self, now_ms: int) -> bool:
        return not self.critical and self.lease_expires_ms <= now_ms

    @cached_property
    def field_bytes(self) -> bytes:
        """This record as one entry of ``ShardState.capabilities`` on the wire."""
        return _entry(capabilities=[self.to_proto()])

    def to_proto(self) -> storage_state_pb2.StoredCapability:
        return storage_state_pb2.StoredCapability(
            id=self.id,
            kind=self.kind.value,  # type: ignore[arg-type]
            frontier=frontier_to_proto(self.frontier),
            lease_expires_ms=self.lease_expires_ms,
            holder=self.holder,
            last_token=self.last_token,
            token_upper=frontier_to_proto(self.token_upper),
            critical=self.critical,
            owner=self.owner,
        )

    @classmethod
    def from_proto(cls, proto: storage_state_pb2.StoredCapability) -> CapabilityRecord:
        return cls(
            proto.id,
            CapabilityKind(proto.kind),
            frontier_from_proto(proto.frontier),
            proto.lease_expires_ms,
            proto.holder,
            proto.last_token,
            frontier_from_proto(proto.token_upper),
            proto.critical,
            proto.owner,
        )


@dataclass(frozen=True)
class RetiredBlob:
    """A blob compaction replaced; deleted once readers of older states are done with it."""

    key: str
    retired_ms: int

    @cached_property
    def field_bytes(self) -> bytes:
        """This record as one entry of ``ShardState.retired`` on the wire."""
        return _entry(
            retired=[storage_state_pb2.RetiredBlob(key=self.key, retired_ms=self.retired_ms)]
        )


@dataclass(frozen=True)
class ShardState:
    collection_id: str
    schema: RelationSchema
    since: Antichain[int]
    upper: Antichain[int]
    batches: tuple[StoredBatch, ...] = ()
    capabilities: tuple[CapabilityRecord, ...] = ()
    retired: tuple[RetiredBlob, ...] = ()
    created_ms: int = 0
    tenant: str = ""
    """The tenant (database) owning the collection; empty: the system's own."""
    writer: str = ""
    """The identity URI allowed to write it (empty: any service but compute)."""

    def capability(self, capability_id: str) -> CapabilityRecord | None:
        for record in self.capabilities:
            if record.id == capability_id:
                return record
        return None

    def critical_hold(self, holder: str) -> CapabilityRecord | None:
        """``holder``'s critical read capability, if it has one."""
        for record in self.capabilities:
            if record.critical and record.holder == holder:
                return record
        return None

    def with_capabilities(
        self, records: Iterable[CapabilityRecord], *, released: bool = True
    ) -> ShardState:
        """This state holding exactly ``records``, with the since recomputed.

        ``released=False`` says the removed capabilities were not given up by their holder
        (their lease lapsed): then, if no read capability is left, the since stays where it
        is rather than moving to ``{}``, so the data survives a holder that was merely down
        for longer than its lease and :func:`acquire` can take it back."""
        state = replace(self, capabilities=tuple(records))
        if not released and not any(r.kind is CapabilityKind.READ for r in state.capabilities):
            return state
        return state.with_since_recomputed()

    def with_since_recomputed(self) -> ShardState:
        """The since moved up to the meet of the read capabilities' frontiers (``{}`` when
        there are none). It never moves back."""
        held: Antichain[int] = Antichain(U64)
        for record in self.capabilities:
            if record.kind is CapabilityKind.READ:
                held = held.meet(record.frontier)
        since = self.since.join(held)
        return self if since == self.since else replace(self, since=since)

    @property
    def total_rows(self) -> int:
        return sum(batch.rows for batch in self.batches)

    @property
    def total_bytes(self) -> int:
        return sum(batch.size for batch in self.batches)

    # -- encoding -------------------------------------------------------------------------
    def encode(self) -> bytes:
        """The ``tidemark.v1.ShardState`` wire form. A repeated field on the wire is just its
        entries one after another, so each record's entry is encoded once (records are shared
        between successive states) and the state is their concatenation behind the scalar
        fields: the cost of a change does not grow with the number of batches. The same state
        always gives the same bytes, so a state encodes once (see
        :meth:`services.storage.shards.ShardStore.prepare`)."""
        return self._encoded

    @cached_property
    def _encoded(self) -> bytes:
        head = storage_state_pb2.ShardState(
            collection_id=self.collection_id,
            since=frontier_to_proto(self.since),
            upper=frontier_to_proto(self.upper),
            created_ms=self.created_ms,
            tenant=self.tenant,
            writer=self.writer,
        ).SerializeToString(deterministic=True)
        return b"".join(
            [
                head,
                _schema_entry(self.schema),
                *(batch.field_bytes for batch in self.batches),
                *(record.field_bytes for record in self.capabilities),
                *(r.field_bytes for r in self.retired),
            ]
        )

    @classmethod
    def decode(cls, data: bytes) -> ShardState:
        proto = storage_state_pb2.ShardState.FromString(data)
        return cls(
            collection_id=proto.collection_id,
            schema=RelationSchema.from_proto(proto.schema),
            since=frontier_from_proto(proto.since),
            upper=frontier_from_proto(proto.upper),
            batches=tuple(StoredBatch.from_proto(b) for b in proto.batches),
            capabilities=tuple(CapabilityRecord.from_proto(c) for c in proto.capabilities),
            retired=tuple(RetiredBlob(r.key, r.retired_ms) for r in proto.retired),
            created_ms=proto.created_ms,
            tenant=proto.tenant,
            writer=proto.writer,
        )


def _entry(**fields: object) -> bytes:
    return storage_state_pb2.ShardState(**fields).SerializeToString(deterministic=True)  # type: ignore[arg-type]


@lru_cache(maxsize=1024)
def _schema_entry(schema: RelationSchema) -> bytes:
    return _entry(schema=schema.to_proto())


def frontier_text(frontier: Antichain[int]) -> str:
    """``{}`` or ``{t}``, as frontiers appear in error messages."""
    return "{" + ", ".join(str(t) for t in sorted(frontier)) + "}"
