"""Type derivation and validation of plans: output schemas, nullability, and the errors."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.plan import (
    DETERMINISTIC,
    FUNCTIONS,
    NONDETERMINISTIC,
    check_plan,
    derive_schema,
    scalar_type,
)
from tidemark.plan import builders as pb
from tidemark.plan.derive import true_columns
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import common_pb2, plan_pb2

T = ColumnType
DEC102 = ScalarType.decimal(10, 2)
SCHEMA = RelationSchema(
    [
        Column("i", T.INT64, nullable=True),
        Column("t", T.TEXT, nullable=True),
        Column("d", T.DECIMAL, True, 10, 2),
        Column("f", T.FLOAT64, nullable=False),
        Column("k", T.INT64, nullable=False),
    ]
)
R = pb.get("r", SCHEMA)
COLUMNS = [ScalarType.of_column(c) for c in SCHEMA.columns]


def types_of(relation: plan_pb2.Relation) -> list[str]:
    return [ScalarType.of_column(c).describe() for c in derive_schema(relation).columns]


def names_of(relation: plan_pb2.Relation) -> list[str]:
    return derive_schema(relation).names


def typed(expr: plan_pb2.Scalar) -> str:
    return scalar_type(expr, COLUMNS).describe()


def lit(value: object, kind: ColumnType | ScalarType) -> plan_pb2.Scalar:
    return pb.literal(value, kind)


# Scalars ----------------------------------------------------------------------------------

SCALAR_TYPES = [
    (pb.column(0), "int64"),
    (pb.column(3), "float64 not null"),
    (lit(1, T.INT64), "int64 not null"),
    (lit(None, T.TEXT), "text"),
    (lit(Decimal("1.50"), T.DECIMAL), "decimal(3,2) not null"),
    (lit(Decimal("1.5"), DEC102), "decimal(10,2) not null"),
    (pb.call("eq", 0, 4), "bool"),
    (pb.call("lt", 3, 4), "bool not null"),
    (pb.call("eq", 2, 3), "bool"),
    (pb.call("and", pb.call("eq", 4, 4), pb.call("eq", 4, 4)), "bool not null"),
    (pb.call("is_null", 0), "bool not null"),
    (pb.call("add", 4, 4), "int64"),  # may overflow
    (pb.call("add", 3, 3), "float64 not null"),
    (pb.call("div", 3, 3), "float64"),  # division by zero
    (pb.call("add", 2, 4), "decimal(38,2)"),
    (pb.call("sub", 2, lit(Decimal("0.001"), T.DECIMAL)), "decimal(38,3)"),
    (pb.call("mul", 2, 2), "decimal(38,4)"),
    (pb.call("div", 2, 4), "decimal(38,6)"),
    (pb.call("div", 2, lit(Decimal("1.0000000"), T.DECIMAL)), "decimal(38,7)"),
    (pb.call("mod", 2, 4), "decimal(38,2)"),
    (pb.call("add", 2, 3), "float64"),
    (pb.call("neg", 2), "decimal(10,2)"),
    (pb.call("abs", 3), "float64 not null"),
    (pb.call("neg", 4), "int64"),
    (pb.call("lower", 1), "text"),
    (pb.call("length", lit("x", T.TEXT)), "int64 not null"),
    (pb.call("substr", lit("x", T.TEXT), 4), "text not null"),
    (pb.call("substr", lit("x", T.TEXT), 4, 4), "text"),  # a negative length is NULL
    (pb.call("concat", 1, lit("x", T.TEXT), 1), "text"),
    (pb.call("like", 1, lit("a%", T.TEXT)), "bool"),
    (pb.call("coalesce", 0, 4), "int64 not null"),
    (pb.call("coalesce", 0, 0), "int64"),
    (pb.call("coalesce", 0, 2), "decimal(21,2)"),  # 19 integer digits + scale 2
    (pb.call("coalesce", 4, 2, 3), "float64 not null"),
    (pb.call("coalesce", lit(None, T.DECIMAL), 4), "decimal(38,0) not null"),
    (pb.call("coalesce", 2, lit(Decimal("1." + "0" * 20), T.DECIMAL)), "decimal(28,20) not null"),
    # 19 integer digits + scale 20 do not fit in 38: a value may become NULL.
    (pb.call("coalesce", 4, lit(Decimal("1." + "0" * 20), T.DECIMAL)), "decimal(38,20)"),
    (pb.call("extract_year", lit(datetime.date(2020, 1, 1), T.DATE)), "int64 not null"),
    (pb.call("date_trunc_day", lit(None, T.TIMESTAMP)), "timestamp"),
    (pb.case(pb.call("eq", 0, 4), 4, 4), "int64 not null"),
    (pb.case(pb.call("eq", 0, 4), 4, 2), "decimal(21,2)"),
    (pb.case(pb.call("eq", 0, 4), 4, 0), "int64"),
    (pb.cast(4, T.TEXT), "text not null"),
    (pb.cast(0, T.TEXT), "text"),
    (pb.cast(4, T.FLOAT64), "float64 not null"),
    (pb.cast(4, ScalarType.decimal(19, 0)), "decimal(19,0) not null"),
    (pb.cast(4, ScalarType.decimal(18, 0)), "decimal(18,0)"),  # may not fit
    (pb.cast(2, ScalarType.decimal(9, 2)), "decimal(9,2)"),
    (pb.cast(pb.call("coalesce", 2, lit(Decimal(0), T.DECIMAL)), DEC102), "decimal(10,2) not null"),
    (pb.cast(pb.cast(4, ScalarType.decimal(10, 2)), ScalarType.decimal(10, 1)), "decimal(10,1)"),
    (pb.cast(pb.cast(4, ScalarType.decimal(10, 2)), ScalarType.decimal(11, 1)), "decimal(11,1)"),
    (pb.cast(pb.cast(3, ScalarType.decimal(20, 2)), T.INT64), "int64"),
    (pb.cast(pb.cast(3, ScalarType.decimal(20, 2)), T.FLOAT64), "float64"),
    (pb.cast(3, T.INT64), "int64"),
    (pb.cast(lit("1", T.TEXT), T.INT64), "int64"),
    (pb.cast(lit("1", T.TEXT), T.JSON), "json"),
    (pb.cast(lit("[1]", T.JSON), T.TEXT), "text not null"),
    (pb.cast(lit(datetime.date(2020, 1, 1), T.DATE), T.TIMESTAMP), "timestamp not null"),
]


@pytest.mark.parametrize(("expr", "expected"), SCALAR_TYPES)
def test_scalar_types(expr: plan_pb2.Scalar, expected: str) -> None:
    assert typed(expr) == expected


def test_decimal_cast_nullability_counts_the_rounding_carry() -> None:
    # DECIMAL(10,2) holds 8 integer digits; at scale 1, 9.99 rounds to 10.0, so 9 are needed.
    src = pb.cast(4, ScalarType.decimal(10, 2))
    assert typed(pb.cast(src, ScalarType.decimal(9, 1))).endswith("decimal(9,1)")
    assert typed(pb.cast(pb.cast(pb.cast(4, ScalarType.decimal(3, 0)), T.INT64), T.INT64)) == (
        "int64"
    )


SCALAR_ERRORS = [
    (pb.column(5), "column #5 is out of range"),
    (pb.call("now"), "'now' is nondeterministic"),
    (pb.call("RANDOM"), "'RANDOM' is nondeterministic"),
    (pb.call("frob", 0), "unknown function 'frob'"),
    (pb.call("ADD", 0, 0), "unknown function 'ADD'"),  # names are exact
    (pb.call("Current_Date"), "'Current_Date' is nondeterministic"),
    (pb.call("eq", 0), "'eq' takes 2 arguments, got 1"),
    (pb.call("and", pb.call("eq", 0, 0)), "'and' takes at least 2 arguments"),
    (pb.call("substr", 1), "'substr' takes 2 to 3 arguments"),
    (pb.call("eq", 0, 1), "'eq' takes two comparable arguments"),
    (pb.call("lt", lit("[1]", T.JSON), 1), "'lt' takes two comparable"),
    (pb.call("add", 0, 1), "'add' takes numeric arguments"),
    (pb.call("neg", 1), "'neg' takes a numeric argument"),
    (pb.call("and", 0, 0), "'and' takes (bool"),
    (pb.call("lower", 0), "'lower' takes (text"),
    (pb.call("substr", 1, 1), "'substr' takes (text, int64"),
    (pb.call("coalesce", 0, 1), "'coalesce': arguments have different types"),
    (pb.call("extract_year", 0), "'extract_year' takes (date|timestamp"),
    (pb.call("date_trunc_day", lit(datetime.date(2020, 1, 1), T.DATE)), "'date_trunc_day'"),
    (pb.case(0, 0, 0), "case condition is int64"),
    (pb.case(pb.call("eq", 0, 0), 0, 1), "case branches: arguments have different types"),
    (pb.cast(0, T.DATE), "cannot cast int64 to date"),
    (pb.cast(lit(True, T.BOOL), T.INT64), "cannot cast bool"),
    (pb.cast(lit(b"x", T.BYTES), T.JSON), "cannot cast bytes to json"),
    (plan_pb2.Scalar(), "no kind set"),
    (plan_pb2.Scalar(case=plan_pb2.Case(cond=pb.column(0))), "case has no then"),
    (plan_pb2.Scalar(cast=plan_pb2.Cast(to=common_pb2.Column(type=T.INT64.value))), "no input"),  # type: ignore[arg-type]
    (plan_pb2.Scalar(cast=plan_pb2.Cast(input=pb.column(0))), "has no type"),
    (plan_pb2.Scalar(literal=plan_pb2.Datum(int64_value=1)), "datum has no type"),
]


@pytest.mark.parametrize(("expr", "message"), SCALAR_ERRORS)
def test_scalar_errors(expr: plan_pb2.Scalar, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace("|", r"\|")):
        scalar_type(expr, COLUMNS)


def test_registry_flags_nondeterministic_functions() -> None:
    assert DETERMINISTIC | NONDETERMINISTIC == set(FUNCTIONS)
    assert not DETERMINISTIC & NONDETERMINISTIC
    assert {"now", "random", "current_timestamp"} <= NONDETERMINISTIC
    assert not FUNCTIONS["now"].deterministic
    assert FUNCTIONS["add"].deterministic
    assert len(DETERMINISTIC) == 34


# Relations --------------------------------------------------------------------------------


def test_get_uses_its_schema_or_the_inputs() -> None:
    assert derive_schema(R) == SCHEMA
    assert derive_schema(pb.get("r"), {"r": SCHEMA}) == SCHEMA
    with pytest.raises(InvalidArgument, match="no schema for collection 'r'"):
        derive_schema(pb.get("r"))
    other = RelationSchema.of(("i", T.INT64))
    with pytest.raises(InvalidArgument, match="differs from the collection's schema"):
        derive_schema(R, {"r": other})
    with pytest.raises(InvalidArgument, match="no collection_id"):
        derive_schema(pb.get("", SCHEMA))


def test_constant_rows_are_checked_against_the_schema() -> None:
    schema = RelationSchema([Column("a", T.INT64, False), Column("d", T.DECIMAL, True, 4, 1)])
    good = pb.constant(schema, [(1, Decimal("1.5")), ((2, None), 3)])
    assert derive_schema(good) == schema
    wide = pb.constant(schema, [(1, None)])
    wide.constant.rows[0].values.append(pb.literal(1, T.INT64).literal)
    with pytest.raises(InvalidArgument, match="row 0 has 3 values for 2 columns"):
        derive_schema(wide)
    wrong = pb.constant(schema, [(1, None)])
    wrong.constant.rows[0].values[0].CopyFrom(pb.literal("1", T.TEXT).literal)
    with pytest.raises(InvalidArgument, match="a TEXT value in INT64 column 'a'"):
        derive_schema(wrong)
    null = pb.constant(schema, [(1, None)])
    null.constant.rows[0].values[0].CopyFrom(pb.literal(None, T.INT64).literal)
    with pytest.raises(InvalidArgument, match="NULL in NOT NULL column 'a'"):
        derive_schema(null)
    loose = pb.constant(schema, [(1, None)])
    loose.constant.rows[0].values[1].decimal_value = "1.25"
    with pytest.raises(InvalidArgument, match=r"does not fit column 'd' DECIMAL\(4, 1\)"):
        derive_schema(loose)


def test_filter_learns_which_columns_are_not_null() -> None:
    def nullable_after(*predicates: plan_pb2.Scalar) -> list[bool]:
        return [c.nullable for c in derive_schema(pb.filter(R, *predicates)).columns[:3]]

    assert nullable_after(pb.call("gt", 0, lit(1, T.INT64))) == [False, True, True]
    assert nullable_after(pb.call("is_not_null", 1)) == [True, False, True]
    assert nullable_after(pb.call("is_null", 1)) == [True, True, True]
    both = pb.call("and", pb.call("eq", 0, 4), pb.call("like", 1, lit("a", T.TEXT)))
    assert nullable_after(both) == [False, False, True]
    either = pb.call("or", pb.call("eq", 0, 4), pb.call("eq", 0, pb.call("length", 1)))
    assert nullable_after(either) == [False, True, True]
    assert nullable_after(pb.call("not", pb.call("eq", 0, pb.cast(2, T.INT64)))) == [
        False,
        True,
        False,
    ]
    assert nullable_after(pb.call("eq", pb.call("coalesce", 0, 4), 4)) == [True, True, True]
    assert nullable_after(pb.call("eq", 0, 4), pb.call("gt", 2, 4)) == [False, True, False]


def test_filter_predicates_must_be_bool() -> None:
    with pytest.raises(InvalidArgument, match="at filter: predicate 1 is int64, not bool"):
        derive_schema(pb.filter(R, pb.call("eq", 0, 0), pb.column(0)))


def test_map_appends_named_columns_that_see_earlier_ones() -> None:
    mapped = pb.map(R, pb.call("add", 4, 4), pb.call("mul", 5, 5), pb.column(1))
    assert names_of(mapped) == ["i", "t", "d", "f", "k", "add", "mul", "t_2"]
    assert types_of(mapped)[5:] == ["int64", "int64", "text"]
    with pytest.raises(InvalidArgument, match="at map: expression 1: column #7"):
        derive_schema(pb.map(R, pb.column(0), pb.column(7)))


def test_project_picks_and_renames_repeats() -> None:
    projected = pb.project(R, 1, 1, 0)
    assert names_of(projected) == ["t", "t_2", "i"]
    assert types_of(projected) == ["text", "text", "int64"]
    with pytest.raises(InvalidArgument, match=r"at project: column #5 is out of range"):
        derive_schema(pb.project(R, 5))
    with pytest.raises(InvalidArgument, match="at least one column"):
        derive_schema(pb.project(R))


def test_union_types_must_agree_and_nullability_combines() -> None:
    nonnull = pb.filter(R, pb.call("is_not_null", 0))
    union = pb.union(pb.project(nonnull, 0, 4), pb.project(R, 4, 0))
    assert types_of(union) == ["int64 not null", "int64"]
    assert types_of(pb.union(pb.project(nonnull, 0))) == ["int64 not null"]
    with pytest.raises(InvalidArgument, match=r"at union: input 1 has column types \['text'\]"):
        derive_schema(pb.union(pb.project(R, 0), pb.project(R, 1)))
    with pytest.raises(InvalidArgument, match="input 1 has column types"):
        derive_schema(pb.union(pb.project(R, 0), R))
    with pytest.raises(InvalidArgument, match=r"decimal\(10,1\)"):
        narrower = pb.project(pb.map(R, pb.cast(2, ScalarType.decimal(10, 1))), 5)
        derive_schema(pb.union(pb.project(R, 2), narrower))
    with pytest.raises(InvalidArgument, match="union has no inputs"):
        derive_schema(pb.union())


def test_negate_threshold_distinct_top_k_keep_the_schema() -> None:
    for wrap in (pb.negate, pb.threshold, pb.distinct):
        assert derive_schema(wrap(R)) == SCHEMA
    assert derive_schema(pb.top_k(R, [1], [pb.sort_key(0, True)], 3, 1)) == SCHEMA
    with pytest.raises(InvalidArgument, match=r"at top_k: order column #9 is out of range"):
        derive_schema(pb.top_k(R, [], [9]))
    with pytest.raises(InvalidArgument, match=r"group key column #9"):
        derive_schema(pb.top_k(R, [9], []))


LEFT = pb.project(R, 0, 4)  # i int64, k int64 not null
RIGHT = pb.project(R, 4, 1)  # k int64 not null, t text


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("inner", ["int64 not null", "int64 not null", "int64 not null", "text"]),
        ("left_outer", ["int64", "int64 not null", "int64", "text"]),
        ("right_outer", ["int64", "int64", "int64 not null", "text"]),
        ("full_outer", ["int64", "int64", "int64", "text"]),
    ],
)
def test_join_nullability_by_kind(kind: pb.JoinKind, expected: list[str]) -> None:
    joined = pb.join(LEFT, RIGHT, [0], [0], kind)
    assert types_of(joined) == expected
    assert names_of(joined) == ["i", "k", "k_2", "t"]


def test_join_keys_are_checked() -> None:
    promoted = pb.join(LEFT, pb.project(R, 2), [0], [0])
    assert types_of(promoted) == ["int64 not null", "int64 not null", "decimal(10,2) not null"]
    with pytest.raises(InvalidArgument, match="at join: key 0 compares int64 with text"):
        derive_schema(pb.join(LEFT, RIGHT, [0], [1]))
    with pytest.raises(InvalidArgument, match="1 left keys but 0 right keys"):
        derive_schema(pb.join(LEFT, RIGHT, [0], []))
    with pytest.raises(InvalidArgument, match="at join: key 0: column #5"):
        derive_schema(pb.join(LEFT, RIGHT, [5], [0]))
    bad_kind = pb.join(LEFT, RIGHT)
    bad_kind.join.kind = 9  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match="unknown join kind 9"):
        derive_schema(bad_kind)


def test_reduce_output_types() -> None:
    reduced = pb.reduce(
        R,
        [1],
        [
            pb.aggregate("count"),
            pb.aggregate("count", 0, distinct=True),
            pb.aggregate("sum", 0),
            pb.aggregate("sum", 2),
            pb.aggregate("sum", 3),
            pb.aggregate("avg", 0),
            pb.aggregate("avg", 2),
            pb.aggregate("avg", 3),
            pb.aggregate("min", 1),
            pb.aggregate("max", 4),
            pb.aggregate("sum", pb.cast(2, ScalarType.decimal(38, 35))),
        ],
    )
    assert types_of(reduced) == [
        "text",
        "int64 not null",
        "int64 not null",
        "decimal(38,0)",
        "decimal(38,2)",
        "float64 not null",
        "float64",
        "decimal(38,8)",
        "float64 not null",
        "text",
        "int64 not null",
        "decimal(38,35)",
    ]
    assert names_of(reduced)[:4] == ["t", "count", "count_2", "sum"]


@pytest.mark.parametrize(
    ("aggregate", "message"),
    [
        (pb.aggregate("sum", 1), "aggregate 0: sum takes a numeric argument, not text"),
        (pb.aggregate("avg", pb.call("eq", 0, 0)), "avg takes a numeric argument, not bool"),
        (pb.aggregate("sum"), "sum needs an argument"),
        (pb.aggregate("count", distinct=True), r"count\(\*\) cannot be distinct"),
        (pb.aggregate("min", 9), "column #9 is out of range"),
        (plan_pb2.Aggregate(func=7), "unknown aggregate function 7"),  # type: ignore[arg-type]
    ],
)
def test_reduce_aggregate_errors(aggregate: plan_pb2.Aggregate, message: str) -> None:
    with pytest.raises(
        InvalidArgument, match=f"at reduce: {message}" if "aggregate 0" in message else message
    ):
        derive_schema(pb.reduce(R, [0], [aggregate]))


def test_reduce_errors() -> None:
    with pytest.raises(InvalidArgument, match="group key column #5 is out of range"):
        derive_schema(pb.reduce(R, [5]))
    with pytest.raises(InvalidArgument, match="at reduce: a relation needs at least one column"):
        derive_schema(pb.reduce(R))


def test_window_output_types() -> None:
    rows = pb.frame("rows", ("preceding", 2), ("following", 1))
    window = pb.window(
        R,
        [1],
        [pb.sort_key(0, descending=True)],
        [
            pb.window_function("row_number"),
            pb.window_function("rank"),
            pb.window_function("dense_rank"),
            pb.window_function("lag", 2, offset=2, default=pb.literal(Decimal("1.00"), DEC102)),
            pb.window_function("lead", 1),
            pb.window_function("first_value", 3, frame=rows),
            pb.window_function("last_value", 0),
            pb.window_function("count", frame=rows),
            pb.window_function("count", 1),
            pb.window_function("sum", 0),
            pb.window_function("sum", 2, frame=rows),
            pb.window_function("avg", 3),
            pb.window_function("min", 3),
            pb.window_function("max", 1),
        ],
    )
    input_types = types_of(R)
    assert types_of(window) == [
        *input_types,
        "int64 not null",
        "int64 not null",
        "int64 not null",
        "decimal(10,2)",
        "text",
        "float64",
        "int64",
        "int64 not null",
        "int64 not null",
        "decimal(38,0)",
        "decimal(38,2)",
        "float64",  # nullable although the argument is not: a frame can be empty
        "float64",
        "text",
    ]
    assert names_of(window)[len(input_types) :][:4] == ["row_number", "rank", "dense_rank", "lag"]


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (pb.window_function("rank", 0), "rank takes no argument"),
        (pb.window_function("first_value"), "first_value needs an argument"),
        (pb.window_function("lag", 0, default=pb.literal("x", T.TEXT)), "lag's default is text"),
        (pb.window_function("lag", 2, default=pb.literal(1, T.INT64)), "lag's default is int64"),
        (pb.window_function("sum", 1), "sum takes a numeric argument, not text"),
        (pb.window_function("count", offset=1), "count takes no offset or default"),
        (pb.window_function("max", 9), "column #9 is out of range"),
        (plan_pb2.WindowFunction(kind=40), "unknown window function kind 40"),  # type: ignore[arg-type]
        (
            pb.window_function("min", 0, frame=pb.frame("range", "current_row", ("following", 1))),
            "RANGE frames with an offset are not supported",
        ),
        (
            pb.window_function(
                "min", 0, frame=pb.frame("rows", "current_row", "unbounded_preceding")
            ),
            "a frame cannot end at UNBOUNDED PRECEDING",
        ),
        (
            pb.window_function(
                "min", 0, frame=pb.frame("rows", ("following", 1), ("preceding", 1))
            ),
            "a frame starting after the current row cannot end before it",
        ),
    ],
)
def test_window_function_errors(function: plan_pb2.WindowFunction, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"at window: function 0: {message}"):
        derive_schema(pb.window(R, [0], [1], [function]))


def test_window_key_columns_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="partition key column #7 is out of range"):
        derive_schema(pb.window(R, [7], [], [pb.window_function("rank")]))
    with pytest.raises(InvalidArgument, match="order column #5 is out of range"):
        derive_schema(pb.window(R, [], [5], [pb.window_function("rank")]))


def test_let_scopes_bindings() -> None:
    shared = pb.let(3, pb.project(R, 1), pb.union(pb.local_get(3), pb.local_get(3)))
    assert types_of(shared) == ["text"]
    # An inner Let shadows; its value sees the outer binding.
    inner = pb.let(3, pb.map(pb.local_get(3), pb.call("length", 0)), pb.local_get(3))
    assert types_of(pb.let(3, pb.project(R, 1), inner)) == ["text", "int64"]
    with pytest.raises(InvalidArgument, match="local_get l3 is not inside a let binding it"):
        derive_schema(pb.local_get(3))
    with pytest.raises(InvalidArgument, match=r"let\(l3\).value > local_get"):
        derive_schema(pb.let(3, pb.local_get(3), R))
    with pytest.raises(InvalidArgument, match="not inside a let"):
        derive_schema(pb.union(pb.let(3, R, pb.local_get(3)), pb.local_get(3)))


def test_errors_name_the_path_to_the_node() -> None:
    deep = pb.reduce(
        pb.join(pb.filter(R, pb.call("frob")), R, [0], [0]), [0], [pb.aggregate("count")]
    )
    with pytest.raises(
        InvalidArgument, match=r"^at reduce > join.left > filter: unknown function 'frob'"
    ):
        derive_schema(deep)
    with pytest.raises(InvalidArgument, match="relation with no kind set"):
        derive_schema(pb.negate(plan_pb2.Relation()))


OUT = RelationSchema([Column("name", T.TEXT, True), Column("n", T.INT64, False)])


def test_check_plan_returns_the_declared_schema_when_it_matches() -> None:
    root = pb.reduce(R, [1], [pb.aggregate("count")])
    assert check_plan(pb.plan(root, OUT)) == OUT
    assert check_plan(pb.plan(root)).names == ["t", "count"]
    # Declaring a NOT NULL column nullable is fine.
    loose = RelationSchema([Column("name", T.TEXT, True), Column("n", T.INT64, True)])
    assert check_plan(pb.plan(root, loose)) == loose


def test_check_plan_rejects_a_mismatched_output_schema() -> None:
    root = pb.reduce(R, [1], [pb.aggregate("count")])
    strict = RelationSchema([Column("name", T.TEXT, False), Column("n", T.INT64, False)])
    with pytest.raises(InvalidArgument, match="'name' is declared NOT NULL but the plan may"):
        check_plan(pb.plan(root, strict))
    wrong = RelationSchema([Column("name", T.TEXT), Column("n", T.FLOAT64)])
    with pytest.raises(
        InvalidArgument, match="'n' is declared float64 but the plan produces int64"
    ):
        check_plan(pb.plan(root, wrong))
    with pytest.raises(InvalidArgument, match="output_schema has 1 columns; the plan produces 2"):
        check_plan(pb.plan(root, RelationSchema.of(("x", T.TEXT))))
    with pytest.raises(InvalidArgument, match="plan has no root"):
        check_plan(plan_pb2.Plan())
    with pytest.raises(InvalidArgument, match="'now' is nondeterministic"):
        check_plan(pb.plan(pb.map(R, pb.call("now"))))


def test_true_columns_see_through_case_and_never_true_branches() -> None:
    col, call = pb.column, pb.call
    true, false = pb.literal(True, ColumnType.BOOL), pb.literal(False, ColumnType.BOOL)
    null = pb.literal(None, ColumnType.BOOL)
    # TRUE only through THEN, whose condition needs #0: #0 is not NULL when TRUE.
    assert true_columns(pb.case(call("is_not_null", col(0)), true, false)) == {0}
    assert true_columns(pb.case(call("is_not_null", col(0)), true, null)) == {0}
    # TRUE through either branch: only what both need.
    either = pb.case(call("is_not_null", col(0)), call("gt", col(1), col(2)), col(1))
    assert true_columns(either) == {1}
    # An ELSE that can be TRUE keeps #0 out.
    assert true_columns(pb.case(call("is_not_null", col(0)), true, true)) == set()
    assert true_columns(call("or", false, call("is_not_null", col(3)))) == {3}
    assert true_columns(call("and", null, col(1))) == set()  # never TRUE: claims nothing
