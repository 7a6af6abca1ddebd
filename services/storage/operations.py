"""State transitions of a shard, as pure functions: the rules of capabilities and appends.

Each operation takes the current state and the wall-clock time and returns the next state and
its result, or raises a Tidemark error and changes nothing. Being pure, an operation can be
re-run against a newer state after a lost compare-and-set, and decides again from scratch:
nothing here trusts anything but the state it is given. Random ids are chosen by the caller
beforehand, so a re-run decides the same way.

Before every operation, expired leases are removed (:func:`expire_leases`), so an expired
capability is as unknown as a dropped one. Critical read capabilities have no lease and are
never removed that way: they are an owner's durable hold (:func:`acquire_critical`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from services.storage.state import (
    MINIMUM,
    CapabilityKind,
    CapabilityRecord,
    PartRef,
    RetiredBlob,
    ShardState,
    StoredBatch,
    frontier_text,
)
from tidemark.columnar import RelationSchema
from tidemark.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unavailable,
)
from tidemark.frontier import Antichain, u64_frontier
from tidemark.rpc.identity import COMPUTE, Identity

R = TypeVar("R")

Operation = Callable[[ShardState, int], tuple[ShardState, R]]
"""``(state, now_ms) -> (next state, result)``."""

MAX_HOLDER_CHARS = 200
MAX_TOKEN_CHARS = 128
_CAPABILITY_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class Policy:
    """Limits every operation applies."""

    lease_ms: int = 60_000
    max_capabilities: int = 2_000
    # A blob older than this is not committed: the orphan sweep may already consider it
    # garbage (see services.storage.garbage).
    max_blob_age_ms: int = 150_000
    # Retired blobs the state keeps track of. Under heavy churn the oldest are handed back to
    # be deleted at once instead, which keeps the state small; a read that still wanted one
    # starts over (see services.storage.reads).
    max_retired: int = 128


def short_id(capability_id: str) -> str:
    """The first 8 digits of a capability id: enough to tell capabilities apart in messages
    and listings without handing out the secret."""
    return capability_id[:8] + "…" if len(capability_id) > 8 else capability_id


def check_holder(holder: str) -> str:
    if len(holder) > MAX_HOLDER_CHARS:
        raise InvalidArgument(f"holder names are at most {MAX_HOLDER_CHARS} characters")
    return holder


def check_token(token: str) -> str:
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidArgument(f"idempotency tokens are at most {MAX_TOKEN_CHARS} characters")
    return token


# -- reading capabilities -------------------------------------------------------------------


def expire_leases(state: ShardState, now_ms: int) -> ShardState:
    """``state`` without the capabilities whose lease ran out by ``now_ms``. A lapsed lease
    releases its hold on the since, but never gives up the collection's data: if no read
    capability is left, the since stays put (only an explicit drop releases the last hold)."""
    live = [c for c in state.capabilities if not c.expired(now_ms)]
    if len(live) == len(state.capabilities):
        return state
    return state.with_capabilities(live, released=False)


def require_capability(
    state: ShardState, capability_id: str, kind: CapabilityKind | None = None
) -> CapabilityRecord:
    """The live capability ``capability_id`` (of ``kind``, if given), else
    ``PermissionDenied``."""
    record = state.capability(capability_id) if _CAPABILITY_ID.fullmatch(capability_id) else None
    if record is None:
        raise PermissionDenied(
            f"capability {short_id(capability_id)!r} is not a live capability of collection "
            f"{state.collection_id} (unknown, dropped or expired)"
        )
    if kind is not None and record.kind is not kind:
        raise PermissionDenied(
            f"capability {short_id(capability_id)!r} is a {record.kind.label} capability; "
            f"this needs a {kind.label} capability"
        )
    return record


def _renewed(record: CapabilityRecord, now_ms: int, policy: Policy) -> CapabilityRecord:
    if record.critical:
        return record  # no lease to extend
    return replace(record, lease_expires_ms=max(record.lease_expires_ms, now_ms + policy.lease_ms))


def _swap(state: ShardState, record: CapabilityRecord) -> ShardState:
    """``state`` with the capability of the same id replaced by ``record``."""
    return state.with_capabilities(record if c.id == record.id else c for c in state.capabilities)


def _check_room(state: ShardState, adding: int, policy: Policy) -> None:
    if len(state.capabilities) + adding > policy.max_capabilities:
        raise FailedPrecondition(
            f"collection {state.collection_id} already has {len(state.capabilities)} live "
            f"capabilities (limit {policy.max_capabilities}); drop unused ones or let them expire"
        )


# -- creation ---------------------------------------------------------------------------------


def initial_state(
    collection_id: str,
    schema: RelationSchema,
    initial_frontier: int,
    read_id: str,
    write_id: str,
    holder: str,
    now_ms: int,
    policy: Policy,
    *,
    critical_id: str = "",
    critical_holder: str = "",
    tenant: str = "",
    writer: str = "",
    owner: str = "",
) -> tuple[ShardState, tuple[CapabilityRecord, CapabilityRecord]]:
    """A new, empty collection with ``since = upper = {initial_frontier}`` and a read and a
    write capability there; with a ``critical_holder``, that holder's critical read capability
    (id ``critical_id``) too."""
    frontier = u64_frontier(initial_frontier)
    expires = now_ms + policy.lease_ms
    read = CapabilityRecord(
        read_id, CapabilityKind.READ, frontier, expires, check_holder(holder), owner=owner
    )
    write = CapabilityRecord(write_id, CapabilityKind.WRITE, frontier, expires, holder, owner=owner)
    capabilities: tuple[CapabilityRecord, ...] = (read, write)
    if critical_holder:
        capabilities += (_critical(critical_id, frontier, critical_holder),)
    state = ShardState(
        collection_id=collection_id,
        schema=schema,
        since=frontier,
        upper=frontier,
        capabilities=capabilities,
        created_ms=now_ms,
        tenant=tenant,
        writer=writer,
    )
    return state, (read, write)


# -- appends ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendRequest:
    """An append, once its updates are consolidated and (if any) written to ``batch_key``."""

    capability_id: str
    new_upper: Antichain[int]
    token: str = ""
    expected_upper: Antichain[int] | None = None
    times: tuple[int, int] | None = None
    """Least and greatest update time; ``None``: no updates."""
    batch_key: str | None = None
    batch_rows: int = 0
    batch_bytes: int = 0
    blob_written_ms: int = 0
    more_parts: tuple[PartRef, ...] = ()
    """Parts after the first, for a batch written elsewhere in several parts."""


@dataclass(frozen=True)
class AppendOutcome:
    upper: Antichain[int]
    already_committed: bool = False
    batch_kept: bool = False
    """This very attempt had landed already (its compare-and-set's reply was lost)."""


def check_append(state: ShardState, request: AppendRequest) -> CapabilityRecord | AppendOutcome:
    """The write capability the append goes through, or the outcome of the earlier attempt
    if this is a retry of the capability's last append. Raises if the append is not allowed
    in ``state``."""
    if request.batch_key is not None and any(b.key == request.batch_key for b in state.batches):
        # This very attempt landed (e.g. a compare-and-set whose reply was lost).
        return AppendOutcome(request.new_upper, batch_kept=True)
    record = require_capability(state, request.capability_id, CapabilityKind.WRITE)
    if request.token and record.last_token == request.token:
        return AppendOutcome(record.token_upper, already_committed=True)
    if request.expected_upper is not None and request.expected_upper != state.upper:
        raise FailedPrecondition(
            f"upper mismatch: expected upper {frontier_text(request.expected_upper)}, "
            f"but {_where(state)}"
        )
    # With an expected upper the caller names the upper it appends at (compare-and-append),
    # so a capability left behind by other writers of the same collection may append too.
    behind_ok = request.expected_upper is not None and record.frontier.frontier_less_equal(
        state.upper
    )
    if record.frontier != state.upper and not behind_ok:
        raise FailedPrecondition(
            f"upper mismatch: write capability {short_id(record.id)!r} is at "
            f"{frontier_text(record.frontier)}, but {_where(state)}; downgrade it to the upper "
            "first"
        )
    if not state.upper.frontier_less_than(request.new_upper):
        raise FailedPrecondition(
            f"new upper {frontier_text(request.new_upper)} is not beyond the upper: {_where(state)}"
        )
    if request.times is not None:
        least, greatest = request.times
        if not state.upper.less_equal(least) or request.new_upper.less_equal(greatest):
            bad = least if not state.upper.less_equal(least) else greatest
            raise InvalidArgument(
                f"update time {bad} lies outside [{frontier_text(state.upper)}, "
                f"{frontier_text(request.new_upper)}), the interval this append covers; "
                f"{_where(state)}"
            )
    return record


def _where(state: ShardState) -> str:
    """The since and upper, for error messages (built only when one is raised)."""
    return (
        f"collection {state.collection_id} has since {frontier_text(state.since)} and upper "
        f"{frontier_text(state.upper)}"
    )


def append(request: AppendRequest, policy: Policy) -> Operation[AppendOutcome]:
    """Commit an append: the batch joins the state, the upper and the capability move to
    ``new_upper``, the capability's lease is renewed and its token remembered."""

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, AppendOutcome]:
        checked = check_append(state, request)
        if isinstance(checked, AppendOutcome):
            return state, checked
        batches = state.batches
        if request.batch_key is not None:
            if now_ms - request.blob_written_ms > policy.max_blob_age_ms:
                raise Unavailable(
                    "the append's batch was written too long ago to be committed safely; retry"
                )
            batch = StoredBatch(
                request.batch_key,
                state.upper,
                request.new_upper,
                MINIMUM,
                request.batch_rows,
                request.batch_bytes,
                request.more_parts,
            )
            batches = (*batches, batch)
        record = replace(
            _renewed(checked, now_ms, policy),
            frontier=request.new_upper,
            last_token=request.token,
            token_upper=request.new_upper,
        )
        moved = replace(state, upper=request.new_upper, batches=batches)
        return _swap(moved, record), AppendOutcome(request.new_upper)

    return run


