"""Several parts-only subscriptions followed as one (``joint_parts.subscribe_jointly``),
checked against the intervals each input sent, cut by an independent reckoning of the meet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.storage.joint_parts import (
    MAX_BATCHES_PER_MESSAGE,
    JointPartsEvent,
    cut,
    subscribe_jointly,
)
from services.storage.subscriptions import Event, PartsEvent
from tidemark.errors import FailedPrecondition

Interval = tuple[int, int | None, str]
"""An input's interval as its own subscription sends it: lower, upper, the part it names."""


def _event(lower: int, upper: int | None, part: str) -> PartsEvent:
    return PartsEvent(lower, upper, cast(Any, (part,)))


def _plain(events: tuple[PartsEvent, ...]) -> list[Interval]:
    return [(e.lower, e.upper, cast(Any, e.batches)[0]) for e in events]


class _Released:
    """Input streams whose events the test lets through one at a time."""

    def __init__(self, count: int) -> None:
        self.queues: list[asyncio.Queue[PartsEvent | Exception]] = [
            asyncio.Queue() for _ in range(count)
        ]
        self.closed = [False] * count

    async def stream(self, index: int) -> AsyncIterator[Event]:
        try:
            while True:
                item = await self.queues[index].get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.upper is None:
                    return
        finally:
            self.closed[index] = True


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_cut_splits_an_interval_the_time_falls_inside() -> None:
    intervals = [_event(1, 3, "a"), _event(3, 8, "b"), _event(8, None, "c")]
    before, after = cut(intervals, 5)
    assert _plain(tuple(before)) == [(1, 3, "a"), (3, 5, "b")]
    assert _plain(tuple(after)) == [(5, 8, "b"), (8, None, "c")]
    before, after = cut(intervals, None)
    assert _plain(tuple(before)) == _plain(tuple(intervals)) and after == []
    before, after = cut(intervals, 3)
    assert _plain(tuple(before)) == [(1, 3, "a")]


@st.composite
def _histories(draw: st.DrawFn) -> tuple[list[list[Interval]], list[int]]:
    """Each input's intervals (consecutive, from its own start, maybe ending closed), and an
    order in which their events arrive (each input's in its own order)."""
    inputs = []
    for i in range(draw(st.integers(1, 3))):
        lower = draw(st.integers(1, 4))
        intervals: list[Interval] = []
        for j in range(draw(st.integers(1, 5))):
            upper = lower + draw(st.integers(1, 4))
            intervals.append((lower, upper, f"p{i}.{j}"))
            lower = upper
        if draw(st.booleans()):
            intervals.append((lower, None, f"p{i}.end"))
        inputs.append(intervals)
    tickets = [i for i, intervals in enumerate(inputs) for _ in intervals]
    order = draw(st.permutations(tickets))
    return inputs, list(order)


def _pieces(intervals: list[Interval], lower: int, upper: int | None) -> list[Interval]:
    """The sides of ``intervals`` within ``[lower, upper)`` (``None``: no end)."""
    far = float("inf")
    out: list[Interval] = []
    for start, end, part in intervals:
        low = max(start, lower)
        high = min(far if end is None else end, far if upper is None else upper)
        if low < high:
            out.append((low, None if high == far else int(high), part))
    return out


def _joint_run(
    inputs: list[list[Interval]], order: list[int], max_batches: int
) -> tuple[list[JointPartsEvent], list[int | None]]:
    """The joint stream's messages as each input's events arrive in ``order``, one at a time,
    and the meets the test reckons along the way."""

    async def run() -> tuple[list[JointPartsEvent], list[int | None]]:
        released = _Released(len(inputs))
        joint = subscribe_jointly(
            [released.stream(i) for i in range(len(inputs))], max_batches=max_batches
        )
        received: list[JointPartsEvent] = []

        async def consume() -> None:
            async for event in joint:
                received.append(event)

        consumer = asyncio.create_task(consume())
        meets: list[int | None] = []
        uppers: list[int | str | None] = ["unheard"] * len(inputs)
        sent = [0] * len(inputs)
        for index in order:
            start, end, part = inputs[index][sent[index]]
            sent[index] += 1
            released.queues[index].put_nowait(_event(start, end, part))
            uppers[index] = end
            await _settle()
            if "unheard" not in uppers:
                finite = [u for u in uppers if isinstance(u, int)]
                meet = min(finite) if finite else None
                if not meets or meets[-1] != meet:
                    meets.append(meet)
        if all(intervals[-1][1] is None for intervals in inputs):
            await asyncio.wait_for(consumer, 5)
        else:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await joint.aclose()
        assert all(released.closed), "every input's subscription ends with the joint one"
        return received, meets

    return asyncio.run(run())


