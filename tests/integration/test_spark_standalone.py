"""Compute on a real Spark standalone cluster: a master and two workers, each its own JVM, and a
compute process whose driver runs with ``--spark-master spark://…`` and fixed ports.

The resident tasks of a maintained view run in the workers' executors and dial back to the
driver's fixed resident port; views hydrate and one-shot queries run as Spark jobs there.
Then one executor JVM is killed (``kill -9``) while inputs keep changing: the master launches a
new executor, the process starts new resident tasks for the shards that executor held and
rebuilds those shards by Spark (the view is not restarted, the other tasks keep running), and
the output is exact at every time, with no update missing or doubled.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.compute import (
    Collections,
    Stack,
    contents_at,
    current_task_pids,
    eventually,
    exact_history,
    resident_task_pids,
    running_stack,
)
from tests.support.orders_workload import CUSTOMERS, ORDERS, RandomChanges, totals_by_region
from tests.support.ports import free_port
from tests.support.reference_eval import canonical, evaluate
from tests.support.spark_standalone import StandaloneCluster, remote_ports, standalone_cluster
from tidemark.clients.compute import ComputeClient, one_shot
from tidemark.clients.storage import StorageClient
from tidemark.plan import check_plan
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
PATIENT_MS = 180_000
BATCHES = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("standalone"), workers=2) as running:
        yield running


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    """The compute process's fixed Spark ports, by flag."""
    return {
        "--spark-driver-port": free_port(),
        "--spark-block-manager-port": free_port(),
        "--spark-resident-port": free_port(),
    }


