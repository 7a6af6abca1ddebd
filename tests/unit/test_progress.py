"""Progress of long work, without Spark: Spark's status tracker read into tasks done (a fake
tracker), tasks scaled into parts and rows done, a peek's progress while it waits for
hydrating dataflows and while Spark runs it, the log lines, and the adapter answering
StatementProgress from compute's report."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import structlog

from services.adapter.progress import RunningStatements, peek_name
from services.compute.progress import RunningQueries, WorkDone, log_once, scaled
from services.compute.spark.jobs import JobProgress, SparkJobs
from tidemark.clients.compute import ComputeClient, QueryInfo
from tidemark.errors import Unavailable

# -- a fake Spark ---------------------------------------------------------------------------


@dataclass
class FakeStage:
    numTasks: int
    numCompletedTasks: int = 0


@dataclass
class FakeJob:
    stageIds: list[int]


@dataclass
class FakeTracker:
    """Spark's status tracker, as ``SparkJobs`` reads it: jobs by group, stages by job; and
    the input rows by stage, which the JVM's status store holds (absent: it cannot tell)."""

    groups: dict[str, list[int]] = field(default_factory=dict)
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    stages: dict[int, FakeStage] = field(default_factory=dict)
    rows_read: dict[int, int] | None = None

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return list(self.groups.get(group, []))

    def getJobInfo(self, job_id: int) -> FakeJob | None:
        return self.jobs.get(job_id)

    def getStageInfo(self, stage_id: int) -> FakeStage | None:
        return self.stages.get(stage_id)


class FakeStageData:
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def inputRecords(self) -> int:
        return self.rows


class FakeStatusStore:
    def __init__(self, tracker: FakeTracker) -> None:
        self.tracker = tracker

    def lastStageAttempt(self, stage_id: int) -> FakeStageData:
        if self.tracker.rows_read is None:
            raise AttributeError("no status store")
        if stage_id not in self.tracker.rows_read:
            raise LookupError(f"no stage {stage_id}")  # py4j's NoSuchElementException
        return FakeStageData(self.tracker.rows_read[stage_id])


class FakeJvmContext:
    def __init__(self, tracker: FakeTracker) -> None:
        self.store = FakeStatusStore(tracker)

    def sc(self) -> FakeJvmContext:
        return self

    def statusStore(self) -> FakeStatusStore:
        return self.store


class FakeContext:
    def __init__(self, tracker: FakeTracker) -> None:
        self.tracker = tracker
        self.groups: list[str] = []
        self._jsc = FakeJvmContext(tracker)

    def statusTracker(self) -> FakeTracker:
        return self.tracker

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool) -> None:
        self.groups.append(group)

    def setLocalProperty(self, key: str, value: Any) -> None:
        pass

    def cancelJobGroup(self, group: str) -> None:
        pass


class FakeSpark:
    def __init__(self, tracker: FakeTracker) -> None:
        self.sparkContext = FakeContext(tracker)


def fake_jobs(tracker: FakeTracker) -> SparkJobs:
    return SparkJobs(FakeSpark(tracker), prefix="fake")  # type: ignore[arg-type]


# -- tasks, parts and rows ------------------------------------------------------------------


async def test_progress_counts_the_tasks_of_every_stage_of_the_group() -> None:
    tracker = FakeTracker()
    jobs = fake_jobs(tracker)
    group = jobs.new_group()
    release = threading.Event()
    running = asyncio.create_task(jobs.run(release.wait, "scan and sum", group=group))
    await asyncio.sleep(0)  # the run registers its group as it starts
    assert jobs.progress(group) is not None
    # Two jobs: a scan of 8 tasks (5 done) and a final stage of 2 (none done); another
    # group's job does not count.
    tracker.groups = {group: [1, 2], "other": [3]}
    tracker.jobs = {1: FakeJob([10]), 2: FakeJob([11, 12]), 3: FakeJob([13])}
    tracker.stages = {10: FakeStage(8, 5), 11: FakeStage(2), 13: FakeStage(100, 100)}
    progress = jobs.progress(group)
    assert progress is not None
    assert (progress.jobs, progress.tasks_done, progress.tasks_total) == (2, 5, 10)
    assert progress.description == "scan and sum" and progress.fraction == 0.5
    assert progress.rows_read == 0  # no status store to tell
    # The rows read: the scan's, from the status store (the pending stage 12 is unknown).
    tracker.rows_read = {10: 5000, 11: 0, 13: 99}
    progress = jobs.progress(group)
    assert progress is not None and progress.rows_read == 5000
    assert progress.read_fraction(20_000) == 0.25 and progress.read_fraction(0) == 0.0
    assert progress.read_fraction(4000) == 1.0
    assert [p.group for p in jobs.running()] == [group]
    release.set()
    await running
    assert jobs.progress(group) is None and jobs.running() == []


