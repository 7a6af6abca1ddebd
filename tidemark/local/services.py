"""The processes of a local Tidemark: which module, which port, which flags.

Ports follow the adapter's: with the default base port 6875 the adapter listens on 6875 (gRPC) and
6874 (the PostgreSQL wire protocol, base port - 1), the
oracle on 6876, storage on 6877, the catalog on 6878, the ``default`` compute cluster on 6879 and
the sources process (load generators, PostgreSQL sources) on 6880. Each serves its Prometheus
metrics 100 ports above its gRPC port (6975 to 6980 by default).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_BASE_PORT = 6875
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_CLUSTER = "default"
METRICS_PORT_OFFSET = 100
"""A service's metrics port is its gRPC port plus this."""


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


def planned_services(
    data_dir: Path,
    base_port: int = DEFAULT_BASE_PORT,
    spark_master: str = DEFAULT_SPARK_MASTER,
) -> list[ServiceSpec]:
    """The processes of a local Tidemark, in start order (each one's dependencies first)."""
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
    return [with_metrics(spec) for spec in specs]


def is_built(spec: ServiceSpec) -> bool:
    """Whether the service has a process entry point yet."""
    return importlib.util.find_spec(f"{spec.module}.__main__") is not None
