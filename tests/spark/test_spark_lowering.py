"""Targeted cases of the Spark lowering, each checked against the reference evaluator and
against the answer written out: NULL join keys, outer padding, retractions through the
stateful nodes, exact decimal and float aggregates, overflow, and the fallbacks."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql import SparkSession

from services.compute.spark.lowering import lower, release
from services.compute.spark.lowering.errors import collect
from tests.support import random_plans, reference_eval, spark_lowering
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.errors import Internal, InvalidArgument
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

T = ColumnType
Row = tuple[Any, ...]
INT64_MAX = 2**63 - 1

KV = RelationSchema([Column("k", T.INT64, True), Column("v", T.TEXT, True)])
NUM = RelationSchema([Column("g", T.INT64, True), Column("x", T.INT64, True)])
DEC = RelationSchema([Column("g", T.INT64, True), Column("d", T.DECIMAL, True, 10, 2)])
FLT = RelationSchema([Column("g", T.INT64, True), Column("f", T.FLOAT64, True)])


def check(
    spark: SparkSession,
    root: plan_pb2.Relation,
    schemas: dict[str, RelationSchema],
    inputs: dict[str, dict[Row, int]],
    answer: dict[Row, int],
) -> None:
    """The lowering's output equals the reference evaluator's, which is ``answer``."""
    plan = pb.plan(root, derive_schema(root))
    expected = reference_eval.evaluate(plan, inputs)
    assert expected == reference_eval.canonical(answer)
    assert spark_lowering.run(spark, plan, schemas, inputs) == expected


def test_null_join_keys_match_nothing_and_outer_joins_pad(spark: SparkSession) -> None:
    left = {(1, "a"): 2, (None, "n"): 1, (3, "c"): 1}
    right = {(1, "x"): 3, (None, "m"): 1, (4, "d"): 1}
    schemas = {"l": KV, "r": KV}
    inputs = {"l": left, "r": right}
    get_l, get_r = pb.get("l", KV), pb.get("r", KV)
    check(spark, pb.join(get_l, get_r, [0], [0]), schemas, inputs, {(1, "a", 1, "x"): 6})
    check(
        spark,
        pb.join(get_l, get_r, [0], [0], "full_outer"),
        schemas,
        inputs,
        {
            (1, "a", 1, "x"): 6,
            (None, "n", None, None): 1,
            (3, "c", None, None): 1,
            (None, None, None, "m"): 1,
            (None, None, 4, "d"): 1,
        },
    )
    check(
        spark,
        pb.join(get_l, get_r, [0], [0], "right_outer"),
        schemas,
        inputs,
        {(1, "a", 1, "x"): 6, (None, None, None, "m"): 1, (None, None, 4, "d"): 1},
    )


def test_outer_join_sees_consolidated_inputs(spark: SparkSession) -> None:
    # The right row (1, "x") comes and goes in the input's updates: it matches nothing.
    schemas = {"l": KV, "r": KV}
    right = pb.union(pb.get("r", KV), pb.negate(pb.get("r", KV)), pb.get("s", KV))
    schemas["s"] = KV
    inputs = {"l": {(1, "a"): 1}, "r": {(1, "x"): 1}, "s": {(2, "y"): 1}}
    check(
        spark,
        pb.join(pb.get("l", KV), right, [0], [0], "left_outer"),
        schemas,
        inputs,
        {(1, "a", None, None): 1},
    )


def test_one_row_left_join_of_a_global_aggregate_pads_or_matches(spark: SparkSession) -> None:
    # A global aggregate's one row even over no input, as the adapter plans it: a one-row
    # constant left-joined to the Reduce on nothing.
    one = RelationSchema([Column("u", T.BOOL, False)])
    schemas = {"n": NUM}
    total = pb.reduce(
        pb.filter(pb.get("n", NUM), pb.call("gt", 1, pb.literal(0, T.INT64))),
        (),
        [pb.aggregate("sum", 1), pb.aggregate("count")],
    )
    root = pb.join(pb.constant(one, [(True,)]), total, [], [], "left_outer")
    rows = {(1, 5): 2, (2, -1): 1, (3, 7): 1}
    check(spark, root, schemas, {"n": rows}, {(True, Decimal(17), 3): 1})
    check(spark, root, schemas, {"n": {(2, -1): 1}}, {(True, None, None): 1})
    twice = pb.join(pb.constant(one, [((True,), 2)]), total, [], [], "left_outer")
    check(spark, twice, schemas, {"n": {}}, {(True, None, None): 2})
    check(spark, twice, schemas, {"n": rows}, {(True, Decimal(17), 3): 2})


def test_numeric_join_keys_are_promoted(spark: SparkSession) -> None:
    schemas = {"n": NUM, "d": DEC}
    inputs = {"n": {(2, 1): 1, (3, 1): 1}, "d": {(0, Decimal("2.00")): 1, (0, Decimal("3.5")): 1}}
    check(
        spark,
        pb.join(pb.get("n", NUM), pb.get("d", DEC), [0], [1]),
        schemas,
        inputs,
        {(2, 1, 0, Decimal("2.00")): 1},
    )


def test_retractions_through_threshold_distinct_reduce_and_top_k(spark: SparkSession) -> None:
    # EXCEPT ALL: a - b, thresholded, then every stateful node over it.
    schemas = {"a": NUM, "b": NUM}
    inputs = {"a": {(1, 10): 3, (1, 20): 1, (2, 5): 2}, "b": {(1, 10): 1, (2, 5): 2, (9, 9): 1}}
    diff = pb.union(pb.get("a", NUM), pb.negate(pb.get("b", NUM)))
    kept = pb.threshold(diff)
    check(spark, kept, schemas, inputs, {(1, 10): 2, (1, 20): 1})
    check(spark, pb.negate(diff), schemas, inputs, {(1, 10): -2, (1, 20): -1, (9, 9): 1})
    check(spark, pb.distinct(kept), schemas, inputs, {(1, 10): 1, (1, 20): 1})
    counts = pb.reduce(kept, [0], [pb.aggregate("count"), pb.aggregate("sum", 1)])
    check(spark, counts, schemas, inputs, {(1, 3, Decimal(40)): 1})
    # Positions 0..2 in ascending x: 10, 10, 20. Offset 1, limit 1 keeps one copy of 10.
    top = pb.top_k(kept, [0], [1], limit=1, offset=1)
    check(spark, top, schemas, inputs, {(1, 10): 1})
    top_desc = pb.top_k(kept, [], [pb.sort_key(1, descending=True)], limit=2)
    check(spark, top_desc, schemas, inputs, {(1, 20): 1, (1, 10): 1})


def test_top_k_keeps_part_of_a_multiplicity_and_orders_nulls(spark: SparkSession) -> None:
    schemas = {"n": NUM}
    inputs = {"n": {(1, None): 2, (1, 5): 3, (1, 7): 1, (2, 1): 4}}
    get = pb.get("n", NUM)
    # Ascending, NULLs last: 5 5 5 7 NULL NULL; positions [2, 5) are 5, 7, NULL.
    check(
        spark,
        pb.top_k(get, [0], [1], limit=3, offset=2),
        schemas,
        inputs,
        {
            (1, 5): 1,
            (1, 7): 1,
            (1, None): 1,
            (2, 1): 2,
        },
    )
    # NULLs flipped to first: NULL NULL 5 5 5 7.
    flipped = pb.top_k(get, [0], [pb.sort_key(1, nulls_flipped=True)], limit=3)
    check(spark, flipped, schemas, inputs, {(1, None): 2, (1, 5): 1, (2, 1): 3})


def test_decimal_aggregates_keep_scale_and_round_half_even(spark: SparkSession) -> None:
    schemas = {"d": DEC}
    inputs = {
        "d": {
            (1, Decimal("0.01")): 2,
            (1, Decimal("0.02")): 1,
            (2, Decimal("-1.25")): 3,
            (2, None): 1,
            (3, None): 2,
            # 0.01 over 128 rows: 0.000078125, exactly halfway at 8 places.
            (4, Decimal("0.01")): 1,
            (4, Decimal("0.00")): 127,
        }
    }
    aggregates = [
        pb.aggregate("sum", 1),
        pb.aggregate("avg", 1),
        pb.aggregate("count", 1),
        pb.aggregate("sum", 1, distinct=True),
        pb.aggregate("count", 1, distinct=True),
        pb.aggregate("min", 1),
    ]
    check(
        spark,
        pb.reduce(pb.get("d", DEC), [0], aggregates),
        schemas,
        inputs,
        {
            # avg 0.04 / 3 = 0.013333... to 8 places.
            (1, Decimal("0.04"), Decimal("0.01333333"), 3, Decimal("0.03"), 2, Decimal("0.01")): 1,
            (
                2,
                Decimal("-3.75"),
                Decimal("-1.25000000"),
                3,
                Decimal("-1.25"),
                1,
                Decimal("-1.25"),
            ): 1,
            (3, None, None, 0, None, 0, None): 1,
            # Half to even: 0.00007812, where half up would give 0.00007813.
            (4, Decimal("0.01"), Decimal("0.00007812"), 128, Decimal("0.01"), 2, Decimal("0")): 1,
        },
    )


def test_integer_sums_are_exact_and_averages_correctly_rounded(spark: SparkSession) -> None:
    schemas = {"n": NUM}
    inputs = {"n": {(1, INT64_MAX): 3, (2, 1): 1, (2, 2): 2}}
    aggregates = [pb.aggregate("sum", 1), pb.aggregate("avg", 1)]
    check(
        spark,
        pb.reduce(pb.get("n", NUM), [0], aggregates),
        schemas,
        inputs,
        {
            (1, Decimal(3 * INT64_MAX), float(INT64_MAX)): 1,
            (2, Decimal(5), 5 / 3): 1,
        },
    )


def test_integer_sums_by_pieces_are_exact_at_the_extremes(spark: SparkSession, ansi: str) -> None:
    """BIGINT sums add three 21-bit pieces of each value as longs: the extremes of 64 bits,
    negative values (whose high piece is negative), NULLs, large diffs, and a group of NULLs
    alone all come out exact."""
    low = -(2**63)
    schemas = {"n": NUM}
    inputs = {
        "n": {
            (1, INT64_MAX): 2**40,
            (1, low): 3,
            (1, -1): 5,
            (1, None): 2,
            (2, -(2**42) - 7): 1,
            (2, 2**21 - 1): 3,
            (2, 2**42 + 2**21): 4,
            (3, None): 2,
        }
    }
    aggregates = [
        pb.aggregate("sum", 1),
        pb.aggregate("count", 1),
        pb.aggregate("avg", 1),
        pb.aggregate("count"),
    ]
    first = INT64_MAX * 2**40 + 3 * low - 5
    second = -(2**42) - 7 + 3 * (2**21 - 1) + 4 * (2**42 + 2**21)
    check(
        spark,
        pb.reduce(pb.get("n", NUM), [0], aggregates),
        schemas,
        inputs,
        {
            (1, Decimal(first), 2**40 + 8, first / (2**40 + 8), 2**40 + 10): 1,
            (2, Decimal(second), 8, second / 8, 8): 1,
            (3, None, 0, None, 2): 1,
        },
    )


def test_a_bigint_sum_past_its_exact_range_fails_the_query(spark: SparkSession, ansi: str) -> None:
    """A group whose multiplicities pass 2^42 loses its BIGINT sum's exact total: an error,
    not a wrong answer."""
    frame = spark_lowering.input_frame(spark, NUM, {(1, INT64_MAX): 2**43})
    plan = pb.plan(pb.reduce(pb.get("n", NUM), [0], [pb.aggregate("sum", 1)]))
    with pytest.raises(Internal, match="2\\^42"):
        collect(lower(plan, {"n": frame}, spark))


def test_float_sums_are_exact(spark: SparkSession) -> None:
    schemas = {"f": FLT}
    inputs = {
        "f": {
            (1, 1e16): 1,
            (1, 1.0): 1,
            (1, -1e16): 1,
            (2, float("nan")): 1,
            (2, 1.0): 2,
            (3, 1e308): 2,
        }
    }
    aggregates = [pb.aggregate("sum", 1), pb.aggregate("max", 1), pb.aggregate("avg", 1)]
    check(
        spark,
        pb.reduce(pb.get("f", FLT), [0], aggregates),
        schemas,
        inputs,
        {
            (1, 1.0, 1e16, 1 / 3): 1,
            (2, float("nan"), float("nan"), float("nan")): 1,
            (3, float("inf"), 1e308, float("inf")): 1,
        },
    )


@pytest.fixture(params=["true", "false"])
def ansi(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    """The shared session with ANSI mode on, then off (restored after)."""
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", request.param)
    try:
        yield request.param
    finally:
        spark.conf.set("spark.sql.ansi.enabled", before)


def test_overflow_and_division_by_zero_are_null(spark: SparkSession, ansi: str) -> None:
    schemas = {"n": NUM}
    inputs = {"n": {(INT64_MAX, 0): 1, (-(2**63), -1): 1, (7, 2): 1}}
    exprs = [
        pb.call("add", pb.column(0), pb.literal(1, T.INT64)),
        pb.call("mul", pb.column(0), pb.column(1)),
        pb.call("div", pb.column(0), pb.column(1)),
        pb.call("mod", pb.column(0), pb.column(1)),
        pb.call("neg", pb.column(0)),
        pb.call("div", pb.cast(pb.column(0), ScalarType.decimal(20, 1)), pb.column(1)),
    ]
    root = pb.project(pb.map(pb.get("n", NUM), *exprs), 2, 3, 4, 5, 6, 7)
    check(
        spark,
        root,
        schemas,
        inputs,
        {
            (None, 0, None, None, -INT64_MAX, None): 1,
            (-(2**63) + 1, None, None, 0, None, Decimal("9223372036854775808.000000")): 1,
            (8, 14, 3, 1, -7, Decimal("3.500000")): 1,
        },
    )


def test_decimal_sums_near_38_digits_with_unit_and_other_diffs(spark: SparkSession) -> None:
    """A row of diff 1 adds its value as it is, others value * diff: both exact, and a
    product or a sum past 38 digits makes the SUM NULL (the overflow rule)."""
    wide = RelationSchema([Column("g", T.INT64, True), Column("d", T.DECIMAL, True, 38, 2)])
    top = Decimal("9" * 36 + ".99")
    half = Decimal("4" * 36 + ".99")
    rows = {
        (1, top): 1,  # the largest value, diff 1: fits
        (1, Decimal("-0.01")): 3,
        (1, None): 2,
        (2, half): 2,  # doubled: still 37 digits
        (2, Decimal("1.00")): 1,
        (3, top): 2,  # top * 2 is past 38 digits: the group's sum is NULL
        (3, Decimal("1.00")): 1,
        (4, top): 1,  # top + top: the sum is past 38 digits
        (4, Decimal("9" * 35 + ".99")): 9,
        (5, Decimal("-2.50")): 4,
        (5, Decimal("2.50")): 4,
    }
    root = pb.reduce(pb.get("w", wide), [0], [pb.aggregate("sum", 1), pb.aggregate("count", 1)])
    check(
        spark,
        root,
        {"w": wide},
        {"w": rows},
        {
            (1, Decimal("9" * 34 + "99.96"), 4): 1,
            (2, Decimal("8" * 34 + "90.98"), 3): 1,
            (3, None, 3): 1,
            (4, None, 10): 1,
            (5, Decimal("0.00"), 8): 1,
        },
    )


def test_fallback_functions_and_casts(spark: SparkSession) -> None:
    schemas = {"kv": KV}
    inputs = {"kv": {(-1, "straße"): 1, (2, " 12.345 "): 1, (3, None): 1}}
    ts = datetime.datetime(2020, 1, 31, 8, 30)
    exprs = [
        pb.call("upper", pb.column(1)),
        pb.call("substr", pb.column(1), pb.column(0), pb.literal(3, T.INT64)),
        pb.cast(pb.column(1), ScalarType.decimal(10, 2)),
        pb.call("add_months", pb.literal(ts, T.TIMESTAMP), pb.column(0)),
        pb.call("add_days", pb.literal(datetime.date(9999, 12, 30), T.DATE), pb.column(0)),
        pb.call(
            "like",
            pb.column(1),
            pb.call("concat", pb.literal("%", T.TEXT), pb.literal("e", T.TEXT)),
        ),
        pb.cast(pb.cast(pb.column(0), T.FLOAT64), T.TEXT),
    ]
    root = pb.project(pb.map(pb.get("kv", KV), *exprs), *range(2, 9))
    check(
        spark,
        root,
        schemas,
        inputs,
        {
            (
                "STRASSE",
                "s",
                None,
                datetime.datetime(2019, 12, 31, 8, 30),
                datetime.date(9999, 12, 29),
                True,
                "-1.0",
            ): 1,
            (
                " 12.345 ",
                "12.",
                Decimal("12.34"),
                datetime.datetime(2020, 3, 31, 8, 30),
                None,
                False,
                "2.0",
            ): 1,
            (None, None, None, datetime.datetime(2020, 4, 30, 8, 30), None, None, "3.0"): 1,
        },
    )


def test_let_binding_is_shared(spark: SparkSession) -> None:
    schemas = {"n": NUM}
    inputs = {"n": {(1, 2): 1, (2, 3): 2}}
    body = pb.join(pb.local_get(0), pb.local_get(0), [0], [1])
    root = pb.let(0, pb.map(pb.get("n", NUM), pb.call("add", pb.column(0), pb.column(1))), body)
    check(spark, root, schemas, inputs, {(2, 3, 5, 1, 2, 3): 2})
    inputs = {"n": {(1, 1): 1, (2, 1): 2}}
    check(spark, root, schemas, inputs, {(1, 1, 2, 1, 1, 2): 1, (1, 1, 2, 2, 1, 3): 2})


def test_a_let_read_twice_is_cached_for_the_query_and_released(spark: SparkSession) -> None:
    schemas = {"n": NUM}
    inputs = {"n": {(1, 2): 1, (1, 5): 2, (2, 3): 1, (2, 4): 2, (None, 7): 1}}
    totals = pb.reduce(pb.get("n", NUM), [0], [pb.aggregate("sum", 1)])
    body = pb.union(
        pb.local_get(0), pb.negate(pb.filter(pb.local_get(0), pb.call("is_null", pb.column(0))))
    )
    root = pb.let(0, totals, body)
    check(spark, root, schemas, inputs, {(1, Decimal(12)): 1, (2, Decimal(11)): 1})
    plan = pb.plan(root, derive_schema(root))
    frames = {"n": spark_lowering.input_frame(spark, NUM, inputs["n"])}
    kept: list[Any] = []
    df = lower(plan, frames, spark, kept=kept)
    assert len(kept) == 1 and kept[0].is_cached
    assert sorted(tuple(r) for r in df.collect()) == [(1, Decimal(12), 1), (2, Decimal(11), 1)]
    release(kept)
    assert kept == [] and not df.is_cached
    # Without a list to hand them back in, nothing is cached.
    assert not lower(plan, frames, spark).is_cached


def test_keyed_relations_skip_consolidation_yet_stay_consolidated(spark: SparkSession) -> None:
    """Reduce outputs are distinct on their group keys, so joins and projections keeping
    those keys need no consolidation; a full join may still pad two rows into one."""
    schemas = {"n": NUM, "m": NUM}
    inputs = {
        "n": {(1, 2): 1, (1, 5): 2, (None, 3): 1, (2, 0): 1},
        "m": {(1, 7): 1, (None, 8): 2, (3, 9): 1},
    }
    n_sums = pb.reduce(pb.get("n", NUM), [0], [pb.aggregate("sum", 1), pb.aggregate("count")])
    m_counts = pb.reduce(pb.get("m", NUM), [0], [pb.aggregate("count")])
    joined = pb.project(pb.join(n_sums, m_counts, [0], [0], "left_outer"), 0, 2, 4)
    check(
        spark,
        joined,
        schemas,
        inputs,
        {(1, 3, 1): 1, (None, 1, None): 1, (2, 1, None): 1},
    )
    # Only the NULL groups' keys: one all-NULL row on each side, which the full join pads
    # into the same row twice.
    nulls_n = pb.project(pb.filter(n_sums, pb.call("is_null", pb.column(0))), 0)
    nulls_m = pb.project(pb.filter(m_counts, pb.call("is_null", pb.column(0))), 0)
    check(
        spark,
        pb.join(nulls_n, nulls_m, [0], [0], "full_outer"),
        schemas,
        inputs,
        {(None, None): 2},
    )
    # Dropping the key column loses distinctness: equal counts of two groups add up.
    check(spark, pb.project(n_sums, 2), schemas, inputs, {(3,): 1, (1,): 2})


def test_constants_are_exact_and_consolidated(spark: SparkSession) -> None:
    schema = RelationSchema(
        [
            Column("d", T.DECIMAL, True, 38, 2),
            Column("day", T.DATE, True),
            Column("t", T.TEXT, True),
            Column("f", T.FLOAT64, True),
        ]
    )
    big = Decimal("-" + "9" * 36 + ".99")
    rows = [
        ((big, datetime.date(1, 1, 1), "it's", -0.0), 2),
        ((big, datetime.date(1, 1, 1), "it's", 0.0), -1),
        ((None, None, None, float("nan")), -3),
        ((Decimal("0.01"), datetime.date(9999, 12, 31), "", None), 1),
    ]
    check(
        spark,
        pb.constant(schema, rows),
        {},
        {},
        {
            (big, datetime.date(1, 1, 1), "it's", 0.0): 1,
            (None, None, None, float("nan")): -3,
            (Decimal("0.01"), datetime.date(9999, 12, 31), "", None): 1,
        },
    )
    check(spark, pb.constant(schema, []), {}, {}, {})
    one = pb.constant(schema, [((Decimal("1.50"), None, "x", 2.5), -2)])
    check(spark, one, {}, {}, {(Decimal("1.50"), None, "x", 2.5): -2})


def test_misshapen_input_is_rejected(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1, "a")], "k long, v string")
    with pytest.raises(InvalidArgument, match="diff"):
        lower(pb.plan(pb.get("kv", KV)), {"kv": frame}, spark)


@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    data=random_plans.input_schemas()
    .flatmap(lambda schemas: random_plans.window_plans(schemas).map(lambda plan: (schemas, plan)))
    .flatmap(lambda pair: random_plans.histories(pair[0], 1).map(lambda h: (*pair, h)))
)
def test_window_plans_match_the_reference(
    spark: SparkSession, data: tuple[dict[str, RelationSchema], plan_pb2.Plan, Any]
) -> None:
    schemas, plan, history = data
    inputs = random_plans.inputs_at(history, 1)
    expected = reference_eval.evaluate(plan, inputs)
    assert spark_lowering.run(spark, plan, schemas, inputs) == expected


WIDE = RelationSchema(
    [
        Column("d", T.DATE, True),
        Column("t", T.TIMESTAMP, True),
        Column("b", T.BYTES, True),
        Column("j", T.JSON, True),
        Column("f", T.FLOAT64, True),
    ]
)


def test_dates_timestamps_bytes_json_and_floats_round_trip(spark: SparkSession) -> None:
    """Extreme dates and timestamps, bytes and JSON pass through grouping and ordering; NaN
    groups and joins with NaN, and -0.0 with 0.0."""
    first = (datetime.date(1, 1, 1), datetime.datetime(1, 1, 1, 0, 0, 0, 1), b"\x00\xff", "[1]")
    last = (
        datetime.date(9999, 12, 31),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
        b"",
        '{"a": null}',
    )
    schemas = {"w": WIDE, "v": WIDE}
    inputs = {
        "w": {(*first, float("nan")): 2, (*last, -0.0): 1, (None, None, None, None, 0.0): 1},
        "v": {(*first, float("nan")): 1, (*last, 0.0): 1},
    }
    get = pb.get("w", WIDE)
    check(
        spark,
        pb.distinct(get),
        schemas,
        inputs,
        {
            (*first, float("nan")): 1,
            (*last, 0.0): 1,
            (None, None, None, None, 0.0): 1,
        },
    )
    check(
        spark,
        pb.top_k(get, [], [pb.sort_key(1, descending=True)], limit=1),
        schemas,
        inputs,
        {(None, None, None, None, 0.0): 1},
    )
    check(spark, pb.top_k(get, [], [2], limit=1), schemas, inputs, {(*last, 0.0): 1})
    counts = pb.reduce(get, [4], [pb.aggregate("count"), pb.aggregate("max", 0)])
    check(
        spark,
        counts,
        schemas,
        inputs,
        {
            (float("nan"), 2, datetime.date(1, 1, 1)): 1,
            (0.0, 2, datetime.date(9999, 12, 31)): 1,
        },
    )
    joined = pb.project(pb.join(get, pb.get("v", WIDE), [4], [4]), 4, 9)
    check(
        spark,
        joined,
        schemas,
        inputs,
        {
            (float("nan"), float("nan")): 2,
            (0.0, 0.0): 2,
        },
    )


def test_a_multiplicity_past_64_bits_fails_the_query(spark: SparkSession, ansi: str) -> None:
    """Values never fail, but a diff product that would wrap is an error, not a wrong answer,
    whatever the session's ANSI mode."""
    frame = spark_lowering.input_frame(spark, NUM, {(1, 1): 2**40})
    plan = pb.plan(pb.join(pb.get("a", NUM), pb.get("b", NUM), [0], [0]))
    with pytest.raises(Internal, match="multiplicity"):
        collect(lower(plan, {"a": frame, "b": frame}, spark))
    # Within 64 bits the product is exact.
    small = spark_lowering.input_frame(spark, NUM, {(1, 1): 2**31})
    rows = collect(lower(plan, {"a": small, "b": small}, spark))
    assert [tuple(r) for r in rows] == [(1, 1, 1, 1, 2**62)]


