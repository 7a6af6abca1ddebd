"""A request round run on the event loop (``ResidentCluster.acall``, a step that writes its
output's parts): it answers as the thread path does, heartbeats of a busy task only show it
alive, a task that falls silent or dies is reported as in a thread round, and a caller that
gives up mid-round leaves nothing behind for the next round to read."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.compute.dataflow.batch import Update
from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark import requests as rq
from services.compute.spark.liveness import Liveness
from services.compute.spark.resident import _Job
from services.compute.spark.wire import receive_message, send_hello
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import Unavailable
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

NUMBERS = RelationSchema.of(("n", T.INT64))
QUICK = Liveness(heartbeat_s=0.2, deadline_s=3.0)
# Long enough (seconds on a task) to be under way when the test acts on it.
LONG = [((n % 50_000,), 1, 1) for n in range(400_000)]


def counted() -> plan_pb2.Relation:
    return pb.reduce(pb.get("numbers", NUMBERS), [0], [pb.aggregate("count")])


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any hand-off to a thread fails the test: the round must run on the loop."""

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the round was handed to a thread")

    monkeypatch.setattr(asyncio, "to_thread", refused)


@pytest.fixture
def quick(spark: SparkSession) -> Iterator[ResidentCluster]:
    with ResidentCluster(spark, 2, liveness=QUICK) as resident:
        yield resident


def steps(flow: SparkDataflow, updates: list[Update], upper: int) -> list[rq.Request]:
    """One ``Step`` per shard, the updates split between them (the tasks exchange them)."""
    node = flow._input_node("numbers").id
    half = len(updates) // 2
    shares = [updates[:half], updates[half:]]
    return [rq.Step(flow.dataflow_id, {node: share}, None, upper) for share in shares]


def output(answers: list[object]) -> list[Update]:
    return sorted(update for answer in answers for update in answer)  # type: ignore[attr-defined]


def test_a_round_on_the_loop_answers_as_a_round_in_a_thread(
    cluster: ResidentCluster, no_threads: None
) -> None:
    on_loop = SparkDataflow(counted(), as_of=0, cluster=cluster)
    in_thread = SparkDataflow(counted(), as_of=0, cluster=cluster)
    numbers = [((n % 7,), 0, 1) for n in range(30)]
    for flow in (on_loop, in_thread):
        flow.hydrate({"numbers": numbers})
    change = [((3,), 1, 1), ((3,), 1, 1), ((5,), 1, -1), ((11,), 1, 1)]
    got = output(asyncio.run(cluster.acall(steps(on_loop, change, 2))))
    assert got == sorted(
        [((3, 4), 1, -1), ((3, 6), 1, 1), ((5, 4), 1, -1), ((5, 3), 1, 1), ((11, 1), 1, 1)]
    )
    assert got == output(cluster.call(steps(in_thread, change, 2)))
    # Both dataflows hold the same: a round of another kind answers alike both ways.
    assert [
        answer[0]  # type: ignore[index]
        for answer in asyncio.run(cluster.acall([rq.Stats(on_loop.dataflow_id)] * 2))
    ] == [answer[0] for answer in cluster.call([rq.Stats(in_thread.dataflow_id)] * 2)]  # type: ignore[index]
    for flow in (on_loop, in_thread):
        flow.drop()


def test_a_busy_tasks_heartbeats_do_not_end_its_round(
    quick: ResidentCluster, no_threads: None
) -> None:
    flow = SparkDataflow(counted(), as_of=0, cluster=quick)
    flow.hydrate({"numbers": []})
    answers = asyncio.run(quick.acall(steps(flow, LONG, 2)))
    assert output(answers) == [((n, 8), 1, 1) for n in range(50_000)]


def test_a_task_that_falls_silent_mid_round_is_reported(quick: ResidentCluster) -> None:
    flow = SparkDataflow(counted(), as_of=0, cluster=quick)
    flow.hydrate({"numbers": []})
    victim = quick.task_pids[1]

    async def round_with_a_mute_task() -> None:
        call = asyncio.ensure_future(quick.acall(steps(flow, LONG, 2)))
        await asyncio.sleep(0.3)
        os.kill(victim, signal.SIGSTOP)  # its socket stays open; it says nothing
        await call

    try:
        with pytest.raises(Unavailable, match="resident task of shard 1 said nothing for"):
            asyncio.run(asyncio.wait_for(round_with_a_mute_task(), 20 * QUICK.deadline_s))
        assert quick.failure is not None and "shard 1" in quick.failure
    finally:
        os.kill(victim, signal.SIGCONT)


