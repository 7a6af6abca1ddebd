"""Catalog benchmark: ``make bench-catalog`` or ``.venv/bin/python bench/catalog.py``.

Runs the production path on one machine: a private etcd and an S3 endpoint (``moto_server``)
under the oracle and storage, and the catalog on top, each its own process (``--backend
sqlite`` uses the embedded SQLite consensus and a blob directory instead). Then:

1. **CompareAndAppend** with 1 and 8 concurrent writers, each doing DDL the adapter's way in a
   closed loop: ``WriteTs``, ``CompareAndAppend`` of one new table (plus the allocator bump)
   at the upper it last saw; on a lost race it re-reads ``SnapshotAt(current upper - 1)`` and
   retries at a new timestamp. Reported: committed appends per second, attempts per second,
   latency of each CompareAndAppend call and of a whole DDL operation (retries included).
2. **SnapshotAt with 10,000 items**: fills the catalog to 10,000 items (appends of 500 tables),
   then times ``SnapshotAt`` at the latest time and at a time 2,500 items back (rewinding
   history), client-side, decoding included.
3. **Restart**: stops the catalog, starts a new one and times until it answers SnapshotAt with
   all 10,000 items; reports how many batches storage keeps for the catalog collection.

Prints a table and writes ``bench/results/catalog.json``.
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
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support when run as a script

import grpc  # noqa: E402

from bench.common import CpuMeter, Latency, LoggedService  # noqa: E402
from services.catalog.storage_log import CATALOG_SCHEMA  # noqa: E402
from tests.support.catalog_items import Draft  # noqa: E402
from tests.support.etcd import running_etcd  # noqa: E402
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server, unique_bucket  # noqa: E402
from tidemark.clients.catalog import CatalogClient, CatalogUpperMismatch  # noqa: E402
from tidemark.clients.oracle import OracleClient  # noqa: E402
from tidemark.clients.storage import StorageClient  # noqa: E402
from tidemark.frontier import u64_frontier  # noqa: E402
from tidemark.v1 import catalog_pb2  # noqa: E402

TIMELINE = "catalog"
TARGET_ITEMS = 10_000
FILL_BATCH = 500
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 60.0


# --- measurements -------------------------------------------------------------------------


# --- processes ----------------------------------------------------------------------------


def start_catalog(oracle: LoggedService, storage: LoggedService, work_dir: Path) -> LoggedService:
    return LoggedService(
        "services.catalog",
        ["--storage", storage.address, "--oracle", oracle.address],
        work_dir / "catalog.log",
    )


@dataclass
class Stack:
    oracle: LoggedService
    storage: LoggedService
    catalog: LoggedService
    backend_pids: dict[str, int]
    work_dir: Path

    def start_catalog(self) -> LoggedService:
        return start_catalog(self.oracle, self.storage, self.work_dir)

    def meter(self) -> CpuMeter:
        return CpuMeter(
            {
                "catalog": [self.catalog.pid],
                "storage": [self.storage.pid],
                "oracle": [self.oracle.pid],
                **{name: [pid] for name, pid in self.backend_pids.items()},
                "bench": [os.getpid()],
            }
        )


@contextmanager
def running_stack(backend: str, work_dir: Path) -> Iterator[Stack]:
    with ExitStack() as stack:
        env: dict[str, str] = {}
        backend_pids: dict[str, int] = {}
        if backend == "etcd-s3":
            etcd = stack.enter_context(running_etcd(work_dir / "etcd"))
            s3 = S3Server()
            s3.start()
            stack.callback(s3.close)
            consensus, blobs = etcd.url, s3.url(unique_bucket("bench-catalog"))
            env = {"TIDEMARK_S3_ACCESS_KEY": ACCESS_KEY, "TIDEMARK_S3_SECRET_KEY": SECRET_KEY}
            backend_pids = {"etcd": etcd.pid or 0}
        else:
            consensus = f"sqlite://{work_dir / 'consensus.db'}"
            blobs = f"file://{work_dir / 'blobs'}"
        oracle = LoggedService(
            "services.oracle", ["--consensus-url", consensus], work_dir / "oracle.log"
        )
        stack.callback(oracle.stop)
        storage = LoggedService(
            "services.storage",
            ["--consensus-url", consensus, "--blob-url", blobs],
            work_dir / "storage.log",
            env=env,
        )
        stack.callback(storage.stop)
        catalog = start_catalog(oracle, storage, work_dir)
        made = Stack(oracle, storage, catalog, backend_pids, work_dir)
        stack.callback(lambda: made.catalog.stop())
        yield made


# --- 1. CompareAndAppend ------------------------------------------------------------------


@dataclass
class WriterSample:
    append_s: list[float] = field(default_factory=list)
    ddl_s: list[float] = field(default_factory=list)
    commits: int = 0
    conflicts: int = 0


@dataclass(frozen=True)
class AppendCell:
    writers: int
    commits_per_s: float
    attempts_per_s: float
    conflicts: int
    append_call: Latency
    ddl_operation: Latency
    cpu_percent: dict[str, float]


async def writer(
    number: int,
    catalog: CatalogClient,
    oracle: OracleClient,
    measure_from: float,
    measure_to: float,
    sample: WriterSample,
) -> None:
    snapshot = await catalog.snapshot_at(await oracle.read_ts(TIMELINE))
    items, upper = list(snapshot.items), snapshot.upper
    made = 0
    while time.monotonic() < measure_to:
        started = time.monotonic()
        while True:
            draft = Draft(items, await oracle.write_ts(TIMELINE), upper)
            draft.table(f"w{number}_{made}_{int(started * 1000)}")
            call_started = time.monotonic()
            try:
                upper = await catalog.compare_and_append(
                    draft.upper, draft.time + 1, draft.updates()
                )
            except CatalogUpperMismatch as lost:
                if call_started >= measure_from:
                    sample.append_s.append(time.monotonic() - call_started)
                    sample.conflicts += 1
                fresh = await catalog.snapshot_at(lost.current_upper - 1)
                items, upper = list(fresh.items), lost.current_upper
                continue
            finished = time.monotonic()
            if measure_from <= call_started and finished <= measure_to:
                sample.append_s.append(finished - call_started)
            if measure_from <= started and finished <= measure_to:
                sample.ddl_s.append(finished - started)
                sample.commits += 1
            items = draft.after()
            made += 1
            break


async def append_cell(stack: Stack, writers: int, seconds: float, warmup: float) -> AppendCell:
    catalogs = [CatalogClient(stack.catalog.address) for _ in range(writers)]
    oracle = OracleClient(stack.oracle.address)
    meter = stack.meter()
    sample = WriterSample()
    measure_from = time.monotonic() + warmup
    measure_to = measure_from + seconds

    async def metered() -> dict[str, float]:
        await asyncio.sleep(max(0.0, measure_from - time.monotonic()))
        meter.start()
        await asyncio.sleep(max(0.0, measure_to - time.monotonic()))
        return meter.stop()

    try:
        metering = asyncio.create_task(metered())
        await asyncio.gather(
            *(
                writer(n, catalog, oracle, measure_from, measure_to, sample)
                for n, catalog in enumerate(catalogs)
            )
        )
        cpu = await metering
    finally:
        for catalog in catalogs:
            await catalog.close()
        await oracle.close()
    return AppendCell(
        writers,
        round(sample.commits / seconds, 1),
        round(len(sample.append_s) / seconds, 1),
        sample.conflicts,
        Latency.of(sample.append_s),
        Latency.of(sample.ddl_s),
        cpu,
    )


@dataclass(frozen=True)
class Floor:
    appends_per_s: float
    append: Latency


async def storage_floor(stack: Stack, seconds: float) -> Floor:
    """One writer appending one catalog-shaped row at a time straight to storage: the part of
    a CompareAndAppend that is storage's."""
    storage = StorageClient(stack.storage.address)
    try:
        pair = await storage.create("u999999999", CATALOG_SCHEMA, initial_frontier=1)
        write, latencies = pair.write, []
        end = time.monotonic() + seconds
        upper = 1
        while time.monotonic() < end:
            started = time.monotonic()
            row = (("u1", "table", b"x" * 200), upper, 1)
            await storage.append(write, [row], upper + 1, expected_upper=upper)
            latencies.append(time.monotonic() - started)
            write = replace(write, frontier=u64_frontier(upper + 1))
            upper += 1
        return Floor(round(len(latencies) / seconds, 1), Latency.of(latencies))
    finally:
        await storage.close()


