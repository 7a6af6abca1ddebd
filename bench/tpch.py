"""TPC-H through Tidemark, next to DuckDB on the same rows (`make bench-tpch`).

Generates TPC-H at ``--scale-factor`` offline with DuckDB's TPC-H extension, starts the
services as their own processes (embedded backends, Spark ``local[2]``), creates the eight
tables and loads them the way the adapter writes a table. Then, per query:

- ``direct``: the SELECT's time through the adapter (a one-shot query), and DuckDB's;
- ``mv``: CREATE MATERIALIZED VIEW plus its first answered read (hydration included);
- ``after``: the view's read time after a round of inserts, deletes and updates to ``orders``
  and ``lineitem`` (the maintained view, not a recomputation).

Every answer is checked against DuckDB's; a wrong or failed one is reported as such, never
timed. Writes ``bench/results/tpch.json``.
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

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

from bench.common import load_average  # noqa: E402
from tests.support.sql_stack import SqlStack, sql_stack  # noqa: E402
from tests.support.tpch_workload import (  # noqa: E402
    change_statements,
    load_tables,
    queries,
    same_rows,
    tpch_duckdb,
)
from tidemark.clients.adapter import AdapterClient  # noqa: E402
from tidemark.clients.catalog import CatalogClient  # noqa: E402
from tidemark.clients.oracle import OracleClient  # noqa: E402
from tidemark.clients.storage import StorageClient  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "tpch.json"


def _timed_duckdb(duck: Any, sql: str) -> tuple[float, list[tuple[Any, ...]]]:
    start = time.perf_counter()
    answer = [tuple(row) for row in duck.execute(sql).fetchall()]
    return time.perf_counter() - start, answer


async def _timed(client: AdapterClient, sql: str) -> tuple[float, list[tuple[Any, ...]] | str]:
    start = time.perf_counter()
    result = await client.execute(sql)
    elapsed = time.perf_counter() - start
    if result.error is not None:
        return elapsed, str(result.error)
    return elapsed, result.results[-1].rows


def _cell(
    elapsed: float, answer: list[tuple[Any, ...]] | str, expected: list[Any]
) -> dict[str, Any]:
    if isinstance(answer, str):
        return {"ok": False, "error": answer[:300]}
    if not same_rows(answer, expected):
        return {"ok": False, "error": f"{len(answer)} rows differ from DuckDB's"}
    return {"ok": True, "seconds": round(elapsed, 4)}


async def run(args: argparse.Namespace, stack: SqlStack) -> dict[str, Any]:
    duck = tpch_duckdb(args.scale_factor)
    texts = queries(duck)
    numbers = [int(n) for n in args.queries.split(",")] if args.queries else sorted(texts)
    async with (
        AdapterClient(stack.adapter(0), timeout=args.timeout) as client,
        StorageClient(stack.storage.address) as storage,
        OracleClient(stack.oracle.address) as oracle,
        CatalogClient(stack.catalog.address) as catalog,
    ):
        load_start = time.perf_counter()
        loaded_rows = await load_tables(client, storage, oracle, catalog, duck)
        load_seconds = time.perf_counter() - load_start
        per_query: dict[str, dict[str, Any]] = {}
        for number in numbers:
            sql = texts[number]
            duck_seconds, expected = _timed_duckdb(duck, sql)
            elapsed, answer = await _timed(client, sql)
            cell = {
                "duckdb_seconds": round(duck_seconds, 4),
                "direct": _cell(elapsed, answer, expected),
            }
            start = time.perf_counter()
            created = await client.execute(f"CREATE MATERIALIZED VIEW q{number:02d} AS {sql}")
            if created.error is not None:
                cell["mv"] = {"ok": False, "error": str(created.error)[:300]}
            else:
                _, answer = await _timed(client, f"SELECT * FROM q{number:02d}")
                cell["mv"] = _cell(time.perf_counter() - start, answer, expected)
            per_query[f"q{number:02d}"] = cell
            _print_row(number, cell)
        for statement in change_statements(duck, random.Random(20261124)):
            result = await client.execute(statement)
            assert result.error is None, f"{statement}: {result.error}"
            duck.execute(statement)
        for number in numbers:
            cell = per_query[f"q{number:02d}"]
            if not cell["mv"].get("ok"):
                continue
            _, expected = _timed_duckdb(duck, texts[number])
            elapsed, answer = await _timed(client, f"SELECT * FROM q{number:02d}")
            cell["after"] = _cell(elapsed, answer, expected)
    return {
        "scale_factor": args.scale_factor,
        "rows_loaded": loaded_rows,
        "load_seconds": round(load_seconds, 2),
        "spark_master": args.spark_master,
        "machine": {"platform": platform.platform(), "load_average": load_average()},
        "queries": per_query,
    }


def _print_row(number: int, cell: dict[str, Any]) -> None:
    def show(part: dict[str, Any] | None) -> str:
        if part is None:
            return "-"
        return f"{part['seconds']:.3f}" if part.get("ok") else "FAIL"

    print(
        f"Q{number:02d}  duckdb {cell['duckdb_seconds']:.4f}s  direct {show(cell['direct'])}"
        f"  mv {show(cell.get('mv'))}",
        flush=True,
    )


def print_table(report: dict[str, Any]) -> None:
    print()
    print(
        f"TPC-H scale factor {report['scale_factor']}: {report['rows_loaded']:,} rows loaded "
        f"in {report['load_seconds']} s"
    )
    header = ("query", "DuckDB s", "direct s", "x DuckDB", "MV+read s", "after s")
    print("".join(f"{h:>{w}}" for h, w in zip(header, (6, 10, 10, 10, 11, 9), strict=True)))
    answered = {"direct": 0, "mv": 0, "after": 0}
    for name, cell in report["queries"].items():
        parts = []
        for part in ("direct", "mv", "after"):
            value = cell.get(part)
            if value is None:
                parts.append("-")
            elif value.get("ok"):
                answered[part] += 1
                parts.append(f"{value['seconds']:.3f}")
            else:
                parts.append("FAIL")
        ratio = "-"
        if cell["direct"].get("ok") and cell["duckdb_seconds"] > 0:
            ratio = f"{cell['direct']['seconds'] / cell['duckdb_seconds']:.0f}"
        print(
            f"{name:<6}{cell['duckdb_seconds']:>10.4f}{parts[0]:>10}{ratio:>10}{parts[1]:>11}{parts[2]:>9}"
        )
    total = len(report["queries"])
    print(
        f"answered like DuckDB: direct {answered['direct']}/{total}, "
        f"materialized view {answered['mv']}/{total}, after changes {answered['after']}/{total}"
    )
    for name, cell in report["queries"].items():
        for part in ("direct", "mv", "after"):
            value = cell.get(part)
            if value is not None and not value.get("ok"):
                print(f"  {name} {part}: {value['error']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--queries", default="", help="comma-separated query numbers (all 22)")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per statement")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tidemark-tpch-") as directory,
        sql_stack(Path(directory), adapters=1, spark_master=args.spark_master) as stack,
    ):
        report = asyncio.run(run(args, stack))
    print_table(report)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
