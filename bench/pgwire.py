"""The PostgreSQL wire protocol's cost: ``SELECT 1`` and a point read from an indexed
materialized view through psycopg 3 (one connection, statements one after another), next to the
same statements over the adapter's gRPC API (``AdapterClient.execute``) and against a
PostgreSQL on the same machine (Debian's server, a throwaway cluster) as the anchor.

Tidemark runs as real processes (embedded backends, the ``local`` compute engine); psycopg binds
the point read's key as a server-side parameter (Parse/Bind/Execute), the gRPC client sends the
literal statement. p50 and p99 in milliseconds.

    .venv/bin/python bench/pgwire.py [--samples 1000] [--rows 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import Latency, load_average
from tests.support.ports import free_port
from tests.support.sql_stack import sql_stack
from tidemark.clients.adapter import AdapterClient

RESULTS = Path(__file__).resolve().parent / "results" / "pgwire.json"
WARM_UP = 50
SETUP = [
    "CREATE TABLE kv (k bigint, v text)",
    "CREATE MATERIALIZED VIEW kv_view AS SELECT k, v FROM kv",
    "CREATE INDEX kv_view_by_k ON kv_view (k)",
]
POINT_READ = "SELECT v FROM kv_view WHERE k = %s"


def insert_rows(rows: int) -> list[str]:
    return [
        "INSERT INTO kv VALUES "
        + ", ".join(f"({k}, 'value-{k}')" for k in range(start, min(rows, start + 1000)))
        for start in range(0, rows, 1000)
    ]


def timed(samples: int, run: Callable[[int], None]) -> dict[str, Any]:
    keys = random.Random(11)
    for _ in range(WARM_UP):
        run(keys.randrange(1 << 30))
    seconds = []
    for _ in range(samples):
        key = keys.randrange(1 << 30)
        started = time.perf_counter()
        run(key)
        seconds.append(time.perf_counter() - started)
    return Latency.of(seconds).__dict__


def psycopg_figures(url: str, samples: int, rows: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()

        def select_one(_: int) -> None:
            assert cur.execute("SELECT 1").fetchone() == (1,)

        def point_read(key: int) -> None:
            k = key % rows
            assert cur.execute(POINT_READ, (k,)).fetchone() == (f"value-{k}",)

        return {
            "select_1": timed(samples, select_one),
            "point_read": timed(samples, point_read),
        }


async def grpc_figures(address: str, samples: int, rows: int) -> dict[str, Any]:
    client = AdapterClient(address)
    keys = random.Random(11)

    async def run(statement: Callable[[int], str], check: Callable[[int], Any]) -> dict[str, Any]:
        seconds = []
        for index in range(WARM_UP + samples):
            key = keys.randrange(1 << 30) % rows
            started = time.perf_counter()
            result = await client.execute(statement(key))
            elapsed = time.perf_counter() - started
            assert result.results[0].rows == check(key), result.results[0]
            if index >= WARM_UP:
                seconds.append(elapsed)
        return Latency.of(seconds).__dict__

    try:
        return {
            "select_1": await run(lambda _: "SELECT 1", lambda _: [(1,)]),
            "point_read": await run(
                lambda k: f"SELECT v FROM kv_view WHERE k = {k}", lambda k: [(f"value-{k}",)]
            ),
        }
    finally:
        await client.close()


def tidemark_figures(samples: int, rows: int) -> dict[str, Any]:
    port = free_port()
    with (
        tempfile.TemporaryDirectory() as directory,
        sql_stack(Path(directory), adapters=0, engine="local", warm_up=False) as stack,
    ):
        adapter = stack.start_adapter("--pgwire-listen", f"127.0.0.1:{port}")
        url = f"postgresql://tidemark@127.0.0.1:{port}/tidemark"
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = psycopg.connect(url, autocommit=True)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with conn:
            for statement in SETUP + insert_rows(rows):
                conn.execute(statement)
            # The index has caught up once the last row reads back.
            while conn.execute(POINT_READ, (rows - 1,)).fetchone() != (f"value-{rows - 1}",):
                time.sleep(0.2)
        return {
            "psycopg": psycopg_figures(url, samples, rows),
            "grpc": asyncio.run(grpc_figures(adapter.address, samples, rows)),
        }


def postgres_figures(samples: int, rows: int) -> dict[str, Any]:
    from tests.support.postgres import DATABASE, PASSWORD, SUPERUSER, postgres_cluster

    with postgres_cluster() as pg:
        pg.execute(*SETUP, *insert_rows(rows), "REFRESH MATERIALIZED VIEW kv_view", "ANALYZE")
        url = f"postgresql://{SUPERUSER}:{PASSWORD}@{pg.host}:{pg.port}/{DATABASE}"
        return psycopg_figures(url, samples, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL anchor")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": platform.machine(),
        "load_average_before": load_average(),
        "samples": args.samples,
        "rows": args.rows,
        "tidemark": tidemark_figures(args.samples, args.rows),
    }
    if not args.no_postgres:
        report["postgres"] = postgres_figures(args.samples, args.rows)
    for name in ("select_1", "point_read"):
        parts = [
            f"pgwire {report['tidemark']['psycopg'][name]}",
            f"grpc {report['tidemark']['grpc'][name]}",
        ]
        if "postgres" in report:
            parts.append(f"postgres {report['postgres'][name]}")
        print(f"{name}: " + "; ".join(parts))
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
