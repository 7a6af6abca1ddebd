"""One-shot queries as Spark jobs over storage's Parquet parts.

A query's plan is lowered to DataFrame operations (:mod:`.lowering`) over its inputs read
straight from the parts storage listed for the query's time (:mod:`.parts_source`): the
executors fetch the parts, scan only the columns the plan reads and compute the answer; the
driver receives only the answer, as Arrow. The run is a job group of its own
(:mod:`.jobs`): a statement that is cancelled or passes its deadline cancels its Spark jobs.

A listed part may be compacted away (and, after storage's grace period, deleted) while a long
query runs; the query then lists its inputs again and runs once more, as storage's own reads
do, waiting a little longer before each listing. One that loses that race on every run fails
as a race (Aborted: SQLSTATE 40001 at the adapter, run it again), not as a fault. Spark
running out of memory is ResourceExhausted (SQLSTATE 53200 at the adapter); Spark spills the
shuffles and aggregations that fit on disk first.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from services.compute.spark.jobs import JobProgress, SparkJobs
from services.compute.spark.lowering import DIFF, lower, release
from services.compute.spark.lowering.errors import translate
from services.compute.spark.parts_source import Relisting, collection_frame, missing_part
from tidemark.clients.storage import PartsListing
from tidemark.columnar import RelationSchema
from tidemark.columnar.schema import TIME_COLUMN, TIME_TYPE
from tidemark.errors import Aborted, ResourceExhausted, TidemarkError
from tidemark.logging import get_logger
from tidemark.v1 import plan_pb2

log = get_logger("compute.spark.queries")

_OUT_OF_MEMORY = ("java.lang.OutOfMemoryError", "SparkOutOfMemoryError", "UNABLE_TO_ACQUIRE_MEMORY")


@dataclass(frozen=True)
class QueryInput:
    """One collection a query reads: its parts at the query's time, and the column positions
    the plan reads (``None``: all)."""

    collection_id: str
    listing: PartsListing
    columns: Collection[int] | None = None

    @property
    def rows(self) -> int:
        """Rows in the listed parts (updates, before consolidation): the query's input size."""
        return sum(part.rows for part in self.listing.parts)


Relist = Callable[[str], Awaitable[PartsListing]]
"""Lists a collection's parts again (at the same time), after a part went missing."""


class SparkQueries:
    """Evaluates one-shot plans as Spark jobs on ``spark``."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.jobs = SparkJobs(spark, prefix="one-shot")

    def running(self) -> list[JobProgress]:
        return self.jobs.running()

    async def evaluate(
        self,
        plan: plan_pb2.Plan,
        schema: RelationSchema,
        inputs: Sequence[QueryInput],
        timestamp: int,
        relist: Relist,
    ) -> pa.Table:
        """The plan's output over ``inputs`` at ``timestamp``: ``schema``'s columns, ``time``
        (= ``timestamp``) and ``diff`` (each row once, its multiplicity)."""
        started = time.monotonic()
        rows_in = sum(i.rows for i in inputs)
        relisting = Relisting(log, "one_shot_relisting")
        while True:
            group = self.jobs.new_group()
            description = (
                f"one-shot at {timestamp} over {', '.join(i.collection_id for i in inputs)}"
            )
            try:
                answer = functools.partial(self._answer, plan, schema, list(inputs), timestamp)
                table = await self.jobs.run(answer, description, group=group)
            except Exception as exc:
                wait = relisting.wait_before_next(exc, group=group)
                if wait is not None:
                    await asyncio.sleep(wait)
                    inputs = [replace(i, listing=await relist(i.collection_id)) for i in inputs]
                    continue
                if not missing_part(exc):
                    raise translated_job_error(exc) from exc
                # A lost race, not a fault: the same query run again reads new parts.
                raise Aborted(
                    f"the parts of {', '.join(i.collection_id for i in inputs)} were "
                    f"compacted away under the query {relisting.attempt} times in a row; "
                    "run it again"
                ) from exc
            log.info(
                "spark_one_shot_done",
                group=group,
                rows_in=rows_in,
                rows_out=table.num_rows,
                seconds=round(time.monotonic() - started, 3),
            )
            return table

    def _answer(
        self,
        plan: plan_pb2.Plan,
        schema: RelationSchema,
        inputs: Sequence[QueryInput],
        timestamp: int,
    ) -> pa.Table:
        frames = {
            i.collection_id: collection_frame(
                self.spark, i.listing, columns=i.columns, consolidate=False
            )
            for i in inputs
        }
        kept: list[DataFrame] = []
        try:
            built = time.monotonic()
            frame = lower(plan, frames, self.spark, kept=kept)
            collected = time.monotonic()
            answer = frame.toArrow()
            # Where a query's time goes on the driver: building (analysing) the DataFrame,
            # and Spark's planning plus the job.
            log.debug(
                "spark_one_shot_phases",
                build_seconds=round(collected - built, 3),
                collect_seconds=round(time.monotonic() - collected, 3),
            )
        finally:
            release(kept)
        names = [c.name for c in schema.columns]
        times = pa.repeat(pa.scalar(timestamp, TIME_TYPE), answer.num_rows)
        data = [answer.column(i) for i in range(len(names))]
        diffs = answer.column(answer.num_columns - 1)
        assert answer.column_names[-1] == DIFF
        return pa.table([*data, times, diffs], names=[*names, TIME_COLUMN, DIFF]).cast(
            schema.update_schema()
        )


def translated_job_error(exc: Exception) -> Exception:
    """A failed Spark run as the error the caller reports (a Tidemark error is kept)."""
    if isinstance(exc, TidemarkError):
        return exc
    if any(marker in str(exc) for marker in _OUT_OF_MEMORY):
        return ResourceExhausted(
            "the query ran out of memory in Spark; narrow it, or give the cluster more memory"
        )
    return translate(exc) or exc
