"""Timestamp oracle benchmark: ``make bench-oracle`` or ``.venv/bin/python bench/oracle.py``.

Starts a private etcd, measures the floor (one client doing raw compare-and-set transactions
back to back through ``EtcdConsensus``), then runs the oracle as its own process on etcd and on
SQLite and drives it over gRPC with 1, 8 and 64 concurrent closed-loop clients: ``ReadTs``
calls, and ``WriteTs`` followed by ``ApplyWrite`` of the timestamp it returned (one operation,
two calls). Prints a table and writes ``bench/results/oracle.json``.

The clients live in separate processes (``--client-processes``, spawned once and reused for
every cell) so that the client side's Python is not measured as if it were the oracle's. Each
cell reports the CPU the oracle, etcd and the clients used during its window, which shows what
limits the figures on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for tests.support when run as a script

import grpc  # noqa: E402

from bench.common import (  # noqa: E402
    CpuMeter,
    LoggedService,
    ProcessPool,
    percentile,
    running_service,
)
from tests.support.etcd import running_etcd  # noqa: E402
from tidemark.clients.oracle import OracleClient  # noqa: E402
from tidemark.consensus import Committed, Consensus, open_consensus  # noqa: E402
from tidemark.errors import TidemarkError  # noqa: E402

Operation = Literal["read", "write"]
OPERATION_NAMES: dict[Operation, str] = {"read": "ReadTs", "write": "WriteTs+ApplyWrite"}

# The targets, as multiples of the raw single-client etcd compare-and-set rate.
TARGETS: dict[Operation, float] = {"read": 10.0, "write": 5.0}
TARGET_CLIENTS = 64


# --- measurements -------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """Operations finished in a window, and their latencies."""

    ops_per_s: float
    p50_ms: float
    p99_ms: float
    operations: int
    failures: int = 0

    @staticmethod
    def of(latencies_s: list[float], window_s: float, failures: int = 0) -> Rate:
        latencies_s.sort()
        return Rate(
            ops_per_s=round(len(latencies_s) / window_s, 1),
            p50_ms=round(percentile(latencies_s, 0.50) * 1000, 3),
            p99_ms=round(percentile(latencies_s, 0.99) * 1000, 3),
            operations=len(latencies_s),
            failures=failures,
        )


# --- the floor: raw compare-and-set --------------------------------------------------------


async def raw_cas_rate(consensus: Consensus, seconds: float, warmup_s: float) -> Rate:
    """One client doing compare-and-set back to back on one key, each from the version the
    previous one created (so every transaction succeeds)."""
    key = "bench/raw-cas"
    current = await consensus.head(key)
    version = current.version if current else None
    latencies: list[float] = []
    measure_from = time.monotonic() + warmup_s
    measure_to = measure_from + seconds
    counter = 0
    while (started := time.monotonic()) < measure_to:
        counter += 1
        result = await consensus.compare_and_set(key, version, counter.to_bytes(8, "big"))
        finished = time.monotonic()
        if not isinstance(result, Committed):
            raise RuntimeError(f"raw compare-and-set lost a race it cannot have: {result}")
        version = result.version
        if started >= measure_from:
            latencies.append(finished - started)
    return Rate.of(latencies, seconds)


async def measure_floor(url: str, seconds: float, warmup_s: float) -> Rate:
    consensus = open_consensus(url)
    try:
        return await raw_cas_rate(consensus, seconds, warmup_s)
    finally:
        await consensus.close()


# --- client processes ---------------------------------------------------------------------


@dataclass(frozen=True)
class CellPlan:
    """What one client process does for one cell. Times are ``time.monotonic()`` values,
    which every process on the machine shares."""

    address: str
    operation: Operation
    clients: int
    timeline: str
    begin: float
    measure_from: float
    measure_to: float


@dataclass
class CellSample:
    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0


async def run_plan(client: OracleClient, plan: CellPlan) -> CellSample:
    """``plan.clients`` closed-loop callers; keeps the operations that finished inside the
    measurement window."""
    sample = CellSample()
    await asyncio.sleep(max(0.0, plan.begin - time.monotonic()))

    async def operation() -> None:
        if plan.operation == "read":
            await client.read_ts(plan.timeline)
        else:
            timestamp = await client.write_ts(plan.timeline)
            await client.apply_write(plan.timeline, timestamp)

    async def caller() -> None:
        while (started := time.monotonic()) < plan.measure_to:
            try:
                await operation()
            except TidemarkError:
                if started >= plan.measure_from:
                    sample.failures += 1
                continue
            finished = time.monotonic()
            if plan.measure_from <= finished <= plan.measure_to:
                sample.latencies_s.append(finished - started)

    await asyncio.gather(*(caller() for _ in range(plan.clients)))
    return sample


def client_process_main(conn: multiprocessing.connection.Connection) -> None:
    """A client process: runs the plans it receives (``None`` ends it), one channel per oracle
    address, kept across cells."""
    with asyncio.Runner() as runner:
        clients: dict[str, OracleClient] = {}
        while (plan := conn.recv()) is not None:
            assert isinstance(plan, CellPlan)
            if plan.address not in clients:
                clients[plan.address] = runner.run(_connected_client(plan.address))
            conn.send(runner.run(run_plan(clients[plan.address], plan)))
        for client in clients.values():
            runner.run(client.close())


async def _connected_client(address: str) -> OracleClient:
    return OracleClient(address)


class ClientPool(ProcessPool):
    """Oracle client processes; a cell's samples are merged across them."""

    def __init__(self, size: int) -> None:
        super().__init__(client_process_main, size)

    def split(self, clients: int) -> list[int]:
        """How many of ``clients`` each process runs (as evenly as possible)."""
        size = self.size
        return [clients // size + (1 if i < clients % size else 0) for i in range(size)]

    def run_cell(self, plans: Sequence[CellPlan], during: Callable[[], None]) -> CellSample:
        """Hand each process its plan, call ``during`` while they run, merge the samples."""
        jobs = [plan if plan.clients else None for plan in plans]
        merged = CellSample()
        for sample in self.run(jobs, during):
            merged.latencies_s.extend(sample.latencies_s)
            merged.failures += sample.failures
        return merged


# --- cells --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    backend: str
    operation: Operation
    clients: int
    rate: Rate
    cpu_percent: dict[str, float]


@dataclass(frozen=True)
class Settings:
    seconds: float
    warmup_s: float
    client_processes: int
    client_counts: list[int]
    backends: list[str]
    oracle_args: list[str]


def run_cell(
    pool: ClientPool,
    oracle: LoggedService,
    meter: CpuMeter,
    backend: str,
    operation: Operation,
    clients: int,
    settings: Settings,
) -> Cell:
    begin = time.monotonic() + 0.2  # every process has its plan by then
    measure_from = begin + settings.warmup_s
    measure_to = measure_from + settings.seconds
    plans = [
        CellPlan(
            oracle.address,
            operation,
            share,
            f"bench-{operation}",
            begin,
            measure_from,
            measure_to,
        )
        for share in pool.split(clients)
    ]
    cpu: dict[str, float] = {}

    def meter_window() -> None:
        time.sleep(max(0.0, measure_from - time.monotonic()))
        meter.start()
        time.sleep(max(0.0, measure_to - time.monotonic()))
        cpu.update(meter.stop())

    sample = pool.run_cell(plans, meter_window)
    rate = Rate.of(sample.latencies_s, settings.seconds, sample.failures)
    return Cell(backend, operation, clients, rate, cpu)


def run_backend(
    pool: ClientPool,
    backend: str,
    consensus_url: str,
    backend_pids: list[int],
    log_path: Path,
    settings: Settings,
    report: Callable[[Cell], None],
) -> list[Cell]:
    cells = []
    args = ["--consensus-url", consensus_url, *settings.oracle_args]
    with running_service("services.oracle", args, log_path) as oracle:
        meter = CpuMeter({"oracle": [oracle.pid], "backend": backend_pids, "clients": pool.pids})
        for operation in ("read", "write"):
            for clients in settings.client_counts:
                cell = run_cell(pool, oracle, meter, backend, operation, clients, settings)
                report(cell)
                cells.append(cell)
    return cells


# --- output -------------------------------------------------------------------------------

HEADER = (
    f"{'backend':<8} {'operation':<19} {'clients':>7} {'ops/s':>9} {'p50 ms':>8} "
    f"{'p99 ms':>8} {'x floor':>8} {'oracle us/op':>13}   cpu % oracle/backend/clients/other"
)


def oracle_cpu_us_per_op(cell: Cell) -> float:
    """Oracle CPU time per operation: what the oracle itself costs, and so the rate it could
    reach with a core to itself (1e6 / this); less disturbed by other load than ops/s."""
    if not cell.rate.ops_per_s:
        return 0.0
    return round(cell.cpu_percent["oracle"] / 100 / cell.rate.ops_per_s * 1e6)


def format_cell(cell: Cell, floor: Rate) -> str:
    ratio = cell.rate.ops_per_s / floor.ops_per_s
    cpu = "/".join(
        f"{cell.cpu_percent[name]:.0f}" for name in ("oracle", "backend", "clients", "other")
    )
    failures = f"  ({cell.rate.failures} failed)" if cell.rate.failures else ""
    return (
        f"{cell.backend:<8} {OPERATION_NAMES[cell.operation]:<19} {cell.clients:>7} "
        f"{cell.rate.ops_per_s:>9.0f} {cell.rate.p50_ms:>8.2f} {cell.rate.p99_ms:>8.2f} "
        f"{ratio:>7.1f}x {oracle_cpu_us_per_op(cell):>13.0f}   {cpu}{failures}"
    )


def format_rate(label: str, rate: Rate) -> str:
    return (
        f"{label}: {rate.ops_per_s:.0f} ops/s (p50 {rate.p50_ms:.2f} ms, p99 {rate.p99_ms:.2f} ms)"
    )


def target_results(cells: Sequence[Cell], floor: Rate) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for operation, target in TARGETS.items():
        for cell in cells:
            if (cell.backend, cell.operation, cell.clients) == ("etcd", operation, TARGET_CLIENTS):
                ratio = round(cell.rate.ops_per_s / floor.ops_per_s, 2)
                results.append(
                    {
                        "what": f"{OPERATION_NAMES[operation]} on etcd, {TARGET_CLIENTS} clients",
                        "ratio_to_floor": ratio,
                        "target": target,
                        "met": ratio >= target,
                    }
                )
    return results


def machine_description(load_before: float) -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
    }


