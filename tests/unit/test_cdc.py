"""CDCv2: the writer, the reader under duplication, reordering and re-batching, and the wire form.

The property tests draw small histories on a u64 timeline (times 0..8) and on pairs of times
(0..4 each), so every claim can be checked by brute force against the history itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.cdc import (
    CdcReader,
    CdcWriter,
    Message,
    Progress,
    Updates,
    interval_chain,
    interval_messages,
    read_cdc,
    read_cdc_async,
    write_history,
)
from tidemark.cdc.proto import from_proto, frontier_from_proto, to_proto
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain, u64_frontier
from tidemark.lattice import U64, U64_PAIRS, Lattice
from tidemark.v1 import common_pb2

Time = Any
History = dict[tuple[Any, Time], int]
"""A consolidated history: ``{(data, time): diff}``, no zero diffs."""


@dataclass(frozen=True)
class Line:
    name: str
    lattice: Lattice[Any]
    times: tuple[Time, ...]
    """Times updates are drawn from."""
    bounds: tuple[Time, ...]
    """Frontier elements: the update times plus some just past them, so an upper can cover
    every update without being ``{}``."""
    rank: Callable[[Time], int]
    """A linear extension of the order: drawn cuts are sorted by it, so that they split an
    interval into several pieces rather than jumping to the end at once."""

    def __str__(self) -> str:
        return self.name

    def frontiers(
        self, min_rank: int = 0, max_rank: int = 99, min_size: int = 0, max_size: int = 3
    ) -> st.SearchStrategy[Antichain[Any]]:
        elements = [t for t in self.bounds if min_rank <= self.rank(t) <= max_rank]
        return st.lists(st.sampled_from(elements), min_size=min_size, max_size=max_size).map(
            lambda ts: Antichain(self.lattice, ts)
        )

    def cut_order(self, frontier: Antichain[Any]) -> int:
        return max((self.rank(t) for t in frontier), default=99)


U64_LINE = Line("u64", U64, tuple(range(9)), tuple(range(10)), lambda t: int(t))
PAIR_LINE = Line(
    "pairs",
    U64_PAIRS,
    tuple((a, b) for a in range(5) for b in range(5)),
    tuple((a, b) for a in range(6) for b in range(6)),
    lambda t: int(t[0] + t[1]),
)
LINES = [U64_LINE, PAIR_LINE]


def F(*times: int) -> Antichain[int]:
    return u64_frontier(*times)


def P(*times: tuple[int, int]) -> Antichain[tuple[int, int]]:
    return Antichain(U64_PAIRS, times)


def consolidated(updates: Sequence[tuple[Any, Any, int]]) -> History:
    sums: History = {}
    for data, time, diff in updates:
        sums[(data, time)] = sums.get((data, time), 0) + diff
    return {key: diff for key, diff in sums.items() if diff != 0}


def not_beyond(history: History, frontier: Antichain[Any]) -> History:
    return {(d, t): r for (d, t), r in history.items() if not frontier.less_equal(t)}


def as_updates(history: History) -> list[tuple[Any, Any, int]]:
    return [(d, t, r) for (d, t), r in history.items()]


# -- scenarios ---------------------------------------------------------------------------------


@dataclass
class Batching:
    cuts: list[Antichain[Any]]
    max_updates: int | None


@dataclass
class Scenario:
    line: Line
    lower: Antichain[Any]
    upper: Antichain[Any]
    start: Antichain[Any]
    """Where the reader starts: ``lower`` or later (resuming a stream)."""
    history: History
    deliveries: list[Message[Any, Any]]
    complete: bool
    """Whether every message of the first writing is delivered at least once."""


def batchings(line: Line) -> st.SearchStrategy[Batching]:
    cuts = st.lists(line.frontiers(min_size=1, max_size=2), max_size=6)
    return st.builds(
        Batching,
        cuts.map(lambda fs: sorted(fs, key=line.cut_order)),
        st.one_of(st.none(), st.integers(1, 4)),
    )


@st.composite
def scenarios(draw: st.DrawFn, line: Line) -> Scenario:
    lattice = line.lattice
    lower = draw(
        st.one_of(st.just(Antichain.minimum(lattice)), line.frontiers(max_rank=3, min_size=1))
    )
    # Joining with `lower` keeps the interval well formed; `{}` stays `{}`.
    upper = lower.join(
        draw(st.one_of(st.just(Antichain.empty(lattice)), line.frontiers(5, min_size=1)))
    )
    start = lower
    if draw(st.integers(0, 3)) == 0:
        start = lower.join(draw(line.frontiers(min_size=1))).meet(upper)
    inside = [t for t in line.times if lower.less_equal(t) and not upper.less_equal(t)]
    history: History = {}
    if inside:
        at_least = min(draw(st.sampled_from([0, 1, 4, 8, 12])), 4 * len(inside))
        history = draw(
            st.dictionaries(
                st.tuples(st.sampled_from("abcd"), st.sampled_from(inside)),
                st.sampled_from([-2, -1, 1, 2]),
                min_size=at_least,
                max_size=24,
            )
        )

    first, second = draw(batchings(line)), draw(batchings(line))
    writing_a = write_history(
        as_updates(history), upper, lower, cuts=first.cuts, max_updates=first.max_updates
    )
    writing_b = write_history(
        as_updates(history), upper, lower, cuts=second.cuts, max_updates=second.max_updates
    )
    complete = draw(st.sampled_from([True, True, True, False]))
    least = 1 if complete else 0
    deliveries: list[Message[Any, Any]] = []
    for message in writing_a:
        deliveries.extend([message] * draw(st.integers(least, 3)))
    for message in writing_b:
        deliveries.extend([message] * draw(st.integers(0, 3)))
    draw(st.randoms(use_true_random=False)).shuffle(deliveries)
    return Scenario(line, lower, upper, start, history, deliveries, complete)


def check_reading(s: Scenario) -> None:
    """Push every delivery and check the reader's contract after each push."""
    expected = {k: r for k, r in s.history.items() if s.start.less_equal(k[1])}
    reader: CdcReader[Any, Any] = CdcReader(s.line.lattice, s.start)
    assert reader.frontier == s.start
    reported_batches: list[tuple[Any, Any, int]] = []
    reported: History = {}
    frontier = s.start
    for message in s.deliveries:
        reports = reader.push(message)
        assert len(reports) <= 1
        for updates, new_frontier in reports:
            assert frontier.frontier_less_than(new_frontier), (frontier, new_frontier)
            for data, time, diff in updates:
                assert (data, time) not in reported, "reported twice"
                reported[(data, time)] = diff
            reported_batches.extend(updates)
            frontier = new_frontier
            # Nothing early, nothing missing.
            assert reported == not_beyond(expected, frontier)
        assert reader.frontier == frontier
        held = reader.held_updates
        assert len(held) == reader.pending_updates
        assert all(frontier.less_equal(t) for _, t, _ in held)
        assert all(expected.get((d, t)) == r for d, t, r in held)
        beyond = sum(1 for _, t in expected if frontier.less_equal(t))
        assert reader.pending_updates <= beyond
    assert consolidated(reported_batches) == not_beyond(expected, frontier)
    if s.complete:
        assert frontier == s.upper
        assert reader.pending_updates == 0
        assert reader.pending_progress == 0
        assert reported == expected