# --- 2. SnapshotAt with 10,000 items --------------------------------------------------------


@dataclass(frozen=True)
class SnapshotResult:
    items: int
    response_bytes: int
    fill_seconds: float
    latest: Latency
    rewound: Latency
    rewound_items: int


async def fill(catalog: CatalogClient, oracle: OracleClient, target: int) -> list[int]:
    """Append tables in batches until the catalog holds ``target`` items; the uppers after
    each append."""
    snapshot = await catalog.snapshot_at(await oracle.read_ts(TIMELINE))
    items, upper = list(snapshot.items), snapshot.upper
    uppers = []
    while len(items) < target:
        draft = Draft(items, await oracle.write_ts(TIMELINE), upper)
        for n in range(min(FILL_BATCH, target - len(items))):
            draft.table(f"fill_{draft.time}_{n}")
        upper = await catalog.compare_and_append(upper, draft.time + 1, draft.updates())
        items = draft.after()
        uppers.append(upper)
    return uppers


async def time_snapshots(catalog: CatalogClient, at: int, rounds: int) -> tuple[Latency, int]:
    latencies = []
    count = 0
    for _ in range(rounds):
        started = time.monotonic()
        snapshot = await catalog.snapshot_at(at)
        latencies.append(time.monotonic() - started)
        count = len(snapshot.items)
    return Latency.of(latencies), count


