"""The reference evaluator against hand-computed answers, and against SQLite on random data.

Every expected value below was worked out by hand from plan.proto's comments, not by running
the evaluator. The SQLite cross-check covers the subset SQLite models the same way: inner
joins, filters on integers and text, COUNT/SUM/MIN/MAX of integers, GROUP BY and DISTINCT.
"""

from __future__ import annotations

import datetime
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.reference_eval import NAN, UndefinedResult, canonical, evaluate
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

T = ColumnType
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
D = Decimal
DATE = datetime.date(2020, 2, 29)
STAMP = datetime.datetime(2020, 2, 29, 13, 14, 15, 16)


def lit(value: Any, kind: ColumnType | ScalarType | None = None) -> plan_pb2.Scalar:
    """A literal whose type follows from the Python value unless given."""
    if kind is None:
        if isinstance(value, bool):
            kind = T.BOOL
        elif isinstance(value, int):
            kind = T.INT64
        elif isinstance(value, float):
            kind = T.FLOAT64
        elif isinstance(value, Decimal):
            kind = T.DECIMAL
        elif isinstance(value, str):
            kind = T.TEXT
        elif isinstance(value, bytes):
            kind = T.BYTES
        elif isinstance(value, datetime.datetime):
            kind = T.TIMESTAMP
        elif isinstance(value, datetime.date):
            kind = T.DATE
        else:
            raise AssertionError(value)
    return pb.literal(value, kind)


def null(kind: ColumnType) -> plan_pb2.Scalar:
    return pb.literal(None, kind)


ONE_ROW = RelationSchema.of(("unused", T.INT64))


def value_of(expr: plan_pb2.Scalar) -> Any:
    """``expr`` evaluated through Map on a one-row Constant."""
    relation = pb.project(pb.map(pb.constant(ONE_ROW, [(0,)]), expr), 1)
    ((row, count),) = evaluate(relation, {}).items()
    assert count == 1
    return row[0]


def same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN, and of the same Python type (so 1 != 1.0 != True)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)  # -0.0 is not 0.0 here
    return type(a) is type(b) and a == b


def check(expr: plan_pb2.Scalar, expected: Any) -> None:
    got = value_of(expr)
    assert same(got, expected), f"{expr} gave {got!r}, expected {expected!r}"


def call(name: str, *args: plan_pb2.Scalar) -> plan_pb2.Scalar:
    return pb.call(name, *args)


# Functions --------------------------------------------------------------------------------

COMPARISONS: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("eq", lit(1), lit(1)), True),
    (call("ne", lit(1), lit(1)), False),
    (call("eq", lit(1), null(T.INT64)), None),
    (call("lt", null(T.TEXT), lit("a")), None),
    (call("lt", lit("B"), lit("a")), True),  # code points: "B" is 0x42, "a" 0x61
    (call("lt", lit("é"), lit("z")), False),  # U+00E9 sorts after "z"
    (call("lt", lit("a"), lit("ab")), True),
    (call("lt", lit(b"\x01"), lit(b"\x01\x00")), True),
    (call("lt", lit(False), lit(True)), True),
    (call("eq", lit(1), lit(D("1.00"))), True),
    (call("lt", lit(D("0.1")), lit(1)), True),
    (call("eq", lit(2**53 + 1), lit(float(2**53))), True),  # the int becomes a float first
    (call("gt", lit(2**53 + 1), lit(float(2**53))), False),
    (call("eq", lit(D("0.1")), lit(0.1)), True),  # 0.1 rounds to the same double
    (call("eq", lit(NAN), lit(NAN)), True),
    (call("gt", lit(NAN), lit(math.inf)), True),
    (call("lt", lit(NAN), lit(1)), False),
    (call("eq", lit(-0.0), lit(0.0)), True),
    (call("le", lit(DATE), lit(datetime.date(2020, 3, 1))), True),
    (call("ge", lit(STAMP), lit(datetime.datetime(2020, 2, 29, 13, 14, 15, 17))), False),
    (call("eq", lit("[1]", T.JSON), lit("[1]", T.JSON)), True),
]

LOGIC: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("and", lit(True), lit(True)), True),
    (call("and", lit(True), null(T.BOOL)), None),
    (call("and", lit(False), null(T.BOOL)), False),
    (call("and", lit(True), lit(True), lit(False)), False),
    (call("or", lit(False), null(T.BOOL)), None),
    (call("or", lit(True), null(T.BOOL)), True),
    (call("or", lit(False), lit(False), lit(False)), False),
    (call("not", lit(True)), False),
    (call("not", null(T.BOOL)), None),
    (call("is_null", null(T.TEXT)), True),
    (call("is_null", lit(0)), False),
    (call("is_not_null", null(T.DATE)), False),
    (call("is_not_null", lit("")), True),
]

