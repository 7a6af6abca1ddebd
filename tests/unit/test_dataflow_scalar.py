"""Scalar expressions compiled by the dataflow engine, against the contract in plan.proto."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from typing import Any

import pytest

from services.compute.dataflow.scalar import compile_scalar
from tidemark.columnar import ColumnType as T
from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2

INT = ScalarType(T.INT64)
TEXT = ScalarType(T.TEXT)
FLOAT = ScalarType(T.FLOAT64)
BOOL = ScalarType(T.BOOL)
DEC_10_2 = ScalarType.decimal(10, 2)
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
NAN = float("nan")


def lit(value: Any, kind: T | ScalarType) -> plan_pb2.Scalar:
    return pb.literal(value, kind)


def i(value: int | None) -> plan_pb2.Scalar:
    return lit(value, T.INT64)


def f(value: float | None) -> plan_pb2.Scalar:
    return lit(value, T.FLOAT64)


def d(text: str) -> plan_pb2.Scalar:
    return pb.literal(Decimal(text), T.DECIMAL)


def s(value: str | None) -> plan_pb2.Scalar:
    return lit(value, T.TEXT)


def b(value: bool | None) -> plan_pb2.Scalar:
    return lit(value, T.BOOL)


def ev(
    expr: plan_pb2.Scalar, row: tuple[Any, ...] = (), types: list[ScalarType] | None = None
) -> Any:
    return compile_scalar(expr, types or []).evaluate(row)


def same(a: Any, b: Any) -> bool:
    """Equal values, with NaN equal to NaN and the types the same."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b and str(a) == str(b)


# -- comparison and logic ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        ("eq", f(NAN), f(NAN), True),
        ("lt", f(math.inf), f(NAN), True),
        ("gt", f(NAN), f(1e308), True),
        ("le", f(NAN), f(NAN), True),
        ("ne", f(NAN), f(0.0), True),
        ("eq", f(-0.0), f(0.0), True),
        ("eq", i(1), d("1.00"), True),
        ("lt", i(1), f(1.5), True),
        ("eq", d("0.1"), f(0.1), True),  # promoted to float: both round to the same double
        ("lt", s("B"), s("a"), True),  # code point order
        ("lt", s("a"), s("é"), True),
        ("lt", b(False), b(True), True),
        ("eq", i(None), i(None), None),
        ("ne", i(1), i(None), None),
        ("ge", lit(b"\x00\xff", T.BYTES), lit(b"\x00", T.BYTES), True),
    ],
)
def test_comparisons(op: str, a: plan_pb2.Scalar, b: plan_pb2.Scalar, expected: Any) -> None:
    assert ev(pb.call(op, a, b)) is expected


def test_comparing_a_row_column_promotes_the_integer() -> None:
    expr = pb.call("lt", pb.column(0), pb.column(1))
    assert ev(expr, (2**53 + 1, 2.0**53), [INT, FLOAT]) is False  # 2**53+1 rounds to 2**53
    assert ev(expr, (1, Decimal("1.01")), [INT, DEC_10_2]) is True


@pytest.mark.parametrize(
    ("args", "and_result", "or_result"),
    [
        ((True, True), True, True),
        ((True, False), False, True),
        ((False, None), False, None),
        ((True, None), None, True),
        ((None, None), None, None),
        ((True, True, None), None, True),
        ((None, False, True), False, True),
    ],
)
def test_three_valued_logic(args: tuple[bool | None, ...], and_result: Any, or_result: Any) -> None:
    assert ev(pb.call("and", *(b(a) for a in args))) is and_result
    assert ev(pb.call("or", *(b(a) for a in args))) is or_result


def test_not_and_null_tests() -> None:
    assert ev(pb.call("not", b(None))) is None
    assert ev(pb.call("not", b(False))) is True
    assert ev(pb.call("is_null", i(None))) is True
    assert ev(pb.call("is_not_null", s(""))) is True
    assert not compile_scalar(pb.call("is_null", pb.column(0)), [INT]).type.nullable


