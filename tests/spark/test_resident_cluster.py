"""The resident cluster's life: tasks that die or fall silent are reported clearly, tasks
whose driver falls silent end by themselves, a start waits for slots still coming up, and
stopping a cluster gives its task slots back to Spark."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable

import pytest
import structlog
from pyspark.sql import SparkSession

from services.compute.dataflow.batch import Row, Update
from services.compute.dataflow.dataflow import Dataflow
from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark import requests as rq
from services.compute.spark.liveness import Liveness
from services.compute.spark.session import local_slots
from services.compute.spark.spark_dataflow import hydrated_shard, index_share
from services.compute.spark.wire import TOKEN_BYTES, Hello, authenticate, send_hello, send_message
from tests.support.compute import contents_at
from tests.support.reference_eval import canonical, evaluate
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import FailedPrecondition, Unavailable
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

NUMBERS = RelationSchema.of(("n", T.INT64))


def counted() -> plan_pb2.Relation:
    return pb.reduce(pb.get("numbers", NUMBERS), [0], [pb.aggregate("count")])


def slots(spark: SparkSession) -> int:
    match = re.fullmatch(r"local\[(\d+)\]", spark.sparkContext.master or "")
    assert match, "these tests run on a local[N] session"
    return int(match.group(1))


def test_a_killed_task_is_reported_and_stopping_frees_the_slots(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    doomed = ResidentCluster(spark, 2)
    doomed.start()
    dataflow = SparkDataflow(counted(), as_of=0, cluster=doomed)
    out, _ = dataflow.hydrate({"numbers": [((1,), 0, 1), ((2,), 0, 1), ((2,), 0, 1)]})
    assert out == [((1, 1), 0, 1), ((2, 2), 0, 1)]
    victim = doomed.task_pids[1]
    assert victim != os.getpid() and len(set(doomed.task_pids)) == 2

    os.kill(victim, signal.SIGKILL)
    with pytest.raises(Unavailable, match="resident task of shard 1 is gone"):
        dataflow.step({"numbers": [((3,), 1, 1)]}, 2)
    with pytest.raises(Unavailable, match="shard 1 is gone"):  # and it stays failed
        doomed.stats(dataflow.dataflow_id)
    assert doomed.failure is not None
    doomed.stop()

    # Each shard's job needs a slot: a cluster as wide as every slot not held by the
    # shared cluster only starts if the dead cluster's slots came back.
    with ResidentCluster(spark, slots(spark) - cluster.shards, connect_timeout=60) as wide:
        flow = SparkDataflow(counted(), as_of=0, cluster=wide)
        numbers = [((n,), 0, 1) for n in range(20)]
        assert flow.hydrate({"numbers": numbers})[0] == [((n, 1), 0, 1) for n in range(20)]
        assert flow.key_count() == 20
    assert spark.range(10).count() == 10


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def assert_free_slots(spark: SparkSession, cluster: ResidentCluster) -> None:
    """A cluster as wide as every slot the shared cluster does not hold starts: no slot
    is held by anything else."""
    with ResidentCluster(spark, slots(spark) - cluster.shards, connect_timeout=60) as wide:
        flow = SparkDataflow(counted(), as_of=0, cluster=wide)
        assert flow.hydrate({"numbers": [((7,), 0, 1)]})[0] == [((7, 1), 0, 1)]


QUICK = Liveness(heartbeat_s=0.5, deadline_s=5.0)


def test_a_stopped_task_fails_the_next_call_instead_of_hanging_it(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    doomed = ResidentCluster(spark, 2, liveness=QUICK)
    doomed.start()
    dataflow = SparkDataflow(counted(), as_of=0, cluster=doomed)
    assert dataflow.hydrate({"numbers": [((1,), 0, 1)]})[0] == [((1, 1), 0, 1)]
    victim = doomed.task_pids[1]
    os.kill(victim, signal.SIGSTOP)  # alive to the kernel (its socket stays open), but mute
    try:
        with pytest.raises(Unavailable, match="resident task of shard 1 said nothing for"):
            dataflow.step({"numbers": [((2,), 1, 1)]}, 2)
        assert doomed.failure is not None and "shard 1" in doomed.failure
        doomed.stop()
    finally:
        os.kill(victim, signal.SIGCONT)
    # Spark took the tasks' slots back: the cluster can be replaced.
    assert_free_slots(spark, cluster)


def test_a_task_killed_mid_step_fails_the_step_instead_of_hanging_its_peers(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    doomed = ResidentCluster(spark, 2, liveness=QUICK)
    doomed.start()
    dataflow = SparkDataflow(counted(), as_of=0, cluster=doomed)
    assert dataflow.hydrate({"numbers": [((1,), 0, 1)]})[0] == [((1, 1), 0, 1)]
    # A step long enough to be under way when its shard 1 dies: shard 0 then waits on the
    # mesh for shard 1's part, or is sending it its own.
    numbers = [((n % 50_000,), 1, 1) for n in range(400_000)]
    outcome: list[BaseException | None] = []

    def step() -> None:
        try:
            dataflow.step({"numbers": numbers}, 2)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    stepping = threading.Thread(target=step, daemon=True)
    stepping.start()
    time.sleep(0.3)
    os.kill(doomed.task_pids[1], signal.SIGKILL)
    stepping.join(10 * QUICK.deadline_s)
    assert not stepping.is_alive(), "the step hangs"
    [error] = outcome
    assert isinstance(error, Unavailable)
    assert "resident task of shard 1 is gone" in error.message
    assert doomed.failure is not None and "shard 1" in doomed.failure
    doomed.stop()
    assert_free_slots(spark, cluster)


def test_an_idle_task_that_stops_is_noticed_without_a_call(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    idle = ResidentCluster(spark, 2, liveness=QUICK)
    idle.start()
    victim = idle.task_pids[0]
    os.kill(victim, signal.SIGSTOP)
    try:
        # Nothing is asked of the tasks: the driver's keepalive notices the missing beats.
        wait_until(lambda: idle.failure is not None, 60 * QUICK.deadline_s, "never noticed")
        assert idle.failure is not None
        assert idle.failure.startswith("the resident task of shard 0 said nothing for")
        with pytest.raises(Unavailable, match="shard 0 said nothing"):
            idle.stats("any")
        idle.stop()
    finally:
        os.kill(victim, signal.SIGCONT)


def test_a_lost_task_is_replaced_while_its_peer_keeps_its_process_and_state(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    """With ``replace_lost``, a task killed between rounds is replaced: a new job for its
    shard, a new task in the mesh, the dataflow's shard rebuilt there (here a rebuild that
    takes longer than the deadline, of a state that is empty, so nothing is loaded), and
    steps go on exactly; the other task keeps its process and its state."""
    resident = ResidentCluster(spark, 2, liveness=QUICK, replace_lost=True)
    resident.start()
    try:
        dataflow = SparkDataflow(counted(), as_of=0, cluster=resident)
        assert dataflow.hydrate({"numbers": []})[0] == []
        rebuilt: list[tuple[int, int]] = []

        def rebuild(shard: int, at: int, ask: Callable[[rq.Request], object]) -> None:
            # Longer than the deadline: the keepalive must go on pinging the other task
            # (and the new one) meanwhile.
            time.sleep(2 * QUICK.deadline_s)
            rebuilt.append((shard, at))

        dataflow.rebuild = rebuild
        survivor, victim = resident.task_pids
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: resident.shard_restores == 1, 120, "the task was not replaced")
        assert rebuilt == [(1, 0)] and dataflow.shard_restores == 1
        assert resident.task_pids[0] == survivor and resident.task_pids[1] not in (0, victim)
        numbers = [((n % 7,), 1, 1) for n in range(40)]
        out, _ = dataflow.step({"numbers": numbers}, 2)
        assert out == [((n, 6 if n < 5 else 5), 1, 1) for n in range(7)]
        assert resident.failure is None and resident.task_pids[0] == survivor
    finally:
        resident.stop()


PAIRS = RelationSchema.of(("k", T.INT64), ("v", T.INT64))


def constant_totals() -> plan_pb2.Relation:
    """A plan of constants holding state in two operators: a distinct (each row is there
    twice), then a count and a sum by key."""
    rows = [[n % 5, n] for n in range(40)] * 2
    distinct = pb.distinct(pb.constant(PAIRS, rows))
    return pb.reduce(distinct, [0], [pb.aggregate("count"), pb.aggregate("sum", 1)])


def rebuilt_in_process(
    flow: SparkDataflow, history: list[Update], before: Callable[[], None] = lambda: None
) -> Callable[[int, int, Callable[[rq.Request], object]], None]:
    """A rebuild of ``flow``'s shard from its input's ``history`` (a few rows, held here),
    hydrated in process at the time asked and loaded with ``LoadRows``: what the bulk path
    does by Spark from storage's parts. ``before`` runs first (a test holds it there)."""

    def rebuild(shard: int, at: int, ask: Callable[[rq.Request], object]) -> None:
        before()
        snapshot = [update for update in history if update[1] <= at]
        nodes, output = hydrated_shard(flow.plan, at, shard, flow.shards, {"numbers": snapshot})
        assert flow.index_key_columns is not None
        index = index_share(output, flow.index_key_columns, shard, flow.shards)
        ask(rq.LoadRows(flow.dataflow_id, nodes, index, at + 1))

    return rebuild


