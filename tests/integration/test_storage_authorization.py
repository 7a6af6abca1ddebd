"""Storage's per-collection access rules under mTLS, over gRPC against a real storage process:
a compute cluster reads only its tenant's collections, a materialized view's output takes
writes from its cluster only, durable holds belong to the adapter and the catalog, and the
rules survive a restart. Without mTLS none of it applies (the embedded default)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.service_process import ServiceProcess
from tests.support.storage import embedded_backends, start_storage
from tests.support.tls import TENANT_A, TENANT_A_OTHER, TENANT_B, CertDir, make_certs
from tidemark.cdc import Progress
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import PermissionDenied
from tidemark.frontier import u64_frontier
from tidemark.retry import RetryPolicy
from tidemark.rpc.identity import Identity
from tidemark.rpc.tls import TlsSettings

SCHEMA = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.TEXT))
QUICK = RetryPolicy(total_seconds=1.0, initial_backoff=0.05, max_backoff=0.2)
ADAPTER = Identity("adapter")
CATALOG = Identity("catalog")
TABLE_A, TABLE_B, VIEW_A = "u1", "u2", "u3"
HOLDER = "catalog"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertDir:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("storage")


def start(data_dir: Path, certs: CertDir) -> ServiceProcess:
    flags = certs.flags(Identity("storage"))
    return start_storage(embedded_backends(data_dir), extra=["--lease-seconds", "30", *flags])


@pytest.fixture(scope="module")
def storage(data_dir: Path, certs: CertDir) -> Iterator[ServiceProcess]:
    process = start(data_dir, certs)
    yield process
    process.kill()


def client(process: ServiceProcess, tls: TlsSettings) -> StorageClient:
    return StorageClient(process.address, tls=tls, retry=QUICK, timeout=5.0)


@pytest.fixture
async def adapter(storage: ServiceProcess, certs: CertDir) -> AsyncIterator[StorageClient]:
    async with client(storage, certs.tls(ADAPTER)) as made:
        yield made


@pytest.fixture(scope="module")
def created(storage: ServiceProcess, certs: CertDir) -> None:
    """Two tenants' tables and tenant A's view output, as the adapter makes them."""

    async def create() -> None:
        async with client(storage, certs.tls(ADAPTER)) as adapter:
            table = await adapter.create(TABLE_A, SCHEMA, tenant="tenant_a", critical_holder=HOLDER)
            # Tables are the adapter's to write.
            await adapter.append(table.write, [((7, "seven"), 0, 1)], 1)
            await adapter.create(TABLE_B, SCHEMA, tenant="tenant_b", critical_holder=HOLDER)
            await adapter.create(
                VIEW_A, SCHEMA, tenant="tenant_a", writer=TENANT_A.uri, critical_holder=HOLDER
            )

    asyncio.run(create())


pytestmark = pytest.mark.usefixtures("created")


async def test_a_tenants_compute_reads_its_own_collections_only(
    storage: ServiceProcess, certs: CertDir
) -> None:
    async with client(storage, certs.tls(TENANT_A)) as compute_a:
        pair = await compute_a.acquire(TABLE_A, "compute-a")
        assert pair.read.usable
        # It reads the table; writing it is the adapter's business.
        assert not pair.write.usable
        assert (await compute_a.snapshot(pair.read, 0)).version() == {(7, "seven"): 1}
        with pytest.raises(PermissionDenied, match="tenant_b"):
            await compute_a.acquire(TABLE_B, "compute-a")
        with pytest.raises(PermissionDenied):
            await compute_a.describe(TABLE_B)
        listed = {info.collection_id for info in await compute_a.list()}
        assert listed == {TABLE_A, VIEW_A}
    async with client(storage, certs.tls(TENANT_B)) as compute_b:
        pair = await compute_b.acquire(TABLE_B, "compute-b")
        assert pair.read.usable
        with pytest.raises(PermissionDenied):
            await compute_b.acquire(TABLE_A, "compute-b")
        # A capability of A's, handed over, is no use to B either.
        async with client(storage, certs.tls(TENANT_A)) as compute_a:
            leaked = (await compute_a.acquire(TABLE_A, "compute-a")).read
        with pytest.raises(PermissionDenied):
            await compute_b.snapshot(leaked)
        assert {info.collection_id for info in await compute_b.list()} == {TABLE_B}


async def test_only_the_maintaining_cluster_writes_a_view_output(
    storage: ServiceProcess, certs: CertDir, adapter: StorageClient
) -> None:
    async with client(storage, certs.tls(TENANT_A)) as writer:
        pair = await writer.acquire(VIEW_A, "compute-a")
        assert pair.write.usable
        upper = min(pair.write.frontier)
        await writer.append(pair.write, [((1, "one"), upper, 1)], upper + 1)
    # The adapter holds a write capability from Create, yet may not write the output.
    described = await adapter.describe(VIEW_A)
    assert (described.tenant, described.writer) == ("tenant_a", TENANT_A.uri)
    adapter_pair = await adapter.acquire(VIEW_A, "adapter")
    assert not adapter_pair.write.usable
    async with client(storage, certs.tls(TENANT_A)) as writer:
        stolen = (await writer.acquire(VIEW_A, "compute-a")).write
    with pytest.raises(PermissionDenied, match="only tidemark://compute/tenant_a/c1 writes"):
        await adapter.append(stolen, [((2, "two"), upper + 1, 1)], upper + 2)
    # Another cluster of the same tenant neither gets a write capability nor may use one.
    async with client(storage, certs.tls(TENANT_A_OTHER)) as other:
        assert not (await other.acquire(VIEW_A, "compute-a2")).write.usable
        with pytest.raises(PermissionDenied):
            await other.append(stolen, [((2, "two"), upper + 1, 1)], upper + 2)
        with pytest.raises(PermissionDenied):
            await other.reset_history(VIEW_A, HOLDER)
    # Nor through a CDC ingest.
    async with client(storage, certs.tls(Identity("sources"))) as sources:
        with pytest.raises(PermissionDenied):
            await sources.ingest_cdc(
                stolen, [Progress(u64_frontier(upper + 1), u64_frontier(upper + 2), [])]
            )
    read = (await adapter.acquire(VIEW_A, "adapter")).read
    assert (await adapter.snapshot(read, upper)).version() == {(1, "one"): 1}
    # Tenant B's cluster may not keep A's capabilities alive either.
    async with client(storage, certs.tls(TENANT_B)) as compute_b:
        with pytest.raises(PermissionDenied):
            await compute_b.renew([read])


async def test_durable_holds_belong_to_adapter_and_catalog(
    storage: ServiceProcess, certs: CertDir
) -> None:
    async with client(storage, certs.tls(CATALOG)) as catalog:
        hold = await catalog.acquire_critical(TABLE_A, HOLDER)
    async with client(storage, certs.tls(TENANT_A)) as compute_a:
        with pytest.raises(PermissionDenied):
            await compute_a.acquire_critical(TABLE_A, "compute-a")
        with pytest.raises(PermissionDenied, match="critical hold"):
            await compute_a.drop(hold)
        with pytest.raises(PermissionDenied):
            await compute_a.reset_history(TABLE_A, HOLDER)
        mine = (await compute_a.acquire(TABLE_A, "compute-a")).read
    # Another cluster of the tenant may read the table, but not drop what A1 holds; the
    # adapter may.
    async with client(storage, certs.tls(TENANT_A_OTHER)) as other:
        with pytest.raises(PermissionDenied, match="compute/tenant_a/c1's capability"):
            await other.drop(mine)
        with pytest.raises(PermissionDenied, match="compute/tenant_a/c1's capability"):
            await other.clone(mine, "stolen")
        assert (await other.acquire(TABLE_A, "compute-a2")).read.usable
    async with client(storage, certs.tls(ADAPTER)) as adapter:
        await adapter.drop(mine)


async def test_the_rules_survive_a_restart(
    storage: ServiceProcess, data_dir: Path, certs: CertDir
) -> None:
    storage.kill()
    again = start(data_dir, certs)
    try:
        async with client(again, certs.tls(ADAPTER)) as adapter:
            described = await adapter.describe(VIEW_A)
            assert (described.tenant, described.writer) == ("tenant_a", TENANT_A.uri)
            assert (await adapter.describe(TABLE_B)).tenant == "tenant_b"
        async with client(again, certs.tls(TENANT_A)) as compute_a:
            with pytest.raises(PermissionDenied):
                await compute_a.acquire(TABLE_B, "compute-a")
            assert (await compute_a.acquire(VIEW_A, "compute-a")).write.usable
    finally:
        again.kill()


async def test_without_mtls_nothing_is_checked(tmp_path: Path) -> None:
    plain = start_storage(embedded_backends(tmp_path))
    try:
        async with StorageClient(plain.address) as anyone:
            pair = await anyone.create("u9", SCHEMA, tenant="tenant_a", writer=TENANT_A.uri)
            await anyone.append(pair.write, [((1, "x"), 0, 1)], 1)
            assert (await anyone.describe("u9")).writer == TENANT_A.uri
            assert (await anyone.acquire("u9", "anyone")).write.usable
    finally:
        plain.kill()