# -- arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        ("add", I64_MAX, 1, None),
        ("sub", I64_MIN, 1, None),
        ("mul", 2**32, 2**31, None),
        ("mul", -(2**32), 2**31, I64_MIN),
        ("div", 7, -2, -3),
        ("div", -7, 2, -3),
        ("div", I64_MIN, -1, None),
        ("mod", -7, 3, -1),
        ("mod", 7, -3, 1),
        ("div", 1, 0, None),
        ("mod", 1, 0, None),
    ],
)
def test_int64_arithmetic(op: str, a: int, b: int, expected: int | None) -> None:
    assert ev(pb.call(op, i(a), i(b))) == expected


def test_int64_sign_functions_overflow_to_null() -> None:
    assert ev(pb.call("neg", i(I64_MIN))) is None
    assert ev(pb.call("abs", i(I64_MIN))) is None
    assert ev(pb.call("abs", i(-5))) == 5


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        ("add", "1.5", "2.25", "3.75"),
        ("sub", "1.50", "1.5", "0.00"),
        ("mul", "1.5", "1.5", "2.25"),
        ("div", "1", "3", "0.333333"),  # scale max(0, 0, 6)
        ("div", "2.0000000", "3", "0.6666667"),  # scale 7, half-even
        ("div", "0.0000005", "1", "5E-7"),
        ("div", "1", "8", "0.125000"),
        ("div", "5", "0", None),
        ("mod", "-7.5", "2", "-1.5"),
        ("mod", "1", "0.0", None),
    ],
)
def test_decimal_arithmetic(op: str, a: str, b: str, expected: str | None) -> None:
    result = ev(pb.call(op, d(a), d(b)))
    assert result == (None if expected is None else Decimal(expected))


def test_decimal_division_rounds_half_to_even() -> None:
    # 0.0000125 / 1 at scale 6 lies exactly between 0.000012 and 0.000013: even wins.
    assert ev(pb.call("div", d("0.0000125"), d("1"))) == Decimal("0.0000125")  # scale 7
    assert ev(pb.call("div", d("0.125"), d("1000"))) == Decimal("0.000125")
    assert ev(pb.call("div", d("1"), d("16000000"))) == Decimal("0.000000")  # 6.25e-8
    assert ev(pb.call("div", d("5"), d("10000000"))) == Decimal("0.000000")  # 5e-7: tie, to even
    assert ev(pb.call("div", d("15"), d("10000000"))) == Decimal("0.000002")  # 1.5e-6: to even


def test_decimal_results_beyond_38_digits_are_null() -> None:
    big = "9" * 38
    assert ev(pb.call("add", d(big), d("1"))) is None
    assert ev(pb.call("add", d(big), d("-1"))) == Decimal("9" * 37 + "8")
    assert ev(pb.call("mul", d("1" + "0" * 20), d("1" + "0" * 20))) is None
    # An int64 operand is promoted to DECIMAL(19, 0) exactly.
    assert ev(pb.call("mul", i(I64_MAX), d("1.5"))) == Decimal(I64_MAX) * Decimal("1.5")


def test_decimal_result_types() -> None:
    dec_5_3 = ScalarType.decimal(5, 3)
    types = [DEC_10_2, dec_5_3, INT]
    for op, scale in [("add", 3), ("sub", 3), ("mod", 3), ("mul", 5), ("div", 6)]:
        compiled = compile_scalar(pb.call(op, pb.column(0), pb.column(1)), types)
        assert (compiled.type.kind, compiled.type.precision, compiled.type.scale) == (
            T.DECIMAL,
            38,
            scale,
        )
    assert compile_scalar(pb.call("neg", pb.column(0)), types).type == DEC_10_2
    assert compile_scalar(pb.call("add", pb.column(2), pb.column(0)), types).type.scale == 2


def test_float_arithmetic_is_ieee_with_normalised_results() -> None:
    assert ev(pb.call("mul", f(1e308), f(10.0))) == math.inf
    nan = ev(pb.call("sub", f(math.inf), f(math.inf)))
    assert math.isnan(nan)
    assert same(ev(pb.call("mul", f(-1.0), f(0.0))), 0.0)  # -0.0 is normalised
    assert same(ev(pb.call("neg", f(0.0))), 0.0)
    assert ev(pb.call("div", f(1.0), f(0.0))) is None
    assert ev(pb.call("mod", f(1.0), f(-0.0))) is None
    assert ev(pb.call("mod", f(-7.5), f(2.0))) == -1.5
    assert math.isnan(ev(pb.call("mod", f(math.inf), f(2.0))))
    assert ev(pb.call("add", i(1), f(0.5))) == 1.5
    assert ev(pb.call("add", d("0.1"), f(0.2))) == 0.1 + 0.2