INTEGER_ARITHMETIC: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("add", lit(2), lit(3)), 5),
    (call("add", lit(INT64_MAX), lit(1)), None),
    (call("sub", lit(INT64_MIN), lit(1)), None),
    (call("mul", lit(2**32), lit(2**31)), None),
    (call("mul", lit(-(2**32)), lit(2**31)), INT64_MIN),
    (call("div", lit(7), lit(2)), 3),
    (call("div", lit(-7), lit(2)), -3),  # toward zero
    (call("div", lit(7), lit(-2)), -3),
    (call("mod", lit(-7), lit(2)), -1),  # the dividend's sign
    (call("mod", lit(7), lit(-2)), 1),
    (call("div", lit(1), lit(0)), None),
    (call("mod", lit(1), lit(0)), None),
    (call("div", lit(INT64_MIN), lit(-1)), None),
    (call("mod", lit(INT64_MIN), lit(-1)), 0),
    (call("neg", lit(5)), -5),
    (call("neg", lit(INT64_MIN)), None),
    (call("abs", lit(INT64_MIN)), None),
    (call("abs", lit(-5)), 5),
    (call("add", lit(1), null(T.INT64)), None),
]

DECIMAL_ARITHMETIC: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("add", lit(D("1.50")), lit(D("0.01"))), D("1.51")),
    (call("add", lit(D("1.5")), lit(2)), D("3.5")),
    (call("sub", lit(D("1")), lit(D("0.25"))), D("0.75")),
    (call("mul", lit(D("1.5")), lit(D("0.01"))), D("0.015")),
    (call("div", lit(D("1")), lit(3)), D("0.333333")),  # scale max(0, 0, 6)
    (call("div", lit(D("2")), lit(3)), D("0.666667")),
    (call("div", lit(D("5")), lit(2000000)), D("0.000002")),  # 2.5 millionths, half to even
    (call("div", lit(D("7")), lit(2000000)), D("0.000004")),  # 3.5 millionths
    (call("div", lit(D("1.0000000")), lit(3)), D("0.3333333")),  # scale 7 from the argument
    (call("div", lit(D("1")), lit(D("0.0"))), None),
    (call("mod", lit(D("-7.5")), lit(2)), D("-1.5")),
    (call("mod", lit(D("7.5")), lit(D("0"))), None),
    (call("mul", lit(D("1" + "0" * 36)), lit(100)), None),  # 39 digits
    (call("add", lit(D("9" * 38)), lit(1)), None),
    (call("neg", lit(D("1.25"))), D("-1.25")),
    (call("abs", lit(D("-0.5"))), D("0.5")),
]

FLOAT_ARITHMETIC: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("add", lit(0.1), lit(0.2)), 0.30000000000000004),
    (call("add", lit(1), lit(0.5)), 1.5),
    (call("add", lit(D("0.1")), lit(0.2)), 0.30000000000000004),
    (call("div", lit(1.0), lit(4)), 0.25),
    (call("div", lit(1.0), lit(0.0)), None),
    (call("div", lit(1.0), lit(-0.0)), None),
    (call("mod", lit(5.5), lit(2)), 1.5),
    (call("mod", lit(-5.5), lit(2)), -1.5),
    (call("mod", lit(math.inf), lit(2.0)), NAN),
    (call("mod", lit(5.5), lit(math.inf)), 5.5),
    (call("mod", lit(1.0), lit(0.0)), None),
    (call("mul", lit(1e308), lit(10.0)), math.inf),
    (call("sub", lit(math.inf), lit(math.inf)), NAN),
    (call("mul", lit(-1.0), lit(0.0)), 0.0),
    (call("neg", lit(0.0)), 0.0),
    (call("abs", lit(-2.5)), 2.5),
]

TEXT_FUNCTIONS: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("lower", lit("ÀB")), "àb"),
    (call("upper", lit("ß")), "SS"),
    (call("length", lit("héllo")), 5),
    (call("length", lit("")), 0),
    (call("trim", lit("  a b  ")), "a b"),
    (call("trim", lit("\ta ")), "\ta"),
    (call("substr", lit("hello"), lit(2)), "ello"),
    (call("substr", lit("hello"), lit(0), lit(3)), "he"),
    (call("substr", lit("hello"), lit(-5), lit(3)), ""),
    (call("substr", lit("hello"), lit(2), lit(100)), "ello"),
    (call("substr", lit("hello"), lit(9)), ""),
    (call("substr", lit("hello"), lit(2), lit(-1)), None),
    (call("substr", lit("hello"), null(T.INT64)), None),
    (call("concat", lit("a"), lit("b"), lit("c")), "abc"),
    (call("concat", lit("a")), "a"),
    (call("concat", lit("a"), null(T.TEXT)), None),
    (call("like", lit("abc"), lit("a%")), True),
    (call("like", lit("abc"), lit("_b_")), True),
    (call("like", lit("abc"), lit("A%")), False),
    (call("like", lit("abc"), lit("ab")), False),
    (call("like", lit("a.c"), lit("a.c")), True),
    (call("like", lit("abc"), lit("a.c")), False),
    (call("like", lit("a\nb"), lit("a_b")), True),
    (call("like", lit(""), lit("%")), True),
    (call("like", lit("a%"), lit("a\\%")), False),  # no escape character
    (call("like", null(T.TEXT), lit("%")), None),
]

