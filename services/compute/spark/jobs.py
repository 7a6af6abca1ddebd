"""Running one piece of bulk work as Spark jobs that can be cancelled and watched.

Every run gets a job group of its own. The action runs on a worker thread (PySpark pins a
Python thread to a JVM thread, so the group set there applies to the jobs that thread starts);
when the awaiting task is cancelled (the statement's deadline passed, its client went away),
the group is cancelled in Spark, which interrupts its running tasks and frees their slots, and
the thread returns with Spark's cancellation error shortly after.

:meth:`SparkJobs.progress` reads Spark's status tracker: the tasks done and in total over the
group's stages, which for a scan stage are the parts read, and the input rows the stages have
read (Spark's input metrics, from its status store: counted as tasks finish, and from the
executors' heartbeats while they run). Whoever starts work that may run
Spark jobs deep down (a peek, through :mod:`.queries`) learns their group by setting
:data:`run_observer` around it (``services/compute/progress.py`` does).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from pyspark.sql import SparkSession

from tidemark.logging import get_logger

log = get_logger("compute.spark.jobs")

T = TypeVar("T")

_numbers = itertools.count(1)

run_observer: ContextVar[Callable[[SparkJobs, str], None] | None] = ContextVar(
    "spark_run_observer", default=None
)
"""Told ``(jobs, group)`` when a run starts in the current context, so the work that led to it
can report its progress without the layers in between passing the group up."""
_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@dataclass(frozen=True)
class JobProgress:
    """How far a run has come: its Spark jobs, and the tasks of their stages."""

    group: str
    description: str
    jobs: int
    tasks_done: int
    tasks_total: int
    seconds: float
    rows_read: int = 0
    """Rows the group's stages have read from their inputs so far (0 where a source reports
    none)."""

    @property
    def fraction(self) -> float:
        """Tasks done over the tasks of the stages Spark has submitted so far: a group's
        jobs come one after the other (a schema lookup, a broadcast, adaptive execution's
        stages), so this can read 1.0 before the main work has begun."""
        return self.tasks_done / self.tasks_total if self.tasks_total else 0.0

    def read_fraction(self, rows_total: int) -> float:
        """The rows read over ``rows_total``, the rows of the inputs (at most 1.0): how far
        a run that reads its inputs once has come."""
        return min(1.0, self.rows_read / rows_total) if rows_total else 0.0


@dataclass
class _Run:
    group: str
    description: str
    started: float


class SparkJobs:
    """Runs actions on ``spark`` in job groups of their own, cancellable by cancelling the
    awaiting task."""

    def __init__(self, spark: SparkSession, prefix: str = "tidemark") -> None:
        self.spark = spark
        self.prefix = prefix
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def new_group(self) -> str:
        return f"{self.prefix}-{next(_numbers)}"

    async def run(
        self, action: Callable[[], T], description: str, *, group: str | None = None
    ) -> T:
        """``action()`` (which runs Spark jobs) on a worker thread, in a job group; cancelling
        the caller cancels the group."""
        group = group or self.new_group()
        context = self.spark.sparkContext
        run = _Run(group, description, time.monotonic())

        def in_group() -> T:
            context.setJobGroup(group, description, interruptOnCancel=True)
            try:
                return action()
            finally:
                # Worker threads are shared: later jobs started here must not join the group.
                for key in _GROUP_PROPERTIES:
                    context.setLocalProperty(key, None)  # type: ignore[arg-type]

        with self._lock:
            self._runs[group] = run
        observer = run_observer.get()
        if observer is not None:
            observer(self, group)
        try:
            return await asyncio.to_thread(in_group)
        except asyncio.CancelledError:
            context.cancelJobGroup(group)
            log.info("spark_job_group_cancelled", group=group, description=description)
            raise
        finally:
            with self._lock:
                self._runs.pop(group, None)

    def cancel(self, group: str) -> None:
        self.spark.sparkContext.cancelJobGroup(group)

    def progress(self, group: str) -> JobProgress | None:
        """The run's progress, or ``None`` when no run of that group is going on."""
        with self._lock:
            run = self._runs.get(group)
        if run is None:
            return None
        return self._progress(run)

    def running(self) -> list[JobProgress]:
        """The progress of every run going on."""
        with self._lock:
            runs = list(self._runs.values())
        return [self._progress(run) for run in runs]

    def _progress(self, run: _Run) -> JobProgress:
        tracker = self.spark.sparkContext.statusTracker()
        job_ids = tracker.getJobIdsForGroup(run.group)
        done = total = rows = 0
        for job_id in job_ids:
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
                    rows += self._rows_read(stage_id)
        return JobProgress(
            run.group,
            run.description,
            len(job_ids),
            done,
            total,
            time.monotonic() - run.started,
            rows,
        )

    def _rows_read(self, stage_id: int) -> int:
        """The input records of the stage's latest attempt. PySpark's tracker leaves the
        metrics out, so they come from the JVM's status store; 0 when it does not know the
        stage (not submitted yet) or cannot tell."""
        try:
            store = self.spark.sparkContext._jsc.sc().statusStore()
            return int(store.lastStageAttempt(stage_id).inputRecords())
        except Exception:  # NoSuchElementException through py4j, or a store without it
            return 0
