"""The dataflow engine's guard: a cancelled evaluation stops part-way, an evaluation over its
memory budget fails with ResourceExhausted, and an unguarded one runs as before."""

from __future__ import annotations

import threading
import time

import pytest

from services.compute.dataflow import Dataflow
from services.compute.dataflow.guard import UNGUARDED, Guard, row_bytes
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import Cancelled, ResourceExhausted
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

A = RelationSchema.of(("a", T.INT64))
B = RelationSchema.of(("b", T.INT64))


def cross_join_count() -> plan_pb2.Plan:
    """``SELECT count(*) FROM a CROSS JOIN b``: a join with no key columns."""
    return pb.plan(
        pb.reduce(pb.join(pb.get("a", A), pb.get("b", B), [], []), [], [pb.aggregate("count")])
    )


def snapshots(rows: int) -> dict[str, list[tuple[tuple[int], int, int]]]:
    return {
        "a": [((i,), 0, 1) for i in range(rows)],
        "b": [((i,), 0, 1) for i in range(rows)],
    }


def test_an_unguarded_cross_join_counts_every_pair() -> None:
    out, _ = Dataflow(cross_join_count(), as_of=0).hydrate(snapshots(50))
    assert out == [((2500,), 0, 1)]


def test_a_guard_with_room_to_spare_changes_nothing() -> None:
    guard = Guard(budget_bytes=1 << 30, what="the test")
    out, _ = Dataflow(cross_join_count(), as_of=0, guard=guard).hydrate(snapshots(50))
    assert out == [((2500,), 0, 1)]
    # The peak covers at least the join's 2,500 output rows of two columns.
    assert guard.peak_bytes >= 2500 * row_bytes(2)


def test_a_join_over_its_budget_stops_before_finishing_its_output() -> None:
    # 1,000 x 1,000 = 1M joined rows, about 200 MB by the estimate; the budget is 8 MiB.
    guard = Guard(budget_bytes=8 << 20, what="the one-shot query")
    dataflow = Dataflow(cross_join_count(), as_of=0, guard=guard)
    started = time.monotonic()
    with pytest.raises(
        ResourceExhausted, match="the one-shot query needs more than its memory budget of 8 MiB"
    ):
        dataflow.hydrate(snapshots(1000))
    assert time.monotonic() - started < 5.0
    # It stopped close to the budget, not after building the whole output.
    assert guard.peak_bytes < (8 << 20) + 2 * 4096 * row_bytes(2) + 1000 * row_bytes(2)


def test_cancelling_from_another_thread_stops_a_running_cross_join() -> None:
    guard = Guard(what="the statement")
    dataflow = Dataflow(cross_join_count(), as_of=0, guard=guard)
    failure: list[BaseException] = []
    finished = threading.Event()

    def run() -> None:
        try:
            dataflow.hydrate(snapshots(3000))  # 9M pairs: many seconds of work
        except BaseException as exc:
            failure.append(exc)
        finished.set()

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    cancelled_at = time.monotonic()
    guard.cancel("canceling statement due to statement timeout")
    assert finished.wait(5.0), "the evaluation did not stop after cancel"
    worker.join()
    assert time.monotonic() - cancelled_at < 2.0
    assert len(failure) == 1 and isinstance(failure[0], Cancelled)
    assert failure[0].args[0] == "canceling statement due to statement timeout"


def test_a_budget_counts_large_linear_batches_between_operators() -> None:
    # No join: a filter over 200,000 input rows held as one batch, with a budget of 1 MiB.
    plan = pb.plan(pb.filter(pb.get("a", A), pb.call("ge", pb.column(0), pb.literal(0, T.INT64))))
    guard = Guard(budget_bytes=1 << 20, what="the statement")
    with pytest.raises(ResourceExhausted):
        Dataflow(plan, as_of=0, guard=guard).hydrate({"a": [((i,), 0, 1) for i in range(200_000)]})


def test_cancelling_the_shared_unguarded_guard_stops_no_other_evaluation() -> None:
    # Dropping one dataflow built without a guard cancels its guard, which is the one every
    # such dataflow shares: that must not stop the next one.
    UNGUARDED.cancel("the dataflow was dropped")
    assert not UNGUARDED.cancelled
    UNGUARDED.check()
