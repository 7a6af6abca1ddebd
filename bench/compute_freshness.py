"""(c) of the compute benchmark: freshness of a maintained view through the real processes.

An oracle, storage (embedded backends: a SQLite consensus file and a blob directory), a
catalog and a compute process (Spark engine, ``local[*]``, following the catalog's
``default`` cluster) run as their own processes. This process, over gRPC:

1. creates ``orders``, ``customers`` and the view's output collection, fills the inputs
   (``rows`` orders, 1,000 customers) at the initial time, and asks compute to maintain the
   benchmark's view (``bench/compute_view.py``) into the output (``MaintainView``);
2. follows the output with a storage ``SubscribeAt`` (no snapshot) and notes when each
   progress statement arrives and the upper it announces;
3. once the output has passed the initial time (hydrated), appends on a fixed grid (every
   ``period_s``) a batch of ``append_rows`` rows to ``orders`` (half retractions, half
   insertions: updated orders) at time ``t`` (the wall clock in ms, as on the data timeline)
   with new upper ``t + 1``, and at the same moment an empty append moving ``customers`` to
   ``t + 1`` (the view's upper is the meet of its inputs' uppers, so an idle input must move
   too). The write of ``t`` is acknowledged when both appends have returned.

Freshness of an append: from its acknowledgement until the subscription on the output
reports an upper past ``t`` (p50/p90/p99). Also reported: the same from just before the
appends were sent, the appends' own latency, how long hydration took, and the CPU of each
process. At the end the output's contents are checked against the view computed directly
from the inputs as this process wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import Latency, LoggedService, load_average, percentile
from bench.compute_view import (
    CUSTOMERS,
    ORDERS,
    ViewRow,
    Workload,
    region_of,
    view_plan,
    view_row,
)
from bench.process_cpu import TreeCpuMeter
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import Capability, StorageClient
from tidemark.columnar import RelationSchema
from tidemark.retry import RetryPolicy
from tidemark.v1 import plan_pb2

DATAFLOW_ID = "bench-freshness-view"
HOLDER = "bench"
WARMUP_S = 3.0
"""Appends before this long after the first are not counted."""
DRAIN_S = 15.0
"""How long to wait after the last append for the output to pass it."""
HYDRATE_TIMEOUT_S = 600.0
# Collection ids are GlobalIds; these are far above any the catalog hands out here.
ORDERS_ID, CUSTOMERS_ID, OUTPUT_ID = "u900001", "u900002", "u900003"


@dataclass(frozen=True)
class FreshnessSettings:
    rows: int
    seconds: float
    append_rows: int
    period_s: float


@dataclass(frozen=True)
class Services:
    oracle: LoggedService
    storage: LoggedService
    catalog: LoggedService
    compute: LoggedService


@dataclass
class Freshness:
    settings: FreshnessSettings
    latency: Latency
    """From an append's acknowledgement to the output's upper passing its time."""
    p90_ms: float
    from_send: Latency
    """The same, from just before the appends were sent."""
    append_ack: Latency
    appends: int
    counted: int
    not_passed: int
    """Counted appends the output had not passed when the run ended."""
    progress_messages: int
    hydrate_s: float
    """From MaintainView until the output passed the initial time (the compute process's
    Spark session was already up; starting its resident tasks is included)."""
    spark_master: str
    output_equal: bool
    load_average: float
    cpu: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        cpu = " ".join(f"{name} {value:.0f}" for name, value in self.cpu.items())
        return (
            f"compute on {self.spark_master}; view over {self.settings.rows:,} orders "
            f"(hydrated in {self.hydrate_s:.1f} s); "
            f"{self.settings.append_rows}-row appends every {self.settings.period_s * 1000:.0f} "
            f"ms for {self.settings.seconds:g} s: {self.counted} counted, "
            f"{self.not_passed} never passed\n"
            f"freshness from ack p50 {self.latency.p50_ms:.1f} ms, p90 {self.p90_ms:.1f} ms, "
            f"p99 {self.latency.p99_ms:.1f} ms; from send p50 {self.from_send.p50_ms:.1f} ms; "
            f"append ack p50 {self.append_ack.p50_ms:.1f} ms, p99 {self.append_ack.p99_ms:.1f} "
            f"ms; {self.progress_messages} output progress messages\n"
            f"output equals the view of the inputs: {'yes' if self.output_equal else 'NO'}; "
            f"load {self.load_average:.2f}; cpu % {cpu}"
        )

    def document(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class AppendRecord:
    time: int
    sent: float
    acked: float


@contextmanager
def running_services(
    work_dir: Path, spark_args: Sequence[str] = ("--spark-master", "local[*]")
) -> Iterator[Services]:
    """The four services as processes; ``spark_args``: compute's Spark flags (its master)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:

        def start(module: str, name: str, args: list[str]) -> LoggedService:
            service = LoggedService(module, args, work_dir / f"{name}.log")
            stack.callback(service.stop)
            return service

        oracle = start(
            "services.oracle", "oracle", ["--consensus-url", f"sqlite://{work_dir}/oracle.db"]
        )
        storage = start(
            "services.storage",
            "storage",
            [
                *("--consensus-url", f"sqlite://{work_dir}/storage.db"),
                *("--blob-url", f"file://{work_dir}/blobs"),
            ],
        )
        catalog = start(
            "services.catalog",
            "catalog",
            ["--storage", storage.address, "--oracle", oracle.address],
        )
        compute = start(
            "services.compute",
            "compute",
            [
                *("--cluster", "default", "--engine", "spark", *spark_args),
                *("--storage", storage.address, "--catalog", catalog.address),
                *("--oracle", oracle.address),
            ],
        )
        yield Services(oracle, storage, catalog, compute)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def expected_view(workload: Workload) -> dict[ViewRow, int]:
    totals: dict[str, tuple[int, int]] = {}
    for _, cust, amount in workload.orders():
        count, total = totals.get(region_of(cust), (0, 0))
        totals[region_of(cust)] = (count + 1, total + amount)
    return {(region, count, total): 1 for region, (count, total) in totals.items()}