@pytest.fixture(scope="module")
def stack(
    cluster: StandaloneCluster, ports: dict[str, int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    extra = [
        *("--spark-driver-host", "127.0.0.1", "--spark-bind-address", "127.0.0.1"),
        *("--spark-executor-memory", "512m"),
        # Every one-shot query runs as Spark jobs on the executors, however small, and every
        # view hydrates (again, after a restart) by Spark jobs there.
        *("--spark-one-shot-rows", "0"),
        *("--spark-hydration-rows", "0"),
        *(item for flag, port in ports.items() for item in (flag, str(port))),
    ]
    with running_stack(
        tmp_path_factory.mktemp("stack"), spark_master=cluster.master_url, compute_extra=extra
    ) as running:
        yield running


@pytest.fixture
async def storage(stack: Stack) -> AsyncIterator[StorageClient]:
    client = StorageClient(stack.storage.address)
    yield client
    await client.close()


@pytest.fixture
async def compute(stack: Stack) -> AsyncIterator[ComputeClient]:
    client = ComputeClient(stack.compute().address, timeout=180.0)
    yield client
    await client.close()


class Feed:
    """Random inserts, deletes and changes of orders, one time per batch, and now and then a
    customer moving region."""

    def __init__(self, collections: Collections, orders: str, customers: str) -> None:
        self.collections = collections
        self.orders = orders
        self.customers = customers
        self.random = random.Random(11)
        self.changes = RandomChanges(self.random)
        self.batches_done = 0

    async def start(self) -> None:
        await self.collections.append(self.customers, self.changes.customers(0), 1)
        await self.collections.append(self.orders, self.changes.orders_at(0, 12), 1)

    async def run(self, pause: float, hold: tuple[int, asyncio.Event] | None = None) -> None:
        """Appends one time per batch, ``pause`` seconds apart; with ``hold=(t, event)``,
        waits for ``event`` before time ``t``, so that whatever the test does meanwhile
        happens with updates still to come."""
        for time in range(1, self.final_upper):
            if hold is not None and time == hold[0]:
                await hold[1].wait()
            customers = self.changes.customer_moves(time) if time % 7 == 3 else []
            await self.collections.append(
                self.orders, self.changes.orders_at(time, self.random.randint(0, 4)), time + 1
            )
            await self.collections.append(self.customers, customers, time + 1)
            self.batches_done = time
            await asyncio.sleep(pause)

    @property
    def final_upper(self) -> int:
        return BATCHES + 1


async def started_task_pids(stack: Stack) -> tuple[int, ...]:
    """The latest resident cluster's task pids, once its log line has been read."""

    async def logged() -> tuple[int, ...]:
        return resident_task_pids(stack.compute())

    return await eventually(logged, 30)


def assert_on_executors(
    cluster: StandaloneCluster, task_pids: tuple[int, ...], ports: dict[str, int]
) -> None:
    """Each of the resident tasks ``task_pids`` runs in an executor of a worker and is
    connected to the driver's fixed resident port, and its executor to the driver's fixed
    RPC port."""
    for pid in task_pids:
        placed = cluster.worker_of(pid)
        assert placed is not None, f"resident task {pid} runs in no worker's executor"
        assert ports["--spark-resident-port"] in remote_ports(pid)
        assert ports["--spark-driver-port"] in remote_ports(placed[1])


async def maintained_totals(
    collections: Collections, compute: ComputeClient, dataflow_id: str
) -> tuple[str, str, plan_pb2.Plan, str, Feed]:
    """Fresh orders and customers with the feed's first rows, and the totals by region over
    them maintained as ``dataflow_id`` into a fresh output with an index:
    ``(orders, customers, plan, output, feed)``."""
    orders = await collections.create(ORDERS)
    customers = await collections.create(CUSTOMERS)
    plan = totals_by_region(orders, customers)
    output = await collections.create(check_plan(plan))
    feed = Feed(collections, orders, customers)
    await feed.start()
    await compute.maintain_view(
        dataflow_id,
        plan,
        [await collections.read_capability(orders), await collections.read_capability(customers)],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    return orders, customers, plan, output, feed


async def test_views_and_one_shot_queries_run_on_the_standalone_cluster(
    cluster: StandaloneCluster,
    ports: dict[str, int],
    stack: Stack,
    storage: StorageClient,
    compute: ComputeClient,
) -> None:
    collections = Collections(storage)
    orders, customers, plan, output, feed = await maintained_totals(
        collections, compute, "standalone"
    )
    status = await compute.status()
    assert status.spark_master == cluster.master_url
    assert status.spark_application_id.startswith("app-")
    # The shards live in the workers' executors, not in the compute process.
    assert_on_executors(cluster, await started_task_pids(stack), ports)
    assert [app["id"] for app in cluster.state()["activeapps"]] == [  # type: ignore[index]
        status.spark_application_id
    ]

    await feed.run(pause=0.0)
    final = feed.final_upper
    await compute.peek("standalone", final - 1, wait_ms=PATIENT_MS)
    info = (await compute.status()).dataflow("standalone")
    # Hydrated by Spark jobs on the executors, from every part storage listed.
    assert info is not None and info.hydration_parts_done == info.hydration_parts_total > 0
    assert await exact_history(collections, plan, output, [orders, customers], final) > 5

    histories = {
        orders: await collections.history(orders, final),
        customers: await collections.history(customers, final),
    }
    readers = [collections.read(orders), collections.read(customers)]
    for time in (0, final // 2, final - 1):
        expected = canonical(
            evaluate(plan, {cid: contents_at(h, time) for cid, h in histories.items()})
        )
        peeked = await compute.peek("standalone", time)
        assert canonical(dict(peeked.rows)) == expected, f"index at {time}"
        answered = await compute.peek(one_shot(plan, readers), time)
        assert canonical(dict(answered.rows)) == expected, f"one-shot at {time}"

    # The one-shot queries were Spark jobs (on the executors: the driver runs no tasks).
    async def three_spark_jobs() -> None:
        records = stack.compute().records()
        done = [r for r in records if r.get("event") == "spark_one_shot_done"]
        assert len(done) == 3, [r for r in records if "one" in str(r.get("event"))]

    await eventually(three_spark_jobs, 10)
    await compute.drop_view("standalone")


async def test_an_executor_killed_mid_stream_leaves_the_output_exact(
    cluster: StandaloneCluster,
    ports: dict[str, int],
    stack: Stack,
    storage: StorageClient,
    compute: ComputeClient,
) -> None:
    collections = Collections(storage)
    orders, customers, plan, output, feed = await maintained_totals(
        collections, compute, "survivor"
    )
    before = await started_task_pids(stack)
    placed = cluster.worker_of(before[0])
    assert placed is not None
    worker, executor = placed
    killed = asyncio.Event()
    appending = asyncio.create_task(feed.run(pause=0.2, hold=(BATCHES // 2, killed)))

    async def some_output_written() -> None:
        assert (await storage.describe(output)).upper.elements[0] >= 6

    await eventually(some_output_written)
    # (A hydration that lost a part to compaction restarts the view; only what follows the
    # kill is about it.)
    info = (await compute.status()).dataflow("survivor")
    assert info is not None
    restarts = info.restarts
    logged = len(stack.compute().records())
    # The shards whose tasks the executor holds (one or both).
    lost = {shard for shard, pid in enumerate(before) if cluster.worker_of(pid) == placed}
    assert 0 in lost
    os.kill(executor, signal.SIGKILL)
    killed.set()
    assert feed.batches_done < BATCHES // 2

    # The master launches a new executor on the worker; the process starts new tasks for the
    # shards the dead executor held and rebuilds them, without restarting the view.
    async def restored() -> None:
        info = (await compute.status()).dataflow("survivor")
        assert info is not None and info.shard_restores >= 1 and info.restarts == restarts
        assert info.state == "running" and not info.error

    await eventually(restored, 240)
    await appending
    final = feed.final_upper
    await compute.peek("survivor", final - 1, wait_ms=PATIENT_MS)
    after = current_task_pids(stack.compute())
    for shard, pid in enumerate(after):
        # The killed executor's tasks were replaced; any other task is the same process.
        assert (pid != before[shard]) == (shard in lost)
    assert_on_executors(cluster, after, ports)

    def relaunched() -> list[int]:
        fresh = [pid for pid in cluster.executor_pids(worker) if pid != executor]
        assert fresh, f"no new executor on worker {worker}:\n{cluster.logs()}"
        return fresh

    await eventually(lambda: asyncio.to_thread(relaunched), 120)
    assert await exact_history(collections, plan, output, [orders, customers], final) > 5
    info = (await compute.status()).dataflow("survivor")
    assert info is not None and info.restarts == restarts
    assert info.shard_restores == len(lost)
    records = stack.compute().records()[logged:]
    events = {r.get("event") for r in records}
    assert not events & {"resident_cluster_replaced", "dataflow_restarted", "dataflow_failed"}
    assert [r["shards"] for r in records if r.get("event") == "shard_restored"] == [sorted(lost)]
    # The index answers exactly at every time from its since, which the rebuilt shards'
    # time moved up.
    histories = {cid: await collections.history(cid, final) for cid in (orders, customers)}
    for time in range(info.since.elements[0], final):
        expected = canonical(
            evaluate(plan, {cid: contents_at(h, time) for cid, h in histories.items()})
        )
        peeked = await compute.peek("survivor", time)
        assert canonical(dict(peeked.rows)) == expected, f"index at {time}"
    await compute.drop_view("survivor")