def test_nan_results_share_one_object() -> None:
    first = ev(pb.call("sub", f(math.inf), f(math.inf)))
    second = ev(pb.call("mul", f(0.0), f(math.inf)))
    assert first is second  # so rows holding NaN group and join as equal


# -- text, coalesce, case, dates --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("hello", 2), "ello"),
        (("hello", 2, 3), "ell"),
        (("hello", 0, 3), "he"),
        (("hello", -5, 3), ""),
        (("hello", 4, 100), "lo"),
        (("hello", 9), ""),
        (("héllo", 2, 1), "é"),
        (("hello", 1, -1), None),
    ],
)
def test_substr_follows_postgres(args: tuple[Any, ...], expected: str | None) -> None:
    text, *numbers = args
    assert ev(pb.call("substr", s(text), *(i(n) for n in numbers))) == expected


@pytest.mark.parametrize(
    ("subject", "pattern", "expected"),
    [
        ("abc", "a%", True),
        ("abc", "%b", False),
        ("abc", "_b_", True),
        ("a\nc", "a_c", True),
        ("ABC", "abc", False),
        ("a.c", "a.c", True),
        ("abc", "a.c", False),
        ("", "%", True),
        ("", "_", False),
        ("a%", "a\\%", False),  # no escape character: the backslash is literal
    ],
)
def test_like(subject: str, pattern: str, expected: bool) -> None:
    assert ev(pb.call("like", s(subject), s(pattern))) is expected
    # The same through a pattern that is not a constant.
    expr = pb.call("like", pb.column(0), pb.column(1))
    assert ev(expr, (subject, pattern), [TEXT, TEXT]) is expected


def test_text_functions() -> None:
    assert ev(pb.call("lower", s("ÀB"))) == "àb"
    assert ev(pb.call("upper", s("straße"))) == "STRASSE"
    assert ev(pb.call("length", s("héllo"))) == 5
    assert ev(pb.call("trim", s("\t a b  "))) == "\t a b"
    assert ev(pb.call("concat", s("a"), s(""), s("b"))) == "ab"
    assert ev(pb.call("concat", s("a"), s(None))) is None
    assert ev(pb.call("like", s(None), s("%"))) is None


def test_coalesce_unifies_numbers_and_nulls_values_that_do_not_fit() -> None:
    assert ev(pb.call("coalesce", i(None), i(None), i(3))) == 3
    assert ev(pb.call("coalesce", i(None))) is None
    expr = pb.call("coalesce", pb.column(0), pb.column(1))
    compiled = compile_scalar(expr, [ScalarType.decimal(38, 0), ScalarType.decimal(10, 2)])
    assert (compiled.type.precision, compiled.type.scale) == (38, 2)
    assert compiled.type.nullable
    assert compiled.evaluate((Decimal(10**35), None)) == Decimal(10**35)
    # The first non-NULL value is taken, then converted: 10**36 needs 39 digits at scale 2.
    assert compiled.evaluate((Decimal(10**36), Decimal(1))) is None
    assert compiled.evaluate((None, Decimal(1))) == Decimal("1.00")
    mixed = compile_scalar(expr, [INT, FLOAT])
    assert same(mixed.evaluate((None, 2.5)), 2.5)
    assert same(mixed.evaluate((3, 2.5)), 3.0)


def test_case_takes_the_otherwise_branch_on_null() -> None:
    expr = pb.case(pb.column(0), i(1), d("2.5"))
    compiled = compile_scalar(expr, [BOOL])
    assert compiled.evaluate((True,)) == Decimal(1)
    assert compiled.evaluate((None,)) == Decimal("2.5")
    assert compiled.evaluate((False,)) == Decimal("2.5")