@pytest.mark.parametrize("line", LINES, ids=str)
@given(data=st.data())
def test_reader_reassembles_mangled_streams(line: Line, data: st.DataObject) -> None:
    check_reading(data.draw(scenarios(line)))


@pytest.mark.parametrize("line", LINES, ids=str)
@given(data=st.data())
def test_pull_reader_matches_push_reader(line: Line, data: st.DataObject) -> None:
    s = data.draw(scenarios(line))
    reader: CdcReader[Any, Any] = CdcReader(line.lattice, s.start)
    pushed = reader.push_all(s.deliveries)
    assert list(read_cdc(line.lattice, s.deliveries, s.start)) == pushed


@pytest.mark.parametrize("line", LINES, ids=str)
@given(data=st.data())
def test_writer_counts_and_intervals(line: Line, data: st.DataObject) -> None:
    """Progress statements tile ``[lower, upper)`` in order, and count exactly the history."""
    s = data.draw(scenarios(line))
    batching = data.draw(batchings(line))
    messages = write_history(
        as_updates(s.history),
        s.upper,
        s.lower,
        cuts=batching.cuts,
        max_updates=batching.max_updates,
    )
    progress = [m for m in messages if isinstance(m, Progress)]
    if s.lower == s.upper:
        assert messages == []
        return
    assert progress[0].lower == s.lower
    assert progress[-1].upper == s.upper
    for before, after in pairwise(progress):
        assert before.upper == after.lower
        assert before.lower.frontier_less_than(before.upper)
    counted: dict[Any, int] = {}
    for p in progress:
        for time, count in p.counts:
            assert count > 0
            counted[time] = counted.get(time, 0) + count
    per_time: dict[Any, int] = {}
    for _, t in s.history:
        per_time[t] = per_time.get(t, 0) + 1
    assert counted == per_time
    updates = [u for m in messages if isinstance(m, Updates) for u in m.updates]
    assert consolidated(updates) == s.history
    assert len(updates) == len(s.history)
    if batching.max_updates is not None:
        assert all(
            len(m.updates) <= batching.max_updates for m in messages if isinstance(m, Updates)
        )


