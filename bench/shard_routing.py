"""Hydration's routing of rows to the resident tasks' shards, in process: per 10^6 rows in
Arrow batches of 10^4 (Spark's batch size for ``mapInArrow``), the shard of each row's key
computed whole per batch (``keys.shards_of``) against row by row in Python (``to_pylist``,
then ``keys.shard_of`` through a dict of known keys, as the router still does for a computed
key), each followed by the split of the batch by shard. Keys: an int64 join key with 10^5
distinct values (the compute benchmark's orders), and a text key. Figures go to
``bench/results/shard-routing.json``.

    python bench/shard_routing.py
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from services.compute.dataflow.keys import shard_of, shards_of
from services.compute.spark.hydration import _split

RESULTS = Path(__file__).resolve().parent / "results" / "shard-routing.json"
ROWS, BATCH, SHARDS = 1_000_000, 10_000, 2


def batches(text: bool) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(1)
    out = []
    for start in range(0, ROWS, BATCH):
        keys = rng.integers(0, 100_000, BATCH)
        key = pa.array([f"customer-{k}" for k in keys]) if text else pa.array(keys)
        out.append(
            pa.record_batch(
                [pa.array(np.arange(start, start + BATCH)), key, pa.array(np.ones(BATCH))],
                names=["o", "key", "amount"],
            )
        )
    return out


def whole(batch: pa.RecordBatch) -> np.ndarray:
    return shards_of([batch.column(1)], batch.num_rows, SHARDS)


def by_row(batch: pa.RecordBatch, known: dict[tuple[Any, ...], int]) -> np.ndarray:
    owners = []
    for value in batch.column(1).to_pylist():
        key = (value,)
        owner = known.get(key)
        if owner is None:
            owner = known[key] = shard_of(key, SHARDS)
        owners.append(owner)
    return np.array(owners, dtype=np.int64)


def timed(data: list[pa.RecordBatch], owners_of: Callable[[pa.RecordBatch], np.ndarray]) -> float:
    started = time.perf_counter()
    for batch in data:
        for _ in _split(batch, owners_of(batch), SHARDS):
            pass
    return round(time.perf_counter() - started, 3)


def main() -> None:
    document: dict[str, Any] = {"rows": ROWS, "batch": BATCH, "shards": SHARDS}
    document["machine"] = {"platform": platform.platform()}
    for name, text in (("int64_key", False), ("text_key", True)):
        data = batches(text)
        known: dict[tuple[Any, ...], int] = {}
        row_s = min(timed(data, partial(by_row, known=known)) for _ in range(3))
        whole_s = min(timed(data, whole) for _ in range(3))
        document[name] = {
            "row_by_row_seconds": row_s,
            "whole_batch_seconds": whole_s,
            "speedup": round(row_s / whole_s, 1),
        }
    print(json.dumps(document, indent=2))
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
