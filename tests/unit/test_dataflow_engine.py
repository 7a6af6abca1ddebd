"""The Dataflow's contract: hydration at as_of, steps bounded by the input upper, exact output
times for multi-time batches, validation, and deterministic output."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.compute.dataflow import Dataflow, Update
from services.compute.dataflow import lower as lowering
from services.compute.dataflow.batch import accumulate, consolidate
from services.compute.dataflow.lower import lower
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar import ColumnType as T
from tidemark.errors import FailedPrecondition, Internal, InvalidArgument
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]
NUMS = RelationSchema.of(("g", T.TEXT), ("n", T.INT64))


def count_by_group() -> plan_pb2.Plan:
    return pb.plan(
        pb.reduce(pb.get("t", NUMS), [0], [pb.aggregate("count"), pb.aggregate("sum", 1)])
    )


def test_hydration_returns_the_contents_at_as_of_with_times_advanced() -> None:
    dataflow = Dataflow(count_by_group(), as_of=10)
    out, upper = dataflow.hydrate(
        {"t": [(("a", 1), 3, 1), (("a", 2), 10, 1), (("b", 5), 7, 1), (("b", 5), 9, -1)]}
    )
    assert upper == 11 == dataflow.upper
    assert out == [(("a", 2, 3), 10, 1)]


def test_hydration_refuses_updates_beyond_as_of_and_a_second_call() -> None:
    dataflow = Dataflow(count_by_group(), as_of=10)
    with pytest.raises(InvalidArgument, match="beyond as_of"):
        dataflow.hydrate({"t": [(("a", 1), 11, 1)]})
    dataflow = Dataflow(count_by_group(), as_of=10)
    dataflow.hydrate({})
    with pytest.raises(FailedPrecondition, match="already hydrated"):
        dataflow.hydrate({})


def test_step_output_carries_the_exact_time_of_each_change() -> None:
    dataflow = Dataflow(count_by_group(), as_of=0)
    dataflow.hydrate({})
    batch = [
        (("a", 1), 3, 1),
        (("a", 1), 1, 1),
        (("b", 2), 2, 1),
        (("a", 4), 3, 1),
        (("b", 2), 4, -1),
    ]
    out, upper = dataflow.step({"t": batch}, 5)
    assert upper == 5
    assert out == [
        (("a", 1, 1), 1, 1),
        (("a", 1, 1), 3, -1),
        (("a", 3, 6), 3, 1),
        (("b", 1, 2), 2, 1),
        (("b", 1, 2), 4, -1),
    ]


def test_output_at_a_time_depends_only_on_inputs_up_to_it() -> None:
    """A change at a later time in the same batch must not leak into an earlier time."""
    plan = pb.plan(pb.top_k(pb.get("t", NUMS), [], [1], limit=1))
    dataflow = Dataflow(plan, as_of=0)
    dataflow.hydrate({"t": [(("a", 5), 0, 1)]})
    out, _ = dataflow.step({"t": [(("b", 1), 2, 1), (("c", 3), 1, 1)]}, 3)
    assert out == [(("a", 5), 1, -1), (("b", 1), 2, 1), (("c", 3), 1, 1), (("c", 3), 2, -1)]


def test_updates_that_cancel_at_one_time_produce_nothing() -> None:
    dataflow = Dataflow(count_by_group(), as_of=0)
    dataflow.hydrate({"t": [(("a", 1), 0, 1)]})
    out, upper = dataflow.step({"t": [(("a", 7), 1, 1), (("a", 7), 1, -1)]}, 2)
    assert (out, upper) == ([], 2)


def test_an_empty_step_only_advances_the_upper() -> None:
    dataflow = Dataflow(count_by_group(), as_of=0)
    dataflow.hydrate({})
    assert dataflow.step({}, 5) == ([], 5)
    assert dataflow.step({"t": []}, 5) == ([], 5)
    assert dataflow.upper == 5


@pytest.mark.parametrize(
    ("batch", "upper", "message"),
    [
        ({"t": [(("a", 1), 4, 1)]}, 4, r"outside \[5, 4\)|before the dataflow's upper"),
        ({"t": [(("a", 1), 4, 1)]}, 9, r"time 4 is outside \[5, 9\)"),
        ({"t": [(("a", 1), 9, 1)]}, 9, r"time 9 is outside \[5, 9\)"),
        ({"zz": [(("a", 1), 6, 1)]}, 9, "'zz' is not an input"),
        ({"t": [(("a",), 6, 1)]}, 9, "is not a row of 2 values"),
        ({"t": [(["a", 1], 6, 1)]}, 9, "is not a row of 2 values"),
    ],
)
def test_steps_refuse_updates_outside_the_interval(
    batch: dict[str, list[Update]], upper: int, message: str
) -> None:
    dataflow = Dataflow(count_by_group(), as_of=0)
    dataflow.hydrate({})
    dataflow.step({}, 5)
    with pytest.raises(InvalidArgument, match=message):
        dataflow.step(batch, upper)
    assert dataflow.upper == 5  # a refused step changes nothing


def test_stepping_before_hydration_is_refused() -> None:
    dataflow = Dataflow(count_by_group(), as_of=0)
    with pytest.raises(FailedPrecondition, match="hydrate"):
        dataflow.step({}, 3)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (pb.filter(pb.get("t", NUMS), pb.call("now")), "nondeterministic"),
        (pb.filter(pb.get("t", NUMS), pb.call("frob", 0)), "unknown function 'frob'"),
        (pb.project(pb.get("t", NUMS), 2), "out of range"),
        (pb.union(pb.get("t", NUMS), pb.get("u", RelationSchema.of(("n", T.INT64)))), "input 1"),
        (pb.local_get(3), "local_get"),
        (pb.reduce(pb.get("t", NUMS), [], [pb.aggregate("sum", 0)]), "numeric"),
    ],
)
def test_invalid_plans_are_rejected_at_install(plan: plan_pb2.Relation, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Dataflow(plan, as_of=0)


def test_the_declared_output_schema_is_checked_and_names_come_from_it() -> None:
    relation = pb.reduce(pb.get("t", NUMS), [0], [pb.aggregate("count")])
    good = RelationSchema([Column("group", T.TEXT), Column("rows", T.INT64, nullable=False)])
    assert Dataflow(pb.plan(relation, good), as_of=0).output_names == ("group", "rows")
    wrong = RelationSchema([Column("group", T.TEXT), Column("rows", T.DECIMAL, precision=38)])
    with pytest.raises(InvalidArgument, match="declared"):
        Dataflow(pb.plan(relation, wrong), as_of=0)


def test_engine_and_plan_library_must_agree_on_output_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine derives types itself; a disagreement with the plan library is a bug that
    must stop the install rather than produce wrongly typed output."""
    relation = pb.map(pb.get("t", NUMS), pb.call("add", 1, pb.literal(1, T.INT64)))
    assert [t.kind for t in lower(relation).output_types] == [T.TEXT, T.INT64, T.INT64]
    monkeypatch.setattr(lowering, "derive_schema", lambda rel: RelationSchema.of(("x", T.TEXT)))
    with pytest.raises(Internal, match="derives output types"):
        lower(relation)