class OutputProgress:
    """Follows the output's subscription: when each upper was announced."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, int]] = []  # (monotonic time, upper)
        self.upper = 0
        self.changed = asyncio.Event()

    async def follow(self, storage: StorageClient, capability: Capability) -> None:
        async for message in storage.subscribe_raw(capability, snapshot=False):
            if message.WhichOneof("kind") != "progress":
                continue
            elements = message.progress.upper.elements
            if not elements:
                return  # closed
            arrived = time.monotonic()
            upper = max(elements)
            if upper > self.upper:
                self.upper = upper
                self.seen.append((arrived, upper))
                self.changed.set()

    async def wait_past(self, time_: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.upper <= time_:
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    def passed_at(self, time_: int) -> float | None:
        """When an upper past ``time_`` was first announced."""
        for arrived, upper in self.seen:
            if upper > time_:
                return arrived
        return None


async def _measure(settings: FreshnessSettings, services: Services) -> Freshness:
    patient = RetryPolicy(60.0)
    storage = StorageClient(services.storage.address, timeout=60.0, retry=patient)
    compute = ComputeClient(services.compute.address, timeout=120.0, retry=patient)
    try:
        workload = Workload(settings.rows, seed=3)
        initial = now_ms()
        orders = await storage.create(ORDERS_ID, ORDERS, initial_frontier=initial, holder=HOLDER)
        customers = await storage.create(
            CUSTOMERS_ID, CUSTOMERS, initial_frontier=initial, holder=HOLDER
        )
        plan = view_plan(ORDERS_ID, CUSTOMERS_ID)
        output_schema = RelationSchema.from_proto(plan.output_schema)
        output = await storage.create(OUTPUT_ID, output_schema, initial_frontier=initial)
        await storage.append(
            orders.write, [(row, initial, 1) for row in workload.orders()], initial + 1
        )
        await storage.append(
            customers.write, [(row, initial, 1) for row in workload.customers], initial + 1
        )
        upper = initial + 1

        progress = OutputProgress()
        following = asyncio.create_task(progress.follow(storage, output.read))
        keeper = storage.keep_alive(
            [orders.read, customers.read, output.read, orders.write, customers.write], every=10
        )
        async with keeper:
            spark_master = await _wait_for_spark(compute)
            hydrate_s = await maintain_until_hydrated(
                compute,
                storage,
                plan,
                [orders.read, customers.read],
                output.write,
                progress,
                initial,
            )

            meter = TreeCpuMeter(
                {
                    "compute": [services.compute.pid],
                    "storage": [services.storage.pid],
                    "oracle+catalog": [services.oracle.pid, services.catalog.pid],
                    "bench": [os.getpid()],
                }
            )
            load = load_average()
            meter.start()
            records, upper = await _append_stream(
                settings, storage, workload, orders.write, customers.write, upper
            )
            cpu = meter.stop()
            await progress.wait_past(records[-1].time if records else upper, DRAIN_S)
            snapshot_at = progress.upper - 1
            contents = await storage.snapshot(output.read, snapshot_at, timeout=60.0)
            output_equal = {
                view_row(row): count for row, count in contents.version().items()
            } == expected_view(workload)
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
            await compute.drop_view(DATAFLOW_ID)
    finally:
        await compute.close()
        await storage.close()

    first_counted = records[0].sent + WARMUP_S if records else 0.0
    counted = [r for r in records if r.sent >= first_counted]
    from_ack, from_send, not_passed = [], [], 0
    for record in counted:
        passed = progress.passed_at(record.time)
        if passed is None:
            not_passed += 1
            continue
        # The output can be seen passing before this loop reads the append's reply.
        from_ack.append(max(0.0, passed - record.acked))
        from_send.append(passed - record.sent)
    return Freshness(
        settings=settings,
        latency=Latency.of(from_ack),
        p90_ms=round(percentile(sorted(from_ack), 0.90) * 1000, 3),
        from_send=Latency.of(from_send),
        append_ack=Latency.of([r.acked - r.sent for r in counted]),
        appends=len(records),
        counted=len(counted),
        not_passed=not_passed,
        progress_messages=len(progress.seen),
        hydrate_s=round(hydrate_s, 2),
        spark_master=spark_master,
        output_equal=output_equal,
        load_average=round(load, 2),
        cpu=cpu,
    )


async def _wait_for_spark(compute: ComputeClient) -> str:
    """Waits until the compute process's Spark session is up; returns its master."""
    deadline = time.monotonic() + HYDRATE_TIMEOUT_S
    while time.monotonic() < deadline:
        status = await compute.status()
        if status.spark_application_id:
            return status.spark_master
        await asyncio.sleep(0.2)
    raise RuntimeError("the compute process's Spark session did not start")