# -- capabilities -----------------------------------------------------------------------------


def clone(
    capability_id: str, new_id: str, holder: str, policy: Policy, *, owner: str = ""
) -> Operation[CapabilityRecord]:
    """A new capability like ``capability_id`` (which counts as used, so it is renewed)."""
    check_holder(holder)

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        existing = state.capability(new_id)
        if existing is not None:  # this very clone already landed
            return state, existing
        record = require_capability(state, capability_id)
        _check_room(state, 1, policy)
        copy = CapabilityRecord(
            new_id,
            record.kind,
            record.frontier,
            now_ms + policy.lease_ms,
            holder or record.holder,
            owner=owner,
        )
        renewed = _swap(state, _renewed(record, now_ms, policy))
        return renewed.with_capabilities((*renewed.capabilities, copy)), copy

    return run


def downgrade(
    capability_id: str, frontier: Antichain[int], policy: Policy
) -> Operation[CapabilityRecord]:
    """Move a capability forward to ``frontier``; ``{}`` removes it. Moving it back is
    ``FailedPrecondition``."""

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        record = require_capability(state, capability_id)
        if not record.frontier.frontier_less_equal(frontier):
            raise FailedPrecondition(
                f"cannot downgrade {record.kind.label} capability {short_id(capability_id)!r} "
                f"from {frontier_text(record.frontier)} to {frontier_text(frontier)}: "
                f"capabilities only move forward (collection {state.collection_id} has since "
                f"{frontier_text(state.since)}, upper {frontier_text(state.upper)})"
            )
        moved = replace(_renewed(record, now_ms, policy), frontier=frontier)
        if frontier.is_empty():
            rest = (c for c in state.capabilities if c.id != capability_id)
            return state.with_capabilities(rest), moved
        return _swap(state, moved), moved

    return run


