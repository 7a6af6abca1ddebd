"""Compute benchmark: ``make bench-compute`` or ``.venv/bin/python bench/compute.py``.

One run on ``local[*]`` (widened to the slots resident tasks need), the view
``orders ⋈ customers`` grouped by region with count and sum (``bench/compute_view.py``):

(d) **The floor**: a trivial Spark job (``spark.range(10).count()``) and a 10-row groupBy with
    a shuffle, p50 and min of many runs after a warm-up. Any design that runs a Spark job per
    input batch pays at least this per batch.
(a) **Maintained**: at each input size, the view as a ``SparkDataflow`` on a
    ``ResidentCluster`` of two shards (design option D): hydrated, then stepped through many
    1,000-row deltas (500 order updates over 10 timestamps), timed per step (p50/p90/p99).
    Also per size: a step of one updated order (the fixed cost of a step), the same deltas
    through the in-process engine (the operators' own cost, without the trip to the tasks),
    the work counters per step and the tasks' memory after hydration.
(b) **Recomputed**: the same view from scratch by a Spark DataFrame job over Parquet files of
    the inputs as they are after (a)'s last step (written with pyarrow), p50 and min of several
    runs after a warm-up. Its result must equal (a)'s maintained output row for row, or the
    run stops: a benchmark that computes wrong answers is worthless.
(c) **Freshness** (``bench/compute_freshness.py``): oracle, storage, catalog and compute as
    their own processes; the view maintained by the compute service into an output collection;
    200-row appends every 50 ms; from each acknowledged append until a storage subscription on
    the output reports a progress upper past that append's time.

Prints tables and writes ``bench/results/compute.json``. Every cell records the load average
and the CPU used by processes outside the benchmark's (``other``): the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

import pyarrow as pa  # noqa: E402
import pyspark  # noqa: E402

from bench.common import load_average  # noqa: E402
from bench.compute_freshness import (  # noqa: E402
    Freshness,
    FreshnessSettings,
    measure_freshness,
)
from bench.compute_view import (  # noqa: E402
    Floor,
    Maintained,
    Recomputed,
    Workload,
    maintain_in_process,
    maintain_on_spark,
    mismatch,
    spark_floor,
    time_recompute,
)
from bench.process_cpu import TreeCpuMeter  # noqa: E402
from services.compute.spark import (  # noqa: E402
    ResidentCluster,
    spark_session,
    stop_spark_session,
)

# The targets.
TARGET_GROWTH = 2.0  # (a) at 10^6 over (a) at 10^4, at most
TARGET_SPEEDUP = 10.0  # (b) over (a) at 10^6, at least
TARGET_FRESHNESS_P50_MS = 1000.0
SHARDS = 2


@dataclass(frozen=True)
class Settings:
    sizes: list[int]
    steps: int
    warmup_steps: int
    one_update_steps: int
    recompute_runs: int
    floor_runs: int
    in_process_max_rows: int
    freshness: FreshnessSettings | None


@dataclass
class SizeCell:
    rows: int
    maintained: Maintained
    in_process: Maintained | None
    recomputed: Recomputed
    output_rows: int
    output_equal: bool
    load_average: float
    cpu: dict[str, float]

    @property
    def speedup(self) -> float:
        """How many times faster (a)'s step p50 is than (b)'s recompute p50."""
        return round(self.recomputed.p50_ms / max(self.maintained.steps.p50_ms, 1e-6), 1)


# --- running ----------------------------------------------------------------------------------


def run_size(cluster: ResidentCluster, settings: Settings, rows: int, work_dir: Path) -> SizeCell:
    spark = spark_session()
    load = load_average()
    meter = TreeCpuMeter({"bench": [os.getpid()]})
    meter.start()
    workload = Workload(rows)
    maintained = maintain_on_spark(
        cluster,
        workload,
        steps=settings.steps,
        warmup_steps=settings.warmup_steps,
        one_update_steps=settings.one_update_steps,
    )
    orders_path, customers_path = workload.write_parquet(work_dir / f"inputs-{rows}")
    del workload
    recomputed = time_recompute(spark, orders_path, customers_path, runs=settings.recompute_runs)
    difference = mismatch(maintained.contents, recomputed.contents)
    if difference is not None:
        raise SystemExit(f"at {rows:,} rows the maintained view is WRONG: {difference}")
    in_process = None
    if rows <= settings.in_process_max_rows:
        # The same seed gives the same inputs and deltas.
        in_process = maintain_in_process(
            Workload(rows),
            steps=settings.steps,
            warmup_steps=settings.warmup_steps,
            one_update_steps=settings.one_update_steps,
        )
        if in_process.contents != maintained.contents:
            raise SystemExit(f"at {rows:,} rows the in-process engine disagrees with Spark")
    return SizeCell(
        rows=rows,
        maintained=maintained,
        in_process=in_process,
        recomputed=recomputed,
        output_rows=len(maintained.contents),
        output_equal=True,
        load_average=round(load, 2),
        cpu=meter.stop(),
    )


# --- reporting --------------------------------------------------------------------------------

FLOOR_HEADER = f"{'(d) Spark job':<52} {'p50 ms':>8} {'min ms':>8}"
SIZE_HEADER = (
    f"{'rows':>10} {'hydrate':>8} {'(a) step p50/p90/p99 ms':>24} {'1-upd':>6} "
    f"{'in-proc':>8} {'cpu ms/step':>13} {'(b) p50 (min) ms':>17} {'(b)/(a)':>8} {'check':>6} "
    f"{'load':>5}  cpu %"
)


def format_floor(floor: Floor) -> str:
    return f"{floor.what:<52} {floor.p50_ms:>8.1f} {floor.min_ms:>8.1f}"


def format_size(cell: SizeCell) -> str:
    m = cell.maintained
    steps = f"{m.steps.p50_ms:.1f} / {m.step_p90_ms:.1f} / {m.steps.p99_ms:.1f}"
    in_process = f"{cell.in_process.steps.p50_ms:.1f}" if cell.in_process else "-"
    recompute = f"{cell.recomputed.p50_ms:.0f} ({cell.recomputed.min_ms:.0f})"
    cpu = " ".join(f"{name} {value:.0f}" for name, value in cell.cpu.items())
    step_cpu = f"{m.driver_cpu_ms_per_step:.1f}|" + "+".join(
        f"{ms:.1f}" for ms in m.task_cpu_ms_per_step
    )
    return (
        f"{cell.rows:>10,} {m.hydrate_s:>7.2f}s {steps:>24} {m.one_update_steps.p50_ms:>6.2f} "
        f"{in_process:>8} {step_cpu:>13} {recompute:>17} {cell.speedup:>7.0f}x "
        f"{'equal' if cell.output_equal else 'WRONG':>6} {cell.load_average:>5.2f}  {cpu}"
    )


def target_results(
    cells: Sequence[SizeCell], freshness: Freshness | None
) -> list[dict[str, object]]:
    by_rows = {cell.rows: cell for cell in cells}
    results: list[dict[str, object]] = []
    small, large = by_rows.get(10_000), by_rows.get(1_000_000)
    if small is not None and large is not None:
        growth = round(large.maintained.steps.p50_ms / small.maintained.steps.p50_ms, 2)
        results.append(
            {
                "what": "(a) step p50 at 10^6 over at 10^4",
                "value": growth,
                "target": f"<= {TARGET_GROWTH}",
                "met": growth <= TARGET_GROWTH,
            }
        )
    if large is not None:
        results.append(
            {
                "what": "(b) recompute p50 over (a) step p50 at 10^6",
                "value": large.speedup,
                "target": f">= {TARGET_SPEEDUP}",
                "met": large.speedup >= TARGET_SPEEDUP,
            }
        )
    if freshness is not None:
        results.append(
            {
                "what": "(c) freshness p50 ms",
                "value": freshness.latency.p50_ms,
                "target": f"<= {TARGET_FRESHNESS_P50_MS:g}",
                "met": freshness.latency.p50_ms <= TARGET_FRESHNESS_P50_MS,
            }
        )
    return results


def machine_description(master: str, load_before: float) -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "spark_master": master,
        "resident_shards": SHARDS,
        "platform": platform.platform(),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(load_average(), 2),
    }


def size_document(cell: SizeCell) -> dict[str, object]:
    def maintained(m: Maintained) -> dict[str, object]:
        document = asdict(m)
        del document["contents"]
        return document

    return {
        "rows": cell.rows,
        "maintained": maintained(cell.maintained),
        "in_process": maintained(cell.in_process) if cell.in_process else None,
        "recomputed": {k: v for k, v in asdict(cell.recomputed).items() if k != "contents"},
        "recompute_over_step": cell.speedup,
        "output_rows": cell.output_rows,
        "output_equal_to_recompute": cell.output_equal,
        "load_average": cell.load_average,
        "cpu_percent": cell.cpu,
    }


# --- main -------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(float(part.replace("_", ""))) for part in text.split(",") if part.strip()]


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1e4,1e5,1e6", help="orders rows, comma-separated")
    parser.add_argument("--steps", type=int, default=300, help="timed 1,000-row steps per size")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    parser.add_argument("--one-update-steps", type=int, default=50, help="timed 1-update steps")
    parser.add_argument("--recompute-runs", type=int, default=7, help="timed recomputes per size")
    parser.add_argument("--floor-runs", type=int, default=30, help="timed runs per floor job")
    parser.add_argument(
        "--in-process-max-rows",
        type=float,
        default=1e6,
        help="run the in-process engine comparison up to this size (0: never)",
    )
    parser.add_argument("--skip-freshness", action="store_true", help="skip (c)")
    parser.add_argument("--freshness-rows", type=int, default=100_000, help="orders rows in (c)")
    parser.add_argument("--freshness-seconds", type=float, default=30.0, help="measured (c)")
    parser.add_argument("--append-rows", type=int, default=200, help="rows per append in (c)")
    parser.add_argument("--append-period", type=float, default=0.05, help="seconds, in (c)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: small sizes, few repetitions"
    )
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "compute.json"
    )
    args = parser.parse_args(argv)
    freshness: FreshnessSettings | None = FreshnessSettings(
        rows=args.freshness_rows,
        seconds=args.freshness_seconds,
        append_rows=args.append_rows,
        period_s=args.append_period,
    )
    settings = Settings(
        sizes=_ints(args.sizes),
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        one_update_steps=args.one_update_steps,
        recompute_runs=args.recompute_runs,
        floor_runs=args.floor_runs,
        in_process_max_rows=int(args.in_process_max_rows),
        freshness=freshness,
    )
    if args.quick:
        settings = Settings(
            sizes=[1_000, 10_000],
            steps=30,
            warmup_steps=5,
            one_update_steps=5,
            recompute_runs=2,
            floor_runs=5,
            in_process_max_rows=settings.in_process_max_rows,
            freshness=FreshnessSettings(
                rows=10_000, seconds=5.0, append_rows=args.append_rows, period_s=args.append_period
            ),
        )
    if args.skip_freshness:
        settings = Settings(**{**settings.__dict__, "freshness": None})
    return settings, args.output


def main(argv: Sequence[str] | None = None) -> None:
    settings, output = parse_settings(argv)
    load_before = load_average()
    print(
        f"Compute benchmark: {os.cpu_count()} CPUs, load {load_before:.2f}; sizes "
        f"{', '.join(f'{n:,}' for n in settings.sizes)}; {settings.steps} steps per size",
        flush=True,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-compute-"))
    cells: list[SizeCell] = []
    freshness: Freshness | None = None
    freshness_error: str | None = None
    try:
        spark = spark_session()
        master = spark.sparkContext.master or ""
        print(f"\nSpark {pyspark.__version__} on {master}\n{FLOOR_HEADER}", flush=True)
        floor_load = load_average()
        floors = spark_floor(spark, runs=settings.floor_runs)
        for floor in floors:
            print(format_floor(floor), flush=True)
        print(
            f"\n(a) maintained on {SHARDS} resident tasks, (b) recomputed from Parquet\n"
            f"{SIZE_HEADER}",
            flush=True,
        )
        with ResidentCluster(spark, SHARDS) as cluster:
            for rows in settings.sizes:
                cells.append(run_size(cluster, settings, rows, work_dir))
                print(format_size(cells[-1]), flush=True)
        # (c) runs its own Spark application in the compute process: this one steps aside.
        stop_spark_session()
        if settings.freshness is not None:
            print("\n(c) freshness through storage and the compute service", flush=True)
            try:
                freshness = measure_freshness(settings.freshness, work_dir / "freshness")
                print(freshness.describe(), flush=True)
            except Exception as error:  # (a), (b) and (d) are still worth writing down
                freshness_error = f"{type(error).__name__}: {error}"
                print(f"(c) FAILED: {freshness_error}", flush=True)
    finally:
        stop_spark_session()
        shutil.rmtree(work_dir, ignore_errors=True)

    print(
        "\nhydrate: the view's initial load on the tasks. (a) step: one SparkDataflow.step of a "
        "1,000-row delta (500 updates over 10 times). 1-upd: a step of one updated order. "
        "in-proc: the same deltas through the in-process engine (no Spark). cpu ms/step: CPU "
        "per (a) step of the driver (this process, which also makes the deltas) | of each "
        "resident task. (b): the view "
        "recomputed from Parquet by a Spark DataFrame job. check: (a)'s output equals (b)'s. "
        "cpu %: of one core, this benchmark's processes (bench) and everything else (other)."
    )
    targets = target_results(cells, freshness)
    for result in targets:
        verdict = "met" if result["met"] else "MISSED"
        print(f"target {result['what']}: {result['value']} (target {result['target']}): {verdict}")
    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "compute",
        "machine": machine_description(master, load_before),
        "settings": asdict(settings),
        "floor": {"load_average": round(floor_load, 2), "jobs": [asdict(f) for f in floors]},
        "sizes": [size_document(cell) for cell in cells],
        "freshness": (
            freshness.document()
            if freshness is not None
            else {"error": freshness_error}
            if freshness_error is not None
            else None
        ),
        "targets": targets,
    }
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")
    if freshness_error is not None:
        raise SystemExit("(c) failed; see above")


if __name__ == "__main__":
    main()