OTHER_FUNCTIONS: list[tuple[plan_pb2.Scalar, Any]] = [
    (call("coalesce", null(T.INT64), lit(2), lit(3)), 2),
    (call("coalesce", null(T.INT64), null(T.INT64)), None),
    (call("coalesce", lit(1), lit(D("1.5"))), D("1")),
    (call("coalesce", null(T.INT64), lit(0.5)), 0.5),
    (call("coalesce", lit(2), lit(0.5)), 2.0),
    (call("extract_year", lit(DATE)), 2020),
    (call("extract_month", lit(DATE)), 2),
    (call("extract_day", lit(STAMP)), 29),
    (call("extract_day", null(T.DATE)), None),
    (call("date_trunc_day", lit(STAMP)), datetime.datetime(2020, 2, 29)),
    (pb.case(lit(True), lit(1), lit(2)), 1),
    (pb.case(lit(False), lit(1), lit(2)), 2),
    (pb.case(null(T.BOOL), lit(1), lit(2)), 2),
    (pb.case(lit(True), lit(1), lit(D("2.5"))), D("1")),
    (pb.case(lit(True), null(T.TEXT), lit("x")), None),
]


@pytest.mark.parametrize(
    ("expr", "expected"),
    COMPARISONS
    + LOGIC
    + INTEGER_ARITHMETIC
    + DECIMAL_ARITHMETIC
    + FLOAT_ARITHMETIC
    + TEXT_FUNCTIONS
    + OTHER_FUNCTIONS,
)
def test_functions(expr: plan_pb2.Scalar, expected: Any) -> None:
    check(expr, expected)


def test_decimal_results_carry_their_type_scale() -> None:
    assert str(value_of(call("add", lit(D("1.5")), lit(D("0.25"))))) == "1.75"
    assert str(value_of(call("div", lit(D("1")), lit(4)))) == "0.250000"
    assert str(value_of(call("add", lit(D("1.50")), lit(1)))) == "2.50"


# Casts ------------------------------------------------------------------------------------

DEC41 = ScalarType.decimal(4, 1)
DEC31 = ScalarType.decimal(3, 1)
DEC52 = ScalarType.decimal(5, 2)
DEC102 = ScalarType.decimal(10, 2)

