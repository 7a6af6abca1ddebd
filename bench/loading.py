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
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import load_average
from tests.support.sql_stack import sql_stack
from tests.support.tpch_workload import create_table_sql, schemas, tpch_duckdb
from tidemark.clients.adapter import AdapterClient

RESULTS = Path(__file__).resolve().parent / "results" / "loading.json"
# Bytes per CopyIn message.
CHUNK_BYTES = 1 << 20


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


async def tidemark_copy(address: str, ddl: str, data: bytes, rows: int) -> dict[str, Any]:
    """COPY lineitem FROM STDIN (CSV) in 1 MiB messages, until SELECT count(*) sees it."""
    client = AdapterClient(address, timeout=600)
    try:
        await client.execute(ddl)
        chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
        started = time.perf_counter()
        result = await client.copy_in("COPY lineitem FROM STDIN (FORMAT csv)", chunks)
        if result.error is not None:
            raise RuntimeError(result.error)
        copied = time.perf_counter() - started
        count = await client.execute("SELECT count(*) FROM lineitem")
        elapsed = time.perf_counter() - started
        assert count.results[0].rows == [(rows,)], count.results[0].rows
    finally:
        await client.close()
    return {
        "rows": rows,
        "copy_seconds": round(copied, 3),
        "until_count_seconds": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed),
    }


def postgres_figures(
    ddl: str, csv_path: Path, rows: int, statements: list[str], insert_rows: int
) -> dict[str, Any]:
    """The anchor: psql \\copy of the same CSV and the same INSERT statements (psycopg2),
    against a PostgreSQL on this machine."""
    from tests.support.postgres import PASSWORD, postgres_cluster

    with postgres_cluster() as pg:
        pg.execute(
            ddl,
            "CREATE TABLE bench_insert (id bigint, customer text, amount numeric(10,2), day date)",
        )
        env = dict(os.environ, PGPASSWORD=PASSWORD)
        command = [
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            pg.host,
            "-p",
            str(pg.port),
            "-U",
            "tidemark",
            "-d",
            "upstream",
            "-c",
            f"\\copy lineitem FROM '{csv_path}' WITH (FORMAT csv)",
            "-c",
            "SELECT count(*) FROM lineitem",
        ]
        started = time.perf_counter()
        output = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        assert str(rows) in output.stdout, output.stdout
        connection = pg.connect()
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                insert_started = time.perf_counter()
                for statement in statements:
                    cursor.execute(statement)
                insert_elapsed = time.perf_counter() - insert_started
        finally:
            connection.close()
    return {
        "copy": {
            "rows": rows,
            "until_count_seconds": round(elapsed, 3),
            "rows_per_s": round(rows / elapsed),
        },
        "insert": {
            "rows": insert_rows,
            "seconds": round(insert_elapsed, 3),
            "rows_per_s": round(insert_rows / insert_elapsed),
        },
    }


def lineitem_csv(directory: Path, scale_factor: float) -> tuple[str, Path, int]:
    """TPC-H lineitem generated by DuckDB, as CSV, with its CREATE TABLE."""
    connection = tpch_duckdb(scale_factor)
    schema = schemas(connection)["lineitem"]
    path = directory / "lineitem.csv"
    connection.execute(f"COPY lineitem TO '{path}' (FORMAT csv, HEADER false)")
    (count,) = connection.execute("SELECT count(*) FROM lineitem").fetchone()  # type: ignore[misc]
    return create_table_sql("lineitem", schema), path, int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--insert-rows", type=int, default=20_000)
    parser.add_argument("--per-statement", type=int, default=1_000)
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL anchor")
    args = parser.parse_args()
    statements = insert_statements("bench_insert", args.insert_rows, args.per_statement)
    report: dict[str, Any] = {
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_average_before": load_average(),
        "scale_factor": args.scale_factor,
    }
    with tempfile.TemporaryDirectory() as tmp:
        ddl, csv_path, rows = lineitem_csv(Path(tmp), args.scale_factor)
        with sql_stack(Path(tmp) / "stack", adapters=1, engine="local") as stack:
            insert = asyncio.run(tidemark_inserts(stack.adapter(), statements, args.insert_rows))
            data = csv_path.read_bytes()
            copy = asyncio.run(tidemark_copy(stack.adapter(), ddl, data, rows))
        report["insert"] = {"tidemark": insert}
        report["copy"] = {"tidemark": copy, "bytes": csv_path.stat().st_size}
        if not args.no_postgres:
            anchor = postgres_figures(ddl, csv_path, rows, statements, args.insert_rows)
            report["insert"]["postgres"] = anchor["insert"]
            report["copy"]["postgres"] = anchor["copy"]
    line = f"INSERT ({args.per_statement}-row statements): tidemark {insert['rows_per_s']} rows/s"
    if "postgres" in report["insert"]:
        line += f", postgres {report['insert']['postgres']['rows_per_s']} rows/s"
    print(line)
    line = (
        f"COPY lineitem sf {args.scale_factor} ({rows} rows, CSV) until count(*) sees it: "
        f"tidemark {copy['rows_per_s']} rows/s ({copy['until_count_seconds']} s)"
    )
    if "postgres" in report["copy"]:
        pg = report["copy"]["postgres"]
        line += f", postgres psql \\copy {pg['rows_per_s']} rows/s ({pg['until_count_seconds']} s)"
    print(line)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
