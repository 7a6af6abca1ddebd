"""Steady state, benchmark (g) of issue #14: ``make bench-steady`` or
``.venv/bin/python bench/steady_state.py``.

The compute benchmark's view (``orders ⋈ customers`` grouped by region with count and sum,
``bench/compute_view.py``) as a ``SparkDataflow`` on a ``ResidentCluster`` of two shards
(``local[*]``, widened to the slots the tasks need, as ``bench/compute.py``), hydrated with
10^6 orders, then stepped through 1,000-row deltas (500 order updates over 10 timestamps):

- **step latency**: each ``SparkDataflow.step`` timed, p50/p90/p99;
- **driver CPU per step**: the user + system CPU time of this Python process (the driver:
  ``resource.getrusage(RUSAGE_SELF)``, every thread of it, no child process: neither Spark's
  JVM nor the executors' Python workers) counted from just before each ``step`` until it
  returns, so making the delta and applying the output are left out; also the same over the
  whole loop, for comparison;
- **task CPU per step**: each resident task's CPU (its pid, ``cluster.task_pids``) over the
  timed steps, divided by the steps;
- **where the driver's time goes**: more steps under ``cProfile`` (enabled only inside
  ``step``), as the top functions by cumulative time and the own time per source file, per
  step; twice, timed by the wall clock (socket reads then show the waits for the tasks) and by
  the process's CPU clock (a system call per profiler event, which inflates functions called
  often). Profiling slows the driver: these figures are proportions, not the step's cost;
- **the anchor**: Spark SQL recomputing the view over the same rows as Parquet (the inputs as
  they are after the last step), whose result must equal the maintained view.

Targets (issue #14): step p50 ≤ 12 ms and driver CPU ≤ 1 ms per step. Prints a table and
writes ``bench/results/steady_state.json``; every figure records the load average.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* when run as a script

import pyspark  # noqa: E402

from bench.common import Latency, cpu_seconds, load_average, percentile  # noqa: E402
from bench.compute_view import (  # noqa: E402
    AS_OF,
    DELTA_TIMES,
    DELTA_UPDATES,
    Contents,
    Recomputed,
    Workload,
    mismatch,
    rss_megabytes,
    time_recompute,
    view_plan,
)
from bench.process_cpu import TreeCpuMeter  # noqa: E402
from services.compute.spark import (  # noqa: E402
    ResidentCluster,
    SparkDataflow,
    spark_session,
    stop_spark_session,
)

TARGET_STEP_P50_MS = 12.0
TARGET_DRIVER_CPU_MS = 1.0
SHARDS = 2
PROFILE_TOP = 25


@dataclass(frozen=True)
class Settings:
    rows: int
    steps: int
    warmup_steps: int
    profile_steps: int
    recompute_runs: int


@dataclass
class Steps:
    """The timed steps' figures."""

    latency: Latency
    p90_ms: float
    driver_cpu_ms_per_step: float
    """This process's CPU inside ``step``, per step (p50 of the per-step figures is below)."""
    driver_cpu_p50_ms: float
    driver_cpu_loop_ms_per_step: float
    """This process's CPU over the whole loop (deltas made, outputs applied), per step."""
    task_cpu_ms_per_step: list[float]
    gc_collections: int
    load_average: float


def _rusage_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _gc_count() -> int:
    return sum(stats["collections"] for stats in gc.get_stats())