def test_rows_read_count_the_rows_and_parts_done() -> None:
    def job(rows_read: int) -> JobProgress:
        return JobProgress("g", "", 2, 1, 3, 1.0, rows_read)

    # A broadcast of one input done, the other's scan running: half the rows, half the parts.
    assert scaled(job(100_000), 2, 200_000) == WorkDone(1, 2, 100_000, 200_000)
    assert scaled(job(150_000), 40, 200_000) == WorkDone(30, 40, 150_000, 200_000)
    # An input read twice (a self-join) counts once.
    assert scaled(job(400_000), 40, 200_000) == WorkDone(40, 40, 200_000, 200_000)
    # Helper jobs done and nothing read yet: nothing done, however many tasks are.
    assert scaled(JobProgress("g", "", 1, 1, 1, 1.0), 40, 200_000) == WorkDone(0, 40, 0, 200_000)
    assert scaled(job(0), 0, 0) == WorkDone()


# -- a peek's progress ----------------------------------------------------------------------


@dataclass
class FakeDataflow:
    dataflow_id: str
    state: str = "hydrating"
    hydrated_rows: int = 0
    hydration_rows_total: int = 0
    hydration_parts_done: int = 0
    hydration_parts_total: int = 0


def test_a_waiting_peek_reports_the_hydration_of_the_dataflows_it_waits_for() -> None:
    now = [100.0]
    queries = RunningQueries(clock=lambda: now[0])
    fresh = FakeDataflow("u7", hydrated_rows=1200, hydration_rows_total=4000)
    fresh.hydration_parts_done, fresh.hydration_parts_total = 3, 10
    other = FakeDataflow("u8", hydrated_rows=5, hydration_rows_total=50)
    other.hydration_parts_done, other.hydration_parts_total = 1, 2
    done = FakeDataflow("u9", state="running", hydrated_rows=99, hydration_rows_total=99)
    with queries.track("q1") as watch:
        watch.waiting_for = [fresh, other, done]
        now[0] += 2.5
        (status,) = queries.statuses(["q1"])
        assert status.state == "waiting" and list(status.waiting_for) == ["u7", "u8"]
        assert (status.parts_done, status.parts_total) == (4, 12)
        assert (status.rows_done, status.rows_total) == (1205, 4050)
        assert status.elapsed_ms == 2500 and status.spark_job_group == ""
        watch.evaluating()
        (status,) = queries.statuses()
        assert status.state == "running" and list(status.waiting_for) == []
        assert (status.parts_total, status.rows_total) == (0, 0)
    assert queries.statuses() == [] and queries.statuses(["q1"]) == []


async def test_a_peek_on_spark_reports_its_job_and_never_goes_back() -> None:
    tracker = FakeTracker()
    jobs = fake_jobs(tracker)
    queries = RunningQueries()
    release = threading.Event()
    with queries.track("q2") as watch:
        watch.evaluating(parts_total=40, rows_total=4_000_000)
        # The run joins the peek by the context it starts in, not by a parameter.
        running = asyncio.create_task(jobs.run(release.wait, "one-shot"))
        await asyncio.sleep(0)
        assert watch.spark is not None
        group = watch.spark[1]
        tracker.groups = {group: [1]}
        tracker.jobs = {1: FakeJob([10])}
        tracker.stages = {10: FakeStage(10, 5)}
        tracker.rows_read = {10: 1_000_000}
        (status,) = queries.statuses(["q2"])
        assert status.state == "running" and status.spark_job_group == group
        assert (status.parts_done, status.parts_total) == (10, 40)
        assert (status.rows_done, status.rows_total) == (1_000_000, 4_000_000)
        # A job that reads nothing (a schema lookup) and is done adds nothing.
        tracker.groups = {group: [1, 2]}
        tracker.jobs = {1: FakeJob([10]), 2: FakeJob([11])}
        tracker.stages = {10: FakeStage(10, 5), 11: FakeStage(1, 1)}
        tracker.rows_read = {10: 2_000_000, 11: 0}
        (status,) = queries.statuses(["q2"])
        assert (status.parts_done, status.rows_done) == (20, 2_000_000)
        # A status store that cannot tell (a stage retried, the store gone): the report
        # stands, it does not go back.
        tracker.rows_read = None
        (status,) = queries.statuses(["q2"])
        assert (status.parts_done, status.rows_done) == (20, 2_000_000)
        tracker.rows_read = {10: 4_000_000, 11: 0}
        (status,) = queries.statuses(["q2"])
        assert (status.parts_done, status.rows_done) == (40, 4_000_000)
        release.set()
        await running
        # The run is over but the peek not yet (its answer is being encoded): the last
        # report stands.
        (status,) = queries.statuses(["q2"])
        assert (status.parts_done, status.parts_total) == (40, 40)