@given(
    history=st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 8)),
        st.sampled_from([-1, 1, 3]),
        max_size=16,
    ),
    uppers=st.lists(st.integers(0, 9), max_size=5).map(sorted),
    max_updates=st.one_of(st.none(), st.integers(1, 3)),
)
def test_incremental_writer_matches_whole_history(
    history: History, uppers: list[int], max_updates: int | None
) -> None:
    frontiers = [F(u) for u in uppers] + [F()]
    ordered = sorted(as_updates(history), key=lambda u: (u[1], u[0]))
    writer: CdcWriter[str, int] = CdcWriter(F(0), max_updates=max_updates)
    incremental: list[Message[str, int]] = []
    for upper in frontiers:
        lower = writer.frontier
        batch = [u for u in ordered if lower.less_equal(u[1]) and not upper.less_equal(u[1])]
        incremental.extend(writer.append(batch, upper))
        assert writer.frontier == upper
    assert incremental == write_history(ordered, F(), cuts=frontiers, max_updates=max_updates)
    reports = list(read_cdc(U64, incremental))
    assert reports[-1][1] == F()
    assert consolidated([u for batch, _ in reports for u in batch]) == history


# -- examples ----------------------------------------------------------------------------------

# The example history of the CDCv2 design: three records over three times.
EXAMPLE = [
    ("record0", 0, 2),
    ("record1", 0, 1),
    ("record2", 0, 1),
    ("record1", 1, -1),
    ("record2", 1, 1),
    ("record0", 2, -1),
    ("record2", 2, -1),
]

EXAMPLE_MESSAGES: list[Message[str, int]] = [
    Updates(EXAMPLE[:3]),
    Progress(F(0), F(1), [(0, 3)]),
    Updates(EXAMPLE[3:5]),
    Progress(F(1), F(2), [(1, 2)]),
    Updates(EXAMPLE[5:]),
    Progress(F(2), F(3), [(2, 2)]),
    Progress(F(3), F(4)),
]


def test_example_in_order_reports_each_time() -> None:
    reports = list(read_cdc(U64, EXAMPLE_MESSAGES))
    assert [frontier for _, frontier in reports] == [F(1), F(2), F(3), F(4)]
    assert [sorted(updates) for updates, _ in reports] == [
        sorted(EXAMPLE[:3]),
        sorted(EXAMPLE[3:5]),
        sorted(EXAMPLE[5:]),
        [],
    ]


def test_example_writer_matches_the_design() -> None:
    assert write_history(EXAMPLE, F(4), cuts=[F(1), F(2), F(3)]) == EXAMPLE_MESSAGES
    whole = Progress(F(0), F(4), [(0, 3), (1, 2), (2, 2)])
    assert write_history(EXAMPLE, F(4)) == [Updates(EXAMPLE), whole]


def test_example_reversed_reports_once_at_the_end() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    for message in reversed(EXAMPLE_MESSAGES[1:]):
        assert reader.push(message) == []
    # Updates at 1 and 2 are held; counts at 1 and 2 are in, time 0 is still owed 3 updates.
    assert reader.pending_updates == 4
    assert reader.frontier == F(0)
    [(updates, frontier)] = reader.push(EXAMPLE_MESSAGES[0])
    assert frontier == F(4)
    assert sorted(updates) == sorted(EXAMPLE)
    assert reader.pending_updates == 0