def outputs_at(flow: SparkDataflow, history: list[Update], times: range) -> None:
    """The index of ``flow`` at each time holds what the reference evaluator gives."""
    for at in times:
        expected = canonical(evaluate(flow.plan, {"numbers": contents_at(history, at)}))
        assert canonical(flow.peek(at)) == expected, f"{flow.dataflow_id} at {at}"


def test_every_dataflow_resumes_once_its_own_shard_is_rebuilt(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    """A task lost between rounds costs no dataflow: a plan of constants gets its shard
    back from the driver (no Spark job, no parts), and each dataflow steps again as soon as
    its own shard is rebuilt, while another one's rebuild is still held; the held one's
    step waits for its rebuild and then counts exactly once."""
    resident = ResidentCluster(spark, 2, liveness=QUICK, replace_lost=True)
    resident.start()
    try:
        constants = SparkDataflow(constant_totals(), as_of=0, cluster=resident)
        constants_indexed = SparkDataflow(
            constant_totals(), as_of=0, cluster=resident, index_key_columns=[0]
        )
        expected = canonical(evaluate(constant_totals(), {}))
        assert len(expected) == 5
        for flow in (constants, constants_indexed):
            out, _ = flow.hydrate({})
            assert canonical({row: diff for row, _, diff in out}) == expected
            assert flow.step({}, 4) == ([], 4)  # no input: nothing runs, the upper moves
        held = SparkDataflow(counted(), as_of=0, cluster=resident, index_key_columns=[0])
        quick = SparkDataflow(counted(), as_of=0, cluster=resident, index_key_columns=[0])
        history: list[Update] = [((n % 7,), 0, 1) for n in range(30)]
        for flow in (held, quick):
            flow.hydrate({"numbers": list(history)})
        first: list[Update] = [((n % 3,), 1, 1) for n in range(9)]
        for flow in (held, quick):
            flow.step({"numbers": first}, 2)
        history += first

        started, release = threading.Event(), threading.Event()
        held.rebuild = rebuilt_in_process(held, history, lambda: (started.set(), release.wait(120)))
        quick.rebuild = rebuilt_in_process(quick, history)
        survivor, victim = resident.task_pids
        os.kill(victim, signal.SIGKILL)
        wait_until(started.is_set, 120, "the held dataflow's rebuild did not start")
        wait_until(
            lambda: (
                not any(
                    resident.rebuilding(flow.dataflow_id)
                    for flow in (quick, constants, constants_indexed)
                )
            ),
            120,
            "the other dataflows' shards were not rebuilt",
        )
        # The held dataflow's rebuild still waits, and the others go on meanwhile.
        assert resident.rebuilding(held.dataflow_id) and resident.shard_restores == 0
        second: list[Update] = [((n % 9,), 2, -1 if n % 4 == 0 else 1) for n in range(18)]
        out, _ = quick.step({"numbers": second}, 3)
        before = canonical(evaluate(quick.plan, {"numbers": contents_at(history, 2)}))
        after = canonical(evaluate(quick.plan, {"numbers": contents_at(history + second, 3)}))
        changes: dict[Row, int] = {}
        for row, at, diff in out:
            assert at == 2
            changes[row] = changes.get(row, 0) + diff
        for row in before.keys() | after.keys():
            assert changes.get(row, 0) == after.get(row, 0) - before.get(row, 0), row
        for at in range(4):
            assert canonical(constants_indexed.peek(at)) == expected
        # Every shard of the constants holds its state again, as hydration left it.
        reference = Dataflow(constant_totals(), as_of=0, shards=2)
        reference.hydrate({})
        for flow in (constants, constants_indexed):
            assert flow.key_count() == reference.key_count() > 0
            assert flow.state_size().rows == reference.state_size().rows

        stepped: list[tuple[list[Update], int]] = []
        stepping = threading.Thread(
            target=lambda: stepped.append(held.step({"numbers": second}, 3)), daemon=True
        )
        stepping.start()
        assert resident.rebuilding(held.dataflow_id)
        release.set()
        stepping.join(120)
        assert stepped and sorted(stepped[0][0]) == sorted(out)
        history += second
        outputs_at(quick, history, range(quick.index_floor, 3))
        outputs_at(held, history, range(held.index_floor, 3))
        assert held.index_floor == quick.index_floor == 1  # rebuilt as of upper - 1
        assert resident.shard_restores == 1 and resident.failure is None
        assert [f.shard_restores for f in (constants, constants_indexed, held, quick)] == [1] * 4
        assert resident.task_pids[0] == survivor and resident.task_pids[1] != victim
        for flow in (constants, constants_indexed, held, quick):
            flow.drop()
    finally:
        resident.stop()


def test_a_task_lost_again_while_a_rebuild_waits_gets_it_done_for_the_newer_task(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    """The task replacing a lost one is lost in turn while a dataflow's rebuild for it has
    not reached it yet: that rebuild finds itself superseded and runs again for the newest
    task, every dataflow is rebuilt there, and steps go on exactly, without failing the
    cluster."""
    resident = ResidentCluster(spark, 2, liveness=QUICK, replace_lost=True)
    resident.start()
    try:
        constants = SparkDataflow(
            constant_totals(), as_of=0, cluster=resident, index_key_columns=[0]
        )
        constants.hydrate({})
        held = SparkDataflow(counted(), as_of=0, cluster=resident, index_key_columns=[0])
        history: list[Update] = [((n % 4,), 0, 1) for n in range(10)]
        held.hydrate({"numbers": list(history)})
        attempts: list[int] = []
        release = threading.Event()

        def hold() -> None:
            attempts.append(len(attempts) + 1)
            release.wait(120)

        held.rebuild = rebuilt_in_process(held, history, hold)
        survivor, victim = resident.task_pids
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: attempts == [1], 120, "the held rebuild did not start")
        wait_until(lambda: not resident.rebuilding(constants.dataflow_id), 120, "constants")
        first = resident.task_pids[1]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: resident.task_pids[1] not in (victim, first), 120, "not replaced again")
        release.set()
        wait_until(lambda: not resident.rebuilding(held.dataflow_id), 120, "held")
        assert attempts == [1, 2]  # the first attempt was for the task lost since
        assert resident.failure is None and resident.shard_restores == 2
        assert (constants.shard_restores, held.shard_restores) == (2, 1)
        step: list[Update] = [((n % 6,), 1, 1) for n in range(12)]
        held.step({"numbers": step}, 2)
        history += step
        outputs_at(held, history, range(held.index_floor, 2))
        expected = canonical(evaluate(constant_totals(), {}))
        assert canonical(constants.peek(0)) == expected
        assert resident.task_pids[0] == survivor
    finally:
        resident.stop()