def test_peeks_under_one_id_are_both_tracked() -> None:
    queries = RunningQueries()
    with queries.track("same") as first, queries.track("same") as second:
        assert first.query_id == "same" and second.query_id.startswith("same#")
        assert {s.query_id for s in queries.statuses()} == {first.query_id, second.query_id}
    with queries.track() as unnamed:
        assert unnamed.query_id.startswith("peek-")


def test_long_peeks_and_hydrating_dataflows_are_logged() -> None:
    now = [0.0]
    queries = RunningQueries(clock=lambda: now[0])
    hydrating = FakeDataflow("u7", hydrated_rows=10, hydration_rows_total=40)
    hydrating.hydration_parts_done, hydrating.hydration_parts_total = 1, 4
    with queries.track("short"), queries.track("long") as long:
        long.evaluating(parts_total=2, rows_total=20)
        now[0] = 5.0
        with queries.track("new"), structlog.testing.capture_logs() as logs:
            log_once(queries, [hydrating, FakeDataflow("u8", state="running")], 3.0)
    peeks = {r["query"]: r for r in logs if r["event"] == "peek_progress"}
    assert set(peeks) == {"short", "long"}
    assert peeks["long"]["state"] == "running" and peeks["long"]["parts_total"] == 2
    assert peeks["long"]["rows_total"] == 20 and peeks["long"]["seconds"] == 5.0
    assert peeks["short"]["state"] == "waiting"
    hydrations = [r for r in logs if r["event"] == "dataflow_hydration_progress"]
    assert hydrations == [
        {
            "event": "dataflow_hydration_progress",
            "log_level": "info",
            "component": "compute.progress",
            "dataflow": "u7",
            "parts_done": 1,
            "parts_total": 4,
            "rows_done": 10,
            "rows_total": 40,
        }
    ]


def test_a_hydration_is_logged_again_only_once_it_moves() -> None:
    queries = RunningQueries()
    hydrating = FakeDataflow("u7", hydrated_rows=10, hydration_rows_total=40)
    logged: dict[str, WorkDone] = {}
    with structlog.testing.capture_logs() as logs:
        log_once(queries, [hydrating], 3.0, logged)
        log_once(queries, [hydrating], 3.0, logged)  # stalled: no second line
        hydrating.hydrated_rows = 30
        log_once(queries, [hydrating], 3.0, logged)
        hydrating.state = "running"
        log_once(queries, [hydrating], 3.0, logged)
    assert [r["rows_done"] for r in logs] == [10, 30]
    assert logged == {}


# -- the adapter's StatementProgress --------------------------------------------------------


class FakeCompute:
    def __init__(self, answer: QueryInfo | Exception | None) -> None:
        self.answer = answer
        self.asked: list[str] = []

    async def query_progress(self, query_id: str) -> QueryInfo | None:
        self.asked.append(query_id)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def query_info(query_id: str) -> QueryInfo:
    return QueryInfo(query_id, "waiting", ["u7"], 3, 10, 1200, 4000, 2500, "")


async def test_statement_progress_asks_compute_about_the_peek_in_flight() -> None:
    now = [10.0]
    statements = RunningStatements(clock=lambda: now[0])
    compute = FakeCompute(None)
    client: ComputeClient = compute  # type: ignore[assignment]
    with peek_name(client) as query_id:
        assert query_id == ""  # nobody follows this statement
    with statements.running("s1", "alice") as activity:
        assert activity is not None
        activity.statement = "SELECT count(*) FROM big"
        now[0] = 13.0
        answer = await statements.progress("s1", "alice")
        assert answer.running and answer.statement == "SELECT count(*) FROM big"
        assert answer.elapsed_ms == 3000 and answer.state == "" and compute.asked == []
        with peek_name(client) as query_id:
            assert query_id.startswith("stmt-")
            compute.answer = query_info(query_id)
            answer = await statements.progress("s1", "alice")
            assert compute.asked == [query_id]
            assert answer.state == "waiting" and list(answer.waiting_for) == ["u7"]
            assert (answer.parts_done, answer.parts_total) == (3, 10)
            assert (answer.rows_done, answer.rows_total) == (1200, 4000)
            # Another user does not learn about it; a compute that cannot tell leaves the
            # answer without counts.
            assert not (await statements.progress("s1", "mallory")).running
            compute.answer = Unavailable("compute is restarting")
            answer = await statements.progress("s1", "alice")
            assert answer.running and answer.parts_total == 0
        assert activity.peek is None
    assert not (await statements.progress("s1", "alice")).running
    with statements.running("", "alice") as nothing:
        assert nothing is None
