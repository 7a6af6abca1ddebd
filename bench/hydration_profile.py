"""Where benchmark (f)'s hydration spends its time: the Spark jobs' stages (from Spark's
status store) and one task's load (read, hash and filter, arrangement build), timed apart.

    python bench/hydration_profile.py --orders 3000000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average
from bench.compute_view import Workload, time_recompute, view_plan
from bench.hydration import AS_OF, run, store_inputs
from services.compute.dataflow.lower import lower
from services.compute.dataflow.operators.join import JoinOperator
from services.compute.spark import spark_session
from services.compute.spark.hydration import OutputTarget, stage
from services.compute.spark.part_shares import read_share
from services.compute.spark.staging import run_prefix
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.clients.storage import StorageClient
from tidemark.plan import check_plan


def stage_times(spark: Any, since_stage: int) -> list[dict[str, Any]]:
    """Every stage after ``since_stage``: its name, wall time and executors' run time."""
    store = spark.sparkContext._jsc.sc().statusStore()
    found = []
    for stage_id in range(since_stage + 1, last_stage(spark) + 1):
        try:
            data = store.lastStageAttempt(stage_id)
        except Exception:
            continue
        submitted, completed = data.submissionTime(), data.completionTime()
        wall = (
            (completed.get().getTime() - submitted.get().getTime()) / 1000
            if submitted.isDefined() and completed.isDefined()
            else None
        )
        found.append(
            {
                "stage": data.stageId(),
                "name": data.name()[:60],
                "tasks": data.numTasks(),
                "wall_s": wall,
                "executor_run_s": data.executorRunTime() / 1000,
                "input_rows": data.inputRecords(),
                "shuffle_write_rows": data.shuffleWriteRecords(),
            }
        )
    return sorted(found, key=lambda s: s["stage"])


def last_stage(spark: Any) -> int:
    tracker = spark.sparkContext.statusTracker()
    ids = [*tracker.getActiveStageIds()]
    for job in tracker.getJobIdsForGroup(None):
        info = tracker.getJobInfo(job)
        if info is not None:
            ids.extend(info.stageIds)
    return max(ids, default=-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--orders", type=int, default=3_000_000)
    parser.add_argument("--spark-master", default="local[6]")
    parser.add_argument("--variants", action="store_true", help="time variants of the job")
    args = parser.parse_args()
    print("load", load_average())
    spark = spark_session(args.spark_master, min_slots=6)
    with tempfile.TemporaryDirectory(prefix="tidemark-hprof-") as scratch:
        root = Path(scratch)
        backends = embedded_backends(root / "storage")
        storage = start_storage(
            backends, extra=(*FAST_SETTINGS, "--orphan-grace", "3600", "--lease-seconds", "3600")
        )
        client = StorageClient(storage.address, timeout=600.0)
        try:
            work = Workload(args.orders)
            reads, orders_path, customers_path = store_inputs(
                spark, client, backends.blob_url, work, root / "parquet"
            )
            recomputed = time_recompute(spark, orders_path, customers_path, runs=3)
            print(f"Spark SQL recompute p50 {recomputed.p50_ms / 1000:.2f} s")
            orders, customers = reads
            plan = view_plan(orders, customers)
            schema = check_plan(plan)
            graph = lower(plan)
            listings = {cid: run(client.list_parts(read, AS_OF)) for cid, read in reads.items()}
            blob_url = next(iter(listings.values())).blob_url
            out = run(client.create("u999", schema, holder="bench"))
            for attempt in range(2):
                before = last_stage(spark)
                started = time.perf_counter()
                staged = stage(
                    spark,
                    plan,
                    graph,
                    dataflow_id=f"profile{attempt}",
                    as_of=AS_OF,
                    shards=2,
                    index_key_columns=None,
                    listings=listings,
                    staging_url=blob_url,
                    prefix=run_prefix(f"profile{attempt}"),
                    output=OutputTarget(out.write.collection_id, schema, blob_url),
                    count_output=False,
                )
                print(
                    f"stage() {time.perf_counter() - started:.2f} s "
                    f"(staging {staged.staging_seconds:.2f} s)"
                )
                for row in stage_times(spark, before):
                    print(" ", json.dumps(row))
            if args.variants:
                from services.compute.spark.hydration import _narrowed_once, _narrowed
                from services.compute.spark.lowering import lower_with, release
                from services.compute.spark.parts_source import collection_frame

                frames = {
                    cid: collection_frame(spark, listing, consolidate=False)
                    for cid, listing in listings.items()
                }
                reduce_node = [
                    n for n in graph.stateful_nodes() if not isinstance(n.operator, JoinOperator)
                ][0]
                relation = graph.nodes[reduce_node.inputs[0]].relation
                _, captured = lower_with(plan, frames, [relation], spark, {})
                narrowed = _narrowed(reduce_node.relation, captured[0])
                narrowed.explain()
                from pyspark.sql import functions as F

                joined = captured[0]
                variants = {
                    "joined": joined,
                    "by region sum": joined.groupBy("c4").agg(F.count(F.lit(1)), F.sum("c2")),
                    "by amount,region sum(diff)": joined.groupBy("c2", "c4").agg(F.sum("diff")),
                    "by amount,region try_sum(diff)": joined.groupBy("c2", "c4").agg(
                        F.try_sum("diff")
                    ),
                    "narrowed": narrowed,
                }
                for name, frame in variants.items():
                    for attempt in range(2):
                        t0 = time.perf_counter()
                        frame.write.format("noop").mode("overwrite").save()
                        print(f"{name} noop write {time.perf_counter() - t0:.2f} s")
            load = staged.loads[0]
            for node_id, shares in load.shares.items():
                node = graph.nodes[node_id]
                assert isinstance(node.operator, JoinOperator)
                for position, share in enumerate(shares):
                    if share is None:
                        continue
                    t0 = time.perf_counter()
                    table = read_share(share, AS_OF, {}, node.operator.key_columns[position], 0, 2)
                    if table is not None:
                        from services.compute.dataflow.columnar import build_keyed
                        import numpy as np

                        t0 = time.perf_counter()
                        w = table.num_columns - 1
                        build_keyed(
                            table.select(list(range(w))),
                            table.column(w).to_numpy(),
                            node.operator.routes[position],
                            node.operator.key_columns[position],
                            True,
                        )
                        print(f"  build_keyed {time.perf_counter() - t0:.2f} s")
                    print(
                        f"  read_share input {position}: {time.perf_counter() - t0:.2f} s, "
                        f"{0 if table is None else table.num_rows} rows"
                    )
        finally:
            run(client.close())
            storage.kill()


if __name__ == "__main__":
    main()