def drop(capability_id: str) -> Operation[CapabilityRecord]:
    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        record = require_capability(state, capability_id)
        rest = (c for c in state.capabilities if c.id != capability_id)
        return state.with_capabilities(rest), record

    return run


def acquire(
    read_id: str,
    write_id: str,
    holder: str,
    policy: Policy,
    *,
    with_write: bool = True,
    owner: str = "",
) -> Operation[tuple[CapabilityRecord, CapabilityRecord]]:
    """Fresh capabilities at the current since and upper. A frontier that is already ``{}``
    gives a record with an empty id that is not stored: nothing is left to hold; so does the
    write capability of a caller that may not write (``with_write=False``)."""
    check_holder(holder)

    def run(
        state: ShardState, now_ms: int
    ) -> tuple[ShardState, tuple[CapabilityRecord, CapabilityRecord]]:
        expires = now_ms + policy.lease_ms
        read = CapabilityRecord(
            read_id, CapabilityKind.READ, state.since, expires, holder, owner=owner
        )
        write = CapabilityRecord(
            write_id, CapabilityKind.WRITE, state.upper, expires, holder, owner=owner
        )
        if state.capability(read_id) or state.capability(write_id):
            # This very call already landed (e.g. a compare-and-set whose reply was lost).
            read = state.capability(read_id) or replace(read, id="", lease_expires_ms=0)
            write = state.capability(write_id) or replace(write, id="", lease_expires_ms=0)
            return state, (read, write)
        wanted = (read, write) if with_write else (read,)
        kept = [record for record in wanted if not record.frontier.is_empty()]
        _check_room(state, len(kept), policy)
        useless = [replace(r, id="", lease_expires_ms=0) for r in (read, write) if r not in kept]
        out = {r.kind: r for r in [*kept, *useless]}
        grown = state.with_capabilities((*state.capabilities, *kept))
        return grown, (out[CapabilityKind.READ], out[CapabilityKind.WRITE])

    return run