def test_date_functions() -> None:
    ts = datetime.datetime(2020, 2, 29, 23, 59, 59, 999999)
    date = datetime.date(1999, 12, 31)
    assert ev(pb.call("extract_year", lit(ts, T.TIMESTAMP))) == 2020
    assert ev(pb.call("extract_month", lit(date, T.DATE))) == 12
    assert ev(pb.call("extract_day", lit(ts, T.TIMESTAMP))) == 29
    assert ev(pb.call("date_trunc_day", lit(ts, T.TIMESTAMP))) == datetime.datetime(2020, 2, 29)


# -- casts -------------------------------------------------------------------------------------


def cast(value: plan_pb2.Scalar, to: T | ScalarType) -> Any:
    return ev(pb.cast(value, to))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b(True), "true"),
        (i(-42), "-42"),
        (f(0.1), "0.1"),
        (f(1e16), "1e+16"),
        (f(1.0), "1.0"),
        (f(-0.0), "0.0"),
        (f(NAN), "NaN"),
        (f(-math.inf), "-Infinity"),
        (pb.cast(d("-0.001"), ScalarType.decimal(5, 2)), "0.00"),
        (pb.cast(d("1.5"), ScalarType.decimal(5, 3)), "1.500"),
        (d("100"), "100"),
        (lit(b"\x01\xab", T.BYTES), "\\x01ab"),
        (lit(datetime.date(5, 1, 2), T.DATE), "0005-01-02"),
        (lit(datetime.datetime(2020, 1, 2, 3, 4, 5), T.TIMESTAMP), "2020-01-02 03:04:05"),
        (
            lit(datetime.datetime(2020, 1, 2, 3, 4, 5, 60), T.TIMESTAMP),
            "2020-01-02 03:04:05.000060",
        ),
        (lit('{"a": 1}', T.JSON), '{"a": 1}'),
    ],
)
def test_casts_to_text_use_canonical_forms(value: plan_pb2.Scalar, expected: str) -> None:
    assert cast(value, T.TEXT) == expected


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        (" TRUE ", T.BOOL, True),
        ("yes", T.BOOL, None),
        (" -12 ", T.INT64, -12),
        ("1_000", T.INT64, None),
        ("٣", T.INT64, None),  # only ASCII digits
        ("9223372036854775808", T.INT64, None),
        ("1e3", T.FLOAT64, 1000.0),
        (".5", T.FLOAT64, 0.5),
        ("-INF", T.FLOAT64, -math.inf),
        ("1e400", T.FLOAT64, None),
        ("-0", T.FLOAT64, 0.0),
        ("0x10", T.FLOAT64, None),
        ("2020-02-29", T.DATE, datetime.date(2020, 2, 29)),
        ("2021-02-29", T.DATE, None),
        ("2020-1-01", T.DATE, None),
        ("2020-01-02T03:04:05.5", T.TIMESTAMP, datetime.datetime(2020, 1, 2, 3, 4, 5, 500000)),
        ("2020-01-02 24:00:00", T.TIMESTAMP, None),
        ("\\xDEad", T.BYTES, b"\xde\xad"),
        ("\\xabc", T.BYTES, None),
        (' [1, "x"] ', T.JSON, ' [1, "x"] '),
        ("NaN", T.JSON, None),
        ("{", T.JSON, None),
    ],
)
def test_casts_from_text(text: str, kind: T, expected: Any) -> None:
    result = cast(s(text), kind)
    if isinstance(expected, float):
        assert same(result, expected)
    else:
        assert result == expected


def test_text_nan_parses_to_the_one_nan() -> None:
    assert math.isnan(cast(s("nan"), T.FLOAT64))
    assert cast(s("+nan"), T.FLOAT64) is None