CASTS: list[tuple[plan_pb2.Scalar, ColumnType | ScalarType, Any]] = [
    (lit(5), T.FLOAT64, 5.0),
    (lit(2**53 + 1), T.FLOAT64, float(2**53)),
    (lit(123), DEC41, D("123.0")),
    (lit(1000), DEC41, None),
    (lit(2.5), T.INT64, 2),
    (lit(3.5), T.INT64, 4),
    (lit(-2.5), T.INT64, -2),
    (lit(NAN), T.INT64, None),
    (lit(math.inf), T.INT64, None),
    (lit(1e19), T.INT64, None),
    (lit(D("2.5")), T.INT64, 2),
    (lit(D("2.51")), T.INT64, 3),
    (lit(D("9223372036854775807.5")), T.INT64, None),
    (lit(D("1.25")), DEC31, D("1.2")),
    (lit(D("1.35")), DEC31, D("1.4")),
    (lit(D("99.95")), DEC31, None),  # rounds to 100.0: four digits
    (lit(D("0.1")), T.FLOAT64, 0.1),
    (lit(0.1), ScalarType.decimal(38, 20), D("0.10000000000000000000")),
    (lit(1e16), DEC102, None),
    (lit(NAN), DEC102, None),
    (lit(2.675), DEC102, D("2.68")),  # from the text "2.675", half to even: 2.68
    (lit(2.665), DEC102, D("2.66")),
    (lit(True), T.TEXT, "true"),
    (lit(-12), T.TEXT, "-12"),
    (lit(0.1), T.TEXT, "0.1"),
    (lit(1e16), T.TEXT, "1e+16"),
    (lit(1.0), T.TEXT, "1.0"),
    (lit(NAN), T.TEXT, "NaN"),
    (lit(-math.inf), T.TEXT, "-Infinity"),
    (pb.cast(lit(D("1.5")), DEC102), T.TEXT, "1.50"),
    (pb.cast(lit(D("-0.5")), DEC102), T.TEXT, "-0.50"),
    (lit(D("-0.00")), T.TEXT, "0.00"),
    (lit(D("120")), T.TEXT, "120"),
    (lit(b"\n\xff"), T.TEXT, "\\x0aff"),
    (lit(DATE), T.TEXT, "2020-02-29"),
    (lit(datetime.date(33, 1, 2)), T.TEXT, "0033-01-02"),
    (lit(STAMP), T.TEXT, "2020-02-29 13:14:15.000016"),
    (lit(datetime.datetime(2020, 1, 2, 3, 4, 5)), T.TEXT, "2020-01-02 03:04:05"),
    (lit('{"a": [1, 2]}', T.JSON), T.TEXT, '{"a": [1, 2]}'),
    (lit(" TRUE "), T.BOOL, True),
    (lit("False"), T.BOOL, False),
    (lit("yes"), T.BOOL, None),
    (lit(" -12 "), T.INT64, -12),
    (lit("+7"), T.INT64, 7),
    (lit("1_000"), T.INT64, None),
    (lit("\u0661"), T.INT64, None),  # an Arabic-Indic digit is not [0-9]
    (lit("\t1"), T.INT64, None),  # only spaces are ignored
    (lit("9223372036854775808"), T.INT64, None),
    (lit("1.5"), T.INT64, None),
    (lit("1e3"), T.FLOAT64, 1000.0),
    (lit(".5"), T.FLOAT64, 0.5),
    (lit("5."), T.FLOAT64, 5.0),
    (lit("-Infinity"), T.FLOAT64, -math.inf),
    (lit("INF"), T.FLOAT64, math.inf),
    (lit("nan"), T.FLOAT64, NAN),
    (lit("1e999"), T.FLOAT64, None),
    (lit("1e-999"), T.FLOAT64, 0.0),
    (lit("abc"), T.FLOAT64, None),
    (lit("1.005"), DEC52, D("1.00")),
    (lit("1.015"), DEC52, D("1.02")),
    (lit("1e2"), DEC52, D("100.00")),
    (lit("-.5"), DEC52, D("-0.50")),
    (lit("1000"), DEC52, None),
    (lit("1e99999"), DEC52, None),
    (lit("1e-99999"), DEC52, D("0.00")),
    (lit("NaN"), DEC52, None),
    (lit("2020-02-29"), T.DATE, DATE),
    (lit("2020-02-30"), T.DATE, None),
    (lit("20200229"), T.DATE, None),
    (lit("2020-02-29T13:14:15.5"), T.TIMESTAMP, datetime.datetime(2020, 2, 29, 13, 14, 15, 500000)),
    (lit("2020-02-29 13:14:15"), T.TIMESTAMP, datetime.datetime(2020, 2, 29, 13, 14, 15)),
    (lit("2020-02-29 24:00:00"), T.TIMESTAMP, None),
    (lit("2020-02-29"), T.TIMESTAMP, None),
    (lit("\\x0A"), T.BYTES, b"\n"),
    (lit("\\x"), T.BYTES, b""),
    (lit("\\x0"), T.BYTES, None),
    (lit('{"a": 1}'), T.JSON, '{"a": 1}'),
    (lit(" [1] "), T.JSON, " [1] "),
    (lit("NaN"), T.JSON, None),
    (lit("[1,"), T.JSON, None),
    (lit(DATE), T.TIMESTAMP, datetime.datetime(2020, 2, 29)),
    (lit(STAMP), T.DATE, DATE),
    (null(T.TEXT), T.INT64, None),
]


@pytest.mark.parametrize(("expr", "to", "expected"), CASTS)
def test_casts(expr: plan_pb2.Scalar, to: ColumnType | ScalarType, expected: Any) -> None:
    check(pb.cast(expr, to), expected)


# Relations --------------------------------------------------------------------------------

AB = RelationSchema.of(("a", T.INT64), ("b", T.TEXT))
AC = RelationSchema.of(("a", T.INT64), ("c", T.TEXT))
R = pb.get("r", AB)
S = pb.get("s", AC)


def run(relation: plan_pb2.Relation, **inputs: dict[tuple[Any, ...], int]) -> dict[Any, int]:
    return evaluate(relation, inputs)


def test_filter_keeps_only_true_rows() -> None:
    data = {(1, "x"): 2, (None, "y"): 1, (3, None): 1}
    assert run(pb.filter(R, call("gt", pb.column(0), lit(0))), r=data) == {
        (1, "x"): 2,
        (3, None): 1,
    }
    # Several predicates all have to hold; a NULL predicate drops the row.
    both = pb.filter(R, call("gt", pb.column(0), lit(0)), call("eq", pb.column(1), lit("x")))
    assert run(both, r=data) == {(1, "x"): 2}


def test_map_appends_columns_that_see_earlier_ones() -> None:
    mapped = pb.map(R, call("add", pb.column(0), lit(1)), call("mul", pb.column(2), lit(10)))
    assert run(mapped, r={(1, "x"): 3, (None, "y"): 1}) == {
        (1, "x", 2, 20): 3,
        (None, "y", None, None): 1,
    }


def test_project_repeats_and_merges_rows() -> None:
    data = {(1, "x"): 2, (1, "y"): 1, (2, "x"): -1}
    assert run(pb.project(R, 0, 0), r=data) == {(1, 1): 3, (2, 2): -1}


