"""A GROUP BY view, a DISTINCT view, a top-k view and a window view whose state is mostly
Reduce, Distinct, TopK or Window state (many groups, many distinct rows), a random history of
inserts, retractions and moves over their input, and the check that a maintained view equals
the reference evaluator at every time."""

from __future__ import annotations

import random
from typing import Any

from services.compute.dataflow import Index, Update
from services.compute.dataflow.ordering import NAN
from tests.support import reference_eval
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.v1 import plan_pb2

EVENTS = RelationSchema.of(
    ("id", ColumnType.INT64),
    ("grp", ColumnType.INT64),
    ("amount", ColumnType.INT64),
    ("score", ColumnType.FLOAT64),
)


def group_view() -> plan_pb2.Plan:
    """Per group: COUNT(*), SUM(amount), MIN(amount), MAX(score) (NaN included) and
    COUNT(DISTINCT amount): the groups keep ordered values and distinct counts."""
    root = pb.reduce(
        pb.get("events", EVENTS),
        [1],
        [
            pb.aggregate("count"),
            pb.aggregate("sum", 2),
            pb.aggregate("min", 2),
            pb.aggregate("max", 3),
            pb.aggregate("count", 2, distinct=True),
        ],
    )
    return pb.plan(root, derive_schema(root))


def distinct_view() -> plan_pb2.Plan:
    """The distinct (group, amount) pairs."""
    root = pb.distinct(pb.project(pb.get("events", EVENTS), 1, 2))
    return pb.plan(root, derive_schema(root))


def top_view() -> plan_pb2.Plan:
    """Per group, the two events of highest score (NaN highest), then lowest id, past the
    first one."""
    root = pb.top_k(
        pb.get("events", EVENTS), [1], [pb.sort_key(3, descending=True), 0], limit=2, offset=1
    )
    return pb.plan(root, derive_schema(root))


def window_view() -> plan_pb2.Plan:
    """Per group, events by score (NaN highest) then id: the row number, the rank, the sum of
    amount over this row and the one before, and the amount before (0 for the first)."""
    rows = pb.frame("rows", ("preceding", 1), "current_row")
    root = pb.window(
        pb.get("events", EVENTS),
        [1],
        [pb.sort_key(3, descending=True), 0],
        [
            pb.window_function("row_number"),
            pb.window_function("rank"),
            pb.window_function("sum", 2, frame=rows),
            pb.window_function("lag", 2, default=pb.literal(0, ColumnType.INT64)),
        ],
    )
    return pb.plan(root, derive_schema(root))


class Events:
    """Events over ``groups`` groups, and random steps of changes to them: moves (a
    retraction and an insertion at the same time), deletions and insertions."""

    def __init__(self, rows: int, groups: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.groups = groups
        self.next_id = rows
        self.current = {number: self._event(number) for number in range(rows)}
        self.history: list[Update] = [(row, 0, 1) for row in self.current.values()]

    def _event(self, number: int) -> tuple[Any, ...]:
        rng = self.rng
        score = NAN if rng.random() < 0.05 else float(rng.randint(-50, 50))
        return (number, rng.randrange(self.groups), rng.randint(1, 30), score)

    def step(self, first: int, times: int, changes: int) -> list[Update]:
        """``changes`` changes spread over times ``first`` .. ``first + times - 1``."""
        rng, out = self.rng, []
        for number in range(changes):
            at = first + number * times // changes
            kind = rng.random()
            if kind < 0.6 and self.current:
                event_id = rng.choice(sorted(self.current))
                out.append((self.current[event_id], at, -1))
                self.current[event_id] = self._event(event_id)
                out.append((self.current[event_id], at, 1))
            elif kind < 0.8 and self.current:
                event_id = rng.choice(sorted(self.current))
                out.append((self.current.pop(event_id), at, -1))
            else:
                self.current[self.next_id] = self._event(self.next_id)
                out.append((self.current[self.next_id], at, 1))
                self.next_id += 1
        self.history.extend(out)
        return out


def assert_exact_at_every_time(
    plan: plan_pb2.Plan, history: list[Update], index: Index, upper: int
) -> None:
    for time in range(upper):
        contents: dict[Any, int] = {}
        for row, at, diff in history:
            if at <= time:
                contents[row] = contents.get(row, 0) + diff
        expected = reference_eval.evaluate(plan, {"events": contents})
        assert reference_eval.canonical(index.contents_at(time)) == expected, time