def _critical(capability_id: str, frontier: Antichain[int], holder: str) -> CapabilityRecord:
    if not check_holder(holder):
        raise InvalidArgument("a critical read capability needs a holder")
    return CapabilityRecord(capability_id, CapabilityKind.READ, frontier, 0, holder, critical=True)


def acquire_critical(new_id: str, holder: str, policy: Policy) -> Operation[CapabilityRecord]:
    """``holder``'s critical read capability: the one it has, else a new one at the since.
    A since of ``{}`` cannot be held any more (``FailedPrecondition``)."""
    _critical(new_id, MINIMUM, holder)  # checks the holder before anything runs

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        existing = state.critical_hold(holder)
        if existing is not None:
            return state, existing
        if state.since.is_empty():
            raise FailedPrecondition(
                f"collection {state.collection_id} has lost its history (its since is {{}}): "
                "nothing is left to hold; reset its history to rebuild it"
            )
        _check_room(state, 1, policy)
        record = _critical(new_id, state.since, holder)
        return state.with_capabilities((*state.capabilities, record)), record

    return run


def _derived(writer: str) -> bool:
    """Whether a collection with this writer holds derived contents: a compute cluster's
    output, which its dataflow can compute again."""
    try:
        return bool(writer) and Identity.parse(writer).kind == COMPUTE
    except ValueError:
        return False


def reset_history(new_id: str, holder: str) -> Operation[CapabilityRecord]:
    """Start the history afresh at the upper: no batches, no capabilities but ``holder``'s new
    critical read capability, ``since = upper``. Only for a collection a compute cluster
    writes (derived contents, which its dataflow computes again). The discarded batches'
    blobs are retired (the garbage collector deletes them once older readers are done)."""
    _critical(new_id, MINIMUM, holder)

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        existing = state.capability(new_id)
        if existing is not None:  # this very reset already landed
            return state, existing
        if not _derived(state.writer):
            # Only derived contents can be written again from scratch: a table's rows, a
            # source's, or the catalog's log would be lost for good.
            raise FailedPrecondition(
                f"collection {state.collection_id} is not written by a compute cluster (it is "
                "not a materialized view's output); its history cannot be reset"
            )
        if state.upper.is_empty():
            raise FailedPrecondition(
                f"collection {state.collection_id} is closed (its upper is {{}}); there is "
                "nothing to rebuild"
            )
        record = _critical(new_id, state.upper, holder)
        retired = (
            *state.retired,
            *(RetiredBlob(key, now_ms) for b in state.batches for key in b.keys),
        )
        fresh = replace(
            state, since=state.upper, batches=(), capabilities=(record,), retired=retired
        )
        return fresh, record

    return run