@pytest.mark.parametrize(
    ("value", "target", "expected"),
    [
        (f(2.5), T.INT64, 2),
        (f(3.5), T.INT64, 4),
        (f(-2.5), T.INT64, -2),
        (f(NAN), T.INT64, None),
        (f(9.3e18), T.INT64, None),
        (d("2.5"), T.INT64, 2),
        (d("-3.5"), T.INT64, -4),
        (d("99999999999999999999"), T.INT64, None),
        (i(2**53 + 1), T.FLOAT64, float(2**53)),
        (d("0.1"), T.FLOAT64, 0.1),
        (f(2.675), ScalarType.decimal(5, 2), Decimal("2.68")),  # from repr "2.675", half-even up
        (f(0.125), ScalarType.decimal(5, 2), Decimal("0.12")),
        (f(math.inf), ScalarType.decimal(5, 2), None),
        (d("123.456"), ScalarType.decimal(5, 2), Decimal("123.46")),
        (d("1234.5"), ScalarType.decimal(5, 2), None),
        (d("999.995"), ScalarType.decimal(5, 2), None),  # rounds up to 1000.00
        (i(-7), ScalarType.decimal(3, 1), Decimal("-7.0")),
        (s(" 1.005 "), ScalarType.decimal(5, 2), Decimal("1.00")),
        (s("1e2"), ScalarType.decimal(5, 2), Decimal("100.00")),
        (lit(datetime.date(2020, 1, 2), T.DATE), T.TIMESTAMP, datetime.datetime(2020, 1, 2)),
        (
            lit(datetime.datetime(2020, 1, 2, 3, 4), T.TIMESTAMP),
            T.DATE,
            datetime.date(2020, 1, 2),
        ),
    ],
)
def test_numeric_and_temporal_casts(
    value: plan_pb2.Scalar, target: T | ScalarType, expected: Any
) -> None:
    assert cast(value, target) == expected


def test_cast_nullability_follows_whether_it_can_fail() -> None:
    def cast_type(source: ScalarType, target: T | ScalarType) -> ScalarType:
        return compile_scalar(pb.cast(pb.column(0), target), [source]).type

    assert not cast_type(ScalarType(T.INT64, False), T.FLOAT64).nullable
    assert cast_type(ScalarType(T.TEXT, False), T.INT64).nullable
    assert cast_type(ScalarType(T.FLOAT64, False), T.INT64).nullable
    assert not cast_type(ScalarType(T.INT64, False), T.TEXT).nullable


# -- compile-time checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (pb.call("now"), "'now' is nondeterministic"),
        (pb.call("random"), "'random' is nondeterministic"),
        (pb.call("frobnicate", i(1)), "unknown function 'frobnicate'"),
        (pb.call("eq", i(1), s("1")), "cannot compare"),
        (pb.call("add", s("a"), i(1)), "'add' takes"),
        (pb.call("and", b(True)), r"takes 2\+ arguments"),
        (pb.call("substr", s("a")), "takes 2 to 3 arguments"),
        (pb.call("eq", pb.column(3), i(1)), "column 3 is out of range"),
        (pb.cast(b(True), T.INT64), "no cast from bool"),
        (pb.case(i(1), i(1), i(2)), "condition is int64"),
        (pb.call("coalesce", i(1), s("a")), "different types"),
    ],
)
def test_bad_expressions_are_rejected_naming_the_problem(
    expr: plan_pb2.Scalar, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        compile_scalar(expr, [INT], "filter (node 1)")


def test_bad_literals_are_rejected() -> None:
    mismatched = plan_pb2.Scalar(literal=plan_pb2.Datum(type=T.INT64.value, text_value="1"))
    with pytest.raises(InvalidArgument, match="cannot hold text_value"):
        compile_scalar(mismatched, [])
    bad_decimal = plan_pb2.Scalar(literal=plan_pb2.Datum(type=T.DECIMAL.value, decimal_value="1e5"))
    with pytest.raises(InvalidArgument, match="not a plain decimal"):
        compile_scalar(bad_decimal, [])
    bad_json = plan_pb2.Scalar(literal=plan_pb2.Datum(type=T.JSON.value, json_value="{"))
    with pytest.raises(InvalidArgument, match="not a JSON document"):
        compile_scalar(bad_json, [])


def test_literal_types() -> None:
    assert compile_scalar(d("-012.50"), []).type == ScalarType.decimal(4, 2, False)
    assert compile_scalar(d("0.05"), []).type == ScalarType.decimal(2, 2, False)
    assert compile_scalar(lit(None, T.DECIMAL), []).type == ScalarType.decimal(38, 0, True)


def test_expressions_without_columns_are_folded() -> None:
    folded = compile_scalar(pb.call("add", i(1), pb.call("mul", i(2), i(3))), [])
    assert folded.constant and folded.evaluate(()) == 7
    live = compile_scalar(pb.call("add", pb.column(0), i(1)), [INT])
    assert not live.constant and live.evaluate((41,)) == 42
