"""Benchmark: the driver<->task frames' codec (``services/compute/spark/codec.py``) against pickle.

Two messages of the steady state and of reads:

- a ``Process`` request of 1,000 updates, rows ``(int, Decimal(12, 2), str, date, float)``:
  what the driver sends a task per stateful node per step;
- a ``Peek`` reply of 100,000 rows of the same shape: a task's share of a large view's
  contents.

For each, the median time to encode and to decode (one process, no sockets: the codec alone),
and the frame's size, for the codec and for ``pickle`` (protocol 5, what the wire carried
before). Then the ``Process`` request's round trip over loopback TCP (sent, decoded by a
thread acting as the task, an empty ``Reply`` back), in plaintext and over mTLS
(``secure.py``, certificates made for the run). Figures go to
``bench/results/wire_codec.json``.

    python bench/wire_codec.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.compute.spark import requests as rq
from services.compute.spark.secure import (
    accept_secure,
    connect_secure,
    own_identity,
    server_context,
)
from services.compute.spark.wire import CODEC, receive_message, send_message, tune
from tidemark.rpc.identity import compute_identity
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import file_stem, write_certificates

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


def round_trip_ms(message: object, tls: TlsSettings | None, repeats: int) -> float:
    """Median time to send ``message`` to a task over loopback and get its reply."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def task() -> None:
            address = listener.getsockname()
            with connect_secure(socket.create_connection(address), tls) as sock:
                tune(sock)
                while not isinstance(receive_message(sock), rq.Stop):
                    send_message(sock, rq.Reply())

        thread = threading.Thread(target=task)
        thread.start()
        accepted, _ = listener.accept()
        context = None if tls is None else server_context(tls)
        sock = accept_secure(accepted, context, None if tls is None else own_identity(tls))
        assert sock is not None
        with sock:
            sock.settimeout(None)
            tune(sock)

            def exchange() -> None:
                send_message(sock, message)
                receive_message(sock)

            figure = median_ms(exchange, repeats)
            send_message(sock, rq.Stop())
        thread.join()
    return figure


def tls_settings(directory: Path) -> TlsSettings:
    identity = compute_identity("bench", "default")
    write_certificates(directory, [identity])
    stem = directory / file_stem(identity)
    return TlsSettings(f"{stem}.crt", f"{stem}.key", str(directory / "ca.crt"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--peek-rows", type=int, default=100_000)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    rng = random.Random(7)
    # A task's part of a stateful node's input for one peer (the kind of frame that carries
    # a step's updates; formerly the driver's Process request, of the same shape).
    process = rq.Exchange(1, 3, ([(row(rng, key), 1_700_000, 1) for key in range(args.updates)],))
    peek = rq.Reply({row(rng, key): 1 for key in range(args.peek_rows)})
    decoded = CODEC.decode(CODEC.encode(process))
    assert isinstance(decoded, rq.Exchange) and repr(decoded) == repr(process)
    results: dict[str, Any] = {
        f"process_{args.updates}_updates": measure(process, 201),
        f"peek_reply_{args.peek_rows}_rows": measure(peek, 7),
    }
    with tempfile.TemporaryDirectory() as directory:
        tls = tls_settings(Path(directory))
        trips = {
            "plaintext_ms": round_trip_ms(process, None, 201),
            "mtls_ms": round_trip_ms(process, tls, 201),
        }
    results[f"process_{args.updates}_updates_round_trip"] = trips
    print(f"{'message':32} {'codec':>8} {'enc':>8} {'dec':>8} {'total ms':>9} {'bytes':>10}")
    for message, figures in results.items():
        if message.endswith("round_trip"):
            continue
        for name, values in figures.items():
            print(
                f"{message:32} {name:>8} {values['encode_ms']:8.3f} {values['decode_ms']:8.3f} "
                f"{values['total_ms']:9.3f} {values['bytes']:10d}"
            )
    for message, figures in results.items():
        if message.endswith("round_trip"):
            continue
        extra = figures["codec"]["total_ms"] - figures["pickle"]["total_ms"]
        print(f"{message}: codec - pickle = {extra:+.3f} ms")
    print(
        f"Process round trip over loopback: plaintext {trips['plaintext_ms']:.3f} ms, "
        f"mTLS {trips['mtls_ms']:.3f} ms"
    )
    document = {
        "benchmark": "wire_codec",
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "load_1m": round(os.getloadavg()[0], 2),
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
