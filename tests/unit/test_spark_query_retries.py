"""A one-shot query whose listed parts are compacted away under it lists again and reruns,
waiting a little longer each time; one that loses every run is a retryable race (Aborted,
SQLSTATE 40001 at the adapter), not an internal error. Spark's errors that are not Tidemark's
keep their cause in the message and their whole text in the log. No Spark runs here: the job
runner is a stand-in that fails the way Spark's jobs do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
import structlog

from services.compute.spark import queries as queries_module
from services.compute.spark.lowering.errors import translate
from services.compute.spark.parts_source import (
    LISTING_ATTEMPTS,
    MISSING_PART,
    Relisting,
    listing_backoff,
    missing_part,
)
from services.compute.spark.queries import QueryInput, SparkQueries
from tidemark.clients.storage import PartsListing
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.errors import Aborted, Internal
from tidemark.frontier import Antichain
from tidemark.logging import get_logger
from tidemark.v1 import plan_pb2

SCHEMA = RelationSchema((Column("k", ColumnType.INT64),))
LOG = get_logger("compute.test")


def listing(generation: int) -> PartsListing:
    return PartsListing(
        as_of=generation,
        schema=SCHEMA,
        blob_url="file:///nowhere",
        parts=[],
        retired_grace_ms=500,
        since=Antichain([0]),
        upper=Antichain([generation + 1]),
    )


class Py4JJavaError(Exception):
    """Shaped like py4j's: the call that failed, then the Java error it wraps."""


class FailingJobs:
    """Fails the first ``failures`` runs as a job over a compacted-away part does."""

    def __init__(self, failures: int, answer: pa.Table) -> None:
        self.failures = failures
        self.answer = answer
        self.runs = 0

    def new_group(self) -> str:
        return f"group-{self.runs}"

    async def run(self, action: Callable[[], Any], description: str, *, group: str) -> pa.Table:
        self.runs += 1
        if self.runs <= self.failures:
            raise Py4JJavaError(
                "An error occurred while calling o1.getResult.\n"
                f": org.apache.spark.SparkException: {MISSING_PART}: u1/part (compacted away)"
            )
        return self.answer


def queries_with(jobs: FailingJobs) -> SparkQueries:
    queries = SparkQueries.__new__(SparkQueries)
    queries.jobs = jobs  # type: ignore[assignment]
    return queries


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    waited: list[int] = []

    async def sleep(seconds: float) -> None:
        waited.append(round(seconds * 1000))

    monkeypatch.setattr(queries_module.asyncio, "sleep", sleep)
    return waited


async def evaluate(queries: SparkQueries, relisted: list[int]) -> pa.Table:
    async def relist(collection_id: str) -> PartsListing:
        relisted.append(len(relisted) + 1)
        return listing(len(relisted))

    return await queries.evaluate(
        plan_pb2.Plan(), SCHEMA, [QueryInput("u1", listing(0))], 7, relist
    )


async def test_a_query_lists_again_until_a_run_finds_its_parts(no_waiting: list[int]) -> None:
    answer = pa.table({"k": [1], "time": pa.array([7], pa.uint64()), "diff": [1]})
    jobs = FailingJobs(LISTING_ATTEMPTS - 1, answer)
    relisted: list[int] = []
    with structlog.testing.capture_logs() as logs:
        assert await evaluate(queries_with(jobs), relisted) is answer
    assert jobs.runs == LISTING_ATTEMPTS
    # Each relisting is logged with the job group of the run that lost its parts.
    assert [
        (e["attempt"], e["group"], e["component"])
        for e in logs
        if e["event"] == "one_shot_relisting"
    ] == [(a, f"group-{a - 1}", "compute.spark.queries") for a in range(1, LISTING_ATTEMPTS)]
    assert relisted == list(range(1, LISTING_ATTEMPTS))
    # The waits double: listing again at once tends to land in the same compaction burst.
    assert no_waiting == [round(listing_backoff(a) * 1000) for a in range(1, LISTING_ATTEMPTS)]
    assert no_waiting == sorted(no_waiting) and no_waiting[0] < no_waiting[-1]


async def test_a_query_that_loses_every_run_is_an_aborted_race() -> None:
    jobs = FailingJobs(LISTING_ATTEMPTS, pa.table({"k": [1]}))
    relisted: list[int] = []
    with pytest.raises(Aborted) as failure:
        await evaluate(queries_with(jobs), relisted)
    assert jobs.runs == LISTING_ATTEMPTS
    assert len(relisted) == LISTING_ATTEMPTS - 1
    assert "u1" in failure.value.message and "run it again" in failure.value.message
    assert f"{LISTING_ATTEMPTS} times in a row" in failure.value.message


class BrokenJobs(FailingJobs):
    """Fails every run as a job that hit a fault (not a part gone) does."""

    async def run(self, action: Callable[[], Any], description: str, *, group: str) -> pa.Table:
        self.runs += 1
        raise Py4JJavaError(
            "An error occurred while calling o1.getResult.\n"
            ": org.apache.spark.SparkException: Job aborted: executor lost"
        )


