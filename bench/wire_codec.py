"""Benchmark: the driver<->task frames' codec (``services/compute/spark/codec.py``) against pickle.

Two messages of the steady state and of reads:

- a ``Process`` request of 1,000 updates, rows ``(int, Decimal(12, 2), str, date, float)``:
  what the driver sends a task per stateful node per step;
- a ``Peek`` reply of 100,000 rows of the same shape: a task's share of a large view's
  contents.

For each, the median time to encode and to decode (one process, no sockets: the codec alone),
and the frame's size, for the codec and for ``pickle`` (protocol 5, what the wire carried
before). Figures go to ``bench/results/wire_codec.json``.

    python bench/wire_codec.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import pickle
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.compute.spark import requests as rq
from services.compute.spark.wire import CODEC

RESULTS = Path(__file__).resolve().parent / "results" / "wire_codec.json"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]


def row(rng: random.Random, key: int) -> tuple[Any, ...]:
    price = Decimal(rng.randrange(-(10**8), 10**8)).scaleb(-2)
    name = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{key}"
    day = datetime.date(2022, 1, 1) + datetime.timedelta(days=rng.randrange(3 * 365))
    weight = float("nan") if rng.random() < 0.01 else rng.uniform(-1e6, 1e6)
    return (key, price, name, day, weight)


def median_ms(action: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return round(statistics.median(samples) * 1000, 3)


def measure(message: object, repeats: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    codecs: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], object]]] = {
        "codec": (CODEC.encode, CODEC.decode),
        "pickle": (lambda m: pickle.dumps(m, protocol=5), pickle.loads),
    }
    for name, (encode, decode) in codecs.items():
        payload = encode(message)
        encode_ms = median_ms(lambda: encode(message), repeats)  # noqa: B023
        decode_ms = median_ms(lambda: decode(payload), repeats)  # noqa: B023
        figures[name] = {
            "encode_ms": encode_ms,
            "decode_ms": decode_ms,
            "total_ms": round(encode_ms + decode_ms, 3),
            "bytes": len(payload),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--peek-rows", type=int, default=100_000)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    rng = random.Random(7)
    process = rq.Process(
        "dataflow", 3, ([(row(rng, key), 1_700_000, 1) for key in range(args.updates)],)
    )
    peek = rq.Reply({row(rng, key): 1 for key in range(args.peek_rows)})
    decoded = CODEC.decode(CODEC.encode(process))
    assert isinstance(decoded, rq.Process) and repr(decoded) == repr(process)
    results = {
        f"process_{args.updates}_updates": measure(process, 201),
        f"peek_reply_{args.peek_rows}_rows": measure(peek, 7),
    }
    print(f"{'message':32} {'codec':>8} {'enc':>8} {'dec':>8} {'total ms':>9} {'bytes':>10}")
    for message, figures in results.items():
        for name, values in figures.items():
            print(
                f"{message:32} {name:>8} {values['encode_ms']:8.3f} {values['decode_ms']:8.3f} "
                f"{values['total_ms']:9.3f} {values['bytes']:10d}"
            )
    for message, figures in results.items():
        extra = figures["codec"]["total_ms"] - figures["pickle"]["total_ms"]
        print(f"{message}: codec - pickle = {extra:+.3f} ms")
    document = {
        "benchmark": "wire_codec",
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
