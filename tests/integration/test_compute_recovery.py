"""kill -9 of a compute process in the middle of a stream of appends, then a restart with the
same flags: the view is installed again over the same output collection (with fresh
capabilities), continues at the output's upper - 1, and the output ends up with no missing
and no doubled updates: at every time it equals the plan evaluated over the inputs. The
restart rebuilds the state from snapshots, or by Spark from the inputs' parts."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.compute import (
    Collections,
    Stack,
    contents_at,
    eventually,
    exact_history,
    running_stack,
)
from tests.support.orders_workload import CUSTOMERS, ORDERS, RandomChanges, totals_by_region
from tests.support.reference_eval import canonical, evaluate
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.plan import check_plan

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
BATCHES = 40
TIMES_PER_BATCH = 3
PATIENT_MS = 180_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("recovery")) as running:
        yield running


class Feed:
    """Random inserts, deletes and updates of orders (and now and then a customer moving
    region), several times per batch."""

    def __init__(self, collections: Collections, orders: str, customers: str) -> None:
        self.collections = collections
        self.orders = orders
        self.customers = customers
        self.random = random.Random(7)
        self.changes = RandomChanges(self.random)
        self.batches_done = 0

    async def start(self) -> None:
        await self.collections.append(self.customers, self.changes.customers(0), 1)
        await self.collections.advance(self.orders, 1)

    async def run(self) -> None:
        for batch in range(BATCHES):
            lower = 1 + batch * TIMES_PER_BATCH
            upper = lower + TIMES_PER_BATCH
            orders = [
                u
                for t in range(lower, upper)
                for u in self.changes.orders_at(t, self.random.randint(0, 4))
            ]
            customers = self.changes.customer_moves(lower) if batch % 7 == 3 else []
            await self.collections.append(self.orders, orders, upper)
            await self.collections.append(self.customers, customers, upper)
            self.batches_done = batch + 1
            await asyncio.sleep(0.05)

    @property
    def final_upper(self) -> int:
        return 1 + BATCHES * TIMES_PER_BATCH


@pytest.mark.parametrize("hydration", ["snapshots", "spark"])
async def test_kill_and_restart_mid_stream_writes_every_update_once(
    stack: Stack, hydration: str
) -> None:
    """``hydration``: how the restarted process rebuilds the view's state: from snapshots
    streamed through it, or by Spark from the inputs' parts."""
    storage = StorageClient(stack.storage.address)
    collections = Collections(storage)
    orders = await collections.create(ORDERS)
    customers = await collections.create(CUSTOMERS)
    plan = totals_by_region(orders, customers)
    output = await collections.create(check_plan(plan))
    feed = Feed(collections, orders, customers)
    await feed.start()

    dataflow_id = "regions"
    first = ComputeClient(stack.compute().address, timeout=180.0)
    installed = await first.maintain_view(
        dataflow_id,
        plan,
        [await collections.read_capability(orders), await collections.read_capability(customers)],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    assert installed.as_of == 0
    appending = asyncio.create_task(feed.run())

    async def some_output_written() -> None:
        assert (await storage.describe(output)).upper.elements[0] >= 20

    await eventually(some_output_written, 300)
    stack.kill_compute()
    await first.close()
    killed_at = (await storage.describe(output)).upper.elements[0]
    assert feed.batches_done < BATCHES, "the appends should still be going on"

    threshold = "0" if hydration == "spark" else "-1"
    await asyncio.to_thread(stack.start_compute, "default", ("--spark-hydration-rows", threshold))
    second = ComputeClient(stack.compute().address, timeout=180.0)
    resumed_at = (await storage.describe(output)).upper.elements[0]
    assert resumed_at == killed_at  # nothing wrote to the output while compute was down
    reads = [await storage.acquire(cid, "test") for cid in (orders, customers)]
    for pair in reads:
        await storage.drop(pair.write)
    reinstalled = await second.maintain_view(
        dataflow_id,
        plan,
        [pair.read for pair in reads],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    assert reinstalled.as_of == resumed_at - 1
    await appending
    final = feed.final_upper
    await second.peek(dataflow_id, final - 1, wait_ms=PATIENT_MS)
    (info,) = [d for d in (await second.status()).dataflows if d.dataflow_id == dataflow_id]
    assert info.state == "running"
    assert info.hydrated_rows == info.hydration_rows_total > 0
    assert info.index_rows == sum(n for _, n in (await second.peek(dataflow_id, final - 1)).rows)
    if hydration == "spark":
        # Progress in parts too, all of them done: the parts storage listed at as_of.
        assert info.hydration_parts_done == info.hydration_parts_total > 0

    # Exact at every time, and each (row, time) written once: no update appended twice and
    # then cancelled out.
    changed = await exact_history(collections, plan, output, [orders, customers], final)
    assert changed > 10  # the view really moved, before and after the restart
    histories = {cid: await collections.history(cid, final) for cid in (orders, customers)}
    for time in range(reinstalled.as_of, final, 10):
        inputs = {cid: contents_at(history, time) for cid, history in histories.items()}
        peeked = await second.peek(dataflow_id, time)
        assert canonical(dict(peeked.rows)) == canonical(evaluate(plan, inputs)), f"index at {time}"
    await second.drop_view(dataflow_id)
    await second.close()
    await storage.close()


async def test_a_stopped_process_exits_cleanly_and_its_successor_continues(stack: Stack) -> None:
    storage = StorageClient(stack.storage.address)
    collections = Collections(storage)
    orders = await collections.create(ORDERS)
    customers = await collections.create(CUSTOMERS)
    plan = totals_by_region(orders, customers)
    output = await collections.create(check_plan(plan))
    await collections.append(customers, [((1, "north"), 0, 1)], 10)
    await collections.append(orders, [((1, 1, 5), 0, 1), ((2, 1, 7), 3, 1)], 5)

    async def install(client: ComputeClient) -> int:
        pairs = [await storage.acquire(cid, "test") for cid in (orders, customers)]
        for pair in pairs:
            await storage.drop(pair.write)
        result = await client.maintain_view(
            "stopped",
            plan,
            [pair.read for pair in pairs],
            output=await collections.write_capability(output),
        )
        return result.as_of

    client = ComputeClient(stack.compute().address, timeout=180.0)
    assert await install(client) == 0

    async def written_to(upper: int) -> None:
        assert (await storage.describe(output)).upper.elements == (upper,)

    await eventually(lambda: written_to(5))
    await client.close()
    process = stack.compute()
    process.signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 60.0) == 0

    await collections.append(orders, [((1, 1, 5), 6, -1)], 8)
    await asyncio.to_thread(stack.start_compute)
    client = ComputeClient(stack.compute().address, timeout=180.0)
    assert await install(client) == 4
    await eventually(lambda: written_to(8))
    written = await collections.history(output, 8)
    assert contents_at(written, 2) == {("north", 1, 5, 5): 1}
    assert contents_at(written, 5) == {("north", 2, 12, 7): 1}
    assert contents_at(written, 7) == {("north", 1, 7, 7): 1}
    assert len(written) == 5  # +t0, then -/+ at 3, then -/+ at 6: nothing twice
    await client.drop_view("stopped")
    await client.close()
    await storage.close()
