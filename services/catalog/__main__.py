"""``python -m services.catalog``: the catalog process."""

from __future__ import annotations

from dataclasses import dataclass

from services.catalog.catalog import CATALOG_COLLECTION_ID, Catalog, CatalogSettings
from services.catalog.holds import CatalogHolds, HoldSettings
from services.catalog.service import catalog_service
from services.catalog.storage_log import StorageCatalogLog
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.config import ServiceConfig, listen_setting, setting
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service


@dataclass(frozen=True)
class CatalogConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:7003")
    storage: str = setting("127.0.0.1:7002", help="storage service address", metavar="HOST:PORT")
    oracle: str = setting("127.0.0.1:7001", help="timestamp oracle address", metavar="HOST:PORT")
    timeline: str = setting("catalog", help="the oracle timeline catalog times live in")
    history_seconds: float = setting(
        3600.0,
        help="how far back (in catalog time) SnapshotAt and SubscribeAt can read; older "
        "history is compacted",
        metavar="SECONDS",
    )
    maintenance_interval: float = setting(
        5.0, help="seconds between compaction passes", metavar="SECONDS"
    )
    data_history_seconds: float = setting(
        900.0,
        help="how far behind a table's, source's or materialized view's upper the catalog's "
        "durable read hold on it stays (the adapter's --history-seconds, the AS OF window)",
        metavar="SECONDS",
    )
    hold_interval: float = setting(
        5.0, help="seconds between passes over the durable read holds", metavar="SECONDS"
    )
    orphan_grace_seconds: float = setting(
        300.0,
        help="age after which a held collection that no catalog object names is released "
        "(an adapter creates a collection shortly before the catalog append naming it)",
        metavar="SECONDS",
    )
    bootstrap_defaults: bool = setting(
        True,
        help="create the database 'tidemark', its schema 'public' and the cluster 'default' "
        "when the catalog is first created",
    )

    def hold_settings(self) -> HoldSettings:
        return HoldSettings(
            history_ms=round(self.data_history_seconds * 1000),
            interval_seconds=self.hold_interval,
            orphan_grace_ms=round(self.orphan_grace_seconds * 1000),
        )

    def settings(self) -> CatalogSettings:
        return CatalogSettings(
            timeline=self.timeline,
            history_ms=round(self.history_seconds * 1000),
            maintenance_seconds=self.maintenance_interval,
            bootstrap_defaults=self.bootstrap_defaults,
        )


async def main(config: CatalogConfig) -> None:
    tls = config.tls()
    storage = StorageClient(config.storage, tls=tls)
    oracle = OracleClient(config.oracle, tls=tls)
    catalog = Catalog(StorageCatalogLog(storage, CATALOG_COLLECTION_ID), oracle, config.settings())
    holds = CatalogHolds(
        storage,
        lambda: [row.item for row in catalog.history.index.rows.values()],
        config.hold_settings(),
    )
    try:
        await catalog.start()
        holds.start()
        await serve(
            [catalog_service(catalog)],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            readiness=catalog.readiness,
            tls=tls,
            reflection=config.reflection,
        )
    finally:
        await holds.close()
        await catalog.close()
        await oracle.close()
        await storage.close()


if __name__ == "__main__":
    run_service(
        main,
        CatalogConfig,
        prog="python -m services.catalog",
        description="Tidemark catalog: the durable, totally ordered record of what exists, "
        "in the oracle's catalog timeline, kept in one storage collection.",
    )
