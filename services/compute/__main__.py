"""``python -m services.compute``: one compute process, serving one cluster.

It announces its port as soon as it serves (Status answers at once); the Spark session starts
in the background meanwhile and the first MaintainView waits for it. With ``--catalog`` the
cluster's catalog controller (``services/compute/controller.py``) runs beside the server,
installing and dropping the dataflows the catalog assigns to this cluster.
"""

from __future__ import annotations

import os

# PySpark launches the JVM by fork and exec while gRPC's threads are busy. With gRPC's fork
# handlers on (they serve children that go on using gRPC), that launch often failed: the
# gateway exited before reporting its port, and the session start's retries hid it. This
# process never uses gRPC in a child, so they are off, set before gRPC is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import asyncio
from dataclasses import dataclass

from services.compute.controller import CatalogController
from services.compute.dataflow.spill import TaskStateBudget
from services.compute.engines import Engine, LocalEngine, SparkEngine
from services.compute.host import DataflowManager, HostSettings
from services.compute.metrics import publish_dataflows
from services.compute.progress import log_progress
from services.compute.readiness import ComputeReadiness
from services.compute.service import compute_service
from services.compute.spark.liveness import ClusterStart, Liveness
from services.compute.spark.session import network_settings
from tidemark import timelines
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.config import ServiceConfig, listen_setting, setting
from tidemark.errors import InvalidArgument
from tidemark.logging import get_logger
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service
from tidemark.tasks import cancel_and_wait

log = get_logger("compute")