@pytest.mark.parametrize("second", ["new task", "survivor"])
def test_a_task_lost_while_the_step_in_flight_is_rebuilt_starts_the_replacement_over(
    spark: SparkSession, cluster: ResidentCluster, second: str
) -> None:
    """A task dies under a step; while the dataflow in flight is rebuilt on its replacement
    (under the request lock, the survivor waiting on the mesh for the step), a second task
    dies. The new one: the replacement starts over with a third task. The survivor: it is
    found lost when the step is sent again, and replaced in turn. Either way the step
    completes exactly, and later steps too. The keepalive is slow here, so that the step,
    not the keepalive, finds the first loss."""
    slow = Liveness(heartbeat_s=30.0, deadline_s=60.0)
    resident = ResidentCluster(spark, 2, liveness=slow, replace_lost=True)
    resident.start()
    try:
        flow = SparkDataflow(counted(), as_of=0, cluster=resident, index_key_columns=[0])
        history: list[Update] = [((n % 4,), 0, 1) for n in range(10)]
        flow.hydrate({"numbers": list(history)})
        survivor, victim = resident.task_pids
        killed: list[int] = []
        rebuilt_on: list[str] = []  # the threads the rebuilds ran on

        def second_loss() -> None:
            # On the step's own thread: the rebuild of the dataflow in flight.
            rebuilt_on.append(threading.current_thread().name)
            if not killed:
                killed.append(resident.task_pids[1] if second == "new task" else survivor)
                os.kill(killed[0], signal.SIGKILL)
                time.sleep(0.2)

        flow.rebuild = rebuilt_in_process(flow, history, second_loss)
        os.kill(victim, signal.SIGKILL)
        step: list[Update] = [((n % 6,), 1, 1) for n in range(12)]
        out, _ = flow.step({"numbers": step}, 2)
        before = canonical(evaluate(counted(), {"numbers": contents_at(history, 0)}))
        history += step
        after = canonical(evaluate(counted(), {"numbers": contents_at(history, 1)}))
        assert canonical(contents_at(out, 1)) == {
            row: after.get(row, 0) - before.get(row, 0)
            for row in after.keys() | before.keys()
            if after.get(row, 0) != before.get(row, 0)
        }
        assert set(rebuilt_on) == {threading.current_thread().name}
        # Two rebuilds: of shard 1 on the first new task, which either dies (and shard 1 is
        # rebuilt on a third) or survives (and shard 0 is rebuilt on the survivor's
        # replacement, found lost when the step is sent again).
        assert len(rebuilt_on) == 2
        assert resident.failure is None
        assert flow.shard_restores == (1 if second == "new task" else 2)
        pids = resident.task_pids
        assert not {victim, *killed} & set(pids)
        assert (pids[0] == survivor) == (second == "new task")
        outputs_at(flow, history, range(flow.index_floor, 2))
        flow.step({"numbers": [((9,), 2, 1)]}, 3)
        history.append(((9,), 2, 1))
        outputs_at(flow, history, range(flow.index_floor, 3))
    finally:
        resident.stop()