def run_steps(
    dataflow: SparkDataflow,
    workload: Workload,
    contents: Contents,
    count: int,
    task_pids: Sequence[int],
) -> Steps:
    load = load_average()
    wall: list[float] = []
    cpu: list[float] = []
    gc_before = _gc_count()
    loop_before = _rusage_seconds()
    tasks_before = [cpu_seconds(pid) for pid in task_pids]
    for _ in range(count):
        delta, upper = workload.delta(DELTA_UPDATES, DELTA_TIMES)
        cpu_started = _rusage_seconds()
        started = time.perf_counter()
        output, _ = dataflow.step({"orders": delta}, upper)
        wall.append(time.perf_counter() - started)
        cpu.append(_rusage_seconds() - cpu_started)
        contents.apply(output)
    loop_cpu = _rusage_seconds() - loop_before
    tasks = [cpu_seconds(pid) - before for pid, before in zip(task_pids, tasks_before, strict=True)]
    per_step = max(1, count)
    return Steps(
        latency=Latency.of(wall),
        p90_ms=round(percentile(sorted(wall), 0.90) * 1000, 3),
        driver_cpu_ms_per_step=round(sum(cpu) * 1000 / per_step, 3),
        driver_cpu_p50_ms=round(percentile(sorted(cpu), 0.50) * 1000, 3),
        driver_cpu_loop_ms_per_step=round(loop_cpu * 1000 / per_step, 3),
        task_cpu_ms_per_step=[round(seconds * 1000 / per_step, 3) for seconds in tasks],
        gc_collections=_gc_count() - gc_before,
        load_average=round(load, 2),
    )


def _where(filename: str) -> str:
    """A source file, relative to the repository or to its installed package."""
    path = Path(filename)
    if path.is_relative_to(REPO_ROOT):
        return str(path.relative_to(REPO_ROOT))
    parts = path.parts
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages") + 1 :])
    return filename


def profile_steps(
    dataflow: SparkDataflow,
    workload: Workload,
    contents: Contents,
    count: int,
    timer: Callable[[], float],
) -> dict[str, object]:
    """``count`` steps with the profiler on inside ``step`` only, timed by ``timer`` (this
    process's CPU time, or the wall clock, which adds the waits for the tasks' answers): the
    top functions by cumulative time and the own time per source file, in ms per step."""
    profiler = cProfile.Profile(timer)
    load = load_average()
    for _ in range(count):
        delta, upper = workload.delta(DELTA_UPDATES, DELTA_TIMES)
        profiler.enable()
        output, _ = dataflow.step({"orders": delta}, upper)
        profiler.disable()
        contents.apply(output)
    stats = pstats.Stats(profiler)
    per_step = max(1, count)
    raw = stats.stats  # type: ignore[attr-defined]
    entries = []
    by_file: dict[str, float] = {}
    total = 0.0
    for (filename, line, name), (_, calls, own, cumulative, _) in raw.items():
        where = _where(filename)
        entries.append(
            {
                "function": f"{where}:{line}({name})" if line else name,
                "calls_per_step": round(calls / per_step, 1),
                "own_ms_per_step": round(own * 1000 / per_step, 3),
                "cumulative_ms_per_step": round(cumulative * 1000 / per_step, 3),
            }
        )
        key = where if line else name.strip("<>")
        by_file[key] = by_file.get(key, 0.0) + own
        total += own
    entries.sort(key=lambda e: -float(e["cumulative_ms_per_step"]))  # type: ignore[arg-type]
    files = sorted(by_file.items(), key=lambda item: -item[1])
    return {
        "steps": count,
        "load_average": round(load, 2),
        "profiled_ms_per_step": round(total * 1000 / per_step, 3),
        "top_by_cumulative": entries[:PROFILE_TOP],
        "own_time_by_file": [
            {
                "file": name,
                "own_ms_per_step": round(seconds * 1000 / per_step, 3),
                "share": round(seconds / total, 3) if total else 0.0,
            }
            for name, seconds in files[:PROFILE_TOP]
        ],
    }


@dataclass
class Result:
    rows: int
    master: str
    hydrate_s: float
    task_rss_mb: list[float]
    steps: Steps
    profile: dict[str, dict[str, object]]
    """By timer: ``cpu`` (this process's CPU time) and ``wall``."""
    recomputed: Recomputed
    output_equal: bool
    cpu: dict[str, float]