@settings(max_examples=150, deadline=None)
@given(_histories())
def test_the_joint_stream_moves_once_per_move_of_the_meet_with_each_inputs_sides(
    history: tuple[list[list[Interval]], list[int]],
) -> None:
    inputs, order = history
    received, meets = _joint_run(inputs, order, MAX_BATCHES_PER_MESSAGE)
    first = min(intervals[0][0] for intervals in inputs)
    # A first message once every input has spoken, then one per move of the meet, in
    # order, back to back.
    assert [event.upper for event in received] == meets
    lowers = [first] + [cast(int, event.upper) for event in received[:-1]]
    assert [event.lower for event in received] == lowers
    for event in received:
        for index, intervals in enumerate(inputs):
            assert _plain(event.inputs[index]) == _pieces(intervals, event.lower, event.upper)


@settings(max_examples=100, deadline=None)
@given(_histories())
def test_a_move_naming_many_parts_goes_out_in_pieces_ending_where_intervals_end(
    history: tuple[list[list[Interval]], list[int]],
) -> None:
    inputs, order = history
    received, meets = _joint_run(inputs, order, max_batches=2)
    first = min(intervals[0][0] for intervals in inputs)
    assert [event.lower for event in received] == [first] + [
        cast(int, event.upper) for event in received[:-1]
    ]
    assert set(meets) <= {event.upper for event in received}, "every meet is a message's end"
    ends = {end for intervals in inputs for _, end, _ in intervals if end is not None}
    for event in received:
        for index, intervals in enumerate(inputs):
            assert _plain(event.inputs[index]) == _pieces(intervals, event.lower, event.upper)
        named = sum(len(pieces) for pieces in event.inputs)
        inside = {
            end for end in ends if end > event.lower and (event.upper is None or end < event.upper)
        }
        assert named <= 2 or not inside, "a bigger message spans no interval's end"


async def test_events_that_came_while_a_message_was_out_go_in_one_message() -> None:
    released = _Released(2)
    joint = subscribe_jointly([released.stream(0), released.stream(1)])
    released.queues[0].put_nowait(_event(1, 3, "a"))
    released.queues[1].put_nowait(_event(1, 2, "b"))
    first = await anext(joint)
    assert (first.lower, first.upper) == (1, 2)
    # Three more arrive before the reader asks again: one message, to the newest meet.
    released.queues[0].put_nowait(_event(3, 5, "c"))
    released.queues[1].put_nowait(_event(2, 4, "d"))
    released.queues[1].put_nowait(_event(4, 6, "e"))
    await _settle()
    second = await anext(joint)
    assert (second.lower, second.upper) == (2, 5)
    assert _plain(second.inputs[0]) == [(2, 3, "a"), (3, 5, "c")]
    assert _plain(second.inputs[1]) == [(2, 4, "d"), (4, 5, "e")]
    await joint.aclose()
    assert released.closed == [True, True]


async def _failing_after_one(released: _Released) -> list[JointPartsEvent]:
    joint = subscribe_jointly([released.stream(0), released.stream(1)])
    released.queues[0].put_nowait(_event(1, 3, "a"))
    released.queues[1].put_nowait(_event(1, 2, "b"))
    first = await anext(joint)
    released.queues[1].put_nowait(FailedPrecondition("capability lost"))
    released.queues[0].put_nowait(_event(3, 4, "c"))
    try:
        return [first, await anext(joint)]
    finally:
        await joint.aclose()


def test_an_inputs_failure_ends_the_joint_stream_and_closes_the_others() -> None:
    released = _Released(2)
    with pytest.raises(FailedPrecondition, match="capability lost"):
        asyncio.run(_failing_after_one(released))
    assert released.closed == [True, True]
