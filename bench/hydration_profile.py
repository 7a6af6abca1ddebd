"""Where benchmark (f)'s hydration spends its time, piece by piece: the Spark jobs' stages
(wall and executor time, from Spark's status store) and one task's load (``ShardHost``'s
``Hydrate`` run in this process under a profiler, so that reading the parts, hashing, the
arrangement build and the Reduce's load show apart).

    python bench/hydration_profile.py --orders 3000000

It prints; figures worth keeping go to ``services/compute/spark/README.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import SparkSession

from bench.common import load_average
from bench.compute_view import Workload, time_recompute, view_plan
from bench.hydration import AS_OF, run, store_inputs
from services.compute.dataflow.lower import lower
from services.compute.spark import spark_session
from services.compute.spark.hydration import OutputTarget, stage
from services.compute.spark.requests import Install
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.staging import delete_prefix, run_prefix
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.clients.storage import StorageClient
from tidemark.plan import check_plan


def _stage_ids(spark: SparkSession) -> list[int]:
    tracker = spark.sparkContext.statusTracker()
    ids = [*tracker.getActiveStageIds()]
    for job in tracker.getJobIdsForGroup(None):
        info = tracker.getJobInfo(job)
        if info is not None:
            ids.extend(info.stageIds)
    return ids


def stage_times(spark: SparkSession, since: int) -> list[dict[str, Any]]:
    """The stages after stage ``since``: wall time, executors' run time and rows."""
    store = spark.sparkContext._jsc.sc().statusStore()  # type: ignore[union-attr]
    found = []
    for stage_id in sorted(set(_stage_ids(spark))):
        if stage_id <= since:
            continue
        data = store.lastStageAttempt(stage_id)
        submitted, completed = data.submissionTime(), data.completionTime()
        wall = None
        if submitted.isDefined() and completed.isDefined():
            wall = (completed.get().getTime() - submitted.get().getTime()) / 1000
        found.append(
            {
                "stage": stage_id,
                "tasks": data.numTasks(),
                "wall_s": wall,
                "executor_run_s": data.executorRunTime() / 1000,
                "input_rows": data.inputRecords(),
                "shuffle_write_rows": data.shuffleWriteRecords(),
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=3_000_000)
    parser.add_argument("--spark-master", default="local[6]")
    parser.add_argument("--runs", type=int, default=2, help="hydrations profiled")
    args = parser.parse_args()
    print("load average", load_average())
    spark = spark_session(args.spark_master, min_slots=6)
    with tempfile.TemporaryDirectory(prefix="tidemark-hydration-profile-") as scratch:
        root = Path(scratch)
        backends = embedded_backends(root / "storage")
        storage = start_storage(
            backends, extra=(*FAST_SETTINGS, "--orphan-grace", "3600", "--lease-seconds", "3600")
        )
        client = StorageClient(storage.address, timeout=600.0)
        try:
            reads, orders_path, customers_path = store_inputs(
                spark, client, backends.blob_url, Workload(args.orders), root / "parquet"
            )
            recomputed = time_recompute(spark, orders_path, customers_path, runs=3)
            print(f"Spark SQL recompute p50 {recomputed.p50_ms / 1000:.2f} s")
            plan = view_plan(*reads)
            schema = check_plan(plan)
            graph = lower(plan)
            listings = {cid: run(client.list_parts(read, AS_OF)) for cid, read in reads.items()}
            blob_url = next(iter(listings.values())).blob_url
            for attempt in range(args.runs):
                dataflow_id = f"profile-{attempt}"
                out = run(client.create(f"u{900 + attempt}", schema, holder="bench"))
                prefix = run_prefix(dataflow_id)
                since = max(_stage_ids(spark), default=-1)
                started = time.perf_counter()
                staged = stage(
                    spark,
                    plan,
                    graph,
                    dataflow_id=dataflow_id,
                    as_of=AS_OF,
                    shards=2,
                    index_key_columns=None,
                    listings=listings,
                    staging_url=blob_url,
                    prefix=prefix,
                    output=OutputTarget(out.write.collection_id, schema, blob_url),
                    count_output=False,
                )
                print(
                    f"Spark jobs {time.perf_counter() - started:.2f} s "
                    f"(staging {staged.staging_seconds:.2f} s)"
                )
                for row in stage_times(spark, since):
                    print("  stage", json.dumps(row))
                host = ShardHost(0, 2)
                host.handle(Install(dataflow_id, plan.SerializeToString(), False, None, AS_OF))
                profile = cProfile.Profile()
                started = time.perf_counter()
                profile.enable()
                loaded = host.handle(staged.loads[0])
                profile.disable()
                print(f"shard 0's load {time.perf_counter() - started:.2f} s: {loaded}")
                pstats.Stats(profile).sort_stats("cumulative").print_stats(18)
                run(delete_prefix(blob_url, prefix))
        finally:
            run(client.close())
            storage.kill()


if __name__ == "__main__":
    main()
