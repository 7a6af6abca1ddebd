"""A whole Tidemark over mTLS, each service its own process with its own certificate (compute
on the local engine: no JVM): SQL works end to end, each cluster reads only its tenant's data
and writes its views' outputs, and the adapter's SQL port serves TLS with client certificates
optional, or required with --tls-client-auth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tests.support.tls import TENANT_A, TOOL, CertDir, make_certs
from tidemark.clients.adapter import AdapterClient, StatementError, StatementResult
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.compute import ComputeClient
from tidemark.errors import FailedPrecondition, PermissionDenied, Unavailable
from tidemark.retry import RetryPolicy
from tidemark.rpc.identity import Identity, compute_identity
from tidemark.rpc.tls import TlsSettings

DEFAULT = compute_identity("tidemark", "default")
QUICK = RetryPolicy(total_seconds=1.0, initial_backoff=0.05, max_backoff=0.2)


@dataclass
class TlsStack:
    certs: CertDir
    processes: list[ServiceProcess]
    adapter: ServiceProcess
    strict_adapter: ServiceProcess
    """One that requires SQL clients' certificates (--tls-client-auth)."""
    catalog: ServiceProcess
    computes: dict[str, ServiceProcess]

    def sql_tls(self, with_certificate: bool) -> TlsSettings:
        tls = self.certs.tls(TOOL)
        return tls if with_certificate else TlsSettings("", "", tls.ca)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsStack]:
    directory = tmp_path_factory.mktemp("stack")
    certs = make_certs(directory / "tls")
    processes: list[ServiceProcess] = []

    def start(module: str, identity: Identity, *args: str) -> ServiceProcess:
        process = ServiceProcess(module, ["--listen", "127.0.0.1:0", *args, *certs.flags(identity)])
        processes.append(process)
        return process

    try:
        storage = start_storage(
            embedded_backends(directory),
            extra=[*FAST_SETTINGS, *certs.flags(Identity("storage"))],
        )
        processes.append(storage)
        oracle = start(
            "services.oracle", Identity("oracle"), "--consensus-url", f"sqlite://{directory}/o.db"
        )
        catalog = start(
            "services.catalog",
            Identity("catalog"),
            *("--storage", storage.address, "--oracle", oracle.address),
        )
        computes = {
            cluster: start(
                "services.compute",
                identity,
                *("--cluster", cluster, "--engine", "local", "--hold-interval", "0.2"),
                *("--storage", storage.address),
                *("--catalog", catalog.address, "--oracle", oracle.address),
            )
            for cluster, identity in (("default", DEFAULT), ("c1", TENANT_A))
        }
        start(
            "services.sources",
            Identity("sources"),
            *("--storage", storage.address, "--oracle", oracle.address),
            *("--catalog", catalog.address),
        )
        endpoints = ",".join(f"{name}={p.address}" for name, p in computes.items())
        backends = (
            *("--oracle", oracle.address, "--storage", storage.address),
            *("--catalog", catalog.address, "--compute", endpoints),
        )
        adapter = start("services.adapter", Identity("adapter"), *backends)
        strict = start("services.adapter", Identity("adapter"), *backends, "--tls-client-auth")
        yield TlsStack(certs, processes, adapter, strict, catalog, computes)
    finally:
        for process in processes:
            process.kill()


async def eventually(
    read: Callable[[], Awaitable[StatementResult]],
    done: Callable[[StatementResult], bool],
    seconds: float = 60.0,
) -> StatementResult:
    deadline = time.monotonic() + seconds
    while True:
        result = await read()
        if done(result) or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.2)


async def ok(client: AdapterClient, sql: str) -> StatementResult:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


async def fails(client: AdapterClient, sql: str) -> StatementError:
    result = await client.execute(sql)
    assert result.error is not None, f"{sql!r} succeeded: {result.results}"
    return result.error


