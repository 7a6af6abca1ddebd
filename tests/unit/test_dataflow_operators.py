"""Each operator of the dataflow engine on hand-made histories: NULLs, retractions, several
times in one step, outer-join transitions, MIN/MAX under deletes, top-k ties."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow import Dataflow, Update
from services.compute.dataflow.batch import accumulate
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar import ColumnType as T
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]

KV = RelationSchema.of(("k", T.INT64), ("v", T.TEXT))
NUMS = RelationSchema.of(("g", T.TEXT), ("n", T.INT64))


def run(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    history: Mapping[str, Sequence[Update]],
    uppers: Sequence[int],
    as_of: int = 0,
) -> tuple[list[Update], list[list[Update]]]:
    """Hydrates at ``as_of``, then steps to each upper in turn. Returns every output update
    and the output of each call (hydration first)."""
    dataflow = Dataflow(plan, as_of=as_of)
    snapshot = {name: [u for u in ups if u[1] <= as_of] for name, ups in history.items()}
    first, upper = dataflow.hydrate(snapshot)
    calls = [first]
    for step_upper in uppers:
        batch = {
            name: [u for u in ups if upper <= u[1] < step_upper] for name, ups in history.items()
        }
        out, upper = dataflow.step(batch, step_upper)
        assert upper == step_upper
        calls.append(out)
    return [u for call in calls for u in call], calls


def at(updates: Sequence[Update], time: int) -> dict[Row, int]:
    return accumulate(updates, time)


# -- linear --------------------------------------------------------------------------------------


def test_filter_keeps_only_true_rows() -> None:
    plan = pb.filter(pb.get("kv", KV), pb.call("gt", pb.column(0), pb.literal(1, T.INT64)))
    history: dict[str, list[Update]] = {
        "kv": [
            ((1, "a"), 0, 1),
            ((2, "b"), 0, 1),
            ((None, "c"), 0, 1),
            ((3, None), 1, 2),
            ((2, "b"), 2, -1),
        ]
    }
    out, calls = run(plan, history, [3])
    assert calls[0] == [((2, "b"), 0, 1)]
    assert calls[1] == [((2, "b"), 2, -1), ((3, None), 1, 2)]
    assert at(out, 2) == {(3, None): 2}


def test_map_sees_earlier_expressions_and_project_repeats_columns() -> None:
    plan = pb.project(
        pb.map(
            pb.get("kv", KV),
            pb.call("add", pb.column(0), pb.literal(10, T.INT64)),
            pb.call("mul", pb.column(2), pb.literal(2, T.INT64)),
        ),
        3,
        1,
        3,
    )
    out, _ = run(plan, {"kv": [((1, "a"), 0, 1), ((None, "b"), 0, 3)]}, [])
    assert at(out, 0) == {(22, "a", 22): 1, (None, "b", None): 3}


def test_union_with_negate_is_a_multiset_difference() -> None:
    plan = pb.union(pb.get("a", KV), pb.negate(pb.get("b", KV)))
    history: dict[str, list[Update]] = {
        "a": [((1, "x"), 0, 2), ((2, "y"), 0, 1)],
        "b": [((1, "x"), 0, 1), ((3, "z"), 1, 1), ((3, "z"), 2, -1)],
    }
    out, _ = run(plan, history, [3])
    assert at(out, 0) == {(1, "x"): 1, (2, "y"): 1}
    assert at(out, 1) == {(1, "x"): 1, (2, "y"): 1, (3, "z"): -1}
    assert at(out, 2) == {(1, "x"): 1, (2, "y"): 1}


def test_constant_rows_appear_at_as_of() -> None:
    schema = RelationSchema([Column("x", T.INT64, False), Column("d", T.DECIMAL, True, 5, 2)])
    plan = pb.constant(schema, [((1, Decimal("1.50")), 2), ((2, None), -1)])
    _, calls = run(plan, {}, [9], as_of=4)
    assert calls[0] == [((1, Decimal("1.50")), 4, 2), ((2, None), 4, -1)]
    assert calls[1] == []


def test_floats_from_inputs_are_normalised() -> None:
    schema = RelationSchema.of(("f", T.FLOAT64))
    plan = pb.distinct(pb.get("f", schema))
    out, _ = run(
        plan,
        {"f": [((-0.0,), 0, 1), ((0.0,), 0, 1), ((float("nan"),), 0, 1), ((-float("nan"),), 0, 1)]},
        [],
    )
    contents = at(out, 0)
    assert len(contents) == 2
    (zero,) = [row for row in contents if row[0] == 0.0]
    assert math.copysign(1.0, zero[0]) == 1.0


# -- join ----------------------------------------------------------------------------------------


def test_inner_join_multiplies_and_ignores_null_keys() -> None:
    plan = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0])
    history: dict[str, list[Update]] = {
        "l": [((1, "a"), 0, 2), ((None, "n"), 0, 1), ((2, "b"), 1, 1)],
        "r": [((1, "x"), 0, 3), ((None, "m"), 0, 1), ((2, "y"), 2, 1), ((1, "x"), 3, -3)],
    }
    out, _ = run(plan, history, [4])
    assert at(out, 0) == {(1, "a", 1, "x"): 6}
    assert at(out, 1) == {(1, "a", 1, "x"): 6}
    assert at(out, 2) == {(1, "a", 1, "x"): 6, (2, "b", 2, "y"): 1}
    assert at(out, 3) == {(2, "b", 2, "y"): 1}


_SIDE = st.lists(
    st.tuples(
        st.tuples(st.sampled_from([1, 2, 3, None]), st.sampled_from(["a", "b"])),
        st.integers(0, 11),
        st.sampled_from([-1, 1, 2]),
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(left=_SIDE, right=_SIDE, cuts=st.sets(st.integers(1, 12), max_size=6))
def test_inner_join_is_the_join_of_its_inputs_at_every_time(
    left: list[Update], right: list[Update], cuts: set[int]
) -> None:
    # Steps of every shape: both sides changing, one side alone (the path that meets the
    # other side as it stands across the step's times), neither.
    plan = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0])
    out, _ = run(plan, {"l": left, "r": right}, sorted(cuts | {12}))
    for time in range(12):
        lefts, rights = at(left, time), at(right, time)
        expected: dict[Row, int] = {}
        for l_row, l_count in lefts.items():
            for r_row, r_count in rights.items():
                if l_row[0] is not None and l_row[0] == r_row[0]:
                    joined = (*l_row, *r_row)
                    expected[joined] = expected.get(joined, 0) + l_count * r_count
        assert at(out, time) == {row: n for row, n in expected.items() if n}


def test_join_matches_keys_across_numeric_types() -> None:
    decimals = RelationSchema.of(("d", T.DECIMAL), ("w", T.TEXT))
    plan = pb.join(pb.get("l", KV), pb.get("r", decimals), [0], [0])
    history: dict[str, list[Update]] = {
        "l": [((1, "a"), 0, 1), ((2, "b"), 0, 1)],
        "r": [((Decimal("1.00"), "one"), 0, 1), ((Decimal("2.5"), "x"), 0, 1)],
    }
    out, _ = run(plan, history, [])
    assert at(out, 0) == {(1, "a", Decimal("1.00"), "one"): 1}


def test_cross_join_without_keys() -> None:
    plan = pb.join(pb.get("l", KV), pb.get("r", KV))
    history = {"l": [((1, "a"), 0, 1), ((2, "b"), 1, 1)], "r": [((5, "x"), 0, 2)]}
    out, _ = run(plan, history, [2])
    assert at(out, 1) == {(1, "a", 5, "x"): 2, (2, "b", 5, "x"): 2}


def test_left_outer_join_transitions_emit_exact_updates() -> None:
    plan = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0], kind="left_outer")
    history: dict[str, list[Update]] = {
        "l": [((1, "a"), 0, 2), ((None, "n"), 0, 1), ((1, "b"), 3, 1)],
        "r": [((1, "x"), 1, 1), ((1, "y"), 2, 1), ((1, "x"), 2, -1), ((1, "y"), 3, -1)],
    }
    # All four times in one step: the transitions still land at their own times.
    _, calls = run(plan, history, [5])
    assert calls[0] == [((1, "a", None, None), 0, 2), ((None, "n", None, None), 0, 1)]
    # Canonical order: by row (NULLs last), then time.
    assert calls[1] == [
        ((1, "a", 1, "x"), 1, 2),
        ((1, "a", 1, "x"), 2, -2),
        ((1, "a", 1, "y"), 2, 2),
        ((1, "a", 1, "y"), 3, -2),
        ((1, "a", None, None), 1, -2),  # matched at 1: the padded rows go
        ((1, "a", None, None), 3, 2),  # unmatched again at 3
        ((1, "b", None, None), 3, 1),
    ]


def test_left_outer_join_padding_follows_the_match_state() -> None:
    plan = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0], kind="left_outer")
    history: dict[str, list[Update]] = {
        "l": [((1, "a"), 0, 2), ((1, "a"), 3, 1), ((1, "a"), 5, -3)],
        "r": [((1, "x"), 1, 1), ((1, "x"), 2, -1), ((1, "x"), 4, 1)],
    }
    out, _ = run(plan, history, [2, 4, 6])
    assert at(out, 0) == {(1, "a", None, None): 2}
    assert at(out, 1) == {(1, "a", 1, "x"): 2}
    assert at(out, 2) == {(1, "a", None, None): 2}
    assert at(out, 3) == {(1, "a", None, None): 3}
    assert at(out, 4) == {(1, "a", 1, "x"): 3}
    assert at(out, 5) == {}


def test_right_and_full_outer_joins() -> None:
    history: dict[str, list[Update]] = {
        "l": [((1, "a"), 0, 1), ((2, "b"), 1, 1), ((1, "a"), 2, -1)],
        "r": [((2, "y"), 0, 1), ((3, "z"), 0, 1), ((None, "n"), 1, 1)],
    }
    right = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0], kind="right_outer")
    out, _ = run(right, history, [1, 3])
    assert at(out, 0) == {(None, None, 2, "y"): 1, (None, None, 3, "z"): 1}
    assert at(out, 1) == {(2, "b", 2, "y"): 1, (None, None, 3, "z"): 1, (None, None, None, "n"): 1}
    full = pb.join(pb.get("l", KV), pb.get("r", KV), [0], [0], kind="full_outer")
    out, _ = run(full, history, [3])
    assert at(out, 0) == {(1, "a", None, None): 1, (None, None, 2, "y"): 1, (None, None, 3, "z"): 1}
    assert at(out, 1) == {
        (1, "a", None, None): 1,
        (2, "b", 2, "y"): 1,
        (None, None, 3, "z"): 1,
        (None, None, None, "n"): 1,
    }
    assert at(out, 2) == {(2, "b", 2, "y"): 1, (None, None, 3, "z"): 1, (None, None, None, "n"): 1}


# -- reduce --------------------------------------------------------------------------------------


def aggregates_plan(
    *aggregates: plan_pb2.Aggregate, group: Sequence[int] = (0,)
) -> plan_pb2.Relation:
    return pb.reduce(pb.get("t", NUMS), group, aggregates)


def test_reduce_aggregates_with_nulls_and_retractions() -> None:
    plan = aggregates_plan(
        pb.aggregate("count"),
        pb.aggregate("count", 1),
        pb.aggregate("sum", 1),
        pb.aggregate("avg", 1),
        pb.aggregate("min", 1),
        pb.aggregate("max", 1),
    )
    history: dict[str, list[Update]] = {
        "t": [
            (("a", 1), 0, 2),
            (("a", None), 0, 1),
            (("a", 4), 0, 1),
            ((None, 7), 0, 1),
            (("b", None), 1, 1),
            (("a", 4), 2, -1),
            (("b", None), 3, -1),
        ]
    }
    out, _ = run(plan, history, [4])
    assert at(out, 0) == {
        ("a", 4, 3, Decimal(6), 2.0, 1, 4): 1,
        (None, 1, 1, Decimal(7), 7.0, 7, 7): 1,  # NULL keys form a group
    }
    assert at(out, 1)[("b", 1, 0, None, None, None, None)] == 1
    assert ("a", 3, 2, Decimal(2), 1.0, 1, 1) in at(out, 2)
    assert at(out, 3) == {
        ("a", 3, 2, Decimal(2), 1.0, 1, 1): 1,
        (None, 1, 1, Decimal(7), 7.0, 7, 7): 1,
    }


def test_reduce_emits_a_retraction_and_an_insertion_per_change() -> None:
    plan = aggregates_plan(pb.aggregate("sum", 1))
    history: dict[str, list[Update]] = {
        "t": [
            (("a", 1), 0, 1),
            (("a", 2), 1, 1),
            (("a", 5), 1, 1),
            (("a", 3), 2, 1),
            (("a", 3), 2, -1),
            (("a", 1), 3, -1),
            (("a", 2), 3, -1),
            (("a", 5), 3, -1),
        ]
    }
    _, calls = run(plan, history, [4])
    assert calls[1] == [
        (("a", Decimal(1)), 1, -1),
        (("a", Decimal(8)), 1, 1),
        (("a", Decimal(8)), 3, -1),
    ]


def test_min_and_max_survive_deletes_of_the_extremes() -> None:
    plan = aggregates_plan(pb.aggregate("min", 1), pb.aggregate("max", 1))
    history: dict[str, list[Update]] = {
        "t": [
            (("g", 5), 0, 1),
            (("g", 3), 0, 2),
            (("g", 9), 0, 1),
            (("g", 3), 1, -1),  # one copy of the minimum left
            (("g", 3), 2, -1),
            (("g", 9), 3, -1),
            (("g", 5), 4, -1),
            (("g", 11), 5, 1),
        ]
    }
    out, _ = run(plan, history, [2, 3, 6])
    expected = {0: (3, 9), 1: (3, 9), 2: (5, 9), 3: (5, 5), 5: (11, 11)}
    for time, (low, high) in expected.items():
        assert at(out, time) == {("g", low, high): 1}
    assert at(out, 4) == {}


def test_min_max_order_nan_above_floats_and_text_by_code_point() -> None:
    schema = RelationSchema.of(("t", T.TEXT), ("f", T.FLOAT64))
    plan = pb.reduce(
        pb.get("t", schema), (), [pb.aggregate(f, c) for f in ("min", "max") for c in (0, 1)]
    )
    history: dict[str, list[Update]] = {
        "t": [
            (("b", 1.0), 0, 1),
            (("B", float("nan")), 0, 1),
            (("é", -math.inf), 0, 1),
            (("é", -math.inf), 1, -1),
        ]
    }
    out, _ = run(plan, history, [2])
    ((row, _),) = at(out, 0).items()
    assert row[:2] == ("B", -math.inf) and row[2] == "é" and math.isnan(row[3])
    ((row, _),) = at(out, 1).items()
    assert row[:3] == ("B", 1.0, "b")


def test_float_sums_are_exact_and_order_independent() -> None:
    schema = RelationSchema.of(("g", T.TEXT), ("f", T.FLOAT64))
    plan = pb.reduce(pb.get("t", schema), (0,), [pb.aggregate("sum", 1), pb.aggregate("avg", 1)])
    values = [1e16, 1.0, -1e16, 0.1, 0.2]
    exact = math.fsum(values)
    for order in (values, list(reversed(values)), sorted(values)):
        ordered = {"t": [(("g", v), i, 1) for i, v in enumerate(order)]}
        out, _ = run(plan, ordered, [3, 6])
        assert at(out, 4) == {("g", exact, exact / 5): 1}
    # Infinities and NaN count as values and can be taken out again.
    history: dict[str, list[Update]] = {
        "t": [
            (("g", 1.5), 0, 1),
            (("g", math.inf), 1, 1),
            (("g", -math.inf), 2, 1),
            (("g", math.inf), 3, -1),
            (("g", -math.inf), 4, -1),
        ]
    }
    out, _ = run(plan, history, [5])
    assert at(out, 1) == {("g", math.inf, math.inf): 1}
    assert math.isnan(next(iter(at(out, 2)))[1])
    assert at(out, 3) == {("g", -math.inf, -math.inf): 1}
    assert at(out, 4) == {("g", 1.5, 1.5): 1}
    overflow = {"t": [(("g", 1e308), 0, 1), (("g", 1e308), 0, 1)]}
    out, _ = run(plan, overflow, [])
    assert at(out, 0) == {("g", math.inf, math.inf): 1}


def test_decimal_sum_and_avg() -> None:
    schema = RelationSchema([Column("g", T.TEXT), Column("d", T.DECIMAL, True, 10, 2)])
    plan = pb.reduce(pb.get("t", schema), (0,), [pb.aggregate("sum", 1), pb.aggregate("avg", 1)])
    history = {"t": [(("g", Decimal("1.00")), 0, 2), (("g", Decimal("0.01")), 0, 1)]}
    out, _ = run(plan, history, [])
    # 2.01 / 3 = 0.67 exactly; scale 8 for the average.
    ((row, _),) = at(out, 0).items()
    assert row == ("g", Decimal("2.01"), Decimal("0.67000000"))
    assert str(row[1]) == "2.01" and str(row[2]) == "0.67000000"
    history = {"t": [(("g", Decimal("0.01")), 0, 1), (("g", Decimal("0.00")), 0, 2)]}
    out, _ = run(plan, history, [])
    # 0.01 / 3 = 0.00333333|33...: rounds down.
    assert at(out, 0) == {("g", Decimal("0.01"), Decimal("0.00333333")): 1}


def test_int_sum_is_exact_beyond_int64_and_avg_rounds_correctly() -> None:
    plan = aggregates_plan(pb.aggregate("sum", 1), pb.aggregate("avg", 1))
    big = 2**63 - 1
    history = {"t": [(("g", big), 0, 3), (("g", 1), 0, 1)]}
    out, _ = run(plan, history, [])
    assert at(out, 0) == {("g", Decimal(3 * big + 1), (3 * big + 1) / 4): 1}


def test_distinct_aggregates() -> None:
    plan = aggregates_plan(
        pb.aggregate("count", 1, distinct=True),
        pb.aggregate("sum", 1, distinct=True),
        pb.aggregate("avg", 1, distinct=True),
        pb.aggregate("count", 1),
    )
    history: dict[str, list[Update]] = {
        "t": [
            (("g", 2), 0, 3),
            (("g", 4), 0, 1),
            (("g", None), 0, 1),
            (("g", 4), 1, -1),
            (("g", 2), 2, -2),
        ]
    }
    out, _ = run(plan, history, [3])
    assert at(out, 0) == {("g", 2, Decimal(6), 3.0, 4): 1}
    assert at(out, 1) == {("g", 1, Decimal(2), 2.0, 3): 1}
    assert at(out, 2) == {("g", 1, Decimal(2), 2.0, 1): 1}


def test_global_aggregate_of_an_empty_input_has_no_row() -> None:
    plan = aggregates_plan(pb.aggregate("count"), group=())
    history = {"t": [(("a", 1), 1, 1), (("a", 1), 2, -1)]}
    out, calls = run(plan, history, [3])
    assert calls[0] == []
    assert at(out, 1) == {(1,): 1}
    assert at(out, 2) == {}


def test_groups_with_non_positive_totals_yield_nothing() -> None:
    plan = pb.reduce(
        pb.union(pb.get("t", NUMS), pb.negate(pb.get("u", NUMS))), (0,), [pb.aggregate("count")]
    )
    history = {"t": [(("a", 1), 0, 1)], "u": [(("a", 2), 0, 1), (("a", 2), 1, -1)]}
    out, _ = run(plan, history, [2])
    assert at(out, 0) == {}
    assert at(out, 1) == {("a", 1): 1}


# -- distinct and threshold ----------------------------------------------------------------------


def test_distinct_and_threshold_over_signed_multiplicities() -> None:
    diff = pb.union(pb.get("a", KV), pb.negate(pb.get("b", KV)))
    history: dict[str, list[Update]] = {
        "a": [((1, "x"), 0, 3), ((2, None), 0, 1)],
        "b": [((1, "x"), 1, 2), ((2, None), 1, 2), ((1, "x"), 2, 1)],
    }
    out, _ = run(pb.distinct(diff), history, [3])
    assert at(out, 0) == {(1, "x"): 1, (2, None): 1}
    assert at(out, 1) == {(1, "x"): 1}
    assert at(out, 2) == {}
    out, calls = run(pb.threshold(diff), history, [3])
    assert at(out, 0) == {(1, "x"): 3, (2, None): 1}
    assert at(out, 1) == {(1, "x"): 1}
    assert calls[1] == [((1, "x"), 1, -2), ((1, "x"), 2, -1), ((2, None), 1, -1)]


# -- top-k ---------------------------------------------------------------------------------------


def test_top_k_breaks_ties_by_the_whole_row() -> None:
    schema = RelationSchema.of(("g", T.TEXT), ("score", T.INT64), ("name", T.TEXT))
    plan = pb.top_k(pb.get("t", schema), [0], [pb.sort_key(1, descending=True)], limit=2)
    history: dict[str, list[Update]] = {
        "t": [
            (("g", 5, "b"), 0, 1),
            (("g", 5, "a"), 0, 1),
            (("g", 5, None), 0, 1),
            (("g", 1, "z"), 0, 1),
            (("h", None, "q"), 0, 1),
            (("h", 0, "q"), 0, 1),
        ]
    }
    out, _ = run(plan, history, [])
    # Descending puts NULLs first; ties on 5 go by name ascending with NULL last.
    assert at(out, 0) == {("g", 5, "a"): 1, ("g", 5, "b"): 1, ("h", None, "q"): 1, ("h", 0, "q"): 1}


def test_top_k_window_moves_with_updates_and_keeps_rows_partly() -> None:
    schema = RelationSchema.of(("x", T.INT64))
    plan = pb.top_k(
        pb.get("t", schema), [], [pb.sort_key(0, nulls_flipped=True)], limit=3, offset=1
    )
    history: dict[str, list[Update]] = {
        "t": [
            ((4,), 0, 1),
            ((2,), 0, 3),
            ((7,), 0, 1),
            ((None,), 1, 1),  # ascending with NULLs first (flipped): takes position 0
            ((2,), 2, -2),
            ((1,), 3, 1),
        ]
    }
    out, calls = run(plan, history, [4])
    assert at(out, 0) == {(2,): 2, (4,): 1}  # positions 1..3 of [2, 2, 2, 4, 7]
    assert at(out, 1) == {(2,): 3}  # [NULL, 2, 2, 2, 4, 7]
    assert at(out, 2) == {(2,): 1, (4,): 1, (7,): 1}
    assert at(out, 3) == {(1,): 1, (2,): 1, (4,): 1}  # [NULL, 1, 2, 4, 7]
    # Time 2 moved the window by one row: 2 loses two copies, 4 and 7 come in.
    assert [u for u in calls[1] if u[1] == 2] == [((2,), 2, -2), ((4,), 2, 1), ((7,), 2, 1)]


def test_top_k_with_offset_and_no_limit() -> None:
    schema = RelationSchema.of(("x", T.FLOAT64))
    plan = pb.top_k(pb.get("t", schema), [], [0], offset=2)
    history: dict[str, list[Update]] = {
        "t": [((float("nan"),), 0, 1), ((1.5,), 0, 2), ((-math.inf,), 0, 1), ((None,), 0, 1)]
    }
    out, _ = run(plan, history, [])
    contents = at(out, 0)
    # Order: -inf, 1.5, 1.5, NaN, NULL; positions 2.. kept.
    assert len(contents) == 3 and contents[(1.5,)] == 1 and contents[(None,)] == 1
    assert any(isinstance(row[0], float) and math.isnan(row[0]) for row in contents)


# -- sharing -------------------------------------------------------------------------------------


def test_let_values_are_lowered_once_and_shared() -> None:
    counted = pb.reduce(pb.get("t", NUMS), (0,), [pb.aggregate("count")])
    plan = pb.let(7, counted, pb.join(pb.local_get(7), pb.local_get(7), [0], [0]))
    dataflow = Dataflow(plan, as_of=0)
    kinds = [node.label.split()[0] for node in dataflow.graph.nodes]
    assert kinds.count("reduce") == 1 and kinds.count("get") == 1
    out, _ = run(plan, {"t": [(("a", 1), 0, 2), (("b", 1), 1, 1)]}, [2])
    assert at(out, 1) == {("a", 2, "a", 2): 1, ("b", 1, "b", 1): 1}