async def test_a_query_that_fails_otherwise_fails_at_once_with_the_cause() -> None:
    jobs = BrokenJobs(0, pa.table({"k": [1]}))
    relisted: list[int] = []
    with pytest.raises(Internal) as failure:
        await evaluate(queries_with(jobs), relisted)
    assert jobs.runs == 1 and relisted == []
    assert "Job aborted: executor lost" in failure.value.message


def test_a_java_error_names_its_cause_and_is_logged_whole() -> None:
    text = (
        "An error occurred while calling o13848.getResult.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: lost task\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:1)\n"
        "Caused by: java.io.IOException: worker crashed\n"
    )
    with structlog.testing.capture_logs() as logs:
        translated = translate(Py4JJavaError(text))
    assert isinstance(translated, Internal)
    assert translated.message == (
        "Spark failed: An error occurred while calling o13848.getResult. "
        "org.apache.spark.SparkException: Job aborted due to stage failure: lost task"
    )
    logged = [entry for entry in logs if entry["event"] == "spark_failed"]
    assert (
        len(logged) == 1 and "Caused by: java.io.IOException: worker crashed" in logged[0]["error"]
    )


def test_a_long_cause_is_cut_in_the_message() -> None:
    translated = translate(Py4JJavaError("An error occurred.\n: " + "x" * 5000))
    assert isinstance(translated, Internal)
    assert len(translated.message) < 450 and translated.message.endswith("…")


def test_errors_that_are_not_sparks_are_left_alone() -> None:
    assert translate(ValueError("no")) is None


@pytest.mark.parametrize(
    "cause",
    [
        # Gone when the task opened it (local directory, S3 through s3a).
        "org.apache.spark.SparkException: [FAILED_READ_FILE.FILE_NOT_EXIST] Encountered error "
        "while reading file file:///b/shards/u4/1.parquet. File does not exist.",
        # Gone while the task read it: Spark has no hint, the file system's error says why.
        "org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error while "
        "reading file file:///b/shards/u4/1.parquet.  SQLSTATE: KD001\n"
        "Caused by: java.nio.file.NoSuchFileException: /b/shards/u4/1.parquet",
        "Caused by: java.io.FileNotFoundException: No such file or directory: s3a://b/u4/1.parquet",
        "org.apache.spark.sql.AnalysisException: [PATH_NOT_FOUND] Path does not exist: file:/b/1",
        f"org.apache.spark.api.python.PythonException: MissingPart: {MISSING_PART}: u4/1.parquet",
    ],
)
def test_a_part_gone_under_a_job_is_recognised_however_spark_words_it(cause: str) -> None:
    text = f"An error occurred while calling o14692.getResult.\n: {cause}\n\tat x.y(z.scala:1)"
    assert missing_part(Py4JJavaError(text))


def test_other_read_failures_are_not_a_missing_part() -> None:
    text = (
        "An error occurred while calling o1.getResult.\n: org.apache.spark.SparkException: "
        "[FAILED_READ_FILE.NO_HINT] Encountered error while reading file file:///b/1.parquet.\n"
        "Caused by: org.apache.parquet.io.ParquetDecodingException: Can not read value at 0"
    )
    assert not missing_part(Py4JJavaError(text))


# -- Relisting: the retry policy the query, hydration and a shard's rebuild share -------------


def gone(run: int) -> Exception:
    return Py4JJavaError(f"An error occurred.\n: {MISSING_PART}: u1/part-{run} (compacted away)")


def test_relisting_waits_longer_each_run_and_stops_after_the_last() -> None:
    relisting = Relisting(LOG, "rebuild_listed_again", dataflow="d1")
    with structlog.testing.capture_logs() as logs:
        waits = [relisting.wait_before_next(gone(run)) for run in range(1, LISTING_ATTEMPTS + 2)]
    allowed = [listing_backoff(a) for a in range(1, LISTING_ATTEMPTS)]
    # Runs 1..LISTING_ATTEMPTS-1 are followed by another; the last one's failure stands, and
    # so does any asked about after it.
    assert waits == [*allowed, None, None]
    assert allowed == sorted(allowed) and allowed[0] == 0.1
    assert relisting.used_up and relisting.attempt == LISTING_ATTEMPTS
    # Logged by the caller's logger (its component), with the caller's fields.
    assert [(e["event"], e["attempt"], e["dataflow"], e["component"]) for e in logs] == [
        ("rebuild_listed_again", a, "d1", "compute.test") for a in range(1, LISTING_ATTEMPTS)
    ]


def test_relisting_lets_any_other_failure_stand_at_once() -> None:
    relisting = Relisting(LOG, "hydration_listed_again")
    decoding = Py4JJavaError("Caused by: org.apache.parquet.io.ParquetDecodingException: bad")
    assert relisting.wait_before_next(decoding) is None
    assert relisting.attempt == 1 and not relisting.used_up
    # The count is the runs': a real failure does not use one up.
    assert relisting.wait_before_next(gone(1)) == listing_backoff(1)
    assert relisting.attempt == 2
