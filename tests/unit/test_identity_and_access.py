"""Service identities (tidemark:// URIs), the per-service caller tables, and storage's
per-collection rules, as pure functions."""

from __future__ import annotations

import pytest

from services.catalog.service import CATALOG_CALLERS
from services.compute.service import COMPUTE_CALLERS
from services.oracle.service import ORACLE_CALLERS
from services.storage import access
from services.storage.service import STORAGE_CALLERS
from services.storage.state import MINIMUM, CapabilityKind, CapabilityRecord, ShardState
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import InvalidArgument, PermissionDenied
from tidemark.rpc.identity import Identity, compute_identity

ADAPTER, CATALOG, SOURCES = Identity("adapter"), Identity("catalog"), Identity("sources")
A1, A2, B1 = (compute_identity(t, c) for t, c in (("a", "c1"), ("a", "c2"), ("b", "c1")))
TOOL = Identity("client", name="ops")
SCHEMA = RelationSchema.of(("k", ColumnType.INT64))


@pytest.mark.parametrize(
    "uri",
    [
        "tidemark://adapter",
        "tidemark://storage",
        "tidemark://compute/acme/c1",
        "tidemark://client/ops",
    ],
)
def test_identities_round_trip(uri: str) -> None:
    assert Identity.parse(uri).uri == uri


@pytest.mark.parametrize(
    "uri",
    [
        "tidemark://",
        "tidemark://compute/acme",
        "tidemark://compute/acme/c1/extra",
        "tidemark://adapter/x",
        "tidemark://client",
        "spiffe://adapter",
    ],
)
def test_malformed_identities_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        Identity.parse(uri)


def test_caller_tables() -> None:
    assert STORAGE_CALLERS.allows("AcquireCapabilities", A1)
    assert not STORAGE_CALLERS.allows("Create", A1)
    assert STORAGE_CALLERS.allows("Create", ADAPTER)
    assert not STORAGE_CALLERS.allows("List", TOOL)
    assert ORACLE_CALLERS.allows("ReadTs", SOURCES)
    assert not ORACLE_CALLERS.allows("ReadTs", Identity("storage"))
    assert CATALOG_CALLERS.allows("SubscribeAt", A1)
    assert not CATALOG_CALLERS.allows("CompareAndAppend", A1)
    assert not CATALOG_CALLERS.allows("CompareAndAppend", SOURCES)
    assert CATALOG_CALLERS.allows("CompareAndAppend", ADAPTER)
    assert COMPUTE_CALLERS.allows("Peek", ADAPTER)
    assert not COMPUTE_CALLERS.allows("Peek", A1)
    assert COMPUTE_CALLERS.allows("Status", TOOL)


def state(tenant: str, writer: str = "") -> ShardState:
    return ShardState("u1", SCHEMA, MINIMUM, MINIMUM, tenant=tenant, writer=writer)


def test_compute_reads_its_tenant_and_writes_its_outputs() -> None:
    table, view = state("a"), state("a", A1.uri)
    access.check_read(A1, table)
    access.check_write(A1, view)
    with pytest.raises(PermissionDenied):
        access.check_read(B1, table)
    with pytest.raises(PermissionDenied):
        access.check_write(A1, table)  # compute writes only its outputs
    with pytest.raises(PermissionDenied):
        access.check_write(A2, view)
    with pytest.raises(PermissionDenied):
        access.check_write(ADAPTER, view)
    access.check_write(ADAPTER, table)
    access.check_write(SOURCES, table)
    assert not access.may_read(A1, state(""))  # the system's collections
    for check in (access.check_read, access.check_write, access.check_reset):
        check(None, view)  # no identity (mTLS off): nothing is checked


def test_holds_and_resets() -> None:
    view = state("a", A1.uri)
    access.check_reset(A1, view)
    access.check_reset(CATALOG, view)
    with pytest.raises(PermissionDenied):
        access.check_reset(A2, view)
    critical = CapabilityRecord("c" * 32, CapabilityKind.READ, MINIMUM, 0, "catalog", critical=True)
    write = CapabilityRecord("d" * 32, CapabilityKind.WRITE, MINIMUM, 1, "compute")
    access.check_capability(CATALOG, view, critical)
    with pytest.raises(PermissionDenied):
        access.check_capability(A1, view, critical)
    access.check_capability(A1, view, write)
    with pytest.raises(PermissionDenied):
        access.check_capability(A2, view, write)
    owned = CapabilityRecord("e" * 32, CapabilityKind.READ, MINIMUM, 1, "x", owner=A1.uri)
    access.check_capability(A1, view, owned)
    access.check_capability(ADAPTER, view, owned)
    access.check_capability(None, view, owned)
    with pytest.raises(PermissionDenied, match="c1's capability"):
        access.check_capability(A2, view, owned)


def test_create_checks_the_policy_it_records() -> None:
    access.check_policy("a", A1.uri)
    with pytest.raises(InvalidArgument):
        access.check_policy("a/b", "")
    with pytest.raises(InvalidArgument):
        access.check_policy("a", "compute/a/c1")


def test_the_policy_survives_encoding() -> None:
    view = state("a", A1.uri)
    decoded = ShardState.decode(view.encode())
    assert (decoded.tenant, decoded.writer) == ("a", A1.uri)
