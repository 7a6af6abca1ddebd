"""How far the long work of a compute process has come: its running peeks and hydrations.

Every peek is tracked while it runs (:class:`RunningQueries`), under the ``query_id`` its
caller chose (``PeekRequest.query_id``, which the adapter's ``StatementProgress`` asks about)
or one the process makes up. A peek is in one of two states:

- ``waiting``: for dataflows of this process that are still hydrating (an index peek on a
  fresh index, a one-shot read of a fresh materialized view's collection): its progress is
  theirs, their hydration parts and rows summed; or for a frontier, with no counts;
- ``running``: being evaluated. On Spark its progress is measured against its inputs' listed
  parts and rows (:func:`scaled`); in process there are no counts.

On Spark, rows done are the rows the job group's stages have read from the inputs (Spark's
input metrics, which both the Parquet reader and the parts data source report: counted as
scan tasks finish, and from the executors' heartbeats while they run), at most the listed
rows; parts done are the listed parts in that proportion (a scan task reads a group of small
parts or a slice of a large one, so parts are not counted one by one). Rows read, not tasks
done: the group's jobs and stages appear one after the other (a broadcast, a schema lookup,
adaptive execution's stages), so a fraction of the tasks known so far can read "all done"
before the scan has started. A peek's reported counts never go back
(:meth:`QueryWatch.status`).

:func:`log_progress` writes a log line every few seconds for each peek that has run that long,
and for each hydrating dataflow whose progress moved since its last line (a hydration that
waits for an input that does not move gets one line, not one every few seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.compute.spark.jobs import JobProgress, SparkJobs, run_observer
from tidemark.logging import get_logger
from tidemark.v1 import compute_pb2

log = get_logger("compute.progress")

WAITING = "waiting"
RUNNING = "running"

_numbers = itertools.count(1)


@dataclass(frozen=True)
class WorkDone:
    parts_done: int = 0
    parts_total: int = 0
    rows_done: int = 0
    rows_total: int = 0

    def __add__(self, other: WorkDone) -> WorkDone:
        return WorkDone(
            self.parts_done + other.parts_done,
            self.parts_total + other.parts_total,
            self.rows_done + other.rows_done,
            self.rows_total + other.rows_total,
        )

    def at_least(self, other: WorkDone) -> WorkDone:
        """This progress, never behind ``other`` (an earlier report of the same work)."""
        return WorkDone(
            max(self.parts_done, other.parts_done),
            max(self.parts_total, other.parts_total),
            max(self.rows_done, other.rows_done),
            max(self.rows_total, other.rows_total),
        )


def scaled(job: JobProgress, parts_total: int, rows_total: int) -> WorkDone:
    """A Spark run over ``parts_total`` listed parts holding ``rows_total`` rows, as parts
    and rows done: the rows it has read (at most the total; an input read twice counts
    once), and the parts in proportion (whole parts, rounded down)."""
    rows_done = min(job.rows_read, rows_total)
    parts_done = parts_total * rows_done // rows_total if rows_total else 0
    return WorkDone(parts_done, parts_total, rows_done, rows_total)


class Hydrating(Protocol):
    """What a peek waiting for a dataflow reads of it (``running.RunningDataflow``)."""

    dataflow_id: str
    state: str
    hydrated_rows: int
    hydration_rows_total: int
    hydration_parts_done: int
    hydration_parts_total: int


def hydration(dataflow: Hydrating) -> WorkDone:
    return WorkDone(
        dataflow.hydration_parts_done,
        dataflow.hydration_parts_total,
        dataflow.hydrated_rows,
        dataflow.hydration_rows_total,
    )


@dataclass
class QueryWatch:
    """One running peek, as the host tells its progress."""

    query_id: str
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0
    waiting_for: list[Hydrating] = field(default_factory=list)
    """Dataflows of this process the peek waits for while they hydrate."""
    waiting: bool = True
    parts_total: int = 0
    rows_total: int = 0
    """The inputs' listed parts and rows, once known (a peek on Spark)."""
    spark: tuple[SparkJobs, str] | None = None
    """The Spark job group evaluating it."""
    _reported: WorkDone = field(default_factory=WorkDone)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def evaluating(self, parts_total: int = 0, rows_total: int = 0) -> None:
        """The wait is over: the peek is being evaluated over inputs this large."""
        self.waiting = False
        self.waiting_for = []
        self.parts_total = parts_total
        self.rows_total = rows_total
        self._reported = WorkDone(0, parts_total, 0, rows_total)

    def spark_run_started(self, jobs: SparkJobs, group: str) -> None:
        self.waiting = False
        self.spark = (jobs, group)

    def status(self) -> compute_pb2.QueryStatus:
        hydrating = [d for d in self.waiting_for if d.state == "hydrating"]
        if self.waiting:
            done = sum((hydration(d) for d in hydrating), WorkDone())
        else:
            done = self._reported
            if self.spark is not None:
                jobs, group = self.spark
                job = jobs.progress(group)
                if job is not None:
                    done = scaled(job, self.parts_total, self.rows_total).at_least(done)
            self._reported = done
        return compute_pb2.QueryStatus(
            query_id=self.query_id,
            state=WAITING if self.waiting else RUNNING,
            waiting_for=[d.dataflow_id for d in hydrating] if self.waiting else [],
            parts_done=done.parts_done,
            parts_total=done.parts_total,
            rows_done=done.rows_done,
            rows_total=done.rows_total,
            elapsed_ms=max(0, round((self.clock() - self.started) * 1000)),
            spark_job_group=self.spark[1] if self.spark is not None else "",
        )

    @property
    def seconds(self) -> float:
        return self.clock() - self.started


