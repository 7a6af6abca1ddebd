"""Running compute with everything it needs as real processes, for integration tests.

``running_stack(directory)`` starts storage (embedded backends under ``directory``), and on
request an oracle and a catalog, then one compute process per cluster name::

    with running_stack(tmp_path, clusters=("a", "b"), catalog=True) as stack:
        compute = ComputeClient(stack.compute("a").address)
        stack.kill_compute("a")              # kill -9
        stack.start_compute("a")             # the same flags again

Compute processes run Spark cheaply (``local[3]``, a small driver heap) unless told
otherwise; every one starts its own JVM, so share stacks across the tests of a module.

``Collections`` creates input collections with unique GlobalIds and appends to them at
chosen times, tracking each one's upper.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.support.reference_eval import canonical, evaluate
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.cdc import CdcReader
from tidemark.clients.storage import Capability, CapabilityPair, StorageClient
from tidemark.columnar import RelationSchema
from tidemark.frontier import u64_frontier
from tidemark.lattice import U64
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]
T = TypeVar("T")

SPARK_MASTER = "local[3]"
# Capabilities a test holds (its own read holds and write capabilities) outlive the test
# without renewals; a killed compute process's holds outlive its restart.
STORAGE_SETTINGS = (*FAST_SETTINGS, "--lease-seconds", "600")
DRIVER_MEMORY = "512m"


@dataclass
class Stack:
    directory: Path
    storage: ServiceProcess
    oracle: ServiceProcess | None = None
    catalog: ServiceProcess | None = None
    engine: str = "spark"
    spark_master: str = SPARK_MASTER
    compute_extra: tuple[str, ...] = ()
    compute_env: dict[str, str] = field(default_factory=dict)
    catalog_extra: tuple[str, ...] = ()
    # The oracle timeline of the catalog's times (None: the catalog's default).
    catalog_timeline: str | None = None
    computes: dict[str, ServiceProcess] = field(default_factory=dict)

    def compute_args(self, cluster: str) -> list[str]:
        args = [
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            cluster,
            "--storage",
            self.storage.address,
            "--engine",
            self.engine,
            "--spark-master",
            self.spark_master,
            "--spark-driver-memory",
            DRIVER_MEMORY,
            "--hold-interval",
            "0.2",
            *self.compute_extra,
        ]
        if self.catalog is not None:
            args += ["--catalog", self.catalog.address, "--oracle", self.oracle.address]
            if self.catalog_timeline is not None:
                args += ["--catalog-timeline", self.catalog_timeline]
        return args

    def start_compute(self, cluster: str = "default", extra: Sequence[str] = ()) -> ServiceProcess:
        """Starts (or restarts, after a kill) the compute process of ``cluster``; ``extra``:
        flags for this process only."""
        process = ServiceProcess(
            "services.compute", [*self.compute_args(cluster), *extra], env=self.compute_env
        )
        self.computes[cluster] = process
        return process

    def compute(self, cluster: str = "default") -> ServiceProcess:
        return self.computes[cluster]

    def kill_compute(self, cluster: str = "default") -> None:
        """``kill -9``: no shutdown, no released holds."""
        self.computes[cluster].kill()

    def start_oracle_and_catalog(self, timeline: str | None = None) -> None:
        """An oracle (SQLite in the stack's directory) and a catalog on the stack's storage;
        ``timeline``: the catalog's own (default: the catalog's default)."""
        self.oracle = ServiceProcess(
            "services.oracle",
            ["--listen", "127.0.0.1:0", "--consensus-url", f"sqlite://{self.directory}/oracle.db"],
        )
        self.catalog_timeline = timeline
        timeline_args = ["--timeline", timeline] if timeline else []
        self.catalog = ServiceProcess(
            "services.catalog",
            [
                *("--listen", "127.0.0.1:0", "--storage", self.storage.address),
                *("--oracle", self.oracle.address, *timeline_args),
                *self.catalog_extra,
            ],
        )

    def stop(self) -> None:
        processes = [*self.computes.values(), self.catalog, self.storage, self.oracle]
        for process in processes:
            if process is not None:
                process.kill()


@contextmanager
def running_stack(
    directory: Path,
    *,
    clusters: Sequence[str] = ("default",),
    catalog: bool = False,
    engine: str = "spark",
    spark_master: str = SPARK_MASTER,
    compute_extra: Sequence[str] = (),
    compute_env: dict[str, str] | None = None,
    storage_extra: Sequence[str] = (),
    catalog_extra: Sequence[str] = (),
) -> Iterator[Stack]:
    """Storage (+ oracle and catalog when ``catalog``) and one compute process per cluster,
    all killed on exit. ``storage_extra`` and ``catalog_extra`` override the settings of
    storage and of the catalog."""
    storage = start_storage(embedded_backends(directory), extra=(*STORAGE_SETTINGS, *storage_extra))
    stack = Stack(
        directory,
        storage,
        engine=engine,
        spark_master=spark_master,
        compute_extra=tuple(compute_extra),
        compute_env=dict(compute_env or {}),
        catalog_extra=tuple(catalog_extra),
    )
    try:
        if catalog:
            stack.start_oracle_and_catalog(timeline=f"catalog-{uuid.uuid4().hex[:12]}")
        for cluster in clusters:
            stack.start_compute(cluster)
        yield stack
    finally:
        stack.stop()


# -- input collections ----------------------------------------------------------------------------


class Collections:
    """Collections in one storage, with fresh GlobalIds, written at times the test picks."""

    _ids = itertools.count(1000)

    def __init__(self, storage: StorageClient, holder: str = "test") -> None:
        self.storage = storage
        self.holder = holder
        self.pairs: dict[str, CapabilityPair] = {}
        self.uppers: dict[str, int] = {}
        self._writes: dict[str, Capability] = {}

    @classmethod
    def new_id(cls) -> str:
        return f"u{next(cls._ids)}"

    async def create(self, schema: RelationSchema, initial: int = 0) -> str:
        collection_id = self.new_id()
        pair = await self.storage.create(
            collection_id, schema, initial_frontier=initial, holder=self.holder
        )
        self.pairs[collection_id] = pair
        self._writes[collection_id] = pair.write
        self.uppers[collection_id] = initial
        return collection_id

    def read(self, collection_id: str) -> Capability:
        """The test's own read capability (it holds the since at the initial frontier)."""
        return self.pairs[collection_id].read

    async def read_capability(self, collection_id: str) -> Capability:
        """A fresh read capability, for handing over to a dataflow."""
        return await self.storage.clone(self.read(collection_id), holder=self.holder)

    async def write_capability(self, collection_id: str) -> Capability:
        """A fresh write capability (for handing over to a dataflow)."""
        pair = await self.storage.acquire(collection_id, self.holder)
        await self.storage.drop(pair.read)
        return pair.write

    async def append(
        self, collection_id: str, updates: Sequence[tuple[Row, int, int]], upper: int
    ) -> None:
        """Appends ``updates`` (times in ``[upper so far, upper)``) and moves the upper."""
        await self.storage.append(
            self._writes[collection_id],
            list(updates),
            upper,
            expected_upper=self.uppers[collection_id],
        )
        self.uppers[collection_id] = upper

    async def advance(self, collection_id: str, upper: int) -> None:
        await self.append(collection_id, [], upper)

    async def history(self, collection_id: str, upper: int) -> list[tuple[Row, int, int]]:
        """Every update of the collection before ``upper`` (from the test's read hold)."""
        updates: list[tuple[Row, int, int]] = []
        reader: CdcReader[Row, int] = CdcReader(U64)
        async for message in self.storage.subscribe(self.read(collection_id), stop_at=upper):
            for batch, frontier in reader.push(message):
                updates.extend(batch)
                if frontier == u64_frontier(upper):
                    return updates
        return updates


