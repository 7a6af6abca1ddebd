"""Every service's Prometheus endpoint, scraped while SQL runs against real processes: the RPC,
storage, oracle and compute metrics are there and move. And readiness: health reports SERVING
only once a service's dependencies let it serve, while liveness answers from the start."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.clients.adapter import AdapterClient

NAMES = ("oracle", "storage", "catalog", "sources", "compute", "adapter")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Deployment:
    processes: dict[str, ServiceProcess]
    metrics_ports: dict[str, int]

    def address(self, name: str) -> str:
        return self.processes[name].address

    def scrape(self, name: str) -> Samples:
        url = f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def start(directory: Path) -> Deployment:
    ports = {name: free_port() for name in NAMES}
    processes: dict[str, ServiceProcess] = {}

    def metrics(name: str) -> tuple[str, str]:
        return ("--metrics-port", str(ports[name]))

    try:
        processes["storage"] = start_storage(
            embedded_backends(directory), extra=(*FAST_SETTINGS, *metrics("storage"))
        )
        storage = processes["storage"].address
        processes["oracle"] = ServiceProcess(
            "services.oracle",
            [
                *("--listen", "127.0.0.1:0"),
                *("--consensus-url", f"sqlite://{directory}/oracle.db", *metrics("oracle")),
            ],
        )
        oracle = processes["oracle"].address
        processes["catalog"] = ServiceProcess(
            "services.catalog",
            [
                *("--listen", "127.0.0.1:0", "--storage", storage, "--oracle", oracle),
                *metrics("catalog"),
            ],
        )
        catalog = processes["catalog"].address
        processes["sources"] = ServiceProcess(
            "services.sources",
            [
                *("--listen", "127.0.0.1:0", "--storage", storage, "--oracle", oracle),
                *("--catalog", catalog, *metrics("sources")),
            ],
        )
        processes["compute"] = ServiceProcess(
            "services.compute",
            [
                *("--listen", "127.0.0.1:0", "--cluster", "default", "--engine", "local"),
                *("--storage", storage, "--catalog", catalog, "--oracle", oracle),
                *("--hold-interval", "0.2", *metrics("compute")),
            ],
        )
        processes["adapter"] = ServiceProcess(
            "services.adapter",
            [
                *("--listen", "127.0.0.1:0", "--oracle", oracle, "--storage", storage),
                *("--catalog", catalog, "--compute", f"default={processes['compute'].address}"),
                *metrics("adapter"),
            ],
        )
    except BaseException:
        for process in processes.values():
            process.kill()
        raise
    return Deployment(processes, ports)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    running = start(tmp_path_factory.mktemp("metrics"))
    try:
        yield running
    finally:
        for process in running.processes.values():
            process.kill()


async def health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


async def eventually_serving(address: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while await health(address) != SERVING:
        assert time.monotonic() < deadline, f"{address} never became ready"
        await asyncio.sleep(0.2)


async def test_every_service_is_ready_and_live(deployment: Deployment) -> None:
    for name in NAMES:
        await eventually_serving(deployment.address(name))
        assert await health(deployment.address(name), "liveness") == SERVING


async def test_every_service_serves_rpc_metrics(deployment: Deployment) -> None:
    for name in NAMES:
        await eventually_serving(deployment.address(name))
    for name in NAMES:
        samples = deployment.scrape(name)
        # Every process has answered health checks at least (ours, above).
        assert (
            value(
                samples, "tidemark_rpc_requests_total", service="grpc.health.v1.Health", code="OK"
            )
            >= 1
        ), name
        assert "tidemark_rpc_duration_seconds_bucket" in names(samples), name


async def test_metrics_move_with_appends_and_peeks(deployment: Deployment) -> None:
    for name in NAMES:
        await eventually_serving(deployment.address(name))
    adapter_before = deployment.scrape("adapter")
    storage_before = deployment.scrape("storage")
    compute_before = deployment.scrape("compute")
    oracle_before = deployment.scrape("oracle")
    async with AdapterClient(deployment.address("adapter")) as client:
        result = await client.execute(
            "CREATE TABLE m (k bigint, v text); INSERT INTO m VALUES (1, 'a'), (2, 'b');"
            "CREATE INDEX m_k ON m (k); SELECT v FROM m WHERE k = 2"
        )
        assert result.error is None, result.error
        assert result.results[-1].rows == [("b",)]
        # A one-shot query too, over a table no index holds.
        joined = await client.execute(
            "CREATE TABLE n (k bigint); INSERT INTO n VALUES (1), (2);"
            "SELECT count(*) FROM n AS x, n AS y"
        )
        assert joined.error is None and joined.results[-1].rows == [(4,)]
        failed = await client.execute("SELECT * FROM no_such_table")
        assert failed.error is not None and failed.error.code == "42P01"
    adapter_after = deployment.scrape("adapter")
    statements = "tidemark_adapter_statements_total"
    assert value(adapter_after, statements, sqlstate="00000") >= (
        value(adapter_before, statements, sqlstate="00000") + 7
    )
    assert value(adapter_after, statements, sqlstate="42P01") == (
        value(adapter_before, statements, sqlstate="42P01") + 1
    )
    storage_after = deployment.scrape("storage")
    # The insert wrote one batch; its bytes and rows count.
    assert value(storage_after, "tidemark_storage_appended_batches_total") > value(
        storage_before, "tidemark_storage_appended_batches_total"
    )
    assert (
        value(storage_after, "tidemark_storage_appended_rows_total")
        >= value(storage_before, "tidemark_storage_appended_rows_total") + 2
    )
    assert value(storage_after, "tidemark_storage_appended_bytes_total") > value(
        storage_before, "tidemark_storage_appended_bytes_total"
    )
    assert value(storage_after, "tidemark_rpc_requests_total", service="tidemark.v1.Storage") > (
        value(storage_before, "tidemark_rpc_requests_total", service="tidemark.v1.Storage")
    )
    # The adapter appends over AppendStream, which counts above once per stream: each append
    # on it counts as a streamed call, so the two INSERTs count at least twice (the table
    # ticker's appends may add more).
    streamed = "tidemark_rpc_streamed_calls_total"
    appends = {"method": "AppendStream", "kind": "append", "code": "OK"}
    assert value(storage_after, streamed, **appends) >= (
        value(storage_before, streamed, **appends) + 2
    )
    lags = {
        dict(labels)["collection"]: v
        for (name, labels), v in storage_after.items()
        if name == "tidemark_storage_upper_lag_seconds"
    }
    # The table's upper is recent: the adapter's table ticker keeps it near the wall clock.
    assert lags and min(lags.values()) < 30.0, lags
    assert value(storage_after, "tidemark_storage_batches") >= 1
    assert value(storage_after, "tidemark_storage_bytes") > 0

    oracle_after = deployment.scrape("oracle")
    for kind in ("read", "write"):
        assert value(oracle_after, "tidemark_oracle_batch_size_count", kind=kind) > value(
            oracle_before, "tidemark_oracle_batch_size_count", kind=kind
        ), kind

    peeks = "tidemark_rpc_requests_total"
    compute_after = deployment.scrape("compute")
    assert (
        value(compute_after, peeks, service="tidemark.v1.Compute", method="Peek", code="OK")
        >= value(compute_before, peeks, service="tidemark.v1.Compute", method="Peek", code="OK") + 2
    )
    assert value(compute_after, "tidemark_compute_one_shots_total", outcome="ok") > value(
        compute_before, "tidemark_compute_one_shots_total", outcome="ok"
    )
    assert value(compute_after, "tidemark_compute_step_seconds_count", kind="hydrate") >= 1

    # The index's gauges are published every 2 s: it has hydrated, holds both rows under
    # two keys, and steps as the table's upper moves.
    deadline = time.monotonic() + 30
    while True:
        samples = deployment.scrape("compute")
        hydrated = [
            dict(labels)["dataflow"]
            for (name, labels), v in samples.items()
            if name == "tidemark_compute_dataflow_hydrated" and v == 1
        ]
        if hydrated:
            dataflow = hydrated[0]
            if value(samples, "tidemark_compute_index_rows", dataflow=dataflow) == 2:
                break
        assert time.monotonic() < deadline, "no hydrated index in the compute metrics"
        await asyncio.sleep(0.5)
    # Hydration is complete: it received every row it expected (none, or both rows,
    # depending on whether the index's as_of came before the insert).
    received = ("tidemark_compute_hydration_input_rows", frozenset({("dataflow", dataflow)}))
    expected = ("tidemark_compute_hydration_input_rows_expected", received[1])
    assert samples[received] == samples[expected]
    for gauge in ("tidemark_compute_arrangement_keys", "tidemark_compute_arrangement_bytes"):
        assert (gauge, received[1]) in samples, gauge
    assert value(samples, "tidemark_compute_dataflow_failed", dataflow=dataflow) == 0
    assert value(samples, "tidemark_compute_step_seconds_count", kind="step") >= 1


async def test_sources_metrics_count_a_load_generators_batches(deployment: Deployment) -> None:
    for name in NAMES:
        await eventually_serving(deployment.address(name))
    async with AdapterClient(deployment.address("adapter")) as client:
        result = await client.execute(
            "CREATE SOURCE metered FROM LOAD GENERATOR COUNTER (TICK INTERVAL '50ms')"
        )
        assert result.error is None, result.error
    source = "tidemark.public.metered"
    deadline = time.monotonic() + 30
    while True:
        samples = deployment.scrape("sources")
        batches = value(samples, "tidemark_sources_batches_total", source=source)
        if batches >= 3:
            break
        assert time.monotonic() < deadline, "the counter's batches are not counted"
        await asyncio.sleep(0.2)
    assert value(samples, "tidemark_sources_rows_total", source=source) >= batches
    assert value(samples, "tidemark_sources_running") >= 1
    assert value(samples, "tidemark_sources_bound_at_ms", source=source) > 1.7e12


async def test_compute_is_live_but_not_ready_while_it_cannot_reach_its_catalog(
    deployment: Deployment,
) -> None:
    # A compute process whose catalog does not answer: it serves (Status, liveness) but
    # cannot have caught up with the catalog, so it is not ready.
    compute = ServiceProcess(
        "services.compute",
        [
            *("--listen", "127.0.0.1:0", "--cluster", "default", "--engine", "local"),
            *("--storage", deployment.address("storage")),
            *("--catalog", f"127.0.0.1:{free_port()}", "--oracle", deployment.address("oracle")),
        ],
    )
    try:
        await asyncio.sleep(2.0)
        assert await health(compute.address, "liveness") == SERVING
        assert await health(compute.address) == NOT_SERVING
        assert await health(compute.address, "tidemark.v1.Compute") == NOT_SERVING
        record = compute.wait_for_record(
            lambda r: r.get("event") == "readiness_changed" and r.get("ready") is False
        )
        assert "catalog" in str(record["reason"])
    finally:
        compute.kill()
