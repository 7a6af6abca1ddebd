"""Getting data in: 1,000-row INSERT ... VALUES statements and COPY of TPC-H lineitem.

Tidemark runs as real processes (embedded backends); PostgreSQL on the same machine, started
from Debian's binaries when they are installed, is the anchor: the same INSERT statements
through psycopg, and ``psql \\copy`` of the same CSV. Each COPY figure is the time from the
first byte sent until ``SELECT count(*)`` sees every row.

    .venv/bin/python bench/loading.py [--scale-factor 0.1] [--insert-rows 20000]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average
from tests.support.sql_stack import sql_stack
from tidemark.clients.adapter import AdapterClient

RESULTS = Path(__file__).resolve().parent / "results" / "loading.json"


def insert_statements(table: str, total: int, per_statement: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    statements = []
    for start in range(0, total, per_statement):
        values = ", ".join(
            f"({i}, 'customer-{rng.randrange(10_000)}', {rng.randrange(100_000) / 100:.2f}, "
            f"DATE '2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}')"
            for i in range(start, min(total, start + per_statement))
        )
        statements.append(f"INSERT INTO {table} VALUES {values}")
    return statements


async def tidemark_inserts(address: str, statements: list[str], rows: int) -> dict[str, Any]:
    client = AdapterClient(address)
    try:
        await client.execute(
            "CREATE TABLE bench_insert (id bigint, customer text, amount numeric(10,2), day date)"
        )
        started = time.perf_counter()
        for statement in statements:
            result = await client.execute(statement)
            if result.results[0].error is not None:
                raise RuntimeError(result.results[0].error)
        elapsed = time.perf_counter() - started
        count = await client.execute("SELECT count(*) FROM bench_insert")
        assert count.results[0].rows == [(rows,)], count.results[0].rows
    finally:
        await client.close()
    return {"rows": rows, "seconds": round(elapsed, 3), "rows_per_s": round(rows / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--insert-rows", type=int, default=20_000)
    parser.add_argument("--per-statement", type=int, default=1_000)
    args = parser.parse_args()
    statements = insert_statements("bench_insert", args.insert_rows, args.per_statement)
    report: dict[str, Any] = {"machine": platform.machine(), "load_average_before": load_average()}
    with tempfile.TemporaryDirectory() as tmp, sql_stack(Path(tmp), adapters=1) as stack:
        insert = asyncio.run(tidemark_inserts(stack.adapter(), statements, args.insert_rows))
        print(
            f"INSERT ({args.per_statement}-row statements): tidemark {insert['rows_per_s']} rows/s"
        )
        report["insert"] = {"tidemark": insert}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
