"""Evaluating a plan once, at one time, in this process: one-shot peeks over storage
snapshots and ``finishing`` plans over index contents. No Spark job runs: the in-process
engine hydrates at the peek's time and its hydration output is the answer.

The engine runs in worker threads, and a thread cannot be stopped from outside, so every
evaluation has a :class:`~services.compute.dataflow.guard.Guard`: when the peek's call ends
early (its deadline passed, the client cancelled, the connection dropped), gRPC cancels the
handler's task, and the wait here turns that into ``guard.cancel``; the engine notices at its
next check and the thread is free again within milliseconds. The guard's memory budget stops
a statement whose state grows past it with ``ResourceExhausted`` (SQLSTATE 53200 at the
adapter).

One-shot evaluations run in a :class:`OneShotPool` of a bounded number of threads: more
statements than that wait in line instead of sharing the CPU until none finishes. Finishing
plans over index contents are small by construction and run beside the pool, so a point
query on an index never waits behind a runaway one-shot query.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Awaitable, Callable, Mapping

import pyarrow as pa

from services.compute.dataflow import Dataflow, Row
from services.compute.dataflow.guard import Guard
from services.compute.metrics import ONE_SHOTS
from tidemark.columnar import RelationSchema, table_from_updates
from tidemark.errors import ResourceExhausted
from tidemark.logging import get_logger
from tidemark.v1 import plan_pb2

log = get_logger("compute.oneshot")

Contents = Mapping[Row, int] | Callable[[], Mapping[Row, int]]
"""An input's contents, or how to get them on the evaluation's thread (decoding a large
snapshot into rows is work the event loop should not do)."""

CANCELLED_REASON = "the statement was cancelled: its deadline passed or its client went away"


def _evaluate(
    plan: plan_pb2.Plan,
    timestamp: int,
    inputs: Mapping[str, Contents],
    guard: Guard,
) -> dict[Row, int]:
    guard.check()  # cancelled while it waited in line
    dataflow = Dataflow(plan, as_of=timestamp, guard=guard)
    snapshots = {}
    for collection_id, contents in inputs.items():
        loaded = contents() if callable(contents) else contents
        snapshots[collection_id] = [(row, timestamp, count) for row, count in loaded.items()]
        guard.check()
    output, _ = dataflow.hydrate(snapshots)
    return {row: diff for row, _, diff in output}


def _log_end(guard: Guard, future: concurrent.futures.Future[dict[Row, int]]) -> None:
    """Logs how a cancelled evaluation's thread ended (it runs on that thread): the proof that
    the work stopped, and how long after the cancel."""
    if guard.cancelled_at is None or future.cancelled():
        return
    error = future.exception()
    log.info(
        "one_shot_stopped",
        outcome=type(error).__name__ if error is not None else "finished",
        seconds_after_cancel=round(time.monotonic() - guard.cancelled_at, 3),
        peak_bytes=guard.peak_bytes,
    )


async def _guarded(work: Awaitable[dict[Row, int]], guard: Guard) -> dict[Row, int]:
    """Awaits ``work``; if the wait is cancelled, the evaluation is cancelled too."""
    try:
        return await work
    except asyncio.CancelledError:
        guard.cancel(CANCELLED_REASON)
        log.info("one_shot_cancelled", peak_bytes=guard.peak_bytes)
        raise
    except ResourceExhausted as exc:
        log.info("one_shot_over_budget", error=exc.message, peak_bytes=guard.peak_bytes)
        raise


class OneShotPool:
    """Runs one-shot evaluations on at most ``workers`` threads, each with a guard of
    ``budget_bytes`` (0: no budget)."""

    def __init__(self, workers: int, budget_bytes: int) -> None:
        self.workers = max(1, workers)
        self.budget_bytes = budget_bytes
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="one-shot"
        )
        self._guards: set[Guard] = set()
        """The guards of evaluations in line or running."""

    @property
    def in_flight(self) -> int:
        """Evaluations in line or running."""
        return len(self._guards)

    def budget_for(self, requested_bytes: int) -> int:
        """The budget of an evaluation that asked for ``requested_bytes`` (0: the pool's own):
        a request may lower the pool's budget, never raise it."""
        if not requested_bytes:
            return self.budget_bytes
        if not self.budget_bytes:
            return requested_bytes
        return min(requested_bytes, self.budget_bytes)

    async def evaluate(
        self,
        plan: plan_pb2.Plan,
        timestamp: int,
        inputs: Mapping[str, Contents],
        budget_bytes: int = 0,
    ) -> dict[Row, int]:
        """The plan's output over ``inputs`` (each input's contents at ``timestamp``), computed
        on the pool; ``budget_bytes`` as :meth:`budget_for` says."""
        guard = Guard(self.budget_for(budget_bytes), "the query")
        loop = asyncio.get_running_loop()
        self._guards.add(guard)
        outcome = "failed"
        try:
            work = self._executor.submit(_evaluate, plan, timestamp, inputs, guard)
            work.add_done_callback(functools.partial(_log_end, guard))
            result = await _guarded(asyncio.wrap_future(work, loop=loop), guard)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except ResourceExhausted:
            outcome = "over_budget"
            raise
        finally:
            self._guards.discard(guard)
            ONE_SHOTS.labels(outcome).inc()

    async def evaluate_finishing(
        self,
        plan: plan_pb2.Plan,
        timestamp: int,
        inputs: Mapping[str, Contents],
        budget_bytes: int = 0,
    ) -> dict[Row, int]:
        """Like :meth:`evaluate`, for a finishing plan over index contents: beside the pool."""
        guard = Guard(self.budget_for(budget_bytes), "the query")
        return await _guarded(asyncio.to_thread(_evaluate, plan, timestamp, inputs, guard), guard)

    def close(self) -> None:
        """Stops every evaluation (the process is stopping): none holds up the exit."""
        for guard in list(self._guards):
            guard.cancel("the compute process is stopping")
        self._executor.shutdown(wait=False, cancel_futures=True)


def result_table(schema: RelationSchema, contents: Mapping[Row, int], timestamp: int) -> pa.Table:
    """A peek's answer: the rows, ``time`` = ``timestamp`` and ``diff`` = multiplicity."""
    return table_from_updates(
        schema, [(row, timestamp, count) for row, count in contents.items() if count]
    )