async def snapshot_benchmark(stack: Stack, rounds: int) -> tuple[SnapshotResult, int]:
    catalog = CatalogClient(stack.catalog.address, timeout=60.0)
    oracle = OracleClient(stack.oracle.address)
    try:
        started = time.monotonic()
        uppers = await fill(catalog, oracle, TARGET_ITEMS)
        fill_seconds = time.monotonic() - started
        read_ts = await oracle.read_ts(TIMELINE)
        latest, count = await time_snapshots(catalog, read_ts, rounds)
        # Five appends (2,500 items) back: SnapshotAt rewinds them from the current contents.
        back = uppers[-6] - 1 if len(uppers) > 5 else uppers[0] - 1
        rewound, rewound_count = await time_snapshots(catalog, back, rounds)
        request = catalog_pb2.SnapshotAtRequest(timestamp=read_ts)
        response_bytes = (await catalog.stub.SnapshotAt(request)).ByteSize()
        return (
            SnapshotResult(
                count,
                response_bytes,
                round(fill_seconds, 2),
                latest,
                rewound,
                rewound_count,
            ),
            read_ts,
        )
    finally:
        await catalog.close()
        await oracle.close()


# --- 3. restart ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartResult:
    seconds_to_first_snapshot: float
    items: int
    storage_batches: int
    storage_rows: int


async def restart_benchmark(stack: Stack, read_ts: int) -> RestartResult:
    storage = StorageClient(stack.storage.address)
    try:
        stack.catalog.stop()
        started = time.monotonic()
        stack.catalog = stack.start_catalog()
        catalog = CatalogClient(stack.catalog.address, timeout=60.0)
        try:
            snapshot = await catalog.snapshot_at(read_ts)
        finally:
            await catalog.close()
        seconds = time.monotonic() - started
        info = await storage.describe("s1")
        return RestartResult(round(seconds, 2), len(snapshot.items), info.batch_count, info.rows)
    finally:
        await storage.close()


# --- main ---------------------------------------------------------------------------------