def test_a_task_killed_mid_round_is_reported(quick: ResidentCluster) -> None:
    flow = SparkDataflow(counted(), as_of=0, cluster=quick)
    flow.hydrate({"numbers": []})

    async def round_with_a_dead_task() -> None:
        call = asyncio.ensure_future(quick.acall(steps(flow, LONG, 2)))
        await asyncio.sleep(0.3)
        os.kill(quick.task_pids[0], signal.SIGKILL)
        await call

    with pytest.raises(Unavailable, match="resident task of shard 0 is gone"):
        asyncio.run(asyncio.wait_for(round_with_a_dead_task(), 20 * QUICK.deadline_s))
    with pytest.raises(Unavailable, match="shard 0"):  # and the cluster stays failed
        asyncio.run(quick.acall([rq.Stats(flow.dataflow_id)] * 2))


def test_a_round_given_up_on_is_finished_before_the_next_one(quick: ResidentCluster) -> None:
    flow = SparkDataflow(counted(), as_of=0, cluster=quick)
    flow.hydrate({"numbers": []})

    async def give_up_then_ask() -> list[object]:
        call = asyncio.ensure_future(quick.acall(steps(flow, LONG, 2)))
        await asyncio.sleep(0.3)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # Sent while the abandoned round's answers are still to come: it must get its own.
        return await quick.acall([rq.Stats(flow.dataflow_id)] * 2)

    stats = asyncio.run(give_up_then_ask())
    assert all(isinstance(answer, tuple) for answer in stats), stats
    assert quick.failure is None
    # The abandoned step ran once, to its end: every count is 8.
    after = asyncio.run(quick.acall(steps(flow, [((1,), 2, 1)], 3)))
    assert output(after) == [((1, 8), 2, -1), ((1, 9), 2, 1)]


def test_a_round_no_thread_can_finish_fails_the_cluster_rather_than_hang_it(
    quick: ResidentCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = SparkDataflow(counted(), as_of=0, cluster=quick)
    flow.hydrate({"numbers": []})

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def give_up() -> None:
        call = asyncio.ensure_future(quick.acall(steps(flow, LONG, 2)))
        await asyncio.sleep(0.3)
        monkeypatch.setattr(threading.Thread, "start", no_thread)
        try:
            call.cancel()
            with pytest.raises(RuntimeError, match="can't start new thread"):
                await call
        finally:
            monkeypatch.undo()  # at once: the rest of the process starts threads too

    asyncio.run(give_up())
    # The round's answers were never read: the cluster is failed, not left to hand them
    # to the next round (or to hang it on the lock).
    assert quick.failure is not None and "could not be finished" in quick.failure
    with pytest.raises(Unavailable, match="could not be finished"):
        asyncio.run(asyncio.wait_for(quick.acall([rq.Stats(flow.dataflow_id)] * 2), 30))


def test_a_task_connected_first_hears_from_its_driver_while_the_others_come_up(
    spark: SparkSession,
) -> None:
    """The driver pings the tasks that connected while it waits for the others (an executor
    still starting): the first one would otherwise give a silent driver up after
    ``deadline_s`` and fail the start."""
    resident = ResidentCluster(spark, 2, liveness=QUICK)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    jobs = {0: _Job("first"), 1: _Job("second")}
    accepted: dict[int, tuple[socket.socket, int]] = {}
    accepting = threading.Thread(
        target=lambda: accepted.update(resident._accept_all(listener, jobs))
    )
    accepting.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as first:
            send_hello(first, resident._token, 0, 100)
            first.settimeout(QUICK.deadline_s)
            # Longer than the task's deadline, and every frame in it is a ping.
            heard = [
                receive_message(first)
                for _ in range(int(QUICK.deadline_s * 1.5 / QUICK.heartbeat_s))
            ]
            assert all(isinstance(frame, rq.Ping) for frame in heard)
            with socket.create_connection(("127.0.0.1", port)) as second:
                send_hello(second, resident._token, 1, 200)
                accepting.join(10)
                assert sorted((shard, pid) for shard, (_, pid) in accepted.items()) == [
                    (0, 100),
                    (1, 200),
                ]
    finally:
        accepting.join(10)
        listener.close()
        for sock, _ in accepted.values():
            sock.close()
