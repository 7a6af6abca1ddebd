"""Steady state with the data work on the resident tasks (issue #14 item 1):
``.venv/bin/python bench/steady_io.py [--orders 100000] [--steps 150]``.

The compute benchmark's view (``bench/compute_view.py``: ``orders ⋈ customers`` grouped by
region) as a ``SparkDataflow`` on a ``ResidentCluster`` of two shards, its inputs and output
collections in a storage process (a local directory). Each step's delta (1,000 changed rows
over 10 times; ``--changed-orders N`` changes N orders, 2N rows) is appended to storage as
one batch; the view then steps through it, the two ways alternating step by step, so both
see the same load:

- **rows** (before): the driver reads the interval's rows (``SubscribeAt``, decoded to rows
  as ``InputFollower`` does), deals them out (``SparkDataflow.step``), gets the tasks' output
  shares back, consolidates them and appends them (``OutputWriter.write``);
- **parts** (after): as ``RunningDataflow._step_io`` does, ``InputFollower``s of both inputs
  (``parts=True``), fed by one ``PartsFeed`` (a ``SubscribePartsJointly`` stream open over
  both), hold the part keys of each interval; the driver takes them, deals them out
  (``SparkDataflow.astep_io``: the tasks read the part and write the output's parts), and
  commits the parts (``OutputWriter.write_parts``). No output row comes back.

The view's state is built as the compute service builds it (``--hydrate spark``, the
default): the inputs' snapshot is in storage, Spark stages it and the tasks load it into
columnar state (``hydration.py``). ``--hydrate rows`` deals the snapshot's rows out instead,
which leaves the state in Python dicts.

The inputs' appends come from a process of their own (``--appender``, the same seeded
workload), so that this process's CPU is the driver's alone. Per step: the wall time and the
driver's CPU (``getrusage(RUSAGE_SELF)``: this process, all its threads; not the storage
process, the appender, Spark's JVM or the tasks), for the whole step and for the engine call
alone (``step`` / ``astep_io``, which benchmark (g) times). The rows path's whole step runs
from reading the interval to the commit. The parts path's runs, in wall time, from the
moment the followers hold the interval to the commit, and in CPU from just after the
appender is told to append (all the followers' work on receiving the interval included) to
the commit. Then as many steps of one changed order each way (the fixed cost of a step). The
resident tasks' CPU per step each way (their pids' user + system time, summed over the timed
steps). The parts path's whole-step driver CPU is also split in three
(``driver_cpu_ms_per_step_by_part``): following the inputs until both hold the interval, the
engine call, and the commit; next to it, what those interactions cost bare on the same
machine (``bench/grpc_floor.py``, ``grpc_floor_cpu_ms``), and their sum for the two a step
keeps even with the tasks following the inputs themselves, as long as the driver commits
(``driver_commits_floor_cpu_ms``: a message in, a commit answered later).

``--compare keyed`` runs the parts path both ways instead: with and without reading a
step's big input part by key partition (``part_shares.keyed_sources``; without it each task
decodes a run of the part's rows and routes them through the mesh), reported as
``parts_path`` and ``parts_path_unkeyed``. ``--compare commit`` runs the parts path with
the commit sent as a message on the client's ``AppendStream`` (``parts_path``) and as an
``AppendParts`` call of its own (``parts_path_unary_commit``). ``--compare thread`` runs
the parts path with the engine call's round on the event loop (``astep_io``, as the service
does: ``parts_path``) and handed to a thread that runs ``step_io``
(``parts_path_thread``). ``--compare none`` runs the
parts path alone: storage then has no other way's reads, appends and compactions to do
between its steps. Each run records the load
average. The output collection must equal the view evaluated in-process at the end, or the
run stops.
Writes ``bench/results/steady_io.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for bench.* and tests.support when run as a script

from bench import grpc_floor  # noqa: E402
from bench.common import Latency, load_average, percentile  # noqa: E402
from bench.compute_view import (  # noqa: E402
    CUSTOMERS,
    DELTA_TIMES,
    DELTA_UPDATES,
    ORDERS,
    Workload,
    view_plan,
)
from services.compute.dataflow import Dataflow  # noqa: E402
from services.compute.inputs import InputFollower, PartsFeed  # noqa: E402
from services.compute.output import OutputWriter  # noqa: E402
from services.compute.spark import ResidentCluster, SparkDataflow, spark_session  # noqa: E402
from services.compute.spark.hydration import early_loads, stage  # noqa: E402
from services.compute.spark.parts_source import s3_credentials  # noqa: E402
from services.compute.spark.spark_dataflow import OutputSink  # noqa: E402
from services.compute.spark.staging import delete_prefix, run_prefix  # noqa: E402
from tests.support.storage import embedded_backends, start_storage  # noqa: E402
from tidemark.cdc import Progress  # noqa: E402
from tidemark.clients.storage import Capability, StorageClient  # noqa: E402
from tidemark.columnar import updates_from_table  # noqa: E402
from tidemark.frontier import u64_frontier  # noqa: E402
from tidemark.plan import derive_schema  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "steady_io.json"
SHARDS = 2


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Timer:
    """Wall and driver CPU seconds of the calls it wraps, per call."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    async def timed(self, work: Callable[[], Any]) -> Any:
        wall, cpu = time.perf_counter(), _cpu()
        result = await work()
        self.cpu.append(_cpu() - cpu)
        self.wall.append(time.perf_counter() - wall)
        return result

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.wall)
        return {
            "p50_ms": round(percentile(ordered, 0.5) * 1000, 2),
            "p90_ms": round(percentile(ordered, 0.9) * 1000, 2),
            "driver_cpu_ms_per_step": round(sum(self.cpu) / len(self.cpu) * 1000, 3),
        }