class RunningQueries:
    """The peeks running in this process, by query id."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._watches: dict[str, QueryWatch] = {}

    @contextlib.contextmanager
    def track(self, query_id: str = "") -> Iterator[QueryWatch]:
        """Tracks a peek for the duration of the block; Spark runs started in it (in this
        task, or tasks it starts) are its evaluation. Two peeks under the same id are both
        tracked, under the later one's id with a suffix."""
        query_id = query_id or f"peek-{next(_numbers)}"
        if query_id in self._watches:
            query_id = f"{query_id}#{next(_numbers)}"
        watch = QueryWatch(query_id, self.clock)
        self._watches[query_id] = watch
        token = run_observer.set(watch.spark_run_started)
        try:
            yield watch
        finally:
            run_observer.reset(token)
            self._watches.pop(query_id, None)

    def statuses(self, query_ids: Sequence[str] = ()) -> list[compute_pb2.QueryStatus]:
        """The running peeks named (all of them when none are named), oldest first."""
        if query_ids:
            watches = [self._watches[q] for q in query_ids if q in self._watches]
        else:
            watches = sorted(self._watches.values(), key=lambda w: w.started)
        return [watch.status() for watch in watches]

    def watches(self) -> list[QueryWatch]:
        return list(self._watches.values())


def _counts(done: compute_pb2.QueryStatus | WorkDone) -> dict[str, int]:
    return {
        "parts_done": done.parts_done,
        "parts_total": done.parts_total,
        "rows_done": done.rows_done,
        "rows_total": done.rows_total,
    }


def log_once(
    queries: RunningQueries,
    dataflows: Iterable[Hydrating],
    longer_than_s: float,
    logged: dict[str, WorkDone] | None = None,
) -> None:
    """One log line per peek running longer than ``longer_than_s``, and per hydrating
    dataflow whose progress differs from what ``logged`` (updated here) last logged."""
    logged = {} if logged is None else logged
    for watch in queries.watches():
        if watch.seconds < longer_than_s:
            continue
        status = watch.status()
        log.info(
            "peek_progress",
            query=status.query_id,
            state=status.state,
            waiting_for=list(status.waiting_for),
            spark_job_group=status.spark_job_group,
            seconds=round(watch.seconds, 1),
            **_counts(status),
        )
    hydrating = [d for d in dataflows if d.state == "hydrating"]
    for dataflow in hydrating:
        done = hydration(dataflow)
        if logged.get(dataflow.dataflow_id) == done:
            continue
        logged[dataflow.dataflow_id] = done
        log.info("dataflow_hydration_progress", dataflow=dataflow.dataflow_id, **_counts(done))
    for gone in logged.keys() - {d.dataflow_id for d in hydrating}:
        del logged[gone]


async def log_progress(
    queries: RunningQueries,
    dataflows: Callable[[], Iterable[Hydrating]],
    interval_s: float = 3.0,
) -> None:
    """Logs the progress of long peeks and of hydrations every ``interval_s``, until
    cancelled."""
    logged: dict[str, WorkDone] = {}
    while True:
        await asyncio.sleep(interval_s)
        try:
            log_once(queries, dataflows(), interval_s, logged)
        except Exception:  # a log line must not take the process down; the log has the bug
            log.exception("progress_log_failed")