def test_progress_waits_for_its_updates_and_duplicates_are_ignored() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    assert reader.push(Progress(F(0), F(5), [(0, 2), (3, 1)])) == []
    assert reader.push(Updates([("a", 0, 1)])) == []
    assert reader.push(Updates([("a", 0, 1)])) == []  # a duplicate does not count twice
    assert reader.push(Updates([("b", 0, -1), ("c", 3, 4)])) == [
        ([("a", 0, 1), ("b", 0, -1), ("c", 3, 4)], F(5))
    ]
    # Late duplicates of reported information change nothing.
    assert reader.push(Updates([("c", 3, 4)])) == []
    assert reader.push(Progress(F(0), F(5), [(0, 2), (3, 1)])) == []
    assert reader.pending_updates == 0


def test_progress_reports_partially_while_earlier_updates_are_missing() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    reader.push(Updates([("x", 2, 1)]))
    assert reader.push(Progress(F(0), F(4), [(2, 1), (3, 1)])) == [([("x", 2, 1)], F(3))]
    assert reader.push(Updates([("y", 3, 1)])) == [([("y", 3, 1)], F(4))]


def test_rebatched_progress_statements_mix() -> None:
    # Two writings of the same history with different intervals; half of each is delivered.
    history = [("a", 1, 1), ("b", 3, 1), ("c", 5, -1)]
    left = write_history(history, F(6), cuts=[F(2), F(4)])
    right = write_history(history, F(6), cuts=[F(3)])
    mixed: list[Message[str, int]] = [m for m in left if isinstance(m, Updates)]
    mixed += [Progress(F(0), F(2), [(1, 1)]), Progress(F(3), F(6), [(3, 1), (5, 1)])]
    assert Progress(F(0), F(2), [(1, 1)]) in left
    assert Progress(F(3), F(6), [(3, 1), (5, 1)]) in right
    reader: CdcReader[str, int] = CdcReader(U64)
    reports = reader.push_all(mixed)
    # [2, 3) is covered by neither statement delivered so far.
    assert [f for _, f in reports] == [F(2)]
    assert reader.pending_progress == 1
    reports = reader.push(Progress(F(2), F(4), [(3, 1)]))  # from `left`
    assert reports == [([("b", 3, 1), ("c", 5, -1)], F(6))]
    assert reader.pending_progress == 0


def test_product_times_complete_independently() -> None:
    # (0, 1) and (1, 0) are incomparable: one can complete while the other still waits.
    reader: CdcReader[str, tuple[int, int]] = CdcReader(U64_PAIRS)
    upper = P((0, 2), (2, 0))
    assert reader.push(Progress(P((0, 0)), upper, [((0, 1), 1), ((1, 0), 1)])) == [
        ([], P((0, 1), (1, 0)))
    ]
    assert reader.push(Updates([("a", (1, 0), 1)])) == [([("a", (1, 0), 1)], P((0, 1), (2, 0)))]
    assert reader.push(Updates([("b", (0, 1), 1)])) == [([("b", (0, 1), 1)], upper)]
    # The region {(0..1, 0..1)} is closed; a statement starting at (1, 1) cannot be grafted
    # yet, because (0, 2) and beyond are not covered.
    assert reader.push(Progress(P((1, 1)), P(), [((3, 3), 1)])) == []
    assert reader.pending_progress == 1
    # Closing the gap grafts both statements: only the count at (3, 3) is still owed.
    assert reader.push(Progress(upper, P((1, 2), (2, 1)))) == [([], P((3, 3)))]
    assert reader.pending_progress == 0
    assert reader.push(Updates([("c", (3, 3), -1)])) == [([("c", (3, 3), -1)], P())]


def test_end_of_stream_drops_everything_after() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    assert reader.push(Progress(F(0), F(), [(7, 1)])) == [([], F(7))]
    assert reader.push(Updates([("z", 7, 2)])) == [([("z", 7, 2)], F())]
    assert reader.push(Updates([("z", 7, 2), ("late", 9, 1)])) == []
    assert reader.push(Progress(F(0), F(), [(7, 1)])) == []
    assert reader.pending_updates == 0
    assert reader.frontier == F()


def test_reader_resumes_from_a_later_frontier() -> None:
    reader: CdcReader[str, int] = CdcReader(U64, F(2))
    reports = reader.push_all(EXAMPLE_MESSAGES)
    assert reports[-1][1] == F(4)
    assert sorted(u for updates, _ in reports for u in updates) == sorted(EXAMPLE[5:])