def measure(settings: Settings, work_dir: Path) -> Result:
    spark = spark_session()
    master = spark.sparkContext.master or ""
    workload = Workload(settings.rows)
    contents = Contents()
    with ResidentCluster(spark, SHARDS) as cluster:
        dataflow = SparkDataflow(view_plan(), as_of=AS_OF, cluster=cluster)
        try:
            snapshot = workload.snapshot()
            started = time.perf_counter()
            output, _ = dataflow.hydrate(snapshot)
            hydrate_s = time.perf_counter() - started
            del snapshot
            contents.apply(output)
            gc.collect()  # the snapshot's garbage is not the steps' to pay for
            rss = [rss_megabytes(pid) for pid in cluster.task_pids]
            print(
                f"hydrated {settings.rows:,} orders on {SHARDS} resident tasks in "
                f"{hydrate_s:.1f} s (task RSS {' + '.join(f'{mb:.0f}' for mb in rss)} MB)",
                flush=True,
            )
            run_steps(dataflow, workload, contents, settings.warmup_steps, cluster.task_pids)
            meter = TreeCpuMeter({"bench": [os.getpid()]})
            meter.start()
            steps = run_steps(dataflow, workload, contents, settings.steps, cluster.task_pids)
            cpu = meter.stop()
            profile = {
                "cpu": profile_steps(
                    dataflow, workload, contents, settings.profile_steps, time.process_time
                ),
                "wall": profile_steps(
                    dataflow, workload, contents, settings.profile_steps, time.perf_counter
                ),
            }
        finally:
            dataflow.drop()
    orders_path, customers_path = workload.write_parquet(work_dir / "inputs")
    recomputed = time_recompute(spark, orders_path, customers_path, runs=settings.recompute_runs)
    difference = mismatch(contents.rows, recomputed.contents)
    if difference is not None:
        raise SystemExit(f"the maintained view is WRONG: {difference}")
    return Result(
        rows=settings.rows,
        master=master,
        hydrate_s=round(hydrate_s, 2),
        task_rss_mb=rss,
        steps=steps,
        profile=profile,
        recomputed=recomputed,
        output_equal=True,
        cpu=cpu,
    )


def targets(result: Result) -> list[dict[str, object]]:
    s = result.steps
    return [
        {
            "what": f"(g) step p50 ms at {result.rows:,} orders",
            "value": s.latency.p50_ms,
            "target": f"<= {TARGET_STEP_P50_MS:g}",
            "met": s.latency.p50_ms <= TARGET_STEP_P50_MS,
            "load_average": s.load_average,
        },
        {
            "what": "(g) driver CPU ms per step",
            "value": s.driver_cpu_ms_per_step,
            "target": f"<= {TARGET_DRIVER_CPU_MS:g}",
            "met": s.driver_cpu_ms_per_step <= TARGET_DRIVER_CPU_MS,
            "load_average": s.load_average,
        },
    ]


