"""Several parts-only subscriptions as one stream that moves with their meet.

A dataflow steps its inputs together: it can take a step only once every input's upper has
passed it. Fed one ``SubscribeParts`` stream per input, its driver wakes once per input per
step, as their uppers move one after the other. ``subscribe_jointly`` merges the inputs'
``PartsEvent`` streams here instead, and emits one ``JointPartsEvent`` each time the least
of their uppers moves (and a first one once every input has spoken, as each input's first
one says it passed its starting time): every input's intervals up to it, the last cut at it
(its later side goes with a later event). A waking costs the driver about as much CPU as a
small step's own work, so this halves what following two inputs costs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from services.storage.subscriptions import Event, PartsEvent
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


async def subscribe_jointly(
    streams: Sequence[AsyncIterator[Event]],
) -> AsyncGenerator[JointPartsEvent, None]:
    """The parts-only subscriptions ``streams`` followed together (see the module). An
    error of any of them ends this with it, before anything of the time it failed at is
    sent; ending early closes them all."""
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Event]) -> None:
        try:
            async for event in stream:
                queue.put_nowait((index, event))
            queue.put_nowait((index, _ENDED))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))

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
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is _ENDED:
                if uppers[index] is not None:  # ended without closing: nothing more comes
                    raise RuntimeError(f"input {index}'s subscription ended before its close")
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
            taken = []
            for i, intervals in enumerate(held):
                before, held[i] = cut(intervals, meet)
                taken.append(tuple(before))
            yield JointPartsEvent(lower, meet, tuple(taken))
            if meet is None:
                return
            lower = meet
    finally:
        for task in pumps:
            await cancel_and_wait(task)
