"""The processes of a local Tidemark: which module, which port, which flags.

Ports follow the adapter's: with the default base port 6875 the adapter listens on 6875 (gRPC) and
6874 (the PostgreSQL wire protocol, base port - 1), the
oracle on 6876, storage on 6877, the catalog on 6878, the ``default`` compute cluster on 6879 and
the sources process (load generators, PostgreSQL sources) on 6880. Each serves its Prometheus
metrics 100 ports above its gRPC port (6975 to 6980 by default).

With ``tidemark up --tls`` every service gets the certificate of its identity from the data
directory's ``tls/`` (written by ``tidemark certs``'s code) and serves mTLS; the ``default``
cluster is the compute of the tenant ``tidemark``, the database made at bootstrap.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

from tidemark.rpc.identity import Identity, compute_identity
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import file_stem

DEFAULT_BASE_PORT = 6875
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_CLUSTER = "default"
METRICS_PORT_OFFSET = 100
"""A service's metrics port is its gRPC port plus this."""
DEFAULT_TENANT = "tidemark"
"""The database the catalog makes at bootstrap: the tenant of the ``default`` cluster."""
TLS_DIR = "tls"
"""Where ``tidemark up --tls`` keeps the CA and the certificates, under the data directory."""
CLI_IDENTITY = Identity("client", name="cli")


def tls_settings(tls_dir: Path, identity: Identity) -> TlsSettings:
    """The certificate files of ``identity`` in ``tls_dir`` (as ``tidemark certs`` names
    them)."""
    stem = tls_dir / file_stem(identity)
    return TlsSettings(f"{stem}.crt", f"{stem}.key", str(tls_dir / "ca.crt"))


def cli_tls(tls_dir: Path) -> TlsSettings:
    """What the command-line tools present to a ``tidemark up --tls``."""
    return tls_settings(tls_dir, CLI_IDENTITY)


def identity_of(name: str) -> Identity:
    """The identity of the local service called ``name``."""
    if name == "compute":
        return compute_identity(DEFAULT_TENANT, DEFAULT_CLUSTER)
    return Identity(name)


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    port: int
    args: tuple[str, ...]
    note: str = ""
    """Shown next to the endpoint (e.g. the compute cluster's name)."""
    metrics_port: int = 0
    """Where the service serves Prometheus metrics (0: nowhere)."""
    postgres_url: str = ""
    """The service's PostgreSQL wire protocol endpoint, if it has one (the adapter)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else ""

    def banner(self) -> str:
        """The service's line in ``tidemark up``'s list of endpoints."""
        metrics = f"  metrics {self.metrics_url}" if self.metrics_port else ""
        note = f"  ({self.note})" if self.note else ""
        line = f"  {self.name:<8} grpc://{self.address}{metrics}{note}"
        if self.postgres_url:
            line += f"\n  {'':<8} {self.postgres_url}  (psql, any PostgreSQL client)"
        return line


def session_keys_path(data_dir: Path) -> Path:
    """The adapter's session keys file (``up`` creates it once), so sessions clients hold stay
    valid when the supervisor restarts the adapter."""
    return data_dir / "session-keys"


def with_metrics(spec: ServiceSpec) -> ServiceSpec:
    """``spec`` serving its metrics on its gRPC port plus ``METRICS_PORT_OFFSET``."""
    port = spec.port + METRICS_PORT_OFFSET
    return replace(spec, metrics_port=port, args=(*spec.args, "--metrics-port", str(port)))


def with_tls(spec: ServiceSpec, tls_dir: Path) -> ServiceSpec:
    """``spec`` serving (and calling) over mTLS with its identity's certificate."""
    tls = tls_settings(tls_dir, identity_of(spec.name))
    flags: tuple[str, ...] = ("--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca)
    note = spec.note
    if spec.name == "adapter":
        note = f"SQL: tidemark sql --address {spec.address} --tls-dir {tls_dir}"
        # PostgreSQL clients get TLS too (sslmode=require), with the same certificate.
        flags += ("--pgwire-tls-cert", tls.cert, "--pgwire-tls-key", tls.key)
    return replace(spec, args=(*spec.args, *flags), note=note)


def planned_services(
    data_dir: Path,
    base_port: int = DEFAULT_BASE_PORT,
    spark_master: str = DEFAULT_SPARK_MASTER,
    tls_dir: Path | None = None,
) -> list[ServiceSpec]:
    """The processes of a local Tidemark, in start order (each one's dependencies first);
    with ``tls_dir``, over mTLS with the certificates there."""
    consensus = "sqlite://" + str(data_dir / "consensus.db")
    blobs = "file://" + str(data_dir / "blobs")
    adapter = f"127.0.0.1:{base_port}"
    pgwire = f"127.0.0.1:{base_port - 1}"
    oracle = f"127.0.0.1:{base_port + 1}"
    storage = f"127.0.0.1:{base_port + 2}"
    catalog = f"127.0.0.1:{base_port + 3}"
    compute = f"127.0.0.1:{base_port + 4}"
    specs = [
        ServiceSpec("oracle", "services.oracle", base_port + 1, ("--consensus-url", consensus)),
        ServiceSpec(
            "storage",
            "services.storage",
            base_port + 2,
            ("--consensus-url", consensus, "--blob-url", blobs),
        ),
        ServiceSpec(
            "catalog", "services.catalog", base_port + 3, ("--storage", storage, "--oracle", oracle)
        ),
        ServiceSpec(
            "sources",
            "services.sources",
            base_port + 5,
            ("--storage", storage, "--catalog", catalog, "--oracle", oracle),
            note="ingests CREATE SOURCE ... FROM LOAD GENERATOR | POSTGRES",
        ),
        ServiceSpec(
            "compute",
            "services.compute",
            base_port + 4,
            (
                "--cluster",
                DEFAULT_CLUSTER,
                "--storage",
                storage,
                "--catalog",
                catalog,
                "--oracle",
                oracle,
                "--spark-master",
                spark_master,
            ),
            note=f"cluster {DEFAULT_CLUSTER}",
        ),
        ServiceSpec(
            "adapter",
            "services.adapter",
            base_port,
            (
                "--oracle",
                oracle,
                "--catalog",
                catalog,
                "--storage",
                storage,
                "--compute",
                f"{DEFAULT_CLUSTER}={compute}",
                "--pgwire-listen",
                pgwire,
                "--session-keys-file",
                str(session_keys_path(data_dir)),
            ),
            note=f"SQL: tidemark sql --address {adapter}",
            postgres_url=f"postgres://tidemark@{pgwire}/tidemark",
        ),
    ]
    specs = [with_metrics(spec) for spec in specs]
    if tls_dir is not None:
        specs = [with_tls(spec, tls_dir) for spec in specs]
    return specs


def is_built(spec: ServiceSpec) -> bool:
    """Whether the service has a process entry point yet."""
    return importlib.util.find_spec(f"{spec.module}.__main__") is not None
