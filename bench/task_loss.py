"""How long a maintained view's output stalls when one resident task is lost.

Storage and a compute process (Spark engine, local master, two shards) run as their own
processes (``tests/support/compute.running_stack``). This process maintains ``views`` views of
orders ⋈ customers totals by region (``tests/support/orders_workload.py``) over the same
inputs, each into its own output with an index, appends a batch every ``period_s``, and,
once ``warmup`` batches have been stepped, SIGKILLs the Python worker of the task of shard 1.

Reported: the stall, from the kill until every view's output collection is complete past the
first time written after the kill (what a reader waits for), the process's own account
(``shard_restored``'s seconds) and the restarts Status counts. Run it from a tree with shard
restores and from one without (``PYTHONPATH``) to compare.

    PYTHONPATH=$PWD python -m bench.task_loss --views 2 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.compute import Collections, running_stack
from tests.support.orders_workload import CUSTOMERS, ORDERS, RandomChanges, totals_by_region
from tests.support.service_process import ServiceProcess
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.plan import check_plan


def task_pids(process: ServiceProcess) -> list[int]:
    records = [
        r
        for r in process.records()
        if r.get("event") in ("resident_cluster_started", "shard_restored")
    ]
    return list(records[-1]["task_pids"])


async def one_run(
    process: ServiceProcess,
    storage: StorageClient,
    views: int,
    period_s: float,
    warmup: int,
    seed: int,
) -> dict[str, Any]:
    compute = ComputeClient(process.address, timeout=180.0)
    collections = Collections(storage)
    changes = RandomChanges(random.Random(seed))
    orders = await collections.create(ORDERS)
    customers = await collections.create(CUSTOMERS)
    await collections.append(customers, changes.customers(0), 1)
    await collections.append(orders, changes.orders_at(0, 50), 1)
    plan = totals_by_region(orders, customers)
    ids = [f"loss-{seed}-{n}" for n in range(views)]
    outputs = []
    for dataflow_id in ids:
        output = await collections.create(check_plan(plan), initial=0)
        outputs.append(output)
        await compute.maintain_view(
            dataflow_id,
            plan,
            [
                await collections.read_capability(orders),
                await collections.read_capability(customers),
            ],
            output=await collections.write_capability(output),
            index_key_columns=[0],
        )
        await compute.peek(dataflow_id, 0, wait_ms=180_000)
    upper = 1

    async def batch() -> None:
        nonlocal upper
        await collections.append(orders, changes.orders_at(upper, 20), upper + 1)
        await collections.append(customers, [], upper + 1)
        upper += 1

    async def caught_up(target: int) -> bool:
        """Whether every output collection is complete past ``target`` (what its readers
        wait for; compute's Status is not asked, as it may wait on the tasks itself)."""
        for output in outputs:
            if (await storage.describe(output)).upper.elements[0] <= target:
                return False
        return True

    for _ in range(warmup):
        await batch()
        await asyncio.sleep(period_s)
    for _ in range(30_000):  # the views step the warm-up batches first
        if await caught_up(upper - 1):
            break
        await asyncio.sleep(0.02)
    victim = task_pids(process)[1]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    await batch()
    after_kill = upper - 1  # the first time written after the kill
    stall = None
    while stall is None:
        if await caught_up(after_kill):
            stall = time.monotonic() - killed
            break
        await asyncio.sleep(period_s)
        await batch()
    status = await compute.status()
    restored = [r for r in process.records() if r.get("event") == "shard_restored"]
    result = {
        "stall_s": round(stall, 2),
        "restore_s": restored[-1]["seconds"] if restored else None,
        "restarts": sum(info.restarts for info in status.dataflows if info.dataflow_id in ids),
        "failures": [
            r["reason"] for r in process.records() if r.get("event") == "resident_cluster_failed"
        ],
    }
    for dataflow_id in ids:
        await compute.drop_view(dataflow_id)
    await compute.close()
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory() as directory, running_stack(Path(directory)) as stack:
        storage = StorageClient(stack.storage.address)
        for run in range(args.runs):
            results.append(
                await one_run(
                    stack.compute(), storage, args.views, args.period_s, args.warmup, seed=run
                )
            )
            print(json.dumps(results[-1]), flush=True)
        await storage.close()
    stalls = [r["stall_s"] for r in results]
    return {
        "views": args.views,
        "runs": results,
        "stall_s_median": statistics.median(stalls),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--period-s", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--output", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    print(json.dumps(figures, indent=2))
    if args.output is not None:
        args.output.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
