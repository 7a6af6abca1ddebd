"""Several parts-only subscriptions as one stream that moves with their meet.

A dataflow steps its inputs together: it can take a step only once every input's upper has
passed it. Fed one ``SubscribeParts`` stream per input, its driver wakes once per input per
step, as their uppers move one after the other. ``subscribe_jointly`` merges the inputs'
``PartsEvent`` streams here instead, and emits one ``JointPartsEvent`` each time the least
of their uppers moves (and a first one once every input has spoken, as each input's first
one says it passed its starting time): every input's intervals up to it, the last cut at it
(its later side goes with a later event). A waking costs the driver about as much CPU as a
small step's own work: with two inputs, this cut what following them costs it by a quarter.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from services.storage.subscriptions import Event, PartsEvent
from tidemark.errors import Internal
from tidemark.tasks import cancel_and_wait


@dataclass(frozen=True)
class JointPartsEvent:
    """The inputs' meet moved from ``lower`` to ``upper`` (``None``: every input is closed);
    ``inputs[i]`` holds input ``i``'s intervals within ``[lower, upper)``."""

    lower: int
    upper: int | None
    inputs: tuple[tuple[PartsEvent, ...], ...]


def _at_or_before(a: int | None, b: int | None) -> bool:
    """``a <= b`` where ``None`` is beyond every time."""
    return b is None or (a is not None and a <= b)


def cut(
    intervals: Sequence[PartsEvent], at: int | None
) -> tuple[list[PartsEvent], list[PartsEvent]]:
    """``intervals`` split at ``at``: the sides before it and the sides from it on. Both sides
    of a cut interval name its parts (each reader keeps its own window's updates)."""
    before: list[PartsEvent] = []
    after: list[PartsEvent] = []
    for interval in intervals:
        if _at_or_before(interval.upper, at):
            before.append(interval)
        elif at is not None and interval.lower >= at:
            after.append(interval)
        else:
            assert at is not None
            before.append(dataclasses.replace(interval, upper=at))
            after.append(dataclasses.replace(interval, lower=at))
    return before, after


_ENDED = object()

MAX_BATCHES_PER_MESSAGE = 10_000
"""A move of the meet naming more batches than this (an input's upper stalled while the
others moved on) goes out as several messages, split where the inputs' intervals end: a
message stays far below gRPC's size limit however long the stall."""


def _batches_before(held: Sequence[Sequence[PartsEvent]], bound: int | None) -> int:
    return sum(
        len(interval.batches)
        for intervals in held
        for interval in intervals
        if bound is None or interval.lower < bound
    )


def _next_bound(
    held: Sequence[Sequence[PartsEvent]], lower: int, meet: int | None, most: int
) -> int | None:
    """Where the next message of the move from ``lower`` to ``meet`` ends: the meet, or the
    furthest end of an interval before it whose message names at most ``most`` batches
    (at least the first such end, however many it names)."""
    if _batches_before(held, meet) <= most:
        return meet
    ends = sorted(
        {
            interval.upper
            for intervals in held
            for interval in intervals
            if interval.upper is not None
            and interval.upper > lower
            and (meet is None or interval.upper < meet)
        }
    )
    chosen = ends[0] if ends else meet
    for end in ends[1:]:
        if _batches_before(held, end) > most:
            break
        chosen = end
    return chosen


async def subscribe_jointly(
    streams: Sequence[AsyncIterator[Event]], *, max_batches: int = MAX_BATCHES_PER_MESSAGE
) -> AsyncGenerator[JointPartsEvent, None]:
    """The parts-only subscriptions ``streams`` followed together (see the module). An
    error of any of them ends this with it, before anything of the time it failed at is
    sent; ending early closes them all. Events that came while a message was being sent go
    out together, in one message."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Event]) -> None:
        outcome: object = _ENDED
        try:
            async for event in stream:
                queue.put_nowait((index, event))
        except Exception as exc:  # handed to the consumer, which raises it
            outcome = exc
        except BaseException as exc:  # cancelled: the consumer must not wait for it
            outcome = exc
            raise
        finally:
            queue.put_nowait((index, outcome))

    pumps = [
        asyncio.create_task(pump(i, s), name=f"joint-parts-{i}") for i, s in enumerate(streams)
    ]
    held: list[list[PartsEvent]] = [[] for _ in streams]
    uppers: list[int | None] = [0] * len(streams)
    heard = [False] * len(streams)
    lower: int | None = None
    sent = False
    try:
        while True:
            arrived = [await queue.get()]
            while not queue.empty():
                arrived.append(queue.get_nowait())
            for index, item in arrived:
                if isinstance(item, BaseException):
                    raise item
                if item is _ENDED:
                    if uppers[index] is not None:  # ended without closing: nothing more comes
                        raise Internal(f"input {index}'s subscription ended before it closed")
                    continue
                assert isinstance(item, PartsEvent)
                held[index].append(item)
                uppers[index] = item.upper
                if not heard[index]:
                    heard[index] = True
                    lower = item.lower if lower is None else min(lower, item.lower)
            if not all(heard):
                continue
            meet = min((u for u in uppers if u is not None), default=None)
            assert lower is not None
            # The first message goes out even with nothing in it, as each input's first one
            # does: it says that every input has passed its starting time.
            if sent and meet is not None and meet <= lower:
                continue
            sent = True
            while True:
                bound = _next_bound(held, lower, meet, max_batches)
                taken = []
                for i, intervals in enumerate(held):
                    before, held[i] = cut(intervals, bound)
                    taken.append(tuple(before))
                yield JointPartsEvent(lower, bound, tuple(taken))
                if bound is None:
                    return
                lower = bound
                if bound == meet:
                    break
    finally:
        await cancel_and_wait(*pumps)