async def test_async_reader() -> None:
    async def stream() -> AsyncIterator[Message[str, int]]:
        for message in reversed(EXAMPLE_MESSAGES):
            yield message

    reports = [r async for r in read_cdc_async(U64, stream())]
    assert len(reports) == 1
    assert reports[0][1] == F(4)
    assert sorted(reports[0][0]) == sorted(EXAMPLE)


def test_interval_chain_clamps_and_orders_cuts() -> None:
    assert interval_chain(F(2), F(8), [F(5), F(1), F(9), F(6)]) == [F(2), F(5), F(8)]
    assert interval_chain(F(0), F(), [F(3), F()]) == [F(0), F(3), F()]
    chain = interval_chain(P((0, 0)), P((3, 3)), [P((1, 0)), P((0, 1))])
    assert chain == [P((0, 0)), P((1, 0)), P((1, 1)), P((3, 3))]


# -- wire form ---------------------------------------------------------------------------------


@given(
    history=st.dictionaries(
        st.tuples(st.binary(max_size=4), st.sampled_from([0, 1, 7, (1 << 64) - 1])),
        st.sampled_from([-(1 << 63), -1, 2, (1 << 63) - 1]),
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 9).map(F), max_size=3),
    max_updates=st.one_of(st.none(), st.integers(1, 3)),
)
def test_proto_round_trip(
    history: History, cuts: list[Antichain[int]], max_updates: int | None
) -> None:
    messages = write_history(as_updates(history), F(), cuts=cuts, max_updates=max_updates)
    assert messages
    for message in messages:
        wire = common_pb2.CdcMessage.FromString(to_proto(message).SerializeToString())
        assert from_proto(wire) == message


def test_proto_keeps_an_empty_upper_explicit() -> None:
    wire = to_proto(Progress(F(3), F(), [(4, 2)]))
    assert wire.progress.HasField("upper")
    assert list(wire.progress.upper.elements) == []
    assert from_proto(wire) == Progress(F(3), F(), [(4, 2)])


def test_proto_arrow_payload_needs_a_decoder() -> None:
    wire = common_pb2.CdcMessage(
        updates=common_pb2.Updates(
            updates=[common_pb2.Update(data=b"r", time=1, diff=1)], arrow_ipc=b"\x01\x02"
        )
    )
    with pytest.raises(InvalidArgument, match="Arrow"):
        from_proto(wire)

    def decode(payload: bytes) -> list[tuple[str, int, int]]:
        assert payload == b"\x01\x02"
        return [("decoded", 2, -1)]

    assert from_proto(wire, decode) == Updates([(b"r", 1, 1), ("decoded", 2, -1)])


@pytest.mark.parametrize(
    "wire",
    [
        common_pb2.CdcMessage(),
        common_pb2.CdcMessage(progress=common_pb2.Progress(lower=common_pb2.Frontier())),
        common_pb2.CdcMessage(progress=common_pb2.Progress(upper=common_pb2.Frontier())),
        common_pb2.CdcMessage(
            progress=common_pb2.Progress(
                lower=common_pb2.Frontier(elements=[3, 5]), upper=common_pb2.Frontier()
            )
        ),
        common_pb2.CdcMessage(
            progress=common_pb2.Progress(
                lower=common_pb2.Frontier(elements=[1]),
                upper=common_pb2.Frontier(elements=[4]),
                counts=[common_pb2.TimeCount(time=4, count=1)],
            )
        ),
        common_pb2.CdcMessage(
            updates=common_pb2.Updates(updates=[common_pb2.Update(data=b"x", time=1, diff=0)])
        ),
    ],
    ids=["no-kind", "no-upper", "no-lower", "not-an-antichain", "count-at-upper", "zero-diff"],
)
def test_proto_rejects_malformed_messages(wire: common_pb2.CdcMessage) -> None:
    with pytest.raises(InvalidArgument):
        from_proto(wire)


def test_frontier_from_proto_rejects_repeats() -> None:
    with pytest.raises(InvalidArgument, match="antichain"):
        frontier_from_proto(common_pb2.Frontier(elements=[3, 3]))
    assert frontier_from_proto(common_pb2.Frontier(elements=[3])) == F(3)