def test_a_rebuild_that_fails_gives_up_its_dataflow_alone(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    """A dataflow whose shard cannot be rebuilt on the new task fails by itself: its
    requests raise ``Unavailable`` naming the cause until it is dropped, while the cluster
    and the other dataflows go on; a dataflow of the same id then starts afresh there."""
    resident = ResidentCluster(spark, 2, liveness=QUICK, replace_lost=True)
    resident.start()
    try:
        doomed = SparkDataflow(counted(), as_of=0, cluster=resident, dataflow_id="doomed")
        kept = SparkDataflow(counted(), as_of=0, cluster=resident, index_key_columns=[0])
        history: list[Update] = [((n % 5,), 0, 1) for n in range(15)]
        for flow in (doomed, kept):
            flow.hydrate({"numbers": list(history)})

        def failing(shard: int, at: int, ask: Callable[[rq.Request], object]) -> None:
            raise Unavailable("the inputs' parts could not be read")

        doomed.rebuild = failing
        kept.rebuild = rebuilt_in_process(kept, history)
        survivor, victim = resident.task_pids
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: resident.shard_restores == 1, 120, "the task was not replaced")
        assert resident.failure is None
        assert "parts could not be read" in (resident.broken("doomed") or "")
        with pytest.raises(Unavailable, match=r"rebuilding dataflow 'doomed'.*parts could not"):
            doomed.step({"numbers": [((1,), 1, 1)]}, 2)
        step: list[Update] = [((n % 3,), 1, 1) for n in range(6)]
        kept.step({"numbers": step}, 2)
        outputs_at(kept, history + step, range(kept.index_floor, 2))
        doomed.drop()  # the new task never had it: no error
        assert resident.broken("doomed") is None
        again = SparkDataflow(counted(), as_of=0, cluster=resident, dataflow_id="doomed")
        out, _ = again.hydrate({"numbers": [((4,), 0, 2)]})
        assert out == [((4, 2), 0, 1)]
        assert resident.failure is None and resident.task_pids[0] == survivor
    finally:
        resident.stop()