@dataclass(frozen=True)
class ComputeConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:6879")
    cluster: str = setting("default", help="the name of the cluster this process serves")
    storage: str = setting("127.0.0.1:7002", help="storage service address", metavar="HOST:PORT")
    catalog: str = setting(
        "",
        help="catalog service address; when set, the cluster's catalog controller installs "
        "the materialized views and indexes assigned to this cluster (empty: none)",
        metavar="HOST:PORT",
    )
    oracle: str = setting(
        "",
        help="timestamp oracle address (needed with --catalog): the catalog controller starts "
        "following the catalog at the oracle's catalog read time",
        metavar="HOST:PORT",
    )
    catalog_timeline: str = setting(
        timelines.CATALOG, help="the oracle timeline of catalog times (the catalog's --timeline)"
    )
    data_timeline: str = setting(
        timelines.DATA,
        help="the oracle timeline of data times, where the cluster publishes the times its "
        "dataflows wrote (the adapter's --data-timeline)",
    )
    engine: str = setting(
        "spark",
        help="where operator state lives: resident Spark tasks, or this process (local; "
        "for tools and tests, no JVM)",
        choices=("spark", "local"),
    )
    spark_master: str = setting(
        "local[*]", help="the Spark master of this cluster's application", metavar="URL"
    )
    spark_driver_memory: str = setting("1g", help="the Spark driver's JVM heap", metavar="SIZE")
    spark_executor_memory: str = setting(
        "1g",
        help="each Spark executor's JVM heap, on a cluster master (a worker must offer at "
        "least this much memory)",
        metavar="SIZE",
    )
    spark_driver_host: str = setting(
        "",
        help="the address executors reach this process's Spark driver and resident listener "
        "at, on a cluster master (empty: Spark's choice of this machine's name or address)",
        metavar="HOST",
    )
    spark_bind_address: str = setting(
        "",
        help="the local address the Spark driver and the resident listener bind, when it "
        "differs from --spark-driver-host (empty: the driver host for Spark, every interface "
        "for the resident listener)",
        metavar="ADDRESS",
    )
    spark_driver_port: int = setting(
        0,
        help="the Spark driver's RPC port, which executors connect to (0: any free port)",
        metavar="PORT",
    )
    spark_block_manager_port: int = setting(
        0,
        help="the block managers' port, the driver's and each executor's (0: any free port)",
        metavar="PORT",
    )
    spark_resident_port: int = setting(
        0,
        help="the port resident Spark tasks connect back to this process on (0: any free "
        "port; fix it, like the driver and block manager ports, for a NetworkPolicy)",
        metavar="PORT",
    )
    spark_mesh_ports: str = setting(
        "",
        help="first-last: the ports resident Spark tasks listen on for each other, each task "
        "taking the first free one on its executor (empty: any free port; fix them for a "
        "NetworkPolicy between executors)",
        metavar="RANGE",
    )
    shards: int = setting(2, help="resident Spark tasks, each holding one shard of the state")
    task_heartbeat: float = setting(
        2.0,
        help="with --engine spark, how often the driver and each resident task speak when "
        "they have nothing else to say",
        metavar="SECONDS",
    )
    task_deadline: float = setting(
        15.0,
        help="with --engine spark, the silence after which the driver gives a resident task "
        "up (and a task its driver): its dataflows are restored elsewhere; at least two "
        "heartbeats",
        metavar="SECONDS",
    )
    cluster_start_timeout: float = setting(
        120.0,
        help="with --engine spark, how long one launch of the resident tasks may take until "
        "every task has connected (slots may still be coming up)",
        metavar="SECONDS",
    )
    cluster_start_attempts: int = setting(
        3,
        help="with --engine spark, launches of the resident tasks before a start gives up, "
        "waiting 2, 4, 8... s (at most 30) between them",
    )
    lease_ms: int = setting(
        60_000,
        help="the storage service's capability lease; leases are renewed three times per "
        "lease, and sooner when storage grants shorter ones",
        metavar="MS",
    )
    hold_interval: float = setting(
        1.0,
        help="seconds between moves of the input read holds up to the dataflows' uppers",
        metavar="SECONDS",
    )
    index_history_ms: int = setting(
        60_000,
        help="how far behind a dataflow's latest complete time its index stays readable; "
        "older history is compacted away and peeks before it are refused",
        metavar="MS",
    )
    one_shot_workers: int = setting(
        2,
        help="one-shot queries evaluated at once (each on its own thread); more wait in line, "
        "and index peeks never do",
    )
    statement_memory_mb: int = setting(
        1024,
        help="memory budget of one one-shot query, estimated from the rows it holds; a query "
        "over it fails with RESOURCE_EXHAUSTED (SQLSTATE 53200) (0: no budget)",
        metavar="MIB",
    )
    spark_one_shot_rows: int = setting(
        100_000,
        help="with --engine spark, one-shot queries whose inputs hold at least this many "
        "updates run as Spark jobs over storage's Parquet parts; smaller ones run in this "
        "process, where they answer sooner (-1: never on Spark)",
        metavar="ROWS",
    )
    spark_hydration_rows: int = setting(
        1_000_000,
        help="with --engine spark, dataflows whose inputs hold at least this many updates "
        "hydrate by Spark jobs over storage's Parquet parts (the executors build the "
        "arrangements and write the initial output); smaller ones hydrate from snapshots "
        "streamed through this process, which start sooner (-1: never by Spark)",
        metavar="ROWS",
    )
    dataflow_memory_mb: int = setting(
        4096,
        help="memory budget of one dataflow, estimated from the rows it holds in this process "
        "(with --engine spark: the batches its driver passes between operators); a dataflow "
        "over it reports failed, the others go on (0: no budget)",
        metavar="MIB",
    )
    task_state_memory_mb: int = setting(
        2048,
        help="with --engine spark, the operator state each resident task keeps in memory, "
        "estimated from the rows it holds; past it, join arrangements move the keys held "
        "longest to the executor's local disk, and dataflows go on, slower "
        "(0: no bound)",
        metavar="MIB",
    )
    task_state_disk_mb: int = setting(
        0,
        help="with --engine spark, how much operator state each resident task may spill to "
        "local disk; a dataflow whose state needs more reports failed with "
        "RESOURCE_EXHAUSTED (0: no limit)",
        metavar="MIB",
    )
    peek_wait: float = setting(
        30.0,
        help="how long a peek waits for a frontier when it names no wait of its own",
        metavar="SECONDS",
    )
    progress_log_interval: float = setting(
        3.0,
        help="log the progress of each peek running longer than this, and of each hydrating "
        "dataflow, this often",
        metavar="SECONDS",
    )

    def host_settings(self) -> HostSettings:
        return HostSettings(
            cluster=self.cluster,
            renew_interval_s=max(0.05, self.lease_ms / 3 / 1000),
            hold_interval_s=self.hold_interval,
            default_wait_s=self.peek_wait,
            index_history_ms=self.index_history_ms,
            one_shot_workers=self.one_shot_workers,
            statement_budget_bytes=self.statement_memory_mb << 20,
            spark_one_shot_rows=self.spark_one_shot_rows,
            spark_hydration_rows=self.spark_hydration_rows,
        )

    def spark_settings(self) -> dict[str, str]:
        """The Spark settings these flags give (the session adds its own, ``session.py``)."""
        return {
            "spark.driver.memory": self.spark_driver_memory,
            "spark.executor.memory": self.spark_executor_memory,
            **network_settings(
                driver_host=self.spark_driver_host,
                bind_address=self.spark_bind_address,
                driver_port=self.spark_driver_port,
                block_manager_port=self.spark_block_manager_port,
                resident_port=self.spark_resident_port,
                mesh_ports=self.spark_mesh_ports,
            ),
        }

    def make_engine(self) -> Engine:
        if self.engine == "local":
            return LocalEngine(self.dataflow_memory_mb << 20)
        return SparkEngine(
            self.spark_master,
            self.shards,
            self.spark_settings(),
            app_name=f"tidemark-compute-{self.cluster}",
            budget_bytes=self.dataflow_memory_mb << 20,
            tls=self.tls(),
            state_budget=TaskStateBudget(
                self.task_state_memory_mb << 20, self.task_state_disk_mb << 20
            ),
            start=ClusterStart(
                Liveness(self.task_heartbeat, self.task_deadline),
                self.cluster_start_timeout,
                self.cluster_start_attempts,
            ),
        )