async def _append_stream(
    settings: FreshnessSettings,
    storage: StorageClient,
    workload: Workload,
    orders: Capability,
    customers: Capability,
    upper: int,
) -> tuple[list[AppendRecord], int]:
    """Appends on a fixed grid for warm-up plus ``seconds``; a tick that comes while the last
    write is still going is skipped rather than queued (a stream, not saturation)."""
    records: list[AppendRecord] = []
    updates_per_append = max(1, settings.append_rows // 2)
    begin = time.monotonic()
    end = begin + WARMUP_S + settings.seconds
    tick = 0
    while (slot := begin + tick * settings.period_s) < end:
        await asyncio.sleep(max(0.0, slot - time.monotonic()))
        at = max(upper, now_ms())
        workload.next_time = at
        delta, new_upper = workload.delta(updates_per_append, 1)
        data = await storage.encode_updates(orders.collection_id, delta)
        sent = time.monotonic()
        await asyncio.gather(
            storage.append_ipc(orders, data, new_upper, expected_upper=upper),
            storage.append(customers, [], new_upper, expected_upper=upper),
        )
        acked = time.monotonic()
        records.append(AppendRecord(at, sent, acked))
        upper = new_upper
        tick = max(tick + 1, int((time.monotonic() - begin) / settings.period_s) + 1)
    return records, upper


def measure_freshness(settings: FreshnessSettings, work_dir: Path) -> Freshness:
    try:
        with running_services(work_dir) as services:
            return asyncio.run(_measure(settings, services))
    except Exception:
        # The services' logs go away with the work directory: show where it went wrong.
        for log in sorted(work_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-20:]
            print(f"--- last lines of {log.name}", *tail, sep="\n", file=sys.stderr)
        raise


async def maintain_until_hydrated(
    compute: ComputeClient,
    storage: StorageClient,
    plan: plan_pb2.Plan,
    reads: Sequence[Capability],
    output: Capability,
    progress: OutputProgress,
    initial: int,
) -> float:
    """Installs the benchmark's view over clones of ``reads`` into ``output`` and waits until
    the output passes ``initial``; returns the seconds that took (the hydration)."""
    started = time.monotonic()
    await compute.maintain_view(
        DATAFLOW_ID,
        plan,
        [await storage.clone(read, "compute-bench") for read in reads],
        output=output,
    )
    if not await progress.wait_past(initial, HYDRATE_TIMEOUT_S):
        raise RuntimeError("the view did not hydrate within the timeout")
    return time.monotonic() - started