# -- determinism ---------------------------------------------------------------------------------


def random_history(seed: int, times: int = 30) -> list[Update]:
    rng = random.Random(seed)
    live: list[Row] = []
    updates: list[Update] = []
    for time in range(1, times):
        for _ in range(rng.randint(0, 6)):
            if live and rng.random() < 0.4:
                row = live.pop(rng.randrange(len(live)))
                updates.append((row, time, -1))
            else:
                row = (rng.choice(["a", "b", None, "c"]), rng.choice([1, 2, 3, None, -5]))
                live.append(row)
                updates.append((row, time, 1))
    return updates


def run_in_batches(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    updates: list[Update],
    uppers: list[int],
    shards: int = 1,
) -> list[list[Update]]:
    dataflow = Dataflow(plan, as_of=0, shards=shards)
    outputs = [dataflow.hydrate({"t": [u for u in updates if u[1] == 0]})[0]]
    for upper in uppers:
        lower = dataflow.upper
        assert lower is not None
        outputs.append(
            dataflow.step({"t": [u for u in updates if lower <= u[1] < upper]}, upper)[0]
        )
    return outputs


def mixed_plan() -> plan_pb2.Relation:
    summed = pb.reduce(pb.get("t", NUMS), [0], [pb.aggregate("sum", 1), pb.aggregate("min", 1)])
    joined = pb.join(pb.get("t", NUMS), summed, [0], [0], kind="left_outer")
    return pb.top_k(joined, [0], [pb.sort_key(1, descending=True)], limit=2)


def test_identical_inputs_give_identical_output_batches() -> None:
    updates = random_history(7)
    uppers = [5, 6, 17, 30]
    first = run_in_batches(mixed_plan(), updates, uppers)
    second = run_in_batches(mixed_plan(), list(reversed(updates)), uppers)
    assert first == second
    assert any(first[1:])


def test_batch_boundaries_do_not_change_the_output_history() -> None:
    updates = random_history(11)
    one_by_one = run_in_batches(mixed_plan(), updates, list(range(1, 31)))
    coarse = run_in_batches(mixed_plan(), updates, [3, 20, 30])
    all_one = [u for batch in one_by_one for u in batch]
    all_coarse = [u for batch in coarse for u in batch]
    # Every change lands at the same time with the same diff, however the input was cut.
    assert consolidate(all_one) == consolidate(all_coarse)
    for time in range(30):
        assert accumulate(all_one, time) == accumulate(all_coarse, time)
