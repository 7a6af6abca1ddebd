"""Which caller may do what to a collection, when mTLS is on.

Each collection records its ``tenant`` (the database it belongs to; empty for the system's own)
and optionally its ``writer`` (the identity that alone may write it: the compute cluster
maintaining a materialized view's output). The rules, by the caller's identity:

- a compute cluster (``tidemark://compute/<tenant>/<cluster>``) reads, describes, lists and
  holds only its tenant's collections, writes only those it is the writer of, takes no
  critical (durable) holds and may start afresh (ResetHistory) only its own outputs;
- a collection with a writer accepts writes from that identity only;
- the shared services (adapter, catalog, sources) do everything else; only adapter and
  catalog handle critical holds.

With no caller identity (mTLS off) nothing is checked. Tenant and writer never change after
Create, so any version of a collection's state serves to decide.
"""

from __future__ import annotations

from collections.abc import Callable

from services.storage.state import CapabilityKind, CapabilityRecord, ShardState
from tidemark.errors import InvalidArgument, PermissionDenied
from tidemark.rpc.identity import COMPUTE, Identity

OWNERS = frozenset({"adapter", "catalog"})
"""Who keeps the durable holds and may reset any collection's history."""

Check = Callable[[Identity, ShardState], None]
"""A rule: raises PermissionDenied when the caller may not."""


def check_policy(tenant: str, writer: str) -> None:
    """A Create's tenant and writer are well formed."""
    if "/" in tenant:
        raise InvalidArgument(f"tenant {tenant!r} contains '/'")
    if writer:
        try:
            Identity.parse(writer)
        except ValueError as exc:
            raise InvalidArgument(f"writer: {exc}") from None


def _denied(caller: Identity, what: str, state: ShardState) -> PermissionDenied:
    return PermissionDenied(f"{caller} may not {what} collection {state.collection_id}")


def may_read(caller: Identity | None, state: ShardState) -> bool:
    return caller is None or caller.kind != COMPUTE or caller.tenant == state.tenant


def may_write(caller: Identity | None, state: ShardState) -> bool:
    if caller is None:
        return True
    if state.writer:
        return caller.uri == state.writer
    return caller.kind != COMPUTE


def check_read(caller: Identity | None, state: ShardState) -> None:
    if not may_read(caller, state):
        assert caller is not None
        raise _denied(caller, f"read tenant {state.tenant or '(system)'}'s", state)


def check_write(caller: Identity | None, state: ShardState) -> None:
    check_read(caller, state)
    if not may_write(caller, state):
        assert caller is not None
        whose = f"only {state.writer} writes" if state.writer else "compute writes only its outputs"
        raise _denied(caller, f"write ({whose})", state)


def check_owner(caller: Identity | None, state: ShardState, what: str) -> None:
    """Critical holds: the adapter's and the catalog's business."""
    if caller is not None and caller.kind not in OWNERS:
        raise _denied(caller, what, state)


def check_reset(caller: Identity | None, state: ShardState) -> None:
    """ResetHistory: the owners, or the collection's writer (a cluster rebuilding its lost
    output)."""
    if caller is None or caller.kind in OWNERS:
        return
    if not (state.writer and caller.uri == state.writer):
        raise _denied(caller, "reset the history of", state)


def check_capability(
    caller: Identity | None, state: ShardState, record: CapabilityRecord | None
) -> None:
    """Cloning, downgrading or dropping a capability: one acquired by another identity is
    that identity's (and the owners'), a write capability the writer's, a critical one the
    owners', any other the readers'."""
    if (
        record is not None
        and record.owner
        and caller is not None
        and caller.kind not in OWNERS
        and record.owner != caller.uri
    ):
        raise _denied(caller, f"touch {record.owner}'s capability on", state)
    if record is not None and record.critical:
        check_owner(caller, state, "touch a critical hold on")
    elif record is not None and record.kind is CapabilityKind.WRITE:
        check_write(caller, state)
    else:
        check_read(caller, state)