def test_union_adds_multiplicities_and_drops_zeros() -> None:
    union = pb.union(R, pb.get("r2", AB))
    got = run(union, r={(1, "x"): 1, (2, "y"): 2}, r2={(1, "x"): -1, (3, "z"): 1})
    assert got == {(2, "y"): 2, (3, "z"): 1}


def test_negate_threshold_distinct() -> None:
    data = {(1, "x"): 3, (2, "y"): -2}
    assert run(pb.negate(R), r=data) == {(1, "x"): -3, (2, "y"): 2}
    assert run(pb.threshold(R), r=data) == {(1, "x"): 3}
    assert run(pb.distinct(R), r=data) == {(1, "x"): 1}
    # EXCEPT ALL: Threshold(r - s).
    except_all = pb.threshold(pb.union(R, pb.negate(pb.get("r2", AB))))
    got = run(except_all, r={(1, "x"): 3, (2, "y"): 1}, r2={(1, "x"): 1, (2, "y"): 4})
    assert got == {(1, "x"): 2}


def test_constant_rows() -> None:
    constant = pb.constant(AB, [(1, "x"), ((1, "x"), 2), ((2, None), -1)])
    assert run(constant) == {(1, "x"): 3, (2, None): -1}
    # A diff of 0 in the message is read as 1.
    raw = plan_pb2.Relation()
    raw.CopyFrom(pb.constant(AB, [(5, "z")]))
    raw.constant.rows[0].diff = 0
    assert run(raw) == {(5, "z"): 1}


R_ROWS = {(1, "x"): 2, (2, "y"): 1, (None, "n"): 1}
S_ROWS = {(1, "p"): 3, (1, "q"): 1, (3, "r"): 1, (None, "m"): 1}


def test_inner_join_multiplies_and_never_matches_null() -> None:
    got = run(pb.join(R, S, [0], [0]), r=R_ROWS, s=S_ROWS)
    assert got == {(1, "x", 1, "p"): 6, (1, "x", 1, "q"): 2}


def test_outer_joins_pad_unmatched_rows() -> None:
    matched = {(1, "x", 1, "p"): 6, (1, "x", 1, "q"): 2}
    left_only = {(2, "y", None, None): 1, (None, "n", None, None): 1}
    right_only = {(None, None, 3, "r"): 1, (None, None, None, "m"): 1}
    assert run(pb.join(R, S, [0], [0], "left_outer"), r=R_ROWS, s=S_ROWS) == matched | left_only
    assert run(pb.join(R, S, [0], [0], "right_outer"), r=R_ROWS, s=S_ROWS) == matched | right_only
    full = run(pb.join(R, S, [0], [0], "full_outer"), r=R_ROWS, s=S_ROWS)
    assert full == matched | left_only | right_only


def test_outer_join_with_an_empty_side() -> None:
    assert run(pb.join(R, S, [0], [0], "left_outer"), r={(1, "x"): 2}, s={}) == {
        (1, "x", None, None): 2
    }


def test_cross_join_and_computed_and_promoted_keys() -> None:
    cross = run(pb.join(R, S), r={(1, "x"): 2}, s={(5, "p"): 3, (6, "q"): 1})
    assert cross == {(1, "x", 5, "p"): 6, (1, "x", 6, "q"): 2}
    # Keys are expressions; an INT64 key meets a DECIMAL one after promotion.
    halves = pb.call("div", pb.cast(pb.column(0), ScalarType.decimal(10, 1)), lit(2))
    joined = run(pb.join(R, S, [halves], [pb.column(0)]), r={(2, "x"): 1}, s={(1, "p"): 1})
    assert joined == {(2, "x", 1, "p"): 1}
    upper = pb.join(R, S, [pb.call("upper", pb.column(1))], [pb.column(1)])
    assert run(upper, r={(1, "p"): 1}, s={(2, "P"): 1, (3, "p"): 1}) == {(1, "p", 2, "P"): 1}


def test_outer_join_over_negative_multiplicities_is_undefined() -> None:
    with pytest.raises(UndefinedResult):
        run(pb.join(R, S, [0], [0], "left_outer"), r={(1, "x"): -1}, s={})


NUMS = RelationSchema.of(
    ("g", T.TEXT), ("i", T.INT64), ("f", T.FLOAT64), Column("d", T.DECIMAL, True, 10, 2)
)
N = pb.get("n", NUMS)


def reduce_one(aggregate: plan_pb2.Aggregate, rows: dict[tuple[Any, ...], int]) -> Any:
    """The single aggregate value over ``rows`` of NUMS, as one global group."""
    ((row, count),) = evaluate(pb.reduce(N, [], [aggregate]), {"n": rows}).items()
    assert count == 1
    return row[0]


ROWS = {
    ("a", 1, 0.5, D("1.25")): 2,
    ("a", None, None, None): 1,
    ("b", 3, 1.5, D("0.10")): 1,
    ("b", 1, 0.5, D("1.25")): 1,
}

