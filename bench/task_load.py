"""One resident task's load of benchmark (f)'s large join side, in process, without Spark.

Hydration (f) has each of the P = 2 tasks read every part of ``orders(o_id, cust, amount)``
itself (``part_shares.read_share``: decode, hash each row's ``cust`` with the shard hash,
keep its shard's rows), then build the join's arrangement of its 5·10^6 rows
(``JoinState.load_columnar``: hash keys and whole rows, order by key hash then row hash,
consolidate, take). Here the parts are Parquet files written as storage writes them
(``tidemark.columnar.to_parquet``) in a local directory, read over ``file://`` as a task
reads them, and shard 0's load is timed ``--runs`` times in this process (the first run
pays for the process's first use of its memory, as a task's first hydration does; the
later ones reuse it), in wall and CPU time; the pieces of the build (hashing, ordering, the
take) are timed apart on the same rows.

    python bench/task_load.py --orders 10000000

Prints the figures and writes ``bench/results/task_load.json``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa

from bench.common import load_average
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.operators.join import JoinOperator, JoinState
from services.compute.spark.part_shares import read_share
from services.compute.spark.requests import PartsShare
from tidemark.columnar.io import to_parquet
from tidemark.columnar.schema import DIFF_COLUMN, TIME_COLUMN

RESULTS = Path(__file__).resolve().parent / "results" / "task_load.json"
CUSTOMERS, REGIONS, AS_OF, SHARDS = 1_000, 10, 1, 2


def write_parts(directory: Path, orders: int, parts: int, seed: int) -> tuple[str, ...]:
    """The orders as ``parts`` Parquet parts in ``directory``; returns their keys."""
    rng = np.random.default_rng(seed)
    keys = []
    bounds = np.linspace(0, orders, parts + 1, dtype=np.int64)
    for number, (start, stop) in enumerate(itertools.pairwise(bounds.tolist())):
        rows = int(stop - start)
        part = pa.table(
            {
                "o_id": np.arange(start, stop, dtype=np.int64),
                "cust": rng.integers(0, CUSTOMERS, rows, dtype=np.int64),
                "amount": rng.integers(1, 1000, rows, dtype=np.int64),
                TIME_COLUMN: np.full(rows, AS_OF, dtype=np.int64),
                DIFF_COLUMN: np.ones(rows, dtype=np.int64),
            }
        )
        key = f"part-{number:04d}.parquet"
        (directory / key).write_bytes(to_parquet(part))
        keys.append(key)
    return tuple(keys)


def customers() -> pa.Table:
    return pa.table(
        {
            "c0": np.arange(CUSTOMERS, dtype=np.int64),
            "c1": pa.array([f"region-{c % REGIONS}" for c in range(CUSTOMERS)]),
            DIFF_COLUMN: np.ones(CUSTOMERS, dtype=np.int64),
        }
    )


def new_state() -> JoinState:
    spec = JoinOperator(
        columns_key([1]), columns_key([0]), 3, 2, False, False, key_columns=((1,), (0,))
    )
    return spec.new_state()


def load_once(share: PartsShare) -> dict[str, float]:
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    table = read_share(share, AS_OF, {}, (1,), 0, SHARDS)
    assert table is not None
    read, read_cpu = time.perf_counter(), time.process_time()
    state = new_state()
    state.load_columnar([table, customers()], AS_OF)
    done, done_cpu = time.perf_counter(), time.process_time()
    return {
        "read_share_s": read - started,
        "load_columnar_s": done - read,
        "total_s": done - started,
        # CPU time (the process's threads, kernel time of its page faults included) moves
        # less than wall time on a machine shared with other work.
        "read_share_cpu_s": read_cpu - cpu,
        "load_columnar_cpu_s": done_cpu - read_cpu,
        "total_cpu_s": done_cpu - cpu,
        "rows": state.row_count(),
    }


def pieces(share: PartsShare) -> dict[str, float]:
    """The build's pieces timed apart (the functions of the current build)."""
    from services.compute.dataflow.columnar import arranged_order, combined_hashes, hash_input

    table = read_share(share, AS_OF, {}, (1,), 0, SHARDS)
    assert table is not None
    rows = table.select([0, 1, 2]).combine_chunks()
    gc.collect()
    started = time.perf_counter()
    sources = [hash_input(column) for column in rows.columns]
    hashes, row_hashes = combined_hashes(sources, rows.num_rows, [(1,), range(3)])
    hashed = time.perf_counter()
    order, _, _ = arranged_order(hashes, row_hashes)
    ordered = time.perf_counter()
    rows.take(pa.array(order))
    taken = time.perf_counter()
    return {"hash_s": hashed - started, "order_s": ordered - hashed, "take_s": taken - ordered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=10_000_000)
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-pieces", action="store_true", help="only the whole load")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    document: dict[str, Any] = {
        "orders": args.orders,
        "parts": args.parts,
        "shards": SHARDS,
        "machine": {"platform": platform.platform(), "load_average": load_average()},
    }
    with tempfile.TemporaryDirectory(prefix="tidemark-task-load-") as scratch:
        root = Path(scratch)
        keys = write_parts(root, args.orders, args.parts, seed=1)
        share = PartsShare(root.as_uri(), keys, ("o_id", "cust", "amount"), False)
        runs = []
        for _ in range(args.runs):
            runs.append(load_once(share))
            print({k: round(v, 3) for k, v in runs[-1].items()}, flush=True)
        for name in (
            "read_share_s",
            "load_columnar_s",
            "total_s",
            "read_share_cpu_s",
            "load_columnar_cpu_s",
            "total_cpu_s",
        ):
            values = [run[name] for run in runs]
            document[name] = {
                "median": round(statistics.median(values), 3),
                "min": round(min(values), 3),
            }
        document["rows"] = runs[-1]["rows"]
        if not args.no_pieces:
            measured = [pieces(share) for _ in range(args.runs)]
            document["build_pieces_median_s"] = {
                name: round(statistics.median(m[name] for m in measured), 3) for name in measured[0]
            }
    document["machine"]["load_average_after"] = load_average()
    print(json.dumps(document, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
