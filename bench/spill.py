"""State past its memory budget, benchmark (i): ``make bench-spill`` or
``.venv/bin/python bench/spill.py [--orders N]``.

The view of the compute benchmark, ``orders ⋈ customers`` grouped by region with count and
sum, over many customers (``--customers``, 10^5 by default: ~10 orders per join key), run by
the operators the resident tasks run (``ShardWorker`` through an in-process ``Dataflow`` of
one shard, so the figures are the state's own cost, without the trip to a task):

1. In memory, without a budget: hydrated, then stepped through ``--steps`` deltas of 1,000
   changed rows (500 orders updated over 10 timestamps); the state's size is measured.
2. The same inputs and deltas with a ``StateBudget`` of a third of that size: the join's
   arrangements spill their oldest keys to local disk and read them back when touched.

Both runs' outputs must equal DuckDB's answer over the final inputs, and each other step by
step, or the run stops. Prints both runs' hydration time and step p50/p90, the spilled keys
and bytes on disk, and writes ``bench/results/spill.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import load_average, percentile  # noqa: E402
from bench.compute_view import ORDERS, view_plan  # noqa: E402
from services.compute.dataflow import Dataflow, Update  # noqa: E402
from services.compute.dataflow.batch import consolidate  # noqa: E402
from services.compute.dataflow.spill import StateBudget  # noqa: E402
from tidemark.plan import builders as pb  # noqa: E402
from tidemark.plan import derive_schema  # noqa: E402
from tidemark.v1 import plan_pb2  # noqa: E402

REGIONS = 10
MAX_AMOUNT = 10_000
DELTA_UPDATES = 500


class Inputs:
    """Orders as machine-integer arrays (so the benchmark's own copy costs the garbage
    collector nothing), customers as rows, and deltas over them."""

    def __init__(self, orders: int, customers: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.customer_count = customers
        self.custs = array("q", (self.rng.randrange(customers) for _ in range(orders)))
        self.amounts = array("q", (self.rng.randint(1, MAX_AMOUNT) for _ in range(orders)))
        self.next_time = 1

    def snapshot(self) -> dict[str, list[Update]]:
        return {
            "orders": [
                ((o_id, cust, amount), 0, 1)
                for o_id, (cust, amount) in enumerate(zip(self.custs, self.amounts, strict=True))
            ],
            "customers": [
                ((cust, f"region-{cust % REGIONS}"), 0, 1) for cust in range(self.customer_count)
            ],
        }

    def delta(self) -> tuple[list[Update], int]:
        rng, first, changed = self.rng, self.next_time, []
        for number, o_id in enumerate(rng.sample(range(len(self.custs)), DELTA_UPDATES)):
            at = first + number * 10 // DELTA_UPDATES
            changed.append(((o_id, self.custs[o_id], self.amounts[o_id]), at, -1))
            self.custs[o_id] = rng.randrange(self.customer_count)
            self.amounts[o_id] = rng.randint(1, MAX_AMOUNT)
            changed.append(((o_id, self.custs[o_id], self.amounts[o_id]), at, 1))
        self.next_time = first + 10
        return changed, self.next_time


def reduce_plan() -> plan_pb2.Plan:
    """Orders grouped by customer: count, sum, min and max of the amount."""
    root = pb.reduce(
        pb.get("orders", ORDERS),
        [1],
        [
            pb.aggregate("count"),
            pb.aggregate("sum", 2),
            pb.aggregate("min", 2),
            pb.aggregate("max", 2),
        ],
    )
    return pb.plan(root, derive_schema(root))


def window_plan() -> plan_pb2.Plan:
    """Per customer, orders by amount then id: the amount before, and the sum of the amount
    over this order and the one before (a change moves only its neighbours' values)."""
    rows = pb.frame("rows", ("preceding", 1), "current_row")
    root = pb.window(
        pb.get("orders", ORDERS),
        [1],
        [2, 0],
        [pb.window_function("lag", 2), pb.window_function("sum", 2, frame=rows)],
    )
    return pb.plan(root, derive_schema(root))


CASES = {
    "join": (
        view_plan,
        "SELECT region, count(*), sum(amount) FROM orders JOIN customers USING (cust) "
        "GROUP BY region",
    ),
    "reduce": (
        reduce_plan,
        "SELECT cust, count(*), sum(amount), min(amount), max(amount) FROM orders GROUP BY cust",
    ),
    "window": (
        window_plan,
        "SELECT o_id, cust, amount, lag(amount) OVER w, sum(amount) OVER (w ROWS BETWEEN 1 "
        "PRECEDING AND CURRENT ROW) FROM orders WINDOW w AS (PARTITION BY cust ORDER BY amount, "
        "o_id)",
    ),
}


def _plain(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(value if value is None or isinstance(value, str) else int(value) for value in row)


def duckdb_answer(inputs: Inputs, query: str) -> dict[tuple[Any, ...], int]:
    """The view over the final inputs, computed by DuckDB from the raw arrays."""
    con = duckdb.connect()
    con.execute("CREATE TABLE orders (o_id BIGINT, cust BIGINT, amount BIGINT)")
    con.execute("CREATE TABLE customers (cust BIGINT, region VARCHAR)")
    con.executemany(
        "INSERT INTO customers VALUES (?, ?)",
        [(c, f"region-{c % REGIONS}") for c in range(inputs.customer_count)],
    )
    table = pa.table(
        {
            "o_id": pa.array(range(len(inputs.custs)), pa.int64()),
            "cust": pa.array(inputs.custs, pa.int64()),
            "amount": pa.array(inputs.amounts, pa.int64()),
        }
    )
    con.register("orders_arrow", table)
    con.execute("INSERT INTO orders SELECT * FROM orders_arrow")
    return {_plain(row): 1 for row in con.execute(query).fetchall()}


def run(
    case: str,
    orders: int,
    customers: int,
    steps: int,
    budget_bytes: int | None,
    directory: str,
) -> dict[str, Any]:
    make_plan, query = CASES[case]
    inputs = Inputs(orders, customers, seed=7)
    budget = None if budget_bytes is None else StateBudget(budget_bytes, directory=directory)
    dataflow = Dataflow(make_plan(), as_of=0, budget=budget)
    snapshot = inputs.snapshot()
    if case != "join":
        del snapshot["customers"]
    gc.collect()
    started = time.perf_counter()
    out, _ = dataflow.hydrate(snapshot)
    hydrate_s = time.perf_counter() - started
    del snapshot
    contents: dict[tuple[Any, ...], int] = {}
    outputs: list[list[Update]] = [out]

    def apply(updates: list[Update]) -> None:
        for row, _, diff in updates:
            total = contents.get(row, 0) + diff
            if total:
                contents[row] = total
            else:
                del contents[row]

    apply(out)
    step_ms = []
    for _ in range(steps):
        delta, next_upper = inputs.delta()
        started = time.perf_counter()
        out, _ = dataflow.step({"orders": delta}, next_upper)
        step_ms.append((time.perf_counter() - started) * 1000)
        outputs.append(consolidate(out))
        apply(out)
    answer = {_plain(row): m for row, m in contents.items()}
    expected = duckdb_answer(inputs, query)
    if answer != expected:
        raise SystemExit(f"the maintained view differs from DuckDB's answer: {answer} {expected}")
    state_bytes = sum(worker.held_bytes() for worker in dataflow.workers)
    ordered = sorted(step_ms)
    result = {
        "hydrate_s": round(hydrate_s, 2),
        "step_p50_ms": round(statistics.median(step_ms), 2),
        "step_p90_ms": round(percentile(ordered, 0.9), 2),
        "state_bytes": state_bytes,
        "budget_bytes": budget_bytes,
        "held_in_memory_bytes": None if budget is None else budget.held_bytes,
        "spilled_keys": None if budget is None else budget.spilled_keys,
        "bytes_on_disk": None if budget is None else budget.bytes_on_disk,
        "load_average": load_average(),
        "_outputs": outputs,
    }
    if budget is not None:
        budget.close()
    return result


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """The case in memory, then over a budget of a third of its state; prints and returns
    both runs' figures."""
    window = case == "window"
    orders = args.window_orders if window else args.orders
    customers = args.window_customers if window else args.customers
    with tempfile.TemporaryDirectory(prefix="tidemark-spill-bench-") as directory:
        in_memory = run(case, orders, customers, args.steps, None, directory)
        budget = in_memory["state_bytes"] // 3
        spilling = run(case, orders, customers, args.steps, budget, directory)
    if in_memory.pop("_outputs") != spilling.pop("_outputs"):
        raise SystemExit(f"{case}: the spilling run's output differs from the in-memory run's")
    print(f"{case}: orders={orders:,} customers={customers:,} steps={args.steps} (1,000 rows)")
    print(f"{'':24}{'hydrate s':>10}{'step p50 ms':>13}{'step p90 ms':>13}{'load':>6}")
    for name, run_result in (("in memory", in_memory), ("budget = state / 3", spilling)):
        print(
            f"{name:24}{run_result['hydrate_s']:>10}{run_result['step_p50_ms']:>13}"
            f"{run_result['step_p90_ms']:>13}{run_result['load_average']:>6.1f}"
        )
    print(
        f"state {in_memory['state_bytes'] / 2**20:.0f} MiB estimated; budget "
        f"{budget / 2**20:.0f} MiB; {spilling['spilled_keys']:,} keys spilled, "
        f"{spilling['bytes_on_disk'] / 2**20:.0f} MiB on disk at the end; both outputs equal "
        "DuckDB's answer and each other at every step"
    )
    return {
        "orders": orders,
        "customers": customers,
        "steps": args.steps,
        "in_memory": in_memory,
        "spilling": spilling,
        "step_p50_ratio": round(spilling["step_p50_ms"] / in_memory["step_p50_ms"], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--window-orders",
        type=int,
        default=250_000,
        help="orders of the window case (its state holds every order twice)",
    )
    parser.add_argument(
        "--window-customers",
        type=int,
        default=10_000,
        help="customers (window partitions) of the window case",
    )
    parser.add_argument(
        "--case", choices=["join", "reduce", "window", "both", "all"], default="both"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/spill.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if args.out.exists():
        results = json.loads(args.out.read_text())
    results["benchmark"] = "spill (i)"
    results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    if args.case in ("join", "both", "all"):
        results.update(run_case("join", args))
    if args.case in ("reduce", "both", "all"):
        results["reduce"] = run_case("reduce", args)
    if args.case in ("window", "all"):
        results["window"] = run_case("window", args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