@pytest.mark.parametrize(
    "message",
    [
        Updates([("not bytes", 1, 1)]),
        Updates([(b"x", -1, 1)]),
        Updates([(b"x", 1 << 64, 1)]),
        Updates([(b"x", 1, 1 << 63)]),
        Progress(F(0), F(), [(3, 1 << 64)]),
    ],
)
def test_to_proto_rejects_values_the_wire_cannot_carry(message: Message[Any, int]) -> None:
    with pytest.raises(InvalidArgument):
        to_proto(message)


# -- malformed input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lower", "upper", "counts", "why"),
    [
        (F(2), F(5), [(1, 1)], "outside"),
        (F(2), F(5), [(5, 1)], "outside"),
        (F(2), F(), [(3, 1), (3, 1)], "more than once"),
        (F(2), F(5), [(3, -1)], "negative"),
        (F(5), F(2), [], "not at or before"),
        (F(), F(2), [], "not at or before"),
        (P((0, 0)), P((1, 1)), [((1, 2), 1)], "outside"),
    ],
)
def test_malformed_progress_is_rejected(
    lower: Antichain[Any], upper: Antichain[Any], counts: list[tuple[Any, int]], why: str
) -> None:
    with pytest.raises(InvalidArgument, match=why):
        Progress(lower, upper, counts)


def test_zero_diff_updates_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match="zero diff"):
        Updates([("a", 1, 0)])


def test_conflicting_diffs_are_rejected_without_side_effects() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    reader.push(Updates([("a", 1, 1)]))
    with pytest.raises(InvalidArgument, match="conflicting"):
        reader.push(Updates([("b", 1, 1), ("a", 1, 2)]))
    with pytest.raises(InvalidArgument, match="conflicting"):
        reader.push(Updates([("c", 1, 1), ("c", 1, -1)]))
    assert reader.held_updates == [("a", 1, 1)]
    assert reader.push(Progress(F(0), F(2), [(1, 1)])) == [([("a", 1, 1)], F(2))]


def test_updates_beyond_their_count_are_rejected() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    reader.push(Progress(F(0), F(5), [(1, 1), (2, 1)]))
    with pytest.raises(InvalidArgument, match="more distinct updates"):
        reader.push(Updates([("a", 2, 1), ("b", 2, 1)]))
    with pytest.raises(InvalidArgument, match="more distinct updates"):
        reader.push(Updates([("a", 3, 1)]))  # time 3 was stated to have none
    assert reader.pending_updates == 0
    assert reader.push(Updates([("a", 2, 1)])) == []
    assert reader.push(Updates([("a", 1, 1)])) == [([("a", 2, 1), ("a", 1, 1)], F(5))]


def test_progress_contradicting_received_updates_stops_the_reader() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    reader.push(Updates([("a", 3, 1), ("b", 3, 1)]))
    with pytest.raises(InvalidArgument, match="more distinct updates"):
        reader.push(Progress(F(0), F(5), [(3, 1)]))
    with pytest.raises(InvalidArgument, match="stopped"):
        reader.push(Updates([("c", 6, 1)]))


def test_progress_on_another_timeline_is_rejected() -> None:
    reader: CdcReader[str, int] = CdcReader(U64)
    with pytest.raises(InvalidArgument, match="timeline"):
        reader.push(Progress(P((0, 0)), P((1, 1))))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("updates", "lower", "upper", "why"),
    [
        ([("a", 1, 1), ("a", 1, 1)], F(0), F(5), "not consolidated"),
        ([("a", 5, 1)], F(0), F(5), "outside"),
        ([("a", 1, 1)], F(2), F(5), "outside"),
        ([("a", 1, 0)], F(0), F(5), "zero diff"),
        ([], F(5), F(0), "not at or before"),
    ],
)
def test_writer_rejects_bad_intervals(
    updates: list[tuple[str, int, int]],
    lower: Antichain[int],
    upper: Antichain[int],
    why: str,
) -> None:
    with pytest.raises(InvalidArgument, match=why):
        interval_messages(updates, lower, upper)
    with pytest.raises(InvalidArgument, match=why):
        write_history(updates, upper, lower, cuts=[F(3)])


def test_writer_rejects_empty_batches() -> None:
    with pytest.raises(InvalidArgument, match="max_updates"):
        interval_messages([("a", 1, 1)], F(0), F(5), max_updates=0)