def report(result: Result, load_before: float) -> list[dict[str, object]]:
    s, r = result.steps, result.recomputed
    tasks = " + ".join(f"{ms:.2f}" for ms in s.task_cpu_ms_per_step)
    print(
        f"\n{s.latency.count} steps of 1,000 rows at {result.rows:,} orders "
        f"(load {s.load_average:.2f}):\n"
        f"  step p50 / p90 / p99         {s.latency.p50_ms:.2f} / {s.p90_ms:.2f} / "
        f"{s.latency.p99_ms:.2f} ms\n"
        f"  driver CPU in step           {s.driver_cpu_ms_per_step:.2f} ms per step "
        f"(p50 {s.driver_cpu_p50_ms:.2f}); whole loop {s.driver_cpu_loop_ms_per_step:.2f}\n"
        f"  resident tasks' CPU          {tasks} ms per step\n"
        f"  anchor: Spark SQL recompute  p50 {r.p50_ms:.0f} ms (min {r.min_ms:.0f}), "
        f"{r.p50_ms / max(s.latency.p50_ms, 1e-6):.0f}x the step p50; outputs equal\n"
        f"  cpu % of one core            "
        + " ".join(f"{name} {value:.0f}" for name, value in result.cpu.items())
    )
    profile, cpu = result.profile["wall"], result.profile["cpu"]
    print(
        f"\nwhere the driver's time goes ({profile['steps']} steps under cProfile, wall clock: "
        f"{profile['profiled_ms_per_step']} ms per step with the profiler's own cost; socket "
        f"reads are waits for the tasks), cumulative ms per step:"
    )
    for entry in profile["top_by_cumulative"][:15]:  # type: ignore[index]
        print(f"  {entry['cumulative_ms_per_step']:>8.2f}  {entry['function']}")
    print("own time by file, ms per step:")
    for entry in profile["own_time_by_file"][:10]:  # type: ignore[index]
        print(f"  {entry['own_ms_per_step']:>8.2f}  {entry['share']:>5.0%}  {entry['file']}")
    print(
        f"(timed by the process's CPU clock instead, a system call per profiler event, which "
        f"inflates functions called often: {cpu['profiled_ms_per_step']} ms per step; "
        "own CPU by file: "
        + ", ".join(
            f"{entry['file']} {entry['share']:.0%}"
            for entry in cpu["own_time_by_file"][:4]  # type: ignore[index]
        )
        + ")"
    )
    checked = targets(result)
    print()
    for target in checked:
        verdict = "PASS" if target["met"] else "MISS"
        print(
            f"{verdict} {target['what']}: {target['value']} (target {target['target']}, "
            f"load {target['load_average']}); Spark SQL recompute p50 {r.p50_ms:.0f} ms"
        )
    return checked


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=float, default=1e6, help="orders in the view's state")
    parser.add_argument("--steps", type=int, default=300, help="timed 1,000-row steps")
    parser.add_argument("--warmup-steps", type=int, default=30, help="untimed steps first")
    parser.add_argument("--profile-steps", type=int, default=100, help="steps under cProfile")
    parser.add_argument("--recompute-runs", type=int, default=5, help="timed Spark SQL runs")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "steady_state.json"
    )
    args = parser.parse_args(argv)
    if args.profile_steps < 1 or args.steps < 1:
        # A profile (or a latency summary) of no step has nothing to report.
        parser.error("--steps and --profile-steps must be at least 1")
    settings = Settings(
        rows=int(args.rows),
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        profile_steps=args.profile_steps,
        recompute_runs=args.recompute_runs,
    )
    return settings, args.output


def main(argv: Sequence[str] | None = None) -> None:
    settings, output = parse_settings(argv)
    load_before = load_average()
    print(
        f"Steady state (g): {os.cpu_count()} CPUs, load {load_before:.2f}; {settings.rows:,} "
        f"orders, {settings.steps} timed steps",
        flush=True,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-steady-"))
    try:
        result = measure(settings, work_dir)
    finally:
        stop_spark_session()
        shutil.rmtree(work_dir, ignore_errors=True)
    checked = report(result, load_before)
    document = {
        "benchmark": "steady_state",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "spark_master": result.master,
            "resident_shards": SHARDS,
            "load_average_before": round(load_before, 2),
            "load_average_after": round(load_average(), 2),
        },
        "settings": asdict(settings),
        "hydrate_s": result.hydrate_s,
        "task_rss_mb": result.task_rss_mb,
        "steps": asdict(result.steps),
        "driver_profile": result.profile,
        "anchor_spark_sql_recompute": {
            k: v for k, v in asdict(result.recomputed).items() if k != "contents"
        },
        "recompute_over_step_p50": round(
            result.recomputed.p50_ms / max(result.steps.latency.p50_ms, 1e-6), 1
        ),
        "output_equal_to_recompute": result.output_equal,
        "cpu_percent": result.cpu,
        "targets": checked,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")


if __name__ == "__main__":
    main()