AGGREGATES: list[tuple[plan_pb2.Aggregate, dict[tuple[Any, ...], int], Any]] = [
    (pb.aggregate("count"), ROWS, 5),
    (pb.aggregate("count", 1), ROWS, 4),
    (pb.aggregate("count", 1, distinct=True), ROWS, 2),
    (pb.aggregate("sum", 1), ROWS, D(6)),
    (pb.aggregate("sum", 1, distinct=True), ROWS, D(4)),
    (pb.aggregate("sum", 3), ROWS, D("3.85")),
    (pb.aggregate("sum", 2), ROWS, 3.0),
    (pb.aggregate("min", 0), ROWS, "a"),
    (pb.aggregate("max", 3), ROWS, D("1.25")),
    (pb.aggregate("min", 2), ROWS, 0.5),
    (pb.aggregate("avg", 1), ROWS, 1.5),
    (pb.aggregate("avg", 1, distinct=True), ROWS, 2.0),
    (pb.aggregate("avg", 2), ROWS, 0.75),
    (pb.aggregate("avg", 3), ROWS, D("0.96250000")),  # 3.85 / 4 at scale 2 + 6
    (pb.aggregate("sum", 1), {("a", None, None, None): 3}, None),
    (pb.aggregate("avg", 3), {("a", None, None, None): 3}, None),
    (pb.aggregate("min", 0), {(None, 1, None, None): 1}, None),
    (pb.aggregate("count", 1), {("a", None, None, None): 3}, 0),
    # SUM(FLOAT64) is the exactly rounded sum: order cannot lose the 1.0.
    (
        pb.aggregate("sum", 2),
        {("a", 1, 1e100, None): 1, ("b", 1, 1.0, None): 1, ("c", 1, -1e100, None): 1},
        1.0,
    ),
    (pb.aggregate("sum", 2), {("a", 1, math.inf, None): 1, ("b", 1, -math.inf, None): 1}, NAN),
    (pb.aggregate("sum", 2), {("a", 1, math.inf, None): 1, ("b", 1, 2.0, None): 1}, math.inf),
    (pb.aggregate("sum", 2), {("a", 1, 1.7e308, None): 2}, math.inf),
    (pb.aggregate("max", 2), {("a", 1, NAN, None): 1, ("b", 1, math.inf, None): 1}, NAN),
    (pb.aggregate("min", 2), {("a", 1, NAN, None): 1, ("b", 1, math.inf, None): 1}, math.inf),
    (
        pb.aggregate("avg", 1),
        {("a", INT64_MAX, None, None): 2, ("b", INT64_MAX - 1, None, None): 1},
        (3 * INT64_MAX - 1) / 3,
    ),
    (pb.aggregate("sum", 1), {("a", INT64_MAX, None, None): 4}, D(4 * INT64_MAX)),
]


@pytest.mark.parametrize(("aggregate", "rows", "expected"), AGGREGATES)
def test_aggregates(
    aggregate: plan_pb2.Aggregate, rows: dict[tuple[Any, ...], int], expected: Any
) -> None:
    got = reduce_one(aggregate, rows)
    assert same(got, expected), f"{aggregate} gave {got!r}, expected {expected!r}"


def test_decimal_sum_overflow_is_null() -> None:
    big = RelationSchema([Column("d", T.DECIMAL, False, 38, 0)])
    rows = {(D("9" * 38),): 2}
    ((row, _),) = evaluate(
        pb.reduce(pb.get("b", big), [], [pb.aggregate("sum", 0)]), {"b": rows}
    ).items()
    assert row == (None,)


def test_reduce_groups_with_null_keys_together() -> None:
    rows = {("a", 1, None, None): 2, (None, 2, None, None): 1, (None, 5, None, None): 1}
    got = evaluate(pb.reduce(N, [0], [pb.aggregate("count"), pb.aggregate("max", 1)]), {"n": rows})
    assert got == {("a", 2, 1): 1, (None, 2, 5): 1}


def test_reduce_without_aggregates_is_distinct_keys() -> None:
    got = evaluate(pb.reduce(N, [0]), {"n": ROWS})
    assert got == {("a",): 1, ("b",): 1}


def test_reduce_skips_groups_with_no_positive_total() -> None:
    rows = {("a", 1, None, None): 1, ("a", 2, None, None): -1, ("b", 1, None, None): 1}
    got = evaluate(pb.reduce(N, [0], [pb.aggregate("count")]), {"n": rows})
    assert got == {("b", 1): 1}


def test_reduce_over_negative_rows_is_undefined() -> None:
    rows = {("a", 1, None, None): 2, ("a", 2, None, None): -1}
    with pytest.raises(UndefinedResult):
        evaluate(pb.reduce(N, [0], [pb.aggregate("count")]), {"n": rows})


def test_global_reduce_of_empty_input_has_no_row() -> None:
    assert evaluate(pb.reduce(N, [], [pb.aggregate("count")]), {"n": {}}) == {}


TOP = RelationSchema.of(("g", T.TEXT), ("v", T.INT64))
TOPS = pb.get("t", TOP)
TOP_ROWS = {("a", 3): 1, ("a", 1): 2, ("a", None): 1, ("b", 5): 1, ("b", 2): 1}


