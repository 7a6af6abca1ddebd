"""mTLS between real service processes: the handshake, identities checked per service, the
refusal of plaintext and certificate-less clients, and reflection switched off."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.service_process import REPO_ROOT, ServiceProcess
from tests.support.tls import TENANT_A, TOOL, CertDir, make_certs
from tidemark.clients.oracle import OracleClient
from tidemark.errors import PermissionDenied, Unavailable
from tidemark.retry import RetryPolicy
from tidemark.rpc.identity import Identity
from tidemark.rpc.tls import TlsSettings

QUICK = RetryPolicy(total_seconds=1.0, initial_backoff=0.05, max_backoff=0.2)
ORACLE = Identity("oracle")
ADAPTER = Identity("adapter")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertDir:
    return make_certs(tmp_path_factory.mktemp("certs"))


def start_oracle(directory: Path, *extra: str) -> ServiceProcess:
    return ServiceProcess(
        "services.oracle",
        [
            "--listen",
            "127.0.0.1:0",
            "--consensus-url",
            f"sqlite://{directory / 'consensus.db'}",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def oracle(certs: CertDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_oracle(tmp_path_factory.mktemp("oracle"), *certs.flags(ORACLE))
    yield process
    process.kill()


async def test_mtls_handshake_carries_the_callers_identity(
    oracle: ServiceProcess, certs: CertDir
) -> None:
    async with OracleClient(oracle.address, tls=certs.tls(ADAPTER)) as client:
        written = await client.write_ts("data")
        await client.apply_write("data", written)
        assert await client.read_ts("data") >= written > 0
    started = oracle.wait_for_record(lambda r: r.get("event") == "server_started")
    assert started["tls"] == "mtls"


async def test_an_identity_outside_the_services_table_is_denied(
    oracle: ServiceProcess, certs: CertDir
) -> None:
    async with OracleClient(oracle.address, tls=certs.tls(TOOL), retry=QUICK) as client:
        with pytest.raises(PermissionDenied, match="tidemark://client/tests may not call"):
            await client.read_ts("data")
    # A compute cluster is one of the oracle's callers, whatever its tenant.
    async with OracleClient(oracle.address, tls=certs.tls(TENANT_A)) as client:
        assert await client.write_ts("data") > 0


async def test_a_plaintext_client_is_refused(oracle: ServiceProcess) -> None:
    async with OracleClient(oracle.address, timeout=2.0, retry=QUICK) as client:
        with pytest.raises(Unavailable):
            await client.read_ts("data")


async def test_a_tls_client_without_a_certificate_is_refused(
    oracle: ServiceProcess, certs: CertDir
) -> None:
    server_only = TlsSettings("", "", certs.tls(ADAPTER).ca)
    async with OracleClient(oracle.address, timeout=2.0, retry=QUICK, tls=server_only) as client:
        with pytest.raises(Unavailable):
            await client.read_ts("data")


async def test_a_certificate_from_another_ca_is_refused(
    oracle: ServiceProcess, tmp_path: Path
) -> None:
    other = make_certs(tmp_path / "other")
    async with OracleClient(
        oracle.address, timeout=2.0, retry=QUICK, tls=other.tls(ADAPTER)
    ) as client:
        with pytest.raises(Unavailable):
            await client.read_ts("data")


def _listed_services(address: str, tls: TlsSettings | None) -> list[str]:
    channel = (
        grpc.secure_channel(address, tls.channel_credentials())
        if tls is not None
        else grpc.insecure_channel(address)
    )
    with channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = stub.ServerReflectionInfo(iter([request]), timeout=5)
        return [s.name for r in responses for s in r.list_services_response.service]


def test_reflection_lists_the_services_unless_switched_off(
    oracle: ServiceProcess, certs: CertDir, tmp_path: Path
) -> None:
    assert "tidemark.v1.TimestampOracle" in _listed_services(oracle.address, certs.tls(TOOL))
    hidden = start_oracle(tmp_path, "--no-reflection")
    try:
        with pytest.raises(grpc.RpcError) as raised:
            _listed_services(hidden.address, None)
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        hidden.kill()


def test_half_a_tls_setup_is_a_usage_error(certs: CertDir) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.oracle", "--tls-cert", certs.tls(ORACLE).cert],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--tls-cert, --tls-key and --tls-ca together" in done.stderr


def _probe(address: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    port = address.rpartition(":")[2]
    return subprocess.run(
        [sys.executable, "-m", "tidemark.probe", port, *extra],
        cwd=REPO_ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_probe_checks_health_over_mtls_with_the_services_own_variables(
    oracle: ServiceProcess, certs: CertDir
) -> None:
    own = certs.tls(ORACLE)
    env = {"TIDEMARK_TLS_CERT": own.cert, "TIDEMARK_TLS_KEY": own.key, "TIDEMARK_TLS_CA": own.ca}
    assert _probe(oracle.address, env).returncode == 0
    assert _probe(oracle.address, env, "--service", "liveness").returncode == 0
    plaintext = _probe(oracle.address, {}, "--timeout", "1")
    assert plaintext.returncode == 1 and "not serving" in plaintext.stderr