def catalog_controller(
    config: ComputeConfig, catalog: CatalogClient, host: DataflowManager
) -> CatalogController:
    """The controller of the process's cluster. It starts following the catalog at the
    oracle's catalog read time, a time every catalog write acknowledged so far is at or
    before."""
    oracle = OracleClient(config.oracle, tls=config.tls())

    async def start_time() -> int:
        return await oracle.read_ts(config.catalog_timeline)

    return CatalogController(
        cluster_name=config.cluster, catalog=catalog, host=host, start_time=start_time
    )


async def main(config: ComputeConfig) -> None:
    if config.catalog and not config.oracle:
        raise SystemExit("--catalog needs --oracle: the controller reads catalog times from it")
    try:
        engine = config.make_engine()
    except InvalidArgument as exc:
        raise SystemExit(exc.message) from None
    tls = config.tls()
    storage = StorageClient(config.storage, tls=tls)
    catalog = CatalogClient(config.catalog, tls=tls) if config.catalog else None
    host = DataflowManager(storage, engine, config.host_settings())
    controller = None
    if catalog is not None:
        controller = catalog_controller(config, catalog, host)
        host.controller = controller
        data_oracle = OracleClient(config.oracle, tls=tls)

        async def publish_time(timestamp: int) -> None:
            await data_oracle.apply_write(config.data_timeline, timestamp)

        host.publish_time = publish_time
    if isinstance(engine, SparkEngine):
        engine.start()
    serving = asyncio.create_task(
        serve(
            [compute_service(host, engine, config.cluster)],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            readiness=ComputeReadiness(host, controller),
            tls=tls,
            reflection=config.reflection,
        ),
        name="serve",
    )
    following = (
        asyncio.create_task(controller.run(), name="catalog-controller")
        if controller is not None
        else None
    )
    supervising = asyncio.create_task(host.supervise(), name="dataflow-supervisor")
    publishing = asyncio.create_task(publish_dataflows(host), name="dataflow-metrics")
    logging_progress = asyncio.create_task(
        log_progress(host.queries, host.running, config.progress_log_interval),
        name="progress-log",
    )
    tasks = [task for task in (serving, following, supervising) if task is not None]
    try:
        # A controller or supervisor that stops (neither ever should) takes the process down
        # with it: a cluster that no longer follows its catalog, or no longer restarts its
        # failed dataflows, must not keep serving peeks.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        if following is not None and following in done:
            raise RuntimeError("the catalog controller stopped")
        if supervising in done:
            raise RuntimeError("the dataflow supervisor stopped")
    finally:
        await cancel_and_wait(*tasks, publishing, logging_progress)
        await host.close()
        await engine.close()
        if catalog is not None:
            await catalog.close()
        await storage.close()


if __name__ == "__main__":
    run_service(
        main,
        ComputeConfig,
        prog="python -m services.compute",
        description="Tidemark compute: one cluster's dataflows, maintained incrementally on "
        "Spark, written back to storage and kept as indexes that answer peeks.",
    )
