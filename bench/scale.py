"""Scale, benchmark (h) of issue #14: ``make bench-scale`` or ``.venv/bin/python bench/scale.py``.

A Spark standalone cluster (``tests/support/spark_standalone.py``: a master and workers, each
its own JVM from pyspark's classes) with 1 worker, then with 2. Against each, the oracle,
storage (embedded backends), catalog and compute run as their own processes, as in
``bench/compute_freshness.py``, compute with ``--spark-master spark://…`` and fixed driver,
block manager and resident ports: its resident tasks run in the workers' executors. Compute
maintains the join + aggregate view (``bench/compute_view.py``) over ``--rows`` orders.

Then this process appends to ``orders`` on a fixed grid (``--period``; each append half
retractions and half insertions: updated orders, and an empty append moving ``customers``
along), at a rate in rows per second held for ``--hold`` seconds (after 3 s of warm-up), and
measures freshness: from an append's acknowledgement until a subscription on the view's
output reports an upper past its time. A rate is **sustained** when the freshness p99 is at
most 1 s, every counted append was passed, and the appends really went in at ≥ 90 % of the
rate (the grid skips a tick while the last write is still going). The search doubles the rate
from ``--start-rate`` until one is not sustained, then bisects ``--bisect`` times between the
last sustained rate and the first that was not. Between rates it waits for the output to catch
up.

Reported per worker count: the highest sustained rate, freshness p50/p99 at it, and the CPU
(percent of one core over the measured window) of the compute driver's Python process, its
JVM, the executors (their JVMs and Python workers, the resident tasks among them), the Spark
master and workers, storage, oracle + catalog, this process, and everything else on the
machine. On this 2-core machine the workers' executors share the same two cores with every
other process: a second worker adds task slots, not CPU. Writes ``bench/results/scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

import pyspark  # noqa: E402

from bench.common import Latency, load_average, percentile  # noqa: E402
from bench.compute_freshness import (  # noqa: E402
    CUSTOMERS_ID,
    DATAFLOW_ID,
    HOLDER,
    ORDERS_ID,
    OUTPUT_ID,
    WARMUP_S,
    AppendRecord,
    FreshnessSettings,
    OutputProgress,
    Services,
    _append_stream,
    _wait_for_spark,
    expected_view,
    maintain_until_hydrated,
    now_ms,
    running_services,
)
from bench.compute_view import CUSTOMERS, ORDERS, Workload, view_plan, view_row  # noqa: E402
from bench.process_cpu import TreeCpuMeter, process_tree  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.spark_standalone import StandaloneCluster, standalone_cluster  # noqa: E402
from tidemark.clients.compute import ComputeClient  # noqa: E402
from tidemark.clients.storage import Capability, StorageClient  # noqa: E402
from tidemark.columnar import RelationSchema  # noqa: E402
from tidemark.retry import RetryPolicy  # noqa: E402

TARGET_P99_MS = 1000.0
SUSTAINED_FRACTION = 0.9
"""The share of the asked rate that must really have been appended."""
CATCH_UP_S = 60.0
"""How long to wait for the output to pass every append of a rate before the next one."""
WORKER_CORES = 3
"""Task slots per worker: two resident tasks, and one for a job beside them."""
SHARDS = 2
RESIDENT_TASKS = "resident tasks"
EXECUTORS = "executors' JVMs + other Python workers"
DRIVER = "compute driver (Python)"
TWO_CORES_NOTE = (
    "On this {cpus}-core machine every worker, executor and service shares the same cores: "
    "a second worker adds task slots and memory, not CPU."
)


@dataclass(frozen=True)
class Settings:
    workers: list[int]
    rows: int
    period_s: float
    start_rate: int
    max_rate: int
    bisect: int
    hold_s: float


@dataclass
class RateCell:
    rate: int
    """Rows per second asked for."""
    achieved_rate: float
    """Rows per second appended over the counted window."""
    sustained: bool
    limited_by: list[str]
    """Why the rate was not sustained (empty when it was)."""
    freshness: Latency
    p90_ms: float
    from_send: Latency
    append_ack: Latency
    counted: int
    not_passed: int
    caught_up_s: float | None
    """How long after the last append the output passed it (None: not within the wait)."""
    load_average: float
    cpu: dict[str, float]
    """Percent of one core per group of processes, ``other``: the rest of the machine."""
    machine_busy_percent: float
    """Every process on the machine, in percent of all its cores."""


@dataclass
class WorkerResult:
    workers: int
    master: str
    hydrate_s: float
    task_workers: list[int | None]
    """The worker each resident task runs on (None: on none)."""
    cells: list[RateCell] = field(default_factory=list)
    output_equal: bool | None = None
    error: str | None = None

    @property
    def best(self) -> RateCell | None:
        sustained = [cell for cell in self.cells if cell.sustained]
        return max(sustained, key=lambda cell: cell.rate) if sustained else None


def compute_spark_args(master_url: str) -> list[str]:
    """Compute's flags for the standalone cluster, as ``tests/integration/
    test_spark_standalone.py`` runs it: loopback, fixed ports, executors that fit a worker."""
    return [
        *("--spark-master", master_url),
        *("--spark-driver-host", "127.0.0.1", "--spark-bind-address", "127.0.0.1"),
        *("--spark-executor-memory", "512m"),
        *("--spark-driver-port", str(free_port())),
        *("--spark-block-manager-port", str(free_port())),
        *("--spark-resident-port", str(free_port())),
        *("--shards", str(SHARDS)),
    ]


def resident_task_pids(services: Services) -> list[int]:
    """The resident tasks' pids (Python workers in the executors), from compute's log."""
    pids: list[int] = []
    for line in services.compute.log_path.read_text(errors="replace").splitlines():
        if '"resident_cluster_started"' in line:
            pids = list(json.loads(line)["task_pids"])
    return pids


def make_meter(services: Services, cluster: StandaloneCluster) -> TreeCpuMeter:
    """A meter of the processes by role. A process counts for the first group whose tree holds
    it: the resident tasks before the executors that run them, the executors before the
    workers that started them, and the driver's JVM (its child) before the driver's Python
    process, which so counts alone."""
    compute = services.compute.pid
    executors = [
        pid for index in range(len(cluster.workers)) for pid in cluster.executor_pids(index)
    ]
    return TreeCpuMeter(
        {
            RESIDENT_TASKS: resident_task_pids(services),
            EXECUTORS: executors,
            "spark master + workers": [
                cluster.master.process.pid,
                *(worker.process.pid for worker in cluster.workers),
            ],
            "compute driver JVM": [pid for pid in process_tree([compute]) if pid != compute],
            DRIVER: [compute],
            "storage": [services.storage.pid],
            "oracle + catalog": [services.oracle.pid, services.catalog.pid],
            "bench": [os.getpid()],
        }
    )


class Feed:
    """The view's inputs in storage, and the appends that change them."""

    def __init__(
        self,
        storage: StorageClient,
        workload: Workload,
        orders: Capability,
        customers: Capability,
        upper: int,
    ) -> None:
        self.storage = storage
        self.workload = workload
        self.orders = orders
        self.customers = customers
        self.upper = upper

    async def hold(self, rate: int, settings: Settings) -> tuple[list[AppendRecord], int]:
        append_rows = max(2, round(rate * settings.period_s))
        stream = FreshnessSettings(
            rows=settings.rows,
            seconds=settings.hold_s,
            append_rows=append_rows,
            period_s=settings.period_s,
        )
        records, self.upper = await _append_stream(
            stream, self.storage, self.workload, self.orders, self.customers, self.upper
        )
        # _append_stream appends append_rows // 2 updated orders: two rows each.
        return records, 2 * (append_rows // 2)


async def measure_rate(
    rate: int,
    settings: Settings,
    feed: Feed,
    progress: OutputProgress,
    meter: TreeCpuMeter,
) -> RateCell:
    load = load_average()
    meter.start()
    records, rows_per_append = await feed.hold(rate, settings)
    cpu = meter.stop()
    last = records[-1].time
    ended = time.monotonic()
    caught = await progress.wait_past(last, CATCH_UP_S)
    caught_up_s = round(time.monotonic() - ended, 2) if caught else None
    first_counted = records[0].sent + WARMUP_S
    counted = [r for r in records if r.sent >= first_counted]
    from_ack, from_send, not_passed = [], [], 0
    for record in counted:
        passed = progress.passed_at(record.time)
        if passed is None:
            not_passed += 1
            continue
        from_ack.append(max(0.0, passed - record.acked))
        from_send.append(passed - record.sent)
    window = (records[-1].sent - first_counted) + settings.period_s if counted else 1.0
    achieved = len(counted) * rows_per_append / window
    freshness = Latency.of(from_ack)
    limited_by = []
    if not counted or not_passed:
        limited_by.append(f"{not_passed} appends never passed by the output")
    if freshness.p99_ms > TARGET_P99_MS:
        limited_by.append(f"freshness p99 over {TARGET_P99_MS:g} ms")
    if achieved < SUSTAINED_FRACTION * rate:
        # The grid skips a tick while the last append is still going: storage's acks (or
        # this process) fell behind, before compute was even asked.
        limited_by.append(f"appends below {SUSTAINED_FRACTION:.0%} of the rate")
    return RateCell(
        rate=rate,
        achieved_rate=round(achieved),
        sustained=not limited_by,
        limited_by=limited_by,
        freshness=freshness,
        p90_ms=round(percentile(sorted(from_ack), 0.90) * 1000, 3),
        from_send=Latency.of(from_send),
        append_ack=Latency.of([r.acked - r.sent for r in counted]),
        counted=len(counted),
        not_passed=not_passed,
        caught_up_s=caught_up_s,
        load_average=round(load, 2),
        cpu=cpu,
        machine_busy_percent=round(sum(cpu.values()) / (os.cpu_count() or 1)),
    )


def describe(cell: RateCell) -> str:
    verdict = "sustained" if cell.sustained else f"NOT sustained ({'; '.join(cell.limited_by)})"
    cpu = ", ".join(f"{name} {value:.0f}" for name, value in cell.cpu.items())
    caught = f"{cell.caught_up_s:.1f} s" if cell.caught_up_s is not None else "no"
    return (
        f"  {cell.rate:>7,} rows/s (appended {cell.achieved_rate:>7,.0f}): freshness p50 "
        f"{cell.freshness.p50_ms:7.1f} ms, p99 {cell.freshness.p99_ms:7.1f} ms, "
        f"append ack p50 {cell.append_ack.p50_ms:5.1f} ms, {cell.not_passed} not passed, "
        f"caught up {caught}, load {cell.load_average:.2f}: {verdict}\n"
        f"           cpu % of one core: {cpu}; machine {cell.machine_busy_percent:.0f}% busy"
    )


async def search(
    settings: Settings, services: Services, cluster: StandaloneCluster
) -> WorkerResult:
    """Hydrates the view, then searches for the highest sustained rate."""
    patient = RetryPolicy(60.0)
    storage = StorageClient(services.storage.address, timeout=60.0, retry=patient)
    compute = ComputeClient(services.compute.address, timeout=180.0, retry=patient)
    try:
        workload = Workload(settings.rows, seed=5)
        initial = now_ms()
        orders = await storage.create(ORDERS_ID, ORDERS, initial_frontier=initial, holder=HOLDER)
        customers = await storage.create(
            CUSTOMERS_ID, CUSTOMERS, initial_frontier=initial, holder=HOLDER
        )
        plan = view_plan(ORDERS_ID, CUSTOMERS_ID)
        output = await storage.create(
            OUTPUT_ID, RelationSchema.from_proto(plan.output_schema), initial_frontier=initial
        )
        await storage.append(
            orders.write, [(row, initial, 1) for row in workload.orders()], initial + 1
        )
        await storage.append(
            customers.write, [(row, initial, 1) for row in workload.customers], initial + 1
        )
        progress = OutputProgress()
        following = asyncio.create_task(progress.follow(storage, output.read))
        keeper = storage.keep_alive(
            [orders.read, customers.read, output.read, orders.write, customers.write], every=10
        )
        async with keeper:
            master = await _wait_for_spark(compute)
            hydrate_s = await maintain_until_hydrated(
                compute,
                storage,
                plan,
                [orders.read, customers.read],
                output.write,
                progress,
                initial,
            )
            placed = [cluster.worker_of(pid) for pid in resident_task_pids(services)]
            result = WorkerResult(
                len(cluster.workers),
                master,
                round(hydrate_s, 2),
                [where[0] if where else None for where in placed],
            )
            print(
                f"view over {settings.rows:,} orders hydrated in {result.hydrate_s:.1f} s; "
                f"compute on {master}; resident tasks on workers {result.task_workers}",
                flush=True,
            )
            feed = Feed(storage, workload, orders.write, customers.write, initial + 1)
            try:
                await _search_rates(settings, services, cluster, feed, progress, result)
            except Exception as error:  # the rates measured so far are still worth keeping
                result.error = f"{type(error).__name__}: {error}"
                print(f"  search stopped: {result.error}", flush=True)
            if await progress.wait_past(feed.upper - 1, CATCH_UP_S):
                contents = await storage.snapshot(output.read, feed.upper - 1, timeout=120.0)
                result.output_equal = {
                    view_row(row): count for row, count in contents.version().items()
                } == expected_view(workload)
            following.cancel()
            try:
                await following
            except asyncio.CancelledError:
                pass
            await compute.drop_view(DATAFLOW_ID)
            return result
    finally:
        await compute.close()
        await storage.close()


async def _search_rates(
    settings: Settings,
    services: Services,
    cluster: StandaloneCluster,
    feed: Feed,
    progress: OutputProgress,
    result: WorkerResult,
) -> None:
    async def run(rate: int) -> RateCell:
        cell = await measure_rate(rate, settings, feed, progress, make_meter(services, cluster))
        result.cells.append(cell)
        print(describe(cell), flush=True)
        if cell.caught_up_s is None:
            raise RuntimeError(f"the output did not catch up within {CATCH_UP_S:g} s")
        return cell

    low, high = 0, 0
    rate = settings.start_rate
    while rate <= settings.max_rate:
        if (await run(rate)).sustained:
            low, rate = rate, rate * 2
        else:
            high = rate
            break
    if low == 0 and high:
        # Not even the first rate: halve until one is.
        rate = high // 2
        while rate >= 100 and not (await run(rate)).sustained:
            high, rate = rate, rate // 2
        low = rate if rate >= 100 else 0
    for _ in range(settings.bisect if low and high else 0):
        middle = round((low + high) / 2, -2)
        if middle <= low or middle >= high:
            break
        if (await run(int(middle))).sustained:
            low = int(middle)
        else:
            high = int(middle)


def run_workers(settings: Settings, workers: int, work_dir: Path) -> WorkerResult:
    print(f"\n{workers} standalone worker(s), {WORKER_CORES} cores each", flush=True)
    with standalone_cluster(
        work_dir / f"standalone-{workers}", workers=workers, cores=WORKER_CORES
    ) as cluster:
        spark_args = compute_spark_args(cluster.master_url)
        try:
            with running_services(work_dir / f"services-{workers}", spark_args) as services:
                return asyncio.run(search(settings, services, cluster))
        except Exception:
            for log in sorted((work_dir / f"services-{workers}").glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-20:]
                print(f"--- last lines of {log.name}", *tail, sep="\n", file=sys.stderr)
            print(cluster.logs(), file=sys.stderr)
            raise


def worker_document(result: WorkerResult) -> dict[str, object]:
    best = result.best
    return {
        "workers": result.workers,
        "spark_master": result.master,
        "hydrate_s": result.hydrate_s,
        "resident_task_workers": result.task_workers,
        "highest_sustained_rows_per_s": best.rate if best else None,
        "at_highest": asdict(best) if best else None,
        "rates": [asdict(cell) for cell in result.cells],
        "output_equal_to_view_of_inputs": result.output_equal,
        "error": result.error,
    }


def summary(result: WorkerResult) -> str:
    best = result.best
    if best is None:
        return f"{result.workers} worker(s): no rate sustained"
    driver = best.cpu.get(DRIVER, 0.0)
    executors = best.cpu.get(RESIDENT_TASKS, 0.0) + best.cpu.get(EXECUTORS, 0.0)
    ours = sum(value for name, value in best.cpu.items() if name != "other")
    share = driver / ours if ours else 0.0
    # The driver's Python work holds the GIL: one core is all it can ever use.
    bottleneck = (
        "the driver is near a full core: it is the bottleneck"
        if driver >= 85
        else f"the driver is not the bottleneck (a Python process tops out at one core; the "
        f"machine was {best.machine_busy_percent:.0f}% busy)"
    )
    checked = {True: "equal to", False: "DIFFERENT from", None: "not checked against"}[
        result.output_equal
    ]
    return (
        f"{result.workers} worker(s): highest sustained {best.rate:,} rows/s "
        f"(freshness p50 {best.freshness.p50_ms:.0f} ms, p99 {best.freshness.p99_ms:.0f} ms, "
        f"load {best.load_average:.2f}); compute driver (Python) {driver:.0f}% of a core = "
        f"{share:.0%} of the benchmark's processes' CPU, executors (JVMs + Python workers, "
        f"resident tasks included) {executors:.0f}%; resident tasks on workers "
        f"{result.task_workers}; "
        f"output {checked} the view of the inputs; {bottleneck}"
    )


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--rows", type=float, default=1e5, help="orders in the view")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between appends")
    parser.add_argument("--start-rate", type=int, default=4_000, help="rows/s, first tried")
    parser.add_argument("--max-rate", type=int, default=256_000, help="rows/s, never above")
    parser.add_argument("--bisect", type=int, default=2, help="bisection steps after doubling")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds measured per rate")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "scale.json"
    )
    args = parser.parse_args(argv)
    return (
        Settings(
            workers=[int(part) for part in args.workers.split(",") if part.strip()],
            rows=int(args.rows),
            period_s=args.period,
            start_rate=args.start_rate,
            max_rate=args.max_rate,
            bisect=args.bisect,
            hold_s=args.hold,
        ),
        args.output,
    )