def top(
    order: Sequence[plan_pb2.SortKey | int],
    limit: int | None,
    offset: int = 0,
    group: Sequence[int] = (0,),
) -> dict[Any, int]:
    return evaluate(pb.top_k(TOPS, group, order, limit, offset), {"t": TOP_ROWS})


def test_top_k_per_group_ascending_nulls_last() -> None:
    assert top([1], 2) == {("a", 1): 2, ("b", 2): 1, ("b", 5): 1}
    assert top([1], 1, offset=2) == {("a", 3): 1}
    assert top([1], None, offset=3) == {("a", None): 1}


def test_top_k_descending_puts_nulls_first_unless_flipped() -> None:
    assert top([pb.sort_key(1, descending=True)], 1) == {("a", None): 1, ("b", 5): 1}
    assert top([pb.sort_key(1, descending=True, nulls_flipped=True)], 1) == {
        ("a", 3): 1,
        ("b", 5): 1,
    }
    assert top([pb.sort_key(1, nulls_flipped=True)], 1) == {("a", None): 1, ("b", 2): 1}


def test_top_k_keeps_part_of_a_repeated_row() -> None:
    # Group "a" ascending: 1, 1, 3, NULL; positions [1, 3) hold one copy of 1 and the 3.
    got = evaluate(pb.top_k(TOPS, [0], [1], 2, 1), {"t": TOP_ROWS})
    assert got == {("a", 1): 1, ("a", 3): 1, ("b", 5): 1}


def test_top_k_breaks_ties_by_the_whole_row() -> None:
    rows = {("b", 1): 1, ("a", 1): 1, (None, 1): 1, ("c", 0): 1}
    # Ordered by v only: ("c", 0) first, then the v = 1 ties by g ascending, NULL last.
    got = evaluate(pb.top_k(TOPS, [], [1], 3), {"t": rows})
    assert got == {("c", 0): 1, ("a", 1): 1, ("b", 1): 1}
    assert evaluate(pb.top_k(TOPS, [], [], 1, 3), {"t": rows}) == {(None, 1): 1}
    assert evaluate(pb.top_k(TOPS, [], [], 0), {"t": rows}) == {}


def test_top_k_over_negative_rows_is_undefined() -> None:
    with pytest.raises(UndefinedResult):
        evaluate(pb.top_k(TOPS, [], [1], 1), {"t": {("a", 1): -1}})


def test_let_binds_a_shared_value_with_shadowing() -> None:
    doubled = pb.let(1, R, pb.union(pb.local_get(1), pb.local_get(1)))
    assert run(doubled, r={(1, "x"): 1}) == {(1, "x"): 2}
    # The inner Let shadows id 1; its value still sees the outer binding.
    inner = pb.let(1, pb.filter(pb.local_get(1), call("gt", pb.column(0), lit(1))), pb.local_get(1))
    shadowed = pb.let(1, R, pb.union(inner, pb.local_get(1)))
    assert run(shadowed, r={(1, "x"): 1, (2, "y"): 1}) == {(1, "x"): 1, (2, "y"): 2}


def test_evaluate_takes_plans_and_rejects_invalid_ones() -> None:
    plan = pb.plan(pb.project(R, 1), RelationSchema.of(("b", T.TEXT)))
    assert evaluate(plan, {"r": {(1, "x"): 1, (2, "x"): 1}}) == {("x",): 2}
    with pytest.raises(InvalidArgument, match="out of range"):
        evaluate(pb.project(R, 7), {"r": {}})


def test_floats_are_normalised() -> None:
    schema = RelationSchema.of(("f", T.FLOAT64))
    got = evaluate(pb.get("f", schema), {"f": {(-0.0,): 2, (float("nan"),): 1}})
    assert got == {(0.0,): 2, (NAN,): 1}
    assert all(math.copysign(1, row[0]) == 1 for row in got)
    assert canonical({(float("nan"),): 1, (NAN,): 2, (-0.0,): 1}) == {(NAN,): 3, (0.0,): 1}


# SQLite cross-check -----------------------------------------------------------------------

SMALL_INTS = st.one_of(st.none(), st.integers(-3, 3))
SMALL_TEXTS = st.one_of(st.none(), st.sampled_from(["a", "b", "B", "ab", "", "é"]))
TABLE_ROWS = st.lists(st.tuples(SMALL_INTS, SMALL_TEXTS), max_size=8)


@dataclass(frozen=True)
class Predicate:
    """A predicate over the joined columns, as a plan scalar and as SQL."""

    scalar: plan_pb2.Scalar
    sql: str