def _by_part(shares: Sequence[tuple[float, float, float]]) -> dict[str, float]:
    """The mean driver CPU per step (ms) of each part of the whole step."""
    names = ("following_inputs", "engine_call", "commit")
    return {
        name: round(sum(share[i] for share in shares) / len(shares) * 1000, 3)
        for i, name in enumerate(names)
    }


def _in_thread(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as a coroutine function that runs it in a thread."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(function, *args, **kwargs)

    return call


def _task_cpu(pids: Sequence[int]) -> float:
    """The user + system CPU seconds of the processes ``pids`` so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def _hydrate_by_spark(
    spark: Any, client: StorageClient, dataflow: SparkDataflow, pairs: dict[str, Any]
) -> float:
    """Hydrates ``dataflow`` from the inputs' parts in storage as the compute service does
    (``engines.py``): the nodes the tasks read from parts alone load first, Spark stages the
    rest, the tasks load it into columnar state. Returns the seconds it took."""
    started = time.perf_counter()
    listings = {
        pair.read.collection_id: await client.list_parts(pair.read, 0) for pair in pairs.values()
    }
    blob_url = next(iter(listings.values())).blob_url
    prefix = run_prefix(dataflow.dataflow_id)
    early, preloaded = early_loads(
        dataflow.graph,
        listings,
        dataflow_id=dataflow.dataflow_id,
        as_of=dataflow.as_of,
        shards=dataflow.shards,
    )
    try:
        if early:
            await asyncio.to_thread(dataflow.load_staged, early)
        staged = await asyncio.to_thread(
            lambda: stage(
                spark,
                dataflow.plan,
                dataflow.graph,
                dataflow_id=dataflow.dataflow_id,
                as_of=dataflow.as_of,
                shards=dataflow.shards,
                index_key_columns=dataflow.index_key_columns,
                listings=listings,
                staging_url=blob_url,
                prefix=prefix,
                output=None,
                count_output=False,
                preloaded=preloaded,
            )
        )
        await asyncio.to_thread(dataflow.load_staged, staged.loads)
    finally:
        await delete_prefix(blob_url, prefix)
    return time.perf_counter() - started


async def run(
    orders: int,
    steps: int,
    warmup: int,
    small_steps: int,
    compare: str = "rows",
    hydrate: str = "spark",
    changed_orders: int = DELTA_UPDATES,
) -> dict[str, Any]:
    # Spark's JVM first: launching it forks, and a fork while gRPC's threads run (the
    # storage client's) can lose the gateway before it sends its port.
    spark = spark_session(min_slots=SHARDS + 4)
    directory = Path(tempfile.mkdtemp(prefix="steady-io-"))
    storage = start_storage(
        embedded_backends(directory),
        extra=("--lease-seconds", "600", "--retired-blob-grace", "600"),
    )
    client = StorageClient(storage.address, timeout=30.0)
    workload = Workload(orders)
    plan = view_plan("u101", "u102")
    schema = derive_schema(plan.root)
    want: dict[Any, int] = {}

    def apply(updates: Any) -> None:
        for row, _, diff in updates:
            want[row] = want.get(row, 0) + diff

    try:
        pairs = {
            "orders": await client.create("u101", ORDERS),
            "customers": await client.create("u102", CUSTOMERS),
        }
        if hydrate == "spark":
            # The snapshot in storage at time 0, as a table's load would leave it.
            for name, table in workload.snapshot_tables().items():
                await client.append_table(pairs[name].write, table, 1, expected_upper=0)
        else:
            for pair in pairs.values():
                await client.append(pair.write, [], 1, expected_upper=0)
        output = await client.create("u103", schema)
        writer = OutputWriter(client, output.write, schema, "bench-view", 0)
        local = Dataflow(view_plan("u101", "u102"), as_of=0)
        with ResidentCluster(spark, SHARDS) as cluster:
            dataflow = SparkDataflow(plan, as_of=0, cluster=cluster)
            snapshot = workload.snapshot()
            renamed = {"u101": snapshot["orders"], "u102": snapshot["customers"]}
            # The expected output is the in-process view's; what is written is the tasks'
            # hydration's when it answers one (from rows), else the in-process one.
            expected, upper = local.hydrate(renamed)
            apply(expected)
            if hydrate == "spark":
                hydrated_s = await _hydrate_by_spark(spark, client, dataflow, pairs)
                hydrated = expected
            else:
                started = time.perf_counter()
                hydrated, _ = await asyncio.to_thread(dataflow.hydrate, renamed)
                hydrated_s = time.perf_counter() - started
            del snapshot, renamed
            await writer.write(hydrated, upper)
            listing = await client.list_parts(pairs["orders"].read, 0)
            sink = OutputSink("u103", listing.blob_url, schema)
            environment = s3_credentials()
            timers = {name: (Timer(), Timer()) for name in ("rows", "parts", "rows-1", "parts-1")}
            task_cpu = {"rows": 0.0, "parts": 0.0}
            # The parts path's whole-step driver CPU in three: until the followers hold the
            # interval, the engine call (dealing included), the commit.
            shares: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
            keyed = dataflow._keyed_sources
            loads: list[float] = []
            appender = await Appender.start(storage.address, orders, pairs)
            arrived = asyncio.Event()
            followers = [
                InputFollower(client, pair.read, 0, arrived.set, snapshot=False, parts=True)
                for pair in pairs.values()
            ]
            feed = PartsFeed(client, followers, arrived.set)
            feed.start()

            async def interval_held(upper: int) -> float:
                """Waits until every follower holds the interval up to ``upper``; when."""
                while min(f.upper or 0 for f in followers) < upper:
                    await arrived.wait()
                    arrived.clear()
                return time.perf_counter()

            async def rows_step(lower: int, upper: int, timed: bool, kind: str = "rows") -> None:
                whole, engine = timers[kind]

                async def work() -> None:
                    tables = []
                    async for event in client.subscribe_arrow(
                        pairs["orders"].read, as_of=lower - 1, snapshot=False, stop_at=upper
                    ):
                        if not isinstance(event, Progress) and event.num_rows:
                            tables.append(event)
                    batch = [u for table in tables for u in updates_from_table(table)]

                    async def call() -> Any:
                        return await asyncio.to_thread(dataflow.step, {"u101": batch}, upper)

                    result, _ = await (engine.timed(call) if timed else call())
                    await writer.write(result, upper)

                await (whole.timed(work) if timed else work())

            async def parts_step(
                upper: int, timed: bool, kind: str = "parts", on_loop: bool = True
            ) -> None:
                """Appends the next delta and runs its step as the runner does (the
                append's wall time is not the step's; the followers' CPU is)."""
                whole, engine = timers[kind]
                appender.send()
                cpu = _cpu()
                held = await interval_held(upper)
                followed = _cpu()
                windows = {
                    f.collection_id: taken for f in followers if (taken := f.take_parts(upper))
                }

                step = dataflow.astep_io if on_loop else _in_thread(dataflow.step_io)

                async def call() -> Any:
                    return await step(
                        {},
                        windows,
                        upper,
                        blob_url=listing.blob_url,
                        environment=environment,
                        sink=sink,
                        return_rows=False,
                    )

                done = await (engine.timed(call) if timed else call())
                times = (done.least or 0, done.greatest or 0)
                stepped = _cpu()
                await writer.write_parts(done.parts, times, upper)
                if timed:
                    whole.cpu.append(_cpu() - cpu)
                    whole.wall.append(time.perf_counter() - held)
                    shares[kind].append((followed - cpu, stepped - followed, _cpu() - stepped))
                await appender.confirm(upper)

            # The two ways alternate step by step; with --compare none the parts path runs alone.
            ways = ("parts",) if compare == "none" else ("rows", "parts")
            plan_steps = [(changed_orders, DELTA_TIMES, "")] * (len(ways) * (warmup + steps))
            plan_steps += [(1, 1, "-1")] * (len(ways) * small_steps)
            for number, (updates, times, suffix) in enumerate(plan_steps):
                delta, upper = workload.delta(updates, times)
                lower = upper - times
                apply(local.step({"u101": delta}, upper)[0])
                appender.next(updates, times)
                timed = number >= len(ways) * warmup and (
                    bool(suffix) or number < len(ways) * (warmup + steps)
                )
                if timed:
                    loads.append(load_average())
                way = ways[number % len(ways)]
                before = _task_cpu(cluster.task_pids)
                if compare == "keyed":
                    dataflow._keyed_sources = keyed if way == "parts" else frozenset()
                    await parts_step(upper, timed, way + suffix)
                elif compare == "commit":
                    # The other way commits through AppendParts calls (one per step) instead
                    # of messages on the AppendStream: the same writer, client and channel.
                    client.append_stream = way == "parts"
                    await parts_step(upper, timed, way + suffix)
                elif compare == "thread":
                    await parts_step(upper, timed, way + suffix, on_loop=way == "parts")
                elif way == "rows":
                    appender.send()
                    # The followers' part keys of this step are the rows path's to ignore.
                    await interval_held(upper)
                    for follower in followers:
                        follower.take_parts(upper)
                    await appender.confirm(upper)
                    await rows_step(lower, upper, timed, "rows" + suffix)
                else:
                    await parts_step(upper, timed, "parts" + suffix)
                if timed and not suffix:
                    task_cpu[way] += _task_cpu(cluster.task_pids) - before
            await feed.stop()
            await appender.close()
            final = (await client.snapshot(output.read, upper - 1)).version()
            if final != {row: n for row, n in want.items() if n}:
                raise SystemExit("the output collection is not the view: the run is worthless")
            dataflow.drop()
        other = {
            "keyed": "parts_path_unkeyed",
            "commit": "parts_path_unary_commit",
            "thread": "parts_path_thread",
        }.get(compare, "rows_path")
        kinds = [("parts_path", "parts")] + ([] if compare == "none" else [(other, "rows")])
        result: dict[str, Any] = {
            "orders": orders,
            "changed_rows_per_step": 2 * changed_orders,
            "steps_each": steps,
            "compare": compare,
            "hydrate": hydrate,
            "hydrate_s": round(hydrated_s, 1),
            "load_average": round(sum(loads) / len(loads), 2),
        }
        for name, kind in kinds:
            result[name] = {
                "step": timers[kind][0].summary(),
                "engine": timers[kind][1].summary(),
                "tasks_cpu_ms_per_step": round(task_cpu[kind] / steps * 1000, 2),
            }
            if kind == "parts" or compare != "rows":
                result[name]["driver_cpu_ms_per_step_by_part"] = _by_part(shares[kind])
        for name, kind in kinds:
            if small_steps:  # --small-steps 0: none timed
                result["one_update_" + name] = {
                    "step": timers[kind + "-1"][0].summary(),
                    "engine": timers[kind + "-1"][1].summary(),
                }
        for name, kind in kinds:
            result["step_latency_" + name.replace("_path", "")] = Latency.of(
                timers[kind][0].wall
            ).__dict__
        result["python"] = platform.python_version()
        return result
    finally:
        await client.close()
        storage.kill()


class Appender:
    """The process appending the workload's deltas to the inputs: ``next`` names the next
    delta's size (the appender draws the same delta from the same seeded workload), ``send``
    has it appended, ``confirm`` asks for the appender's answer and reads it (after the step:
    an answer the appender sent unasked would arrive during the step, and reading it would
    cost this process CPU that is not the driver's)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pending: tuple[int, int] | None = None

    @staticmethod
    async def start(address: str, orders: int, pairs: dict[str, Any]) -> Appender:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--appender",
            address,
            "--orders",
            str(orders),
            pairs["orders"].write.collection_id,
            pairs["orders"].write.id,
            pairs["customers"].write.collection_id,
            pairs["customers"].write.id,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        appender = Appender(process)
        await appender._reply()  # its workload is drawn
        return appender

    def next(self, updates: int, times: int) -> None:
        self.pending = (updates, times)

    def send(self) -> None:
        """Has the next delta appended (the followers see it arrive)."""
        assert self.pending is not None and self.process.stdin is not None
        self.process.stdin.write(f"{self.pending[0]} {self.pending[1]}\n".encode())
        self.pending = None

    async def confirm(self, upper: int) -> None:
        """Checks that the appender's last delta ended at ``upper``."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"?\n")
        if await self._reply() != upper:
            raise SystemExit("the appender's workload went another way")

    async def _reply(self) -> int:
        assert self.process.stdout is not None
        while True:
            line = await self.process.stdout.readline()
            if not line:
                raise SystemExit("the appender stopped")
            if line.startswith(b"upper "):
                return int(line.split()[1])

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


async def append_forever(address: str, orders: int, capabilities: list[str]) -> None:
    """The appender's side: a delta per line read (``<updates> <times>``), appended to both
    inputs; a line ``?`` is answered with ``upper <upper>`` (the last delta's)."""
    workload = Workload(orders)
    client = StorageClient(address, timeout=30.0)
    orders_write, customers_write = (
        Capability(cid, cap_id, "write", u64_frontier(1), 0)
        for cid, cap_id in (capabilities[0:2], capabilities[2:4])
    )
    print("upper 0", flush=True)
    try:
        upper = 1  # the inputs' upper before the first delta
        for line in sys.stdin:
            if line.strip() == "?":
                print(f"upper {upper}", flush=True)
                continue
            updates, times = (int(word) for word in line.split())
            delta, upper = workload.delta(updates, times)
            lower = upper - times
            await client.append(orders_write, delta, upper, expected_upper=lower)
            await client.append(customers_write, [], upper, expected_upper=lower)
    finally:
        await client.close()


def main() -> None:
    if sys.argv[1:2] == ["--appender"]:
        address, _, orders, *capabilities = sys.argv[2:]
        asyncio.run(append_forever(address, int(orders), capabilities))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--small-steps", type=int, default=60, help="1-update steps, each way")
    parser.add_argument(
        "--changed-orders",
        type=int,
        default=DELTA_UPDATES,
        help="orders changed per step, each a retraction and an insertion (the default's "
        "1,000 changed rows are benchmark (g)'s step)",
    )
    parser.add_argument(
        "--hydrate",
        choices=("spark", "rows"),
        default="spark",
        help="how the view's state is built: from the inputs' parts by Spark into the tasks' "
        "columnar state, as the compute service does, or from rows the driver deals out",
    )
    parser.add_argument(
        "--compare",
        choices=("rows", "keyed", "commit", "thread", "none"),
        default="rows",
        help="the other way: the rows path, the parts path without reading by key, the "
        "parts path committing through AppendParts calls, the parts path with its engine "
        "call handed to a thread, or none (the parts path alone, without the other way's "
        "load on storage between its steps)",
    )
    args = parser.parse_args()
    # The bare cost of the step's interactions on this machine, to print next to its split
    # (first: a failure here costs seconds, not the run).
    floor = asyncio.run(grpc_floor.measure())
    result = asyncio.run(
        run(
            args.orders,
            args.steps,
            args.warmup,
            args.small_steps,
            args.compare,
            args.hydrate,
            args.changed_orders,
        )
    )
    result["grpc_floor_cpu_ms"] = floor
    # The least driver CPU a step can cost while the driver commits it, whoever follows the
    # inputs and deals the work: one message in (the tasks' written parts) and one commit
    # answered later on the append stream, each at its bare cost on this machine.
    result["driver_commits_floor_cpu_ms"] = round(
        floor["stream_message_after_idle"] + floor["streamed_call_answered_later"], 3
    )
    print(json.dumps(result, indent=2))
    runs = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    runs.append(result)
    RESULTS.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
