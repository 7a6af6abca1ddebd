"""Index reads in progress hold back the index's compaction.

A peek or a subscription checks its time against the dataflow's since, then reads the
index (for a subscription, the snapshot and then the history up to the live steps). A
compaction round starting between the check and the read used to move the index past the
time and fail the read with FailedPrecondition; a read in progress now holds the compaction
at its time, and a peek over several indexes holds them all before it reads the first. The
engine here is a stand-in index that refuses reads before its since, as the real ones do,
and whose reads wait until the test lets them go.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import pytest

from services.compute.dataflow import Row, Update
from services.compute.host import DataflowManager
from services.compute.running import RUNNING, RunningDataflow, RunSettings
from services.compute.spec import DataflowSpec
from services.compute.subscriptions import output_changes
from tidemark.cdc import Progress
from tidemark.cdc.proto import from_proto as cdc_from_proto
from tidemark.columnar import ColumnType, RelationSchema, from_ipc, updates_from_table
from tidemark.errors import FailedPrecondition
from tidemark.frontier import u64_frontier
from tidemark.plan import builders
from tidemark.v1 import common_pb2, plan_pb2

SCHEMA = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.INT64))
HISTORY = 100
UPPER = 1_000
"""The dataflow's upper: a compaction round moves the since to ``UPPER - 1 - HISTORY``."""


class GatedIndex:
    """An engine's dataflow with an index whose history is one update per time: row
    ``(t, t)`` inserted at every time ``t``. Reads wait for ``release``."""

    hydrates_from_parts = False
    failure: str | None = None
    index_floor = 0

    def __init__(self) -> None:
        self.since = 0
        self.release = asyncio.Event()
        self.reading = asyncio.Event()

    async def _gate(self, timestamp: int) -> None:
        self.reading.set()
        await self.release.wait()
        if timestamp < self.since:
            raise FailedPrecondition(f"the index is compacted to {self.since}, past {timestamp}")

    async def peek(self, timestamp: int) -> dict[Row, int]:
        await self._gate(timestamp)
        return {(t, t): 1 for t in range(timestamp + 1)}

    async def index_changes(self, lower: int, upper: int) -> list[Update]:
        await self._gate(lower - 1)
        return [((t, t), t, 1) for t in range(lower, upper)]

    async def compact_index(self, since: int) -> None:
        self.since = max(self.since, since)


def running_dataflow(index: GatedIndex, dataflow_id: str = "df") -> RunningDataflow:
    spec = DataflowSpec(dataflow_id, plan_pb2.Plan(), (), index_key_columns=(0,))
    running = RunningDataflow(
        spec,
        spec.plan,
        SCHEMA,
        cast(Any, index),
        cast(Any, None),
        (),
        None,
        False,
        0,
        RunSettings("compute/test", 1.0, 1.0, index_history_ms=HISTORY),
    )
    running.state, running.upper = RUNNING, UPPER
    running.feed.start(UPPER)
    return running


async def test_a_peek_past_its_check_holds_the_compaction_at_its_time() -> None:
    index = GatedIndex()
    running = running_dataflow(index)
    peek = asyncio.create_task(running.peek(500, time.monotonic() + 10))
    await index.reading.wait()
    await running._compact_index()
    # Held at the peek's time, not moved to UPPER - 1 - HISTORY.
    assert (running.since, index.since) == (500, 500)
    index.release.set()
    assert await peek == {(t, t): 1 for t in range(501)}
    # Once the read is over, the next round compacts as far as the history window allows.
    await running._compact_index()
    assert (running.since, index.since) == (UPPER - 1 - HISTORY,) * 2
    with pytest.raises(FailedPrecondition, match="before the since"):
        await running.peek(500, time.monotonic() + 10)


async def test_two_reads_at_one_time_hold_until_both_are_done() -> None:
    index = GatedIndex()
    running = running_dataflow(index)
    with running.read_hold(300):
        with running.read_hold(300):
            pass
        await running._compact_index()
        assert running.since == 300
    await running._compact_index()
    assert running.since == UPPER - 1 - HISTORY


async def test_a_subscription_reading_history_holds_the_compaction_at_its_as_of() -> None:
    index = GatedIndex()
    running = running_dataflow(index)
    messages = output_changes(running, cast(Any, None), "h", 500, True, time.monotonic() + 10)
    first = asyncio.create_task(_next(messages))
    await index.reading.wait()
    await running._compact_index()
    assert running.since == 500
    index.release.set()
    updates: list[Update] = []
    message = await first
    while True:
        if message.WhichOneof("kind") == "updates":
            updates.extend(updates_from_table(from_ipc(message.updates.arrow_ipc)))
        else:
            progress = cdc_from_proto(message)
            assert isinstance(progress, Progress)
            if progress.upper == u64_frontier(UPPER):
                break
        message = await _next(messages)
    await messages.aclose()
    # The snapshot at 500, then every change up to the live steps, exact.
    assert sorted(updates) == [((t, t), 500, 1) for t in range(501)] + [
        ((t, t), t, 1) for t in range(501, UPPER)
    ]
    # The hold and the listener are gone with the subscription.
    assert not running.feed.has_listeners
    await running._compact_index()
    assert running.since == UPPER - 1 - HISTORY


class Union:
    """The one-shot evaluator's finishing step, for a union of the indexes read."""

    async def evaluate_finishing(
        self, plan: Any, timestamp: int, inputs: dict[str, dict[Row, int]], budget: int
    ) -> dict[Row, int]:
        out: dict[Row, int] = {}
        for contents in inputs.values():
            for row, count in contents.items():
                out[row] = out.get(row, 0) + count
        return out


class Watch:
    waiting_for: list[Any] = []

    def evaluating(self) -> None:
        pass


async def test_a_peek_over_two_indexes_holds_both_before_reading_either() -> None:
    first, second = GatedIndex(), GatedIndex()
    dataflows = {"a": running_dataflow(first, "a"), "b": running_dataflow(second, "b")}
    manager = cast(Any, DataflowManager.__new__(DataflowManager))
    manager._dataflows, manager.one_shots = dataflows, Union()
    finishing = builders.plan(builders.union(builders.get("a", SCHEMA), builders.get("b", SCHEMA)))
    peek = asyncio.create_task(
        manager._peek_index(Watch(), "a", 500, finishing, time.monotonic() + 10, 0)
    )
    await first.reading.wait()
    # While "a" is read, a compaction round on "b" (not read yet) stops at the peek's time.
    await dataflows["b"]._compact_index()
    assert (dataflows["b"].since, second.since) == (500, 500)
    first.release.set()
    second.release.set()
    answer = await peek
    rows = updates_from_table(answer.table)
    assert sorted(rows) == sorted(((t, t), 500, 2) for t in range(501))
    for running in dataflows.values():
        await running._compact_index()
        assert running.since == UPPER - 1 - HISTORY


async def _next(messages: AsyncGenerator[common_pb2.CdcMessage, None]) -> common_pb2.CdcMessage:
    return await anext(messages)
