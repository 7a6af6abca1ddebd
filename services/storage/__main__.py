"""``python -m services.storage``: the storage (persist) process."""

from __future__ import annotations

from dataclasses import dataclass

from services.storage.core import StorageCore, StorageSettings
from services.storage.service import storage_service
from tidemark.blob import open_blob
from tidemark.config import (
    ServiceConfig,
    blob_url_setting,
    consensus_url_setting,
    listen_setting,
    setting,
)
from tidemark.consensus import open_consensus
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service


@dataclass(frozen=True)
class StorageConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:7002")
    consensus_url: str = consensus_url_setting()
    blob_url: str = blob_url_setting()
    key_prefix: str = setting(
        "storage/", help="prefix of this service's consensus keys", metavar="PREFIX"
    )
    lease_seconds: float = setting(
        60.0, help="how long a capability lives without being renewed or used"
    )
    max_capabilities: int = setting(2000, help="most live capabilities per collection")
    maintenance_interval: float = setting(
        2.0,
        help="seconds between background passes (lease expiry, compaction, garbage)",
        metavar="SECONDS",
    )
    retired_blob_grace: float = setting(
        60.0,
        help="seconds a batch replaced by compaction is kept for reads still using it (Spark "
        "jobs reading listed parts: a job running longer lists again)",
        metavar="SECONDS",
    )
    orphan_grace: float = setting(
        600.0,
        help="age in seconds after which an unreferenced blob (from a crashed append) is "
        "deleted; appends must finish within half of it",
        metavar="SECONDS",
    )
    orphan_sweep_interval: float = setting(
        60.0, help="seconds between listings of each collection's blobs", metavar="SECONDS"
    )
    cache_megabytes: int = setting(256, help="memory for decoded batches")
    max_rows_per_message: int = setting(65536, help="most rows in one streamed message")
    backend_retry_seconds: float = setting(
        5.0, help="how long a call retries an unavailable backend before failing UNAVAILABLE"
    )

    def settings(self) -> StorageSettings:
        return StorageSettings(
            prefix=self.key_prefix,
            lease_ms=round(self.lease_seconds * 1000),
            max_capabilities=self.max_capabilities,
            retired_grace_ms=round(self.retired_blob_grace * 1000),
            orphan_grace_ms=round(self.orphan_grace * 1000),
            maintenance_interval_s=self.maintenance_interval,
            orphan_sweep_interval_s=self.orphan_sweep_interval,
            cache_bytes=self.cache_megabytes << 20,
            max_rows_per_message=self.max_rows_per_message,
            backend_retry_s=self.backend_retry_seconds,
        )


async def main(config: StorageConfig) -> None:
    consensus = open_consensus(config.consensus_url)
    blob = await open_blob(config.blob_url)
    core = StorageCore(consensus, blob, config.settings())
    core.start()
    try:
        await serve(
            [storage_service(core)],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            tls=config.tls(),
            reflection=config.reflection,
        )
    finally:
        await core.close()
        await blob.close()
        await consensus.close()


if __name__ == "__main__":
    run_service(
        main,
        StorageConfig,
        prog="python -m services.storage",
        description="Tidemark storage: durable time-varying collections with leased read and "
        "write capabilities, state in a consensus store and batches in a blob store.",
    )