def format_cell(cell: AppendCell) -> str:
    cpu = "/".join(
        f"{cell.cpu_percent.get(name, 0):.0f}" for name in ("catalog", "storage", "oracle", "bench")
    )
    return (
        f"{cell.writers:>7} {cell.commits_per_s:>9.1f} {cell.attempts_per_s:>10.1f} "
        f"{cell.append_call.p50_ms:>8.2f} {cell.append_call.p99_ms:>8.2f} "
        f"{cell.ddl_operation.p50_ms:>8.2f} {cell.ddl_operation.p99_ms:>8.2f}   {cpu}"
    )


async def run(args: argparse.Namespace, stack: Stack) -> dict[str, object]:
    print()
    floor = await storage_floor(stack, args.seconds)
    print(
        f"floor: storage Append of one row, 1 writer: {floor.appends_per_s:.1f}/s "
        f"(p50 {floor.append.p50_ms:.2f} ms, p99 {floor.append.p99_ms:.2f} ms)",
        flush=True,
    )
    print(
        f"{'writers':>7} {'commits/s':>9} {'attempts/s':>10} {'CAA p50':>8} {'CAA p99':>8} "
        f"{'DDL p50':>8} {'DDL p99':>8}   cpu % catalog/storage/oracle/bench",
        flush=True,
    )
    cells = []
    for writers in args.writers:
        cell = await append_cell(stack, writers, args.seconds, args.warmup)
        print(format_cell(cell), flush=True)
        cells.append(cell)
    snapshot, read_ts = await snapshot_benchmark(stack, args.snapshot_rounds)
    print(
        f"\nSnapshotAt, {snapshot.items} items ({snapshot.response_bytes / 1e6:.1f} MB): latest "
        f"p50 {snapshot.latest.p50_ms:.1f} ms, p99 {snapshot.latest.p99_ms:.1f} ms; "
        f"5 appends back ({snapshot.rewound_items} items), rewound through history: p50 "
        f"{snapshot.rewound.p50_ms:.1f} ms, p99 {snapshot.rewound.p99_ms:.1f} ms "
        f"(filled in {snapshot.fill_seconds:.1f} s)",
        flush=True,
    )
    # Give storage's background compaction a moment, as a long-running catalog would.
    await asyncio.sleep(args.settle)
    restart = await restart_benchmark(stack, read_ts)
    print(
        f"restart: a new catalog process answered SnapshotAt with {restart.items} items after "
        f"{restart.seconds_to_first_snapshot:.2f} s; storage keeps the catalog in "
        f"{restart.storage_batches} batch(es), {restart.storage_rows} rows",
        flush=True,
    )
    return {
        "storage_append_floor": asdict(floor),
        "compare_and_append": [asdict(cell) for cell in cells],
        "snapshot_at": asdict(snapshot),
        "restart": asdict(restart),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", choices=["etcd-s3", "sqlite"], default="etcd-s3")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    parser.add_argument("--writers", default="1,8", help="comma-separated writer counts")
    parser.add_argument("--snapshot-rounds", type=int, default=40)
    parser.add_argument(
        "--settle", type=float, default=5.0, help="seconds before the restart measurement"
    )
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "catalog.json"
    )
    args = parser.parse_args(argv)
    args.writers = [int(n) for n in args.writers.split(",")]
    print(
        f"Catalog benchmark: {os.cpu_count()} CPUs, backend {args.backend}, "
        f"{args.seconds:g} s per cell after {args.warmup:g} s warm-up",
        flush=True,
    )
    load_before = os.getloadavg()[0]
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-catalog-"))
    try:
        with running_stack(args.backend, work_dir) as stack:
            results = asyncio.run(run(args, stack))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    document = {
        "benchmark": "catalog",
        "backend": args.backend,
        "settings": {
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "writers": args.writers,
            "snapshot_rounds": args.snapshot_rounds,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "platform": platform.platform(),
            # Other work on the machine skews every figure; the 1-minute load average says how
            # much there was.
            "load_average_before": round(load_before, 2),
            "load_average_after": round(os.getloadavg()[0], 2),
        },
        **results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