def renew(
    capability_ids: Sequence[str], policy: Policy
) -> Operation[tuple[list[CapabilityRecord], list[str]]]:
    """Extend the leases of the live capabilities among ``capability_ids``; the result is the
    renewed records and the ids that are not live."""

    def run(
        state: ShardState, now_ms: int
    ) -> tuple[ShardState, tuple[list[CapabilityRecord], list[str]]]:
        wanted = set(capability_ids)
        renewed = [_renewed(c, now_ms, policy) if c.id in wanted else c for c in state.capabilities]
        live = {c.id for c in renewed}
        missing = [i for i in dict.fromkeys(capability_ids) if i not in live]
        return state.with_capabilities(renewed), (
            [c for c in renewed if c.id in wanted],
            missing,
        )

    return run


def use(capability_id: str, kind: CapabilityKind, policy: Policy) -> Operation[CapabilityRecord]:
    """Check a capability and renew its lease if less than half of it is left: using a
    capability keeps it alive without a write per use."""

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, CapabilityRecord]:
        record = require_capability(state, capability_id, kind)
        if record.lease_expires_ms - now_ms >= policy.lease_ms // 2:
            return state, record
        renewed = _renewed(record, now_ms, policy)
        return _swap(state, renewed), renewed

    return run


# -- compaction and garbage -------------------------------------------------------------------


def replace_batches(
    old_keys: Sequence[str], merged: StoredBatch | None, written_ms: int, policy: Policy
) -> Operation[list[str]]:
    """Swap the consecutive batches ``old_keys`` for ``merged`` (written at ``written_ms``;
    ``None`` when they consolidated away), retiring their blobs. ``Aborted`` if they are no
    longer there as a run: someone else compacted them first. The result is the retired
    blobs the state no longer tracks (beyond ``policy.max_retired``): delete them now."""

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, list[str]]:
        keys = [batch.key for batch in state.batches]
        if merged is not None and merged.key in keys:  # this very swap already landed
            return state, []
        start = keys.index(old_keys[0]) if old_keys and old_keys[0] in keys else -1
        if start < 0 or keys[start : start + len(old_keys)] != list(old_keys):
            raise Aborted(f"collection {state.collection_id}: batches changed during compaction")
        if merged is not None and now_ms - written_ms > policy.max_blob_age_ms:
            raise Aborted(f"collection {state.collection_id}: compaction took too long")
        inserted = () if merged is None else (merged,)
        batches = (*state.batches[:start], *inserted, *state.batches[start + len(old_keys) :])
        replaced = state.batches[start : start + len(old_keys)]
        retired = (*state.retired, *(RetiredBlob(k, now_ms) for b in replaced for k in b.keys))
        overflow = max(0, len(retired) - policy.max_retired)
        evicted = [r.key for r in retired[:overflow]]
        return replace(state, batches=batches, retired=retired[overflow:]), evicted

    return run


def forget_retired(keys: Sequence[str]) -> Operation[None]:
    """Stop tracking retired blobs that have been deleted."""
    gone = set(keys)

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, None]:
        kept = tuple(r for r in state.retired if r.key not in gone)
        return (state if len(kept) == len(state.retired) else replace(state, retired=kept)), None

    return run


def no_change() -> Operation[None]:
    """Only what every operation does first: remove expired capabilities."""

    def run(state: ShardState, now_ms: int) -> tuple[ShardState, None]:
        return state, None

    return run