SUB = RelationSchema(
    [Column("s", T.TEXT, True), Column("start", T.INT64, True), Column("n", T.INT64, True)]
)


def test_substr_clips_like_postgres(spark: SparkSession) -> None:
    cases = {
        ("héllo", 2, 3): "éll",
        ("héllo", -1, 3): "h",
        ("héllo", 0, 2): "h",
        ("héllo", 4, 10): "lo",
        ("héllo", 9, 1): "",
        ("héllo", 2, -1): None,
        ("héllo", 2, None): None,
        ("héllo", None, 1): None,
        ("héllo", -(2**63), 0): "",
        ("héllo", 2**63 - 1, 2**63 - 1): "",
        ("héllo", -(2**63), 2**63 - 1): "",
        ("héllo", -5, 8): "hé",
    }
    inputs = {"s": {row: 1 for row in cases}}
    with_length = pb.map(pb.get("s", SUB), pb.call("substr", 0, 1, 2), pb.call("substr", 0, 1))
    answer: dict[Row, int] = {}
    for (text, start, count), piece in cases.items():
        rest = None if start is None else text[max(start, 1) - 1 :]
        answer[(text, start, count, piece, rest)] = 1
    check(spark, with_length, {"s": SUB}, inputs, answer)


def test_fallback_calls_on_literals_are_folded(spark: SparkSession) -> None:
    shifted = pb.call(
        "add_days", pb.literal(datetime.date(2020, 2, 28), T.DATE), pb.literal(2, T.INT64)
    )
    root = pb.filter(
        pb.get("kv", KV), pb.call("eq", pb.literal(datetime.date(2020, 3, 1), T.DATE), shifted)
    )
    plan = pb.plan(root, derive_schema(root))
    frame = spark_lowering.input_frame(spark, KV, {(1, "a"): 1})
    lowered = lower(plan, {"kv": frame}, spark)
    assert "BatchEvalPython" not in lowered._jdf.queryExecution().executedPlan().toString()
    assert [tuple(r) for r in lowered.collect()] == [(1, "a", 1)]
