"""One resident task's steady-state step, in process, without Spark or storage.

The compute benchmark's view (``bench/compute_view.py``: ``orders ⋈ customers`` grouped by
region) installed on one ``ShardHost`` (one shard: the whole view), its state built the two
ways a task's state can be:

- **columnar**, as a hydration by Spark leaves it (``load_staged``): the join's inputs loaded
  from Arrow tables (``load_columnar``) into columnar batches, where a customer's thousand
  orders stay and the step's changes collect beside them;
- **dicts**, as a hydration from rows leaves it (``LoadRows``): every row a Python object.

Then ``--steps`` 1,000-update steps (500 orders changed over 10 times) run as ``Step``
requests carrying the changes, timed in wall and thread CPU, with the join's and the
reduce's share (``ShardWorker.process`` per node). The two states step through the same
deltas and must give the same output, or the run stops.

    python bench/task_step.py --orders 1000000

Prints the figures and appends them to ``bench/results/task_step.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from bench.common import load_average
from bench.compute_view import AS_OF, Workload, view_plan
from services.compute.dataflow import Update
from services.compute.dataflow.batch import consolidate
from services.compute.dataflow.graph import GetSource
from services.compute.dataflow.operators.join import JoinOperator
from services.compute.dataflow.operators.reduce import ReduceOperator
from services.compute.spark.requests import Install, Step
from services.compute.spark.shard_host import ShardHost

RESULTS = Path(__file__).resolve().parent / "results" / "task_step.json"
DATAFLOW = "view"


class TimedHost:
    """A one-shard host of the view, with each stateful node's time per step recorded."""

    def __init__(self, workload: Workload, columnar: bool) -> None:
        self.host = ShardHost(0, 1)
        self.host.handle(Install(DATAFLOW, view_plan().SerializeToString()))
        hosted = self.host.dataflows[DATAFLOW]
        nodes = hosted.graph.nodes
        self.sources = {
            node.operator.collection_id: node.id
            for node in nodes
            if isinstance(node.operator, GetSource)
        }
        (self.join,) = [n.id for n in nodes if isinstance(n.operator, JoinOperator)]
        (self.reduce,) = [n.id for n in nodes if isinstance(n.operator, ReduceOperator)]
        worker = hosted.worker
        if columnar:
            snapshot = workload.snapshot_tables()
            worker.load_columnar(
                self.join,
                [_rows_and_diffs(snapshot[name]) for name in ("orders", "customers")],
                AS_OF,
            )
        else:
            rows = workload.snapshot()
            worker.load(self.join, [rows["orders"], rows["customers"]])
        joined = [
            ((o_id, cust, amount, cust, region), AS_OF, 1)
            for (o_id, cust, amount) in workload.orders()
            for region in (workload.customers[cust][1],)
        ]
        worker.load(self.reduce, [joined])
        del joined
        self.seconds: dict[int, float] = {self.join: 0.0, self.reduce: 0.0}
        process = worker.process

        def timed(node_id: int, inputs: Any) -> list[Update]:
            started = time.perf_counter()
            output = process(node_id, inputs)
            self.seconds[node_id] += time.perf_counter() - started
            return output

        worker.process = timed  # type: ignore[method-assign]

    def step(self, changed: list[Update], upper: int) -> list[Update]:
        answer = self.host.handle(Step(DATAFLOW, {self.sources["orders"]: changed}, None, upper))
        assert isinstance(answer, list)
        return answer


def _rows_and_diffs(table: pa.Table) -> pa.Table:
    """An update batch as ``load_columnar`` takes it: the rows' columns, then multiplicities."""
    return table.drop_columns(["time"])


def _timed(host: TimedHost, deltas: list[tuple[list[Update], int]]) -> dict[str, Any]:
    walls, cpus, outputs = [], [], []
    for changed, upper in deltas:
        wall, cpu = time.perf_counter(), time.thread_time()
        outputs.append(consolidate(host.step(changed, upper)))
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    count = len(deltas)
    return {
        "p50_ms": round(statistics.median(walls) * 1000, 3),
        "cpu_p50_ms": round(statistics.median(cpus) * 1000, 3),
        "join_ms_per_step": round(host.seconds[host.join] / count * 1000, 3),
        "reduce_ms_per_step": round(host.seconds[host.reduce] / count * 1000, 3),
        "outputs": outputs,
    }


def run(orders: int, steps: int, warmup: int) -> dict[str, Any]:
    workload = Workload(orders)
    # Both built from the same snapshot, before any delta changes it.
    hosts = {"columnar": TimedHost(workload, True), "dicts": TimedHost(workload, False)}
    deltas = [workload.delta() for _ in range(warmup + steps)]
    results: dict[str, Any] = {}
    for name, host in hosts.items():
        _timed(host, deltas[:warmup])
        host.seconds = dict.fromkeys(host.seconds, 0.0)
        results[name] = _timed(host, deltas[warmup:])
    if results["columnar"].pop("outputs") != results["dicts"].pop("outputs"):
        raise SystemExit("the two states' outputs differ")
    return {
        "orders": orders,
        "steps": steps,
        "updates_per_step": len(deltas[0][0]),
        "load_average": load_average(),
        **results,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None, print_: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args.orders, args.steps, args.warmup)
    print_(json.dumps(result, indent=2))
    runs = json.loads(args.output.read_text()) if args.output.exists() else []
    runs.append(result)
    args.output.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