def main(argv: Sequence[str] | None = None) -> None:
    settings, output = parse_settings(argv)
    load_before = load_average()
    cpus = os.cpu_count() or 0
    note = TWO_CORES_NOTE.format(cpus=cpus)
    print(
        f"Scale (h): {cpus} CPUs, load {load_before:.2f}; view over {settings.rows:,} orders; "
        f"freshness p99 <= {TARGET_P99_MS:g} ms; {settings.hold_s:g} s per rate\n{note}",
        flush=True,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-scale-"))
    results: list[WorkerResult] = []
    started = time.monotonic()
    try:
        for workers in settings.workers:
            results.append(run_workers(settings, workers, work_dir))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print()
    for result in results:
        print(summary(result))
    print(note)
    document = {
        "benchmark": "scale",
        "machine": {
            "cpus": cpus,
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "worker_cores": WORKER_CORES,
            "resident_shards": SHARDS,
            "load_average_before": round(load_before, 2),
            "load_average_after": round(load_average(), 2),
            "note": note,
        },
        "settings": asdict(settings),
        "target": f"freshness p99 <= {TARGET_P99_MS:g} ms, >= {SUSTAINED_FRACTION:.0%} "
        "of the rate appended",
        "seconds": round(time.monotonic() - started, 1),
        "by_workers": [worker_document(result) for result in results],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")
    if any(result.error for result in results):
        raise SystemExit("a search stopped early; see above")


if __name__ == "__main__":
    main()