# --- main ---------------------------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    parser.add_argument(
        "--client-processes", type=int, default=2, help="processes the clients are spread over"
    )
    parser.add_argument("--clients", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--backends", default="etcd,sqlite", help="etcd and/or sqlite")
    parser.add_argument(
        "--oracle-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for the oracle process, e.g. --oracle-arg=--batch-linger=0 (repeatable)",
    )
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "bench" / "results" / "oracle.json"
    )
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"etcd", "sqlite"}
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(sorted(unknown))}")
    settings = Settings(
        seconds=args.seconds,
        warmup_s=args.warmup,
        client_processes=max(1, args.client_processes),
        client_counts=[int(n) for n in args.clients.split(",")],
        backends=backends,
        oracle_args=args.oracle_arg,
    )
    return settings, args.output


def main(argv: Sequence[str] | None = None) -> None:
    settings, output = parse_settings(argv)
    load_before = os.getloadavg()[0]
    print(
        f"Timestamp oracle benchmark: {os.cpu_count()} CPUs, {settings.seconds:g} s per cell "
        f"after {settings.warmup_s:g} s warm-up, clients spread over "
        f"{settings.client_processes} process(es)",
        flush=True,
    )
    work_dir = Path(tempfile.mkdtemp(prefix="tidemark-bench-oracle-"))
    pool = ClientPool(settings.client_processes)
    cells: list[Cell] = []
    try:
        with running_etcd(work_dir / "etcd") as etcd:
            floor = asyncio.run(measure_floor(etcd.url, settings.seconds, settings.warmup_s))
            sqlite_url = f"sqlite://{work_dir / 'consensus.db'}"
            sqlite_floor = asyncio.run(
                measure_floor(sqlite_url, settings.seconds, settings.warmup_s)
            )
            print(format_rate("floor: raw etcd compare-and-set, 1 client ", floor))
            print(format_rate("       raw SQLite compare-and-set, 1 client", sqlite_floor))
            print(f"\n{HEADER}", flush=True)

            def report(cell: Cell) -> None:
                print(format_cell(cell, floor), flush=True)

            backend_urls = {"etcd": (etcd.url, [etcd.pid or 0]), "sqlite": (sqlite_url, [])}
            for backend in settings.backends:
                url, pids = backend_urls[backend]
                log_path = work_dir / f"oracle-{backend}.log"
                cells += run_backend(pool, backend, url, pids, log_path, settings, report)
    finally:
        pool.close()
        shutil.rmtree(work_dir, ignore_errors=True)

    targets = target_results(cells, floor)
    print("\nx floor: ops/s over the raw single-client etcd compare-and-set rate.")
    print("WriteTs+ApplyWrite: one operation is both calls (two batched compare-and-sets).")
    for result in targets:
        verdict = "met" if result["met"] else "MISSED"
        print(
            f"target {result['what']}: {result['ratio_to_floor']}x "
            f"(target >= {result['target']:g}x): {verdict}"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "oracle",
        "machine": machine_description(load_before),
        "settings": asdict(settings),
        "floor": {"etcd_raw_cas": asdict(floor), "sqlite_raw_cas": asdict(sqlite_floor)},
        "cells": [
            {
                "backend": cell.backend,
                "operation": OPERATION_NAMES[cell.operation],
                "clients": cell.clients,
                **asdict(cell.rate),
                "ratio_to_etcd_floor": round(cell.rate.ops_per_s / floor.ops_per_s, 2),
                "cpu_percent": cell.cpu_percent,
                "oracle_cpu_us_per_op": oracle_cpu_us_per_op(cell),
            }
            for cell in cells
        ],
        "targets": targets,
    }
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {output.relative_to(REPO_ROOT) if output.is_relative_to(REPO_ROOT) else output}")


if __name__ == "__main__":
    main()