def test_tasks_whose_driver_falls_silent_end_and_free_their_slots(
    spark: SparkSession, cluster: ResidentCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    orphaned = ResidentCluster(spark, 2, liveness=QUICK)
    orphaned.start()
    assert orphaned.job_running
    # The driver neither pings nor reads any more, and closes nothing: as if its host or
    # network vanished, seen from the tasks.
    monkeypatch.setattr(orphaned, "_keep_alive_once", lambda: None)
    wait_until(lambda: not orphaned.job_running, 60 * QUICK.deadline_s, "the tasks kept running")
    assert orphaned.failure is None  # the driver did nothing: the tasks ended by themselves
    assert_free_slots(spark, cluster)
    orphaned.stop()


def test_a_start_waits_for_slots_that_come_up_late(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    # Every slot but the shared cluster's is held, so a new cluster's first launch cannot
    # get its slots; they come back only once that launch has failed.
    blocker = ResidentCluster(spark, slots(spark) - cluster.shards)
    blocker.start()
    late = ResidentCluster(spark, 2, connect_timeout=5, start_attempts=6)
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            late.start()
        except BaseException as error:
            outcome.append(error)

    with structlog.testing.capture_logs() as logs:
        starting = threading.Thread(target=start)
        starting.start()
        wait_until(
            lambda: any(log["event"] == "resident_cluster_start_retry" for log in logs),
            120,
            "no retry",
        )
        blocker.stop()
        starting.join(300)
    assert not starting.is_alive() and outcome == []
    retried = [log for log in logs if log["event"] == "resident_cluster_start_retry"]
    assert retried[0]["attempt"] == 1 and "tasks connected within 5 s" in retried[0]["error"]
    try:
        flow = SparkDataflow(counted(), as_of=0, cluster=late)
        assert flow.hydrate({"numbers": [((3,), 0, 1)]})[0] == [((3, 1), 0, 1)]
    finally:
        late.stop()


def test_a_start_gives_up_after_its_attempts(spark: SparkSession, cluster: ResidentCluster) -> None:
    with ResidentCluster(spark, slots(spark) - cluster.shards):
        hopeless = ResidentCluster(spark, 2, connect_timeout=1, start_attempts=2)
        with pytest.raises(Unavailable, match="only 0 of 2 resident tasks connected within 1 s"):
            hopeless.start()
        with pytest.raises(FailedPrecondition, match="not running"):
            hopeless.stats("any")


def test_a_stopped_cluster_refuses_requests(spark: SparkSession) -> None:
    with ResidentCluster(spark, 2) as resident:
        SparkDataflow(counted(), as_of=0, cluster=resident, dataflow_id="kept")
        assert resident.stats("kept")[0] == 0
    with pytest.raises(FailedPrecondition, match="not running"):
        resident.stats("kept")
    resident.stop()  # a second stop does nothing


def test_a_cluster_wider_than_the_session_is_refused(spark: SparkSession) -> None:
    too_wide = ResidentCluster(spark, slots(spark) + 1)
    with pytest.raises(FailedPrecondition, match=f"{slots(spark) + 1} resident tasks cannot run"):
        too_wide.start()


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[4, 2]", 4),
        ("local[*]", os.cpu_count()),
        ("spark://host:7077", None),
        ("k8s://https://api:6443", None),
    ],
)
def test_slots_of_a_master(master: str, expected: int | None) -> None:
    assert local_slots(master) == expected


def test_only_a_task_with_the_token_is_accepted() -> None:
    right, wrong = b"r" * TOKEN_BYTES, b"w" * TOKEN_BYTES
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for token, expected in [(wrong, None), (right, Hello(shard=1, pid=42))]:
            with socket.create_connection(listener.getsockname()) as client:
                server, _ = listener.accept()
                with server:
                    send_hello(client, token, 1, 42)
                    assert authenticate(server, right) == expected
        # Anything else (here: a request frame, which is never decoded) is refused too.
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                send_message(client, rq.Drop("hello"))
                assert authenticate(server, right) is None