async def eventually(check: Callable[[], Awaitable[T]], seconds: float = 120.0) -> T:
    """Polls ``check`` until it returns without an ``AssertionError`` (then its result), or
    re-raises the last failure after ``seconds``. For conditions reached in the
    background; never a statement about how fast."""
    end = time.monotonic() + seconds
    while True:
        try:
            return await check()
        except AssertionError:
            if time.monotonic() > end:
                raise
        await asyncio.sleep(0.1)


def resident_task_pids(process: ServiceProcess) -> tuple[int, ...]:
    """The Python worker pids of the latest resident cluster a compute process started."""
    started = [r for r in process.records() if r.get("event") == "resident_cluster_started"]
    assert started, "the compute process has not started a resident cluster"
    return tuple(started[-1]["task_pids"])


def current_task_pids(process: ServiceProcess) -> tuple[int, ...]:
    """The resident tasks' pids now: those the latest cluster started with, as shard restores
    replaced some since."""
    records = [
        r
        for r in process.records()
        if r.get("event") in ("resident_cluster_started", "shard_restored")
    ]
    assert records, "the compute process has not started a resident cluster"
    return tuple(records[-1]["task_pids"])


def contents_at(updates: Sequence[tuple[Row, int, int]], time: int) -> dict[Row, int]:
    """The multiset ``updates`` accumulate to at ``time``."""
    version: dict[Row, int] = {}
    for row, at, diff in updates:
        if at <= time:
            version[row] = version.get(row, 0) + diff
    return {row: n for row, n in version.items() if n}


async def exact_history(
    collections: Collections, plan: plan_pb2.Plan, output: str, inputs: list[str], upper: int
) -> int:
    """Checks the output's contents against the plan evaluated over the inputs at every time
    before ``upper``, and that no (row, time) was written twice; returns how many times the
    output changed."""
    written = await collections.history(output, upper)
    histories = {cid: await collections.history(cid, upper) for cid in inputs}
    changed = 0
    previous: dict[Row, int] = {}
    for at in range(upper):
        expected = canonical(
            evaluate(plan, {cid: contents_at(history, at) for cid, history in histories.items()})
        )
        assert canonical(contents_at(written, at)) == expected, f"output at {at}"
        changed += expected != previous
        previous = expected
    keys = [(row, time) for row, time, _ in written]
    assert len(keys) == len(set(keys)), "an update was written twice"
    return changed
