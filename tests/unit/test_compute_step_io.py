"""The driver's side of steps from parts, without Spark: a follower hands parts over by time
window, the driver deals them out by size, and the change feed skips steps whose rows stayed
on the tasks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest

from services.compute.changes import ChangeFeed, Step
from services.compute.inputs import MAX_TIME, InputFollower, PartsFeed
from services.compute.spark.spark_dataflow import PartWindow, _deal
from tidemark.clients.storage import (
    BatchInfo,
    Capability,
    JointPartsInterval,
    PartsInterval,
    StorageClient,
)
from tidemark.errors import FailedPrecondition, PermissionDenied, TidemarkError, Unavailable
from tidemark.frontier import u64_frontier


class _Capability:
    def __init__(self, collection_id: str = "u1") -> None:
        self.collection_id = collection_id


def _follower(windows: list[PartWindow]) -> InputFollower:
    follower = InputFollower(
        cast(StorageClient, None),
        cast(Capability, _Capability()),
        0,
        lambda: None,
        snapshot=False,
        parts=True,
    )
    follower._windows = list(windows)
    return follower


def test_a_step_boundary_cuts_a_parts_window_into_two_sides() -> None:
    follower = _follower(
        [PartWindow("a", 1, 3, 10), PartWindow("b", 3, 8, 20), PartWindow("c", 8, 9, 5)]
    )
    assert follower.take_parts(5) == [PartWindow("a", 1, 3, 10), PartWindow("b", 3, 5, 20)]
    assert follower.take_parts(9) == [PartWindow("b", 5, 8, 20), PartWindow("c", 8, 9, 5)]
    assert follower.take_parts(100) == []


def test_parts_are_dealt_largest_first_to_the_least_loaded_task() -> None:
    windows = [
        (7, PartWindow("small", 1, 2, 50)),
        (7, PartWindow("big", 1, 2, 70)),
        (9, PartWindow("mid", 1, 2, 60)),
        (9, PartWindow("tiny", 2, 3, 1)),
    ]
    dealt = _deal(windows, 2)
    # None over an even share (90.5): big -> 0; mid -> 1 (60); small -> 1 (110); tiny -> 0.
    assert dealt == [
        {7: [("big", 1, 2, 0, 1)], 9: [("tiny", 2, 3, 0, 1)]},
        {9: [("mid", 1, 2, 0, 1)], 7: [("small", 1, 2, 0, 1)]},
    ]
    # Equal sizes spread by count.
    same = [(1, PartWindow(f"p{i}", 1, 2, 0)) for i in range(4)]
    assert [len(d.get(1, [])) for d in _deal(same, 2)] == [2, 2]


def test_a_part_larger_than_an_even_share_is_sliced_across_every_task() -> None:
    # One new part per step: every task decodes a slice of it.
    assert _deal([(3, PartWindow("one", 4, 6, 500))], 3) == [
        {3: [("one", 4, 6, 0, 3)]},
        {3: [("one", 4, 6, 1, 3)]},
        {3: [("one", 4, 6, 2, 3)]},
    ]
    # big (120 > 171 / 2) is sliced, 60 to each; mid -> 0 (110); small -> 1 (70).
    windows = [
        (7, PartWindow("small", 1, 2, 10)),
        (7, PartWindow("big", 1, 2, 120)),
        (9, PartWindow("mid", 1, 2, 50)),
    ]
    assert _deal(windows, 2) == [
        {7: [("big", 1, 2, 0, 2)], 9: [("mid", 1, 2, 0, 1)]},
        {7: [("big", 1, 2, 1, 2), ("small", 1, 2, 0, 1)]},
    ]
    # One task: whole parts.
    assert _deal([(3, PartWindow("one", 4, 6, 500))], 1) == [{3: [("one", 4, 6, 0, 1)]}]


async def test_a_skipped_step_moves_the_feeds_window_past_it() -> None:
    feed = ChangeFeed()
    feed.start(5)
    update: Any = ((1,), 5, 1)
    feed.publish(Step(5, 6, [update]))
    assert feed.covers(4) and not feed.has_listeners
    feed.skip(8)
    assert not feed.covers(4), "changes at 5..7 are not held"
    assert feed.covers(7)
    with pytest.raises(FailedPrecondition, match="no longer retained"):
        feed.listen(4)
    listener = feed.listen(7)
    assert feed.has_listeners
    feed.publish(Step(8, 9, [((2,), 8, 1)]))
    steps = listener.steps()
    assert await anext(steps) == Step(8, 9, [((2,), 8, 1)])


async def test_a_follower_hears_only_live_steps_and_ended_listeners_hear_why() -> None:
    """``follow`` (a subscriber whose earlier changes come from the index's history) gets
    the steps after the output's upper, wherever its ``as_of``; ``end_listeners`` ends the
    listeners present with the reason and leaves the feed open to later ones."""
    feed = ChangeFeed()
    feed.start(5)
    feed.skip(9)
    listener, live_from = feed.follow(2)
    assert live_from == 9 and feed.has_listeners
    feed.publish(Step(9, 11, [((1,), 10, 1)]))
    steps = listener.steps()
    assert await anext(steps) == Step(9, 11, [((1,), 10, 1)])
    feed.end_listeners(FailedPrecondition("the index was rebuilt"))
    assert not feed.has_listeners
    with pytest.raises(FailedPrecondition, match="rebuilt"):
        await anext(steps)
    later, live_from = feed.follow(10)
    assert live_from == 11
    feed.publish(Step(11, 12, []))
    assert await anext(later.steps()) == Step(11, 12, [])


def _interval(lower: int, upper: int | None, *keys: str) -> PartsInterval:
    frontier = u64_frontier(lower)
    parts = [BatchInfo(key, frontier, frontier, frontier, 10, 100) for key in keys]
    return PartsInterval(lower, upper, "file:///blobs", parts, 1000)


class _JointStorage:
    """``subscribe_parts_jointly`` answering each call with the next script: its messages,
    then its ending error (``None``: the stream just ends)."""

    def __init__(
        self, scripts: list[tuple[list[JointPartsInterval], TidemarkError | None]]
    ) -> None:
        self.scripts = scripts
        self.calls: list[list[tuple[str, int | None]]] = []

    async def subscribe_parts_jointly(
        self, inputs: Sequence[tuple[Capability, int | None]]
    ) -> AsyncIterator[JointPartsInterval]:
        self.calls.append([(c.collection_id, as_of) for c, as_of in inputs])
        messages, error = self.scripts.pop(0)
        for message in messages:
            yield message
        if error is not None:
            raise error
        await asyncio.Event().wait()  # open until stopped


def _parts_followers(
    storage: _JointStorage, changes: list[int], as_ofs: tuple[int, int] = (4, 4)
) -> list[InputFollower]:
    return [
        InputFollower(
            cast(StorageClient, storage),
            cast(Capability, _Capability(cid)),
            as_of,
            lambda: changes.append(1),
            snapshot=False,
            parts=True,
        )
        for cid, as_of in zip(("u1", "u2"), as_ofs, strict=True)
    ]


async def test_one_joint_stream_feeds_every_parts_follower_and_resumes_at_their_upper() -> None:
    storage = _JointStorage(
        [
            (
                [
                    JointPartsInterval(
                        5, 7, [[_interval(5, 6, "a"), _interval(6, 7, "b")], [_interval(5, 7, "c")]]
                    )
                ],
                Unavailable("storage restarted"),
            ),
            (
                [
                    JointPartsInterval(7, 9, [[_interval(7, 9, "d")], [_interval(7, 9, "e")]]),
                    JointPartsInterval(9, None, [[_interval(9, None)], [_interval(9, None)]]),
                ],
                None,
            ),
        ]
    )
    changes: list[int] = []
    followers = _parts_followers(storage, changes)
    feed = PartsFeed(cast(StorageClient, storage), followers, lambda: changes.append(1))
    feed.start()
    await asyncio.wait_for(feed._task, 5)  # type: ignore[arg-type]
    # From after as_of 4, then again from the upper both held when the stream broke.
    assert storage.calls == [[("u1", 4), ("u2", 4)], [("u1", 6), ("u2", 6)]]
    assert len(changes) == 3, "one waking per message, not per input"
    assert [f.upper for f in followers] == [MAX_TIME, MAX_TIME]
    assert followers[0].take_parts(8) == [
        PartWindow("a", 5, 6, 100),
        PartWindow("b", 6, 7, 100),
        PartWindow("d", 7, 8, 100),
    ]
    assert followers[1].take_parts(MAX_TIME) == [
        PartWindow("c", 5, 7, 100),
        PartWindow("e", 7, 9, 100),
    ]
    assert [f.parts_received for f in followers] == [3, 2]
    assert all(f.error is None and f.blob_url == "file:///blobs" for f in followers)
    await feed.stop()


async def test_a_joint_stream_that_fails_for_good_fails_every_follower() -> None:
    lost = PermissionDenied("the read capability expired")
    storage = _JointStorage([([], lost)])
    changes: list[int] = []
    followers = _parts_followers(storage, changes)
    feed = PartsFeed(cast(StorageClient, storage), followers, lambda: changes.append(1))
    feed.start()
    await asyncio.wait_for(feed._task, 5)  # type: ignore[arg-type]
    assert [f.error for f in followers] == [lost, lost]
    assert changes, "the dataflow is woken to see the error"
    await feed.stop()


async def test_an_input_that_starts_later_resumes_at_its_own_start() -> None:
    # u2 starts at 10: the first message moves the meet to 5 only (u1's upper).
    storage = _JointStorage(
        [
            (
                [JointPartsInterval(5, 5, [[_interval(5, 5)], [_interval(11, 11)]])],
                Unavailable("storage restarted"),
            ),
            ([JointPartsInterval(5, None, [[_interval(5, None)], [_interval(11, None)]])], None),
        ]
    )
    changes: list[int] = []
    followers = _parts_followers(storage, changes, as_ofs=(4, 10))
    feed = PartsFeed(cast(StorageClient, storage), followers, lambda: changes.append(1))
    feed.start()
    await asyncio.wait_for(feed._task, 5)  # type: ignore[arg-type]
    assert storage.calls == [[("u1", 4), ("u2", 10)], [("u1", 4), ("u2", 10)]]
    await feed.stop()


async def test_a_joint_message_for_another_number_of_inputs_fails_the_followers() -> None:
    storage = _JointStorage([([JointPartsInterval(5, 6, [[_interval(5, 6, "a")]])], None)])
    changes: list[int] = []
    followers = _parts_followers(storage, changes)
    feed = PartsFeed(cast(StorageClient, storage), followers, lambda: changes.append(1))
    feed.start()
    await asyncio.wait_for(feed._task, 5)  # type: ignore[arg-type]
    assert all(f.error is not None and "for 1 inputs, not 2" in f.error.message for f in followers)
    assert followers[0].take_parts(MAX_TIME) == []
    await feed.stop()
