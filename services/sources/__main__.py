"""``python -m services.sources``: the sources process."""

from __future__ import annotations

from dataclasses import dataclass

from services.sources.runtime import RuntimeSettings, SourcesRuntime
from tidemark import timelines
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.config import ServiceConfig, listen_setting, setting
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service


@dataclass(frozen=True)
class SourcesConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:7006")
    storage: str = setting("127.0.0.1:7002", help="storage service address", metavar="HOST:PORT")
    oracle: str = setting("127.0.0.1:7001", help="timestamp oracle address", metavar="HOST:PORT")
    catalog: str = setting("127.0.0.1:7003", help="catalog service address", metavar="HOST:PORT")
    data_timeline: str = setting(timelines.DATA, help="the oracle timeline data times live in")
    catalog_timeline: str = setting(
        timelines.CATALOG, help="the oracle timeline catalog times live in"
    )
    holder: str = setting("sources", help="the holder name of this process's storage capabilities")
    storage_timeout: float = setting(
        300.0,
        help="seconds one storage call may take: a source's initial data (TPCH at a large "
        "scale factor) is one append per relation",
        metavar="SECONDS",
    )
    advance_interval: float = setting(
        1.0,
        help="seconds between moves of a quiet source's uppers to the oracle's write time",
        metavar="SECONDS",
    )
    read_poll_interval: float = setting(
        0.05,
        help="seconds between looks at the oracle's read time: once it reaches a quiet "
        "source's uppers (a read would wait), they move at once (0: only every "
        "--advance-interval)",
        metavar="SECONDS",
    )

    def runtime_settings(self) -> RuntimeSettings:
        return RuntimeSettings(
            holder=self.holder,
            data_timeline=self.data_timeline,
            catalog_timeline=self.catalog_timeline,
            advance_interval=self.advance_interval,
            read_poll_interval=self.read_poll_interval,
        )


async def main(config: SourcesConfig) -> None:
    tls = config.tls()
    storage = StorageClient(config.storage, timeout=config.storage_timeout, tls=tls)
    oracle = OracleClient(config.oracle, tls=tls)
    catalog = CatalogClient(config.catalog, tls=tls)
    runtime = SourcesRuntime(catalog, storage, oracle, config.runtime_settings())
    try:
        runtime.start()
        await serve(
            [],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            readiness=runtime.readiness,
            tls=tls,
            reflection=config.reflection,
        )
    finally:
        await runtime.close()
        await catalog.close()
        await oracle.close()
        await storage.close()


if __name__ == "__main__":
    run_service(
        main,
        SourcesConfig,
        prog="python -m services.sources",
        description="Tidemark sources: ingests every source in the catalog (load generators, "
        "PostgreSQL) into its storage collections, exactly once across restarts.",
    )
