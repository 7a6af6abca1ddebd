"""PostgreSQL source lag: upstream commit to readable in Tidemark (`make bench-pg-source`).

Starts a throwaway PostgreSQL (Debian's server, ``wal_level=logical``) and Tidemark's
processes (embedded backends, the local compute engine, the sources process), creates a
PostgreSQL source over one upstream table, and subscribes to its subsource through the
adapter. A writer commits upstream at ``--rate`` changes per second, in transactions of
``--changes-per-commit`` changes (inserts, and one update in five), and notes when each
commit returned. A transaction counts as readable when the subscription delivers its first
inserted row: SUBSCRIBE sends a change once the subsource's upper has passed it, which is
when any reader may read it. Lag = that moment minus the commit's return.

Prints p50/p99/max over the measured window (after ``--warmup`` seconds) and writes
``bench/results/pg_source.json``. Target: p50 <= 1 s at 1,000 changes/s. Also times the
initial snapshot: from CREATE SOURCE until a preloaded table of ``--snapshot-rows`` rows is
readable in full.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

from bench.common import Latency, load_average  # noqa: E402
from tests.support.postgres import (  # noqa: E402
    DATABASE,
    PASSWORD,
    SUPERUSER,
    PostgresCluster,
    postgres_cluster,
)
from tests.support.sql_stack import SqlStack, sql_stack  # noqa: E402
from tidemark.clients.adapter import AdapterClient, Changes  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "pg_source.json"


class Writer:
    """Commits transactions upstream at a steady pace on a thread of its own."""

    def __init__(self, pg: PostgresCluster, rate: float, per_commit: int) -> None:
        self.pg = pg
        self.per_commit = per_commit
        self.interval = per_commit / rate
        self.committed: dict[int, float] = {}
        self.changes = 0
        self.behind = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = random.Random(1)
        conn = self.pg.connect()
        next_id = 1
        txn = 0
        due = time.monotonic()
        with contextlib.closing(conn), conn.cursor() as cur:
            while not self.stopped.is_set():
                txn += 1
                rows = []
                updates = self.per_commit // 5 if next_id > 100 else 0
                for _ in range(self.per_commit - updates):
                    rows.append((next_id, txn, f"payload {next_id}"))
                    next_id += 1
                cur.executemany("INSERT INTO events VALUES (%s, %s, %s)", rows)
                for _ in range(updates):
                    cur.execute(
                        "UPDATE events SET payload = payload || '!' WHERE id = %s",
                        (rng.randint(1, next_id - 1),),
                    )
                conn.commit()
                self.committed[txn] = time.time()
                self.changes += self.per_commit
                due += self.interval
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                else:
                    self.behind += 1

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)


async def measure(args: argparse.Namespace, pg: PostgresCluster, stack: SqlStack) -> dict[str, Any]:
    pg.execute(
        "CREATE TABLE events (id bigint, txn bigint, payload text)",
        "ALTER TABLE events REPLICA IDENTITY FULL",
        "CREATE TABLE preload (id bigint, name text, amount numeric(12,2), day date)",
        "ALTER TABLE preload REPLICA IDENTITY FULL",
        f"INSERT INTO preload SELECT g, 'name ' || g, g / 100.0, date '2024-01-01' + g % 365 "
        f"FROM generate_series(1, {args.snapshot_rows}) g",
        "CREATE PUBLICATION bench_pub FOR TABLE events, preload",
    )
    seen: dict[int, float] = {}
    async with AdapterClient(stack.adapter(0), timeout=120) as client:
        for sql in (
            f"CREATE SECRET pg_pw AS '{PASSWORD}'",
            f"CREATE CONNECTION pg TO POSTGRES (HOST '{pg.host}', PORT {pg.port}, "
            f"USER '{SUPERUSER}', PASSWORD SECRET pg_pw, DATABASE '{DATABASE}')",
            "CREATE SOURCE bench FROM POSTGRES CONNECTION pg (PUBLICATION 'bench_pub') "
            "FOR TABLES (events, preload)",
        ):
            created = time.monotonic()
            result = await client.execute(sql)
            if result.error is not None:
                raise RuntimeError(f"{sql}: {result.error}")
        # The initial snapshot: until the preloaded table is readable in full.
        while True:
            result = await client.execute("SELECT count(*) FROM preload")
            if result.error is None and result.results[-1].rows == [(args.snapshot_rows,)]:
                break
            await asyncio.sleep(0.05)
        snapshot_seconds = time.monotonic() - created

        async def follow() -> None:
            async for event in client.subscribe("SUBSCRIBE events"):
                if isinstance(event, Changes):
                    now = time.time()
                    for change in event.changes:
                        if change.diff > 0:
                            txn = int(change.row[1])
                            seen.setdefault(txn, now)

        follower = asyncio.create_task(follow())
        await asyncio.sleep(2.0)  # the subscription is up and the snapshot (empty) is in
        writer = Writer(pg, args.rate, args.changes_per_commit)
        started = time.time()
        writer.start()
        load_before = load_average()
        await asyncio.sleep(args.warmup + args.seconds)
        writer.stop()
        stopped = time.time()
        # Let the last commits arrive.
        for _ in range(300):
            if len(seen) >= len(writer.committed):
                break
            await asyncio.sleep(0.1)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
    window_start = started + args.warmup
    measured = {t: c for t, c in writer.committed.items() if c >= window_start}
    lags = [seen[t] - c for t, c in measured.items() if t in seen]
    missing = len(measured) - len(lags)
    latency = Latency.of(lags)
    achieved = len(measured) * args.changes_per_commit / max(1e-9, stopped - window_start)
    return {
        "snapshot_rows": args.snapshot_rows,
        "snapshot_seconds": round(snapshot_seconds, 3),
        "snapshot_rows_per_s": round(args.snapshot_rows / snapshot_seconds, 1),
        "rate_target_changes_per_s": args.rate,
        "rate_achieved_changes_per_s": round(achieved, 1),
        "changes_per_commit": args.changes_per_commit,
        "commits_measured": len(measured),
        "commits_never_seen": missing,
        "writer_fell_behind": writer.behind,
        "lag_p50_ms": latency.p50_ms,
        "lag_p99_ms": latency.p99_ms,
        "lag_max_ms": round(max(lags) * 1000, 3) if lags else 0.0,
        "target_p50_ms": 1000,
        "meets_target": latency.p50_ms <= 1000 and missing == 0,
        "load_average_1m": round(load_before, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="upstream changes per second")
    parser.add_argument("--changes-per-commit", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument(
        "--snapshot-rows", type=int, default=100_000, help="rows in the table snapshotted first"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tidemark-bench-pg-") as directory,
        postgres_cluster() as pg,
        sql_stack(Path(directory), adapters=1, engine="local", sources=True) as stack,
    ):
        figures = asyncio.run(measure(args, pg, stack))
    report = {
        "benchmark": "pg_source",
        "what": "lag from an upstream PostgreSQL commit to the change being readable in "
        "Tidemark (delivered by SUBSCRIBE on the subsource)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **figures,
    }
    print(
        f"PostgreSQL source at {figures['rate_achieved_changes_per_s']} changes/s "
        f"({figures['commits_measured']} commits of {args.changes_per_commit}): "
        f"lag p50 {figures['lag_p50_ms']} ms, p99 {figures['lag_p99_ms']} ms, "
        f"max {figures['lag_max_ms']} ms; never seen: {figures['commits_never_seen']}; "
        f"target p50 <= 1000 ms: {'met' if figures['meets_target'] else 'NOT met'}"
    )
    print(
        f"initial snapshot of {figures['snapshot_rows']} rows readable after "
        f"{figures['snapshot_seconds']} s ({figures['snapshot_rows_per_s']} rows/s)"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
