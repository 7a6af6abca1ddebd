"""A lost resident task costs only its shards: the compute process (a local Spark master)
starts a new task for the shard, rebuilds that shard of every dataflow by Spark from the
inputs' parts at the dataflow's upper - 1 (a plan of constants from the driver, without
Spark), and the dataflows run on without a restart. The
other task keeps its process and its state, the outputs stay exact at every time, and no
update is written twice, also when the task dies in the middle of a step (the step is run
again on the new task and completes once).

The tasks are killed with SIGKILL (their Python workers; the JVM and its executor stay). The
step in flight is held by the tasks' test-only hook (``shard_host.HOLD_ENV``): every task
waits after the step's first exchange until the test has killed one of them."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.compute.spark.shard_host import HOLD_ENV
from tests.support.compute import (
    Collections,
    Stack,
    contents_at,
    current_task_pids,
    eventually,
    exact_history,
    running_stack,
)
from tests.support.orders_workload import CUSTOMERS, ORDERS, RandomChanges, totals_by_region
from tests.support.reference_eval import canonical, evaluate
from tests.support.service_process import ServiceProcess
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import check_plan
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

PATIENT_MS = 180_000
HELD = "held"
"""The dataflow whose second ``Step`` (its first after hydration) the tasks hold."""


@pytest.fixture(scope="module")
def hold_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, hold_directory: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("restore"),
        compute_env={HOLD_ENV: f"{HELD}@2@{hold_directory}"},
        # An output part a surviving task wrote before the loss showed waits uncommitted
        # for the rebuild in flight (20-40 s for a fresh process's first Spark jobs): the
        # tests' 4 s orphan grace would sweep it, where the default is ten minutes.
        storage_extra=("--orphan-grace", "300"),
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


class Orders:
    """Orders and customers collections fed with random changes, one time per batch."""

    def __init__(self, collections: Collections, seed: int) -> None:
        self.collections = collections
        self.changes = RandomChanges(random.Random(seed))
        self.random = random.Random(seed + 1)
        self.upper = 1

    async def create(self) -> None:
        self.orders = await self.collections.create(ORDERS)
        self.customers = await self.collections.create(CUSTOMERS)
        await self.collections.append(self.customers, self.changes.customers(0), 1)
        await self.collections.append(self.orders, self.changes.orders_at(0, 12), 1)

    async def batch(self) -> None:
        time = self.upper
        moves = self.changes.customer_moves(time) if time % 5 == 3 else []
        await self.collections.append(
            self.orders, self.changes.orders_at(time, self.random.randint(1, 4)), time + 1
        )
        await self.collections.append(self.customers, moves, time + 1)
        self.upper = time + 1

    async def run(self, batches: int, pause: float) -> None:
        for _ in range(batches):
            await self.batch()
            await asyncio.sleep(pause)

    def plan(self) -> plan_pb2.Plan:
        return totals_by_region(self.orders, self.customers)


async def maintain(
    collections: Collections, compute: ComputeClient, feed: Orders, dataflow_id: str
) -> str:
    """Maintains the feed's totals by region as ``dataflow_id``, with an index; its output
    collection's id."""
    plan = feed.plan()
    output = await collections.create(check_plan(plan), initial=0)
    await compute.maintain_view(
        dataflow_id,
        plan,
        [
            await collections.read_capability(feed.orders),
            await collections.read_capability(feed.customers),
        ],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    await compute.peek(dataflow_id, feed.upper - 1, wait_ms=PATIENT_MS)
    return output


async def assert_exact(
    collections: Collections,
    compute: ComputeClient,
    feed: Orders,
    dataflow_id: str,
    output: str,
) -> None:
    """The output collection at every time, and the index from its since on."""
    final = feed.upper
    await compute.peek(dataflow_id, final - 1, wait_ms=PATIENT_MS)
    plan = feed.plan()
    assert await exact_history(collections, plan, output, [feed.orders, feed.customers], final)
    info = (await compute.status()).dataflow(dataflow_id)
    assert info is not None
    since = info.since.elements[0]
    histories: dict[str, Any] = {
        cid: await collections.history(cid, final) for cid in (feed.orders, feed.customers)
    }
    for time in range(since, final):
        expected = canonical(
            evaluate(plan, {cid: contents_at(h, time) for cid, h in histories.items()})
        )
        peeked = await compute.peek(dataflow_id, time)
        assert canonical(dict(peeked.rows)) == expected, f"{dataflow_id}: index at {time}"


PAIRS = RelationSchema.of(("k", T.INT64), ("v", T.INT64))
CONSTANT = "constant"


def constant_totals() -> plan_pb2.Plan:
    """A view of constants holding state in two operators: a distinct (each row is there
    twice), then a count and a sum by key."""
    rows = [[n % 5, n] for n in range(40)] * 2
    distinct = pb.distinct(pb.constant(PAIRS, rows))
    return pb.plan(pb.reduce(distinct, [0], [pb.aggregate("count"), pb.aggregate("sum", 1)]))


async def maintain_constants(collections: Collections, compute: ComputeClient) -> str:
    """Maintains ``constant_totals`` as ``CONSTANT``, with an index; its output collection."""
    plan = constant_totals()
    output = await collections.create(check_plan(plan), initial=0)
    await compute.maintain_view(
        CONSTANT,
        plan,
        [],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    await compute.peek(CONSTANT, 0, wait_ms=PATIENT_MS)
    return output


async def assert_constants_exact(
    collections: Collections, compute: ComputeClient, output: str, upper: int
) -> None:
    """The constants' output collection at every time before ``upper`` (written once), and
    their index at every time from its since to ``upper``."""
    plan = constant_totals()
    await exact_history(collections, plan, output, [], upper)
    expected = canonical(evaluate(plan, {}))
    assert len(expected) == 5
    info = (await compute.status()).dataflow(CONSTANT)
    assert info is not None
    for time in range(info.since.elements[0], upper + 1):
        peeked = await compute.peek(CONSTANT, time)
        assert canonical(dict(peeked.rows)) == expected, f"constants at {time}"


async def restored(
    process: ServiceProcess, compute: ComputeClient, dataflow_ids: list[str], count: int
) -> None:
    status = await compute.status()
    for dataflow_id in dataflow_ids:
        info = status.dataflow(dataflow_id)
        assert info is not None and info.shard_restores == count, (info, losses(process))
        assert info.restarts == 0 and info.state == "running" and not info.error


def losses(process: ServiceProcess) -> list[object]:
    """What the process logged of lost tasks and failures (for a failing assertion)."""
    return [
        r
        for r in process.records()
        if "lost" in str(r.get("event")) or "fail" in str(r.get("event"))
    ]


def assert_no_restart(process: ServiceProcess) -> None:
    events = {r.get("event") for r in process.records()}
    assert not events & {
        "resident_cluster_failed",
        "resident_cluster_replaced",
        "dataflow_failed",
        "dataflow_restarted",
    }


async def test_a_killed_task_is_replaced_and_only_its_shards_are_rebuilt(
    stack: Stack, storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    feed = Orders(collections, seed=7)
    await feed.create()
    outputs = {
        dataflow_id: await maintain(collections, compute, feed, dataflow_id)
        for dataflow_id in ("restored", "bystander")
    }
    constants = await maintain_constants(collections, compute)
    everything = [*outputs, CONSTANT]
    before = current_task_pids(stack.compute())
    assert len(before) == 2
    await feed.run(6, pause=0.1)
    os.kill(before[1], signal.SIGKILL)
    await feed.run(10, pause=0.1)

    await eventually(lambda: restored(stack.compute(), compute, everything, 1), 240)
    after = current_task_pids(stack.compute())
    assert after[0] == before[0] and after[1] != before[1]
    await feed.run(4, pause=0.0)
    for dataflow_id, output in outputs.items():
        await assert_exact(collections, compute, feed, dataflow_id, output)
    await assert_constants_exact(collections, compute, constants, feed.upper)
    await restored(stack.compute(), compute, everything, 1)
    assert current_task_pids(stack.compute())[0] == before[0]
    assert_no_restart(stack.compute())
    records = stack.compute().records()
    [record] = [r for r in records if r.get("event") == "shard_restored"]
    assert record["shards"] == [1] and sorted(record["dataflows"]) == sorted(everything)
    assert record["seconds"] > 0
    # The constants' shard came from the driver: no Spark job staged it.
    [rebuilt] = [
        r
        for r in records
        if r.get("event") == "dataflow_shard_rebuilt" and r.get("dataflow") == CONSTANT
    ]
    assert rebuilt["constants"] is True
    for dataflow_id in everything:
        await compute.drop_view(dataflow_id)


async def test_a_task_killed_during_a_step_gets_the_step_run_once(
    stack: Stack, storage: StorageClient, compute: ComputeClient, hold_directory: Path
) -> None:
    collections = Collections(storage)
    feed = Orders(collections, seed=19)
    await feed.create()
    outputs = {
        dataflow_id: await maintain(collections, compute, feed, dataflow_id)
        for dataflow_id in (HELD, "beside")
    }
    restores = len([r for r in stack.compute().records() if r.get("event") == "shard_restored"])
    before = current_task_pids(stack.compute())
    await feed.batch()  # the held dataflow's first step after hydration: the tasks hold

    async def held() -> None:
        assert all((hold_directory / f"held-{shard}").exists() for shard in range(2))

    await eventually(held, 120)
    os.kill(before[0], signal.SIGKILL)
    (hold_directory / "release").touch()

    async def replaced() -> None:
        records = stack.compute().records()
        assert len([r for r in records if r.get("event") == "shard_restored"]) > restores

    await eventually(replaced, 240)
    after = current_task_pids(stack.compute())
    assert after[1] == before[1] and after[0] != before[0]
    await feed.run(6, pause=0.1)
    for dataflow_id, output in outputs.items():
        await assert_exact(collections, compute, feed, dataflow_id, output)
    status = await compute.status()
    for dataflow_id in outputs:
        info = status.dataflow(dataflow_id)
        assert info is not None and info.shard_restores == 1 and info.restarts == 0
    assert_no_restart(stack.compute())
    for dataflow_id in outputs:
        await compute.drop_view(dataflow_id)