async def test_sql_over_mtls_end_to_end(stack: TlsStack) -> None:
    async with AdapterClient(stack.adapter.address, tls=stack.sql_tls(False)) as sql:
        await ok(sql, "CREATE TABLE orders (id bigint, customer text, amount numeric(10,2))")
        await ok(sql, "INSERT INTO orders VALUES (1, 'ada', 12.50), (2, 'bob', 3.00)")
        await ok(
            sql,
            "CREATE MATERIALIZED VIEW spend AS SELECT customer, sum(amount) AS total "
            "FROM orders GROUP BY customer",
        )
        await ok(sql, "INSERT INTO orders VALUES (3, 'ada', 7.25)")
        rows = (await ok(sql, "SELECT customer, total FROM spend ORDER BY customer")).rows
        assert [(c, str(t)) for c, t in rows] == [("ada", "19.75"), ("bob", "3.00")]
        # The sources process ingests over mTLS too.
        await ok(sql, "CREATE SOURCE counter FROM LOAD GENERATOR COUNTER (UP TO 3)")
        counted = await eventually(
            lambda: ok(sql, "SELECT count(*), max(counter) FROM counter"),
            lambda result: result.rows == [(3, 3)],
        )
        assert counted.rows == [(3, 3)]


async def test_each_cluster_keeps_to_its_tenant(stack: TlsStack) -> None:
    async with AdapterClient(stack.adapter.address, tls=stack.sql_tls(False)) as sql:
        await ok(sql, "CREATE DATABASE tenant_a")
        await ok(sql, "CREATE CLUSTER c1 (SIZE 'small')")
        await ok(sql, "CREATE TABLE tenant_a.public.bids (amount bigint)")
        await ok(sql, "INSERT INTO tenant_a.public.bids VALUES (5), (7)")
        await ok(
            sql,
            "CREATE MATERIALIZED VIEW tenant_a.public.top IN CLUSTER c1 AS "
            "SELECT max(amount) AS top FROM tenant_a.public.bids",
        )
        await ok(sql, "SET cluster = c1")
        assert (await ok(sql, "SELECT top FROM tenant_a.public.top")).rows == [(7,)]
        assert (await ok(sql, "SELECT sum(amount) FROM tenant_a.public.bids")).rows == [(12,)]
        # Tenant A's cluster may not read the tenant tidemark's table ...
        await ok(sql, "CREATE TABLE mine (x bigint)")
        await ok(sql, "INSERT INTO mine VALUES (1)")
        denied = await fails(sql, "SELECT sum(x) FROM mine")
        assert "tidemark://compute/tenant_a/c1 may not read tenant tidemark's" in denied.message
        assert denied.code == "42501" and "each compute cluster serves one database" in denied.hint
        # ... nor the default cluster tenant A's.
        await ok(sql, "SET cluster = default")
        denied = await fails(sql, "SELECT sum(amount) FROM tenant_a.public.bids")
        assert "tidemark://compute/tidemark/default may not read tenant tenant_a's" in (
            denied.message
        )
        assert (await ok(sql, "SELECT sum(x) FROM mine")).rows == [(1,)]


async def test_sql_clients_need_tls_and_a_certificate_where_required(stack: TlsStack) -> None:
    async with AdapterClient(stack.adapter.address, timeout=2.0, retry=QUICK) as plaintext:
        with pytest.raises(Unavailable):
            await plaintext.execute("SELECT 1")
    strict = stack.strict_adapter.address
    async with AdapterClient(strict, timeout=2.0, retry=QUICK, tls=stack.sql_tls(False)) as sql:
        with pytest.raises(Unavailable):
            await sql.execute("SELECT 1")
    async with AdapterClient(strict, tls=stack.sql_tls(True)) as sql:
        assert (await ok(sql, "SELECT 1 + 1")).rows == [(2,)]


async def test_the_catalog_and_compute_take_commands_from_the_adapter_only(
    stack: TlsStack,
) -> None:
    cluster_a = stack.certs.tls(TENANT_A)
    async with CatalogClient(stack.catalog.address, tls=cluster_a, retry=QUICK) as catalog:
        # Clusters read the catalog: this read gets past the caller check to the catalog,
        # which answers it, or refuses it because maintenance has compacted time 0 away by
        # now (which it does on its own schedule) ...
        try:
            await catalog.snapshot_at(0)
        except FailedPrecondition as exc:
            assert "compacted" in exc.message, exc.message
        with pytest.raises(PermissionDenied, match="CompareAndAppend"):
            await catalog.compare_and_append(0, 1, [])  # ... but do not write it
    default = stack.computes["default"].address
    async with ComputeClient(default, tls=cluster_a, retry=QUICK) as compute:
        with pytest.raises(PermissionDenied, match="AdvanceCatalogFrontier"):
            await compute.advance_catalog_frontier(0)
    async with ComputeClient(default, tls=stack.certs.tls(TOOL)) as tool:
        assert (await tool.status()).cluster == "default"
