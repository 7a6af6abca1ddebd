"""A resident task's share of hydration (f), in process: loading a join's staged inputs.

The join of benchmark (f) (``orders(o_id, cust, amount) ⋈ customers(cust, region)``) gets its
two staged inputs as Arrow tables, as ``ShardHost._hydrate`` does after fetching them. Two ways
to load them, same rows:

- **rows**: the tables converted to Python rows (``staging.rows_and_diffs``) and loaded row by
  row into the dict arrangements (``JoinState.load``), as before columnar arrangements;
- **columnar**: ``JoinState.load_columnar``: each side becomes a columnar batch (vectorised
  hashing, sorting, consolidation).

Then, on each loaded state, steps of 1,000 order changes (inserts and retractions of
existing orders, random customers) through ``JoinState.process``: the first steps after a
columnar load move the keys they touch from the batch into the dict, later ones find them
there. Prints a table and writes ``bench/results/columnar_load.json``.

    python bench/columnar_load.py --orders 5000000
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa

from bench.common import load_average
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.operators.join import JoinOperator, JoinState
from services.compute.dataflow.types import ColumnType, ScalarType
from services.compute.spark.staging import rows_and_diffs
from services.compute.spark.transport import normalizer

RESULTS = Path(__file__).resolve().parent / "results" / "columnar_load.json"
CUSTOMERS = 1_000
REGIONS = 10
STEP_ROWS = 1_000


def staged(orders: int, seed: int) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(seed)
    order_table = pa.table(
        {
            "o_id": np.arange(orders, dtype=np.int64),
            "cust": rng.integers(0, CUSTOMERS, orders, dtype=np.int64),
            "amount": rng.integers(1, 1000, orders, dtype=np.int64),
            "diff": np.ones(orders, dtype=np.int64),
        }
    )
    customer_table = pa.table(
        {
            "cust": np.arange(CUSTOMERS, dtype=np.int64),
            "region": np.arange(CUSTOMERS, dtype=np.int64) % REGIONS,
            "diff": np.ones(CUSTOMERS, dtype=np.int64),
        }
    )
    return order_table, customer_table


def new_state() -> JoinState:
    spec = JoinOperator(
        columns_key([1]), columns_key([0]), 3, 2, False, False, key_columns=((1,), (0,))
    )
    return spec.new_state()


def load_rows(state: JoinState, tables: tuple[pa.Table, pa.Table]) -> None:
    ints = [ScalarType(ColumnType.INT64, False)] * 3
    inputs = []
    for table in tables:
        rows, diffs = rows_and_diffs(table, normalizer(ints[: table.num_columns - 1]))
        inputs.append([(row, 0, diff) for row, diff in zip(rows, diffs, strict=True)])
    state.load(inputs)


def steps(state: JoinState, orders: int, count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    next_id = orders
    times = []
    for step in range(1, count + 1):
        changes: list[Any] = []
        for _ in range(STEP_ROWS):
            changes.append(((next_id, rng.randrange(CUSTOMERS), rng.randint(1, 999)), step, 1))
            next_id += 1
        started = time.perf_counter()
        state.process([changes, []])
        times.append((time.perf_counter() - started) * 1000)
    return times


def measure(
    kind: str, tables: tuple[pa.Table, pa.Table], orders: int, count: int
) -> dict[str, Any]:
    gc.collect()
    state = new_state()
    started, cpu = time.perf_counter(), time.process_time()
    if kind == "rows":
        load_rows(state, tables)
    else:
        state.load_columnar(tables, 0)
    load_seconds = time.perf_counter() - started
    load_cpu = time.process_time() - cpu
    rows = state.row_count()
    step_ms = steps(state, orders, count, seed=7)
    first, rest = step_ms[:10], step_ms[10:]
    return {
        "load_seconds": round(load_seconds, 3),
        "load_cpu_seconds": round(load_cpu, 3),
        "load_cpu_us_per_row": round(load_cpu / (orders + CUSTOMERS) * 1e6, 3),
        "rows": rows,
        "first_10_steps_ms_p50": round(statistics.median(first), 2),
        "later_steps_ms_p50": round(statistics.median(rest), 2) if rest else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=5_000_000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    tables = staged(args.orders, seed=1)
    document: dict[str, Any] = {
        "orders": args.orders,
        "customers": CUSTOMERS,
        "step_rows": STEP_ROWS,
        "machine": {"platform": platform.platform(), "load_average": load_average()},
    }
    for kind in ("columnar", "rows"):
        document[kind] = measure(kind, tables, args.orders, args.steps)
        print(kind, document[kind], flush=True)
    document["load_speedup"] = round(
        document["rows"]["load_seconds"] / document["columnar"]["load_seconds"], 1
    )
    print(json.dumps(document, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