@st.composite
def predicates(
    draw: st.DrawFn, columns: Sequence[tuple[str, ColumnType]], depth: int = 2
) -> Predicate:
    shape = draw(st.sampled_from(["compare", "compare", "null", "and", "or", "not"]))
    if depth <= 0 or shape == "compare":
        position = draw(st.integers(0, len(columns) - 1))
        name, kind = columns[position]
        op, sql_op = draw(
            st.sampled_from(
                [("eq", "="), ("ne", "<>"), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")]
            )
        )
        value = draw(
            st.integers(-3, 3) if kind is T.INT64 else st.sampled_from(["a", "b", "B", ""])
        )
        literal = str(value) if kind is T.INT64 else f"'{value}'"
        return Predicate(
            call(op, pb.column(position), lit(value, kind)), f"({name} {sql_op} {literal})"
        )
    if shape == "null":
        position = draw(st.integers(0, len(columns) - 1))
        return Predicate(call("is_null", pb.column(position)), f"({columns[position][0]} IS NULL)")
    if shape == "not":
        inner = draw(predicates(columns, depth - 1))
        return Predicate(call("not", inner.scalar), f"(NOT {inner.sql})")
    a, b = draw(predicates(columns, depth - 1)), draw(predicates(columns, depth - 1))
    return Predicate(call(shape, a.scalar, b.scalar), f"({a.sql} {shape.upper()} {b.sql})")


@dataclass(frozen=True)
class Query:
    relation: plan_pb2.Relation
    sql: str


@st.composite
def queries(draw: st.DrawFn) -> Query:
    """A filter over r or over r JOIN s, then DISTINCT of some columns or GROUP BY with
    COUNT/SUM/MIN/MAX."""
    if draw(st.booleans()):
        on_int = draw(st.booleans())
        keys = ([0], [0]) if on_int else ([1], [1])
        relation = pb.join(R, S, *keys)
        source = "r JOIN s ON " + ("r.a = s.a" if on_int else "r.b = s.c")
        columns = [("r.a", T.INT64), ("r.b", T.TEXT), ("s.a", T.INT64), ("s.c", T.TEXT)]
    else:
        relation, source, columns = R, "r", [("r.a", T.INT64), ("r.b", T.TEXT)]
    where = ""
    if draw(st.booleans()):
        predicate = draw(predicates(columns))
        relation = pb.filter(relation, predicate.scalar)
        where = f" WHERE {predicate.sql}"
    width = len(columns)
    if draw(st.booleans()):
        picked = draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=3))
        names = ", ".join(columns[p][0] for p in picked)
        return Query(
            pb.distinct(pb.project(relation, *picked)),
            f"SELECT DISTINCT {names} FROM {source}{where}",
        )
    key = draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=2, unique=True))
    aggregates, sql_aggregates = [], []
    int_columns = [i for i, (_, kind) in enumerate(columns) if kind is T.INT64]
    for _ in range(draw(st.integers(1, 3))):
        func: pb.AggregateName = draw(st.sampled_from(["count", "count", "sum", "min", "max"]))
        if func == "count" and draw(st.booleans()):
            aggregates.append(pb.aggregate("count"))
            sql_aggregates.append("COUNT(*)")
            continue
        position = draw(st.sampled_from(int_columns if func == "sum" else list(range(width))))
        distinct = draw(st.booleans())
        aggregates.append(pb.aggregate(func, position, distinct=distinct))
        sql_aggregates.append(
            f"{func.upper()}({'DISTINCT ' if distinct else ''}{columns[position][0]})"
        )
    names = ", ".join(columns[p][0] for p in key)
    sql = f"SELECT {names}, {', '.join(sql_aggregates)} FROM {source}{where} GROUP BY {names}"
    return Query(pb.reduce(relation, key, aggregates), sql)


def sqlite_answer(
    sql: str, r_rows: list[tuple[Any, Any]], s_rows: list[tuple[Any, Any]]
) -> dict[tuple[Any, ...], int]:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE TABLE r (a INTEGER, b TEXT)")
        db.execute("CREATE TABLE s (a INTEGER, c TEXT)")
        db.executemany("INSERT INTO r VALUES (?, ?)", r_rows)
        db.executemany("INSERT INTO s VALUES (?, ?)", s_rows)
        answer: dict[tuple[Any, ...], int] = {}
        for row in db.execute(sql):
            answer[tuple(row)] = answer.get(tuple(row), 0) + 1
        return answer
    finally:
        db.close()


def as_multiset(rows: list[tuple[Any, Any]]) -> dict[tuple[Any, ...], int]:
    result: dict[tuple[Any, ...], int] = {}
    for row in rows:
        result[row] = result.get(row, 0) + 1
    return result


@settings(max_examples=150)
@given(queries(), TABLE_ROWS, TABLE_ROWS)
def test_agrees_with_sqlite(
    query: Query, r_rows: list[tuple[Any, Any]], s_rows: list[tuple[Any, Any]]
) -> None:
    ours = evaluate(query.relation, {"r": as_multiset(r_rows), "s": as_multiset(s_rows)})
    # SUM(INT64) is a DECIMAL(38, 0) here and an integer in SQLite: equal values, equal hashes.
    assert ours == sqlite_answer(query.sql, r_rows, s_rows), query.sql
