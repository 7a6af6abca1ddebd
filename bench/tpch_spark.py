"""One-shot TPC-H queries as Spark jobs, next to Spark SQL over the same rows as Parquet
(`make bench-tpch-spark`).

Generates TPC-H at ``--scale-factor`` offline with DuckDB's TPC-H extension and writes each
table as Parquet. Starts the services as their own processes (embedded backends, compute on
Spark at ``--spark-master``), creates the eight tables and loads each with one write straight
into storage, at a timestamp from the oracle as the adapter writes a table. Then, per query:

- Tidemark: the SELECT through the adapter, a one-shot query, which compute runs as a Spark
  job over the tables' Parquet parts (``--spark-one-shot-rows``, default 100,000 updates);
- Spark SQL: the same query text over the DuckDB-written Parquet files, in a Spark session
  of the same master and settings as compute's, in this process;
- DuckDB: the same query, for the answer (and its time).

Each timed figure is the median of ``--runs`` runs after one warm-up run. A query's Tidemark and
Spark SQL runs follow each other (the Spark SQL session lives beside the services), so a
machine shared with other work loads both sides of a ratio alike. Every Tidemark answer is
checked against DuckDB's; a wrong or failed one is reported as such, never timed. Writes
``bench/results/tpch_spark.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

from bench.common import load_average  # noqa: E402
from tests.support.sql_stack import SqlStack, sql_stack  # noqa: E402
from tests.support.tpch_workload import (  # noqa: E402
    TABLES,
    create_table_sql,
    queries,
    same_rows,
    schemas,
    table_collection,
    tpch_duckdb,
)
from tidemark import timelines  # noqa: E402
from tidemark.clients.adapter import AdapterClient  # noqa: E402
from tidemark.clients.catalog import CatalogClient  # noqa: E402
from tidemark.clients.oracle import OracleClient  # noqa: E402
from tidemark.clients.storage import Capability, StorageClient  # noqa: E402
from tidemark.columnar import RelationSchema, frontier_bound  # noqa: E402
from tidemark.columnar.schema import DIFF_COLUMN, DIFF_TYPE, TIME_COLUMN, TIME_TYPE  # noqa: E402
from tidemark.errors import FailedPrecondition  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "tpch_spark.json"
QUERIES = "1,3,5,6,9,18"
DRIVER_MEMORY = "4g"


async def load(
    storage: StorageClient,
    oracle: OracleClient,
    collection_id: str,
    schema: RelationSchema,
    rows: pa.Table,
) -> None:
    """``rows`` appended to a table's collection as one write, as the adapter writes a table:
    at a WriteTs, compare-and-append against the current upper, then ApplyWrite."""
    data = rows.rename_columns([c.name for c in schema.columns])
    pair = await storage.acquire(collection_id, holder="tpch-spark-loader")
    try:
        # lineitem's append can outlast a lease: the capabilities are renewed meanwhile.
        async with storage.keep_alive([pair.read, pair.write], every=5.0):
            await _append(storage, oracle, pair.write, collection_id, schema, data)
    finally:
        await storage.drop(pair.read)
        await storage.drop(pair.write)


async def _append(
    storage: StorageClient,
    oracle: OracleClient,
    write: Capability,
    collection_id: str,
    schema: RelationSchema,
    data: pa.Table,
) -> None:
    for _ in range(200):
        w = await oracle.write_ts(timelines.DATA)
        upper = frontier_bound((await storage.describe(collection_id)).upper)
        if upper is None or upper > w:
            continue
        updates = data.append_column(
            pa.field(TIME_COLUMN, TIME_TYPE, nullable=False),
            pa.repeat(pa.scalar(w, TIME_TYPE), data.num_rows),
        ).append_column(
            pa.field(DIFF_COLUMN, DIFF_TYPE, nullable=False),
            pa.repeat(pa.scalar(1, DIFF_TYPE), data.num_rows),
        )
        try:
            await storage.append_table(
                write, updates.cast(schema.update_schema()), w + 1, expected_upper=upper
            )
        except FailedPrecondition:
            continue  # the table ticker moved the upper: try again
        await oracle.apply_write(timelines.DATA, w)
        return
    raise RuntimeError(f"could not load {collection_id}: lost every race")


async def _tidemark_runs(
    client: AdapterClient, sql: str, runs: int
) -> tuple[list[float], list[tuple[Any, ...]] | str]:
    times = []
    answer: list[tuple[Any, ...]] | str = "no run"
    for run in range(runs + 1):
        start = time.perf_counter()
        result = await client.execute(sql)
        elapsed = time.perf_counter() - start
        if result.error is not None:
            return [], str(result.error)
        answer = result.results[-1].rows
        if run:  # the first run warms up
            times.append(elapsed)
    return times, answer


def _spark_sql_runs(spark: Any, sql: str, runs: int) -> list[float]:
    times = []
    for run in range(runs + 1):
        start = time.perf_counter()
        spark.sql(sql).collect()
        if run:
            times.append(time.perf_counter() - start)
    return times


def _duckdb(duck: Any, sql: str) -> tuple[float, list[tuple[Any, ...]]]:
    start = time.perf_counter()
    answer = [tuple(row) for row in duck.execute(sql).fetchall()]
    return time.perf_counter() - start, answer


async def measure_tidemark(
    args: argparse.Namespace,
    stack: SqlStack,
    duck: Any,
    texts: dict[int, str],
    spark_sql: Callable[[int], float],
) -> dict[str, Any]:
    """Loads the tables, then per query: Tidemark's runs, then Spark SQL's (``spark_sql``:
    the median seconds of a query number)."""
    tables = schemas(duck)
    async with (
        AdapterClient(stack.adapter(0), timeout=args.timeout) as client,
        StorageClient(stack.storage.address, timeout=600) as storage,
        OracleClient(stack.oracle.address) as oracle,
        CatalogClient(stack.catalog.address) as catalog,
    ):
        start = time.perf_counter()
        loaded = 0
        for name in TABLES:
            created = await client.execute(create_table_sql(name, tables[name]))
            if created.error is not None:
                raise RuntimeError(f"CREATE TABLE {name}: {created.error}")
            rows = duck.execute(f"SELECT * FROM {name}").to_arrow_table()
            await load(
                storage, oracle, await table_collection(catalog, oracle, name), tables[name], rows
            )
            loaded += rows.num_rows
        load_seconds = time.perf_counter() - start
        per_query: dict[str, Any] = {}
        for number in [int(n) for n in args.queries.split(",")]:
            sql = texts[number]
            duck_seconds, expected = _duckdb(duck, sql)
            times, answer = await _tidemark_runs(client, sql, args.runs)
            if isinstance(answer, str):
                cell: dict[str, Any] = {"ok": False, "error": answer[:300]}
            elif not same_rows(answer, expected):
                cell = {"ok": False, "error": f"{len(answer)} rows differ from DuckDB's"}
            else:
                cell = {"ok": True, "seconds": round(statistics.median(times), 4)}
            cell["duckdb_seconds"] = round(duck_seconds, 4)
            cell["spark_sql_seconds"] = spark_sql(number)
            per_query[f"q{number:02d}"] = cell
            print(
                f"Q{number:02d} tidemark {cell.get('seconds', 'FAIL')} "
                f"spark sql {cell['spark_sql_seconds']}",
                flush=True,
            )
    return {"rows_loaded": loaded, "load_seconds": round(load_seconds, 1), "queries": per_query}


def spark_sql_session(args: argparse.Namespace, parquet: Path) -> Any:
    """A Spark session of compute's master and settings, with the tables as views over the
    DuckDB-written Parquet."""
    from services.compute.spark.session import spark_session

    spark = spark_session(args.spark_master, settings={"spark.driver.memory": DRIVER_MEMORY})
    for name in TABLES:
        spark.read.parquet(str(parquet / f"{name}.parquet")).createOrReplaceTempView(name)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scale-factor", type=float, default=1.0)
    parser.add_argument("--queries", default=QUERIES)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per query (after one)")
    parser.add_argument("--spark-master", default="local[6]")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per statement")
    parser.add_argument(
        "--spark-one-shot-rows",
        default="100000",
        help="compute's threshold: one-shots over fewer input updates run in-process (-1: all)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--compute-log", type=Path, default=None, help="write compute's log lines here"
    )
    args = parser.parse_args()
    duck = tpch_duckdb(args.scale_factor)
    texts = queries(duck)
    with tempfile.TemporaryDirectory(prefix="tidemark-tpch-spark-") as directory:
        parquet = Path(directory) / "parquet"
        parquet.mkdir()
        for name in TABLES:
            duck.execute(f"COPY {name} TO '{parquet / name}.parquet' (FORMAT parquet)")
        compute = (
            "--spark-driver-memory",
            DRIVER_MEMORY,
            "--spark-one-shot-rows",
            args.spark_one_shot_rows,
        )
        from services.compute.spark.session import stop_spark_session

        spark = spark_sql_session(args, parquet)

        def spark_sql(number: int) -> float:
            return round(statistics.median(_spark_sql_runs(spark, texts[number], args.runs)), 4)

        try:
            with sql_stack(
                Path(directory) / "stack",
                adapters=1,
                spark_master=args.spark_master,
                compute_extra={"default": compute},
            ) as stack:
                try:
                    tidemark = asyncio.run(measure_tidemark(args, stack, duck, texts, spark_sql))
                finally:
                    if args.compute_log is not None:
                        lines = stack.compute.computes["default"].stderr_lines
                        args.compute_log.write_text("\n".join(lines) + "\n")
        finally:
            stop_spark_session()
    report: dict[str, Any] = {
        "scale_factor": args.scale_factor,
        "spark_master": args.spark_master,
        "runs": args.runs,
        "spark_one_shot_rows": int(args.spark_one_shot_rows),
        "machine": {"platform": platform.platform(), "load_average": load_average()},
        **{k: v for k, v in tidemark.items() if k != "queries"},
        "queries": {},
    }
    print()
    print(f"TPC-H sf {args.scale_factor}, one-shot queries, median of {args.runs} runs")
    print(f"{'query':<7}{'Tidemark s':>12}{'Spark SQL s':>13}{'ratio':>8}{'DuckDB s':>10}")
    for name, cell in tidemark["queries"].items():
        spark_seconds = cell["spark_sql_seconds"]
        entry = dict(cell)
        if cell.get("ok"):
            entry["ratio_to_spark_sql"] = round(cell["seconds"] / spark_seconds, 2)
        report["queries"][name] = entry
        shown = f"{cell['seconds']:.3f}" if cell.get("ok") else "FAIL"
        ratio = f"{entry['ratio_to_spark_sql']:.2f}" if cell.get("ok") else "-"
        print(
            f"{name:<7}{shown:>12}{spark_seconds:>13.3f}{ratio:>8}{cell['duckdb_seconds']:>10.3f}"
        )
        if not cell.get("ok"):
            print(f"  {name}: {cell['error']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
