"""Running the storage service as a real process for integration tests, on either backend
pair: the embedded one (SQLite file + local directory) or the production one (etcd + the S3
endpoint)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.s3 import ACCESS_KEY, SECRET_KEY, unique_bucket
from tests.support.service_process import ServiceProcess

# Garbage collection and orphan sweeps happen within a test; leases outlive any test that
# does not renew them (SHORT_LEASE is for the tests about expiry).
FAST_SETTINGS = (
    "--lease-seconds",
    "30",
    "--maintenance-interval",
    "0.2",
    "--retired-blob-grace",
    "0.5",
    "--orphan-grace",
    "4",
    "--orphan-sweep-interval",
    "0.5",
    "--backend-retry-seconds",
    "2",
)


SHORT_LEASE = (*FAST_SETTINGS, "--lease-seconds", "1.5")


@dataclass(frozen=True)
class Backends:
    name: str
    consensus_url: str
    blob_url: str
    key_prefix: str
    env: dict[str, str] = field(default_factory=dict)
    """Environment for the service process (S3 credentials)."""

    def args(self) -> list[str]:
        return [
            "--consensus-url",
            self.consensus_url,
            "--blob-url",
            self.blob_url,
            "--key-prefix",
            self.key_prefix,
        ]


def embedded_backends(directory: Path) -> Backends:
    return Backends(
        "embedded",
        f"sqlite://{directory / 'consensus.db'}",
        f"file://{directory / 'blobs'}",
        "storage/",
    )


def production_backends(request: pytest.FixtureRequest) -> Backends:
    """etcd (the shared server, under a key prefix of our own) and a fresh bucket on the
    shared S3 endpoint."""
    etcd = request.getfixturevalue("etcd_server")
    s3 = request.getfixturevalue("s3_server")
    return Backends(
        "etcd_s3",
        etcd.url,
        s3.url(unique_bucket("storage")),
        f"test/{uuid.uuid4().hex}/storage/",
        {"TIDEMARK_S3_ACCESS_KEY": ACCESS_KEY, "TIDEMARK_S3_SECRET_KEY": SECRET_KEY},
    )


def start_storage(
    backends: Backends, port: int = 0, extra: Sequence[str] = FAST_SETTINGS
) -> ServiceProcess:
    return ServiceProcess(
        "services.storage",
        ["--listen", f"127.0.0.1:{port}", *backends.args(), *extra],
        env=backends.env,
    )
