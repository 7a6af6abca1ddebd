"""Columnar update batches: schemas, conversion, the Arrow algebra against the Python one, and
the IPC/Parquet round trips."""

from __future__ import annotations

import datetime
import decimal
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.columnar import (
    Column,
    ColumnType,
    RelationSchema,
    advance_by,
    concat,
    conform,
    consolidate,
    counts_by_time,
    from_ipc,
    from_parquet,
    project,
    select_times,
    slices,
    table_from_updates,
    time_range,
    to_ipc,
    to_parquet,
    updates_from_table,
    version_from_table,
    with_time,
)
from tidemark.columnar import updates as columnar_updates
from tidemark.columnar.updates import _consolidate_by_grouping
from tidemark.errors import InvalidArgument
from tidemark.frontier import u64_frontier
from tidemark.global_id import validate_global_id
from tidemark.updates import advance_by as py_advance_by
from tidemark.updates import consolidate as py_consolidate
from tidemark.v1 import common_pb2

EVERY_TYPE = RelationSchema(
    [
        Column("flag", ColumnType.BOOL),
        Column("n", ColumnType.INT64, nullable=False),
        Column("x", ColumnType.FLOAT64),
        Column("amount", ColumnType.DECIMAL, precision=12, scale=2),
        Column("name", ColumnType.TEXT),
        Column("blob", ColumnType.BYTES),
        Column("day", ColumnType.DATE),
        Column("at", ColumnType.TIMESTAMP),
        Column("doc", ColumnType.JSON),
    ]
)

SAMPLE_ROW = (
    True,
    7,
    1.5,
    decimal.Decimal("12.34"),
    "hé",
    b"\x00\x01",
    datetime.date(2024, 2, 29),
    datetime.datetime(2024, 2, 29, 12, 30, 1, 123456),
    '{"a": [1, 2]}',
)
NULL_ROW = (None, 8, None, None, None, None, None, None, None)

PAIR = RelationSchema.of(("k", ColumnType.INT64), ("v", ColumnType.TEXT))


# -- schemas ----------------------------------------------------------------------------------


def test_schema_round_trips_through_proto_and_maps_to_arrow() -> None:
    proto = EVERY_TYPE.to_proto()
    assert (
        RelationSchema.from_proto(common_pb2.RelationSchema.FromString(proto.SerializeToString()))
        == EVERY_TYPE
    )
    arrow = EVERY_TYPE.update_schema()
    assert arrow.names == [*EVERY_TYPE.names, "time", "diff"]
    assert arrow.field("amount").type == pa.decimal128(12, 2)
    assert arrow.field("at").type == pa.timestamp("us")
    assert arrow.field("n").nullable is False
    assert arrow.field("time").type == pa.uint64()
    assert arrow.field("diff").type == pa.int64()


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ([], "at least one column"),
        ([Column("a", ColumnType.INT64), Column("a", ColumnType.TEXT)], "appears twice"),
    ],
)
def test_bad_schemas_are_rejected(columns: list[Column], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        RelationSchema(columns)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Column("time", ColumnType.INT64), "reserved"),
        (lambda: Column("diff", ColumnType.INT64), "reserved"),
        (lambda: Column("", ColumnType.INT64), "1 to 255"),
        (lambda: Column("d", ColumnType.DECIMAL, precision=39), "precision"),
        (lambda: Column("d", ColumnType.DECIMAL, precision=5, scale=6), "scale"),
        (lambda: Column("i", ColumnType.INT64, precision=5), "decimal columns only"),
    ],
)
def test_bad_columns_are_rejected(make: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        make()


def test_decimal_precision_zero_means_38_and_untyped_proto_column_is_rejected() -> None:
    assert Column("d", ColumnType.DECIMAL).arrow_type == pa.decimal128(38, 0)
    with pytest.raises(InvalidArgument, match="no type"):
        Column.from_proto(common_pb2.Column(name="x"))


@pytest.mark.parametrize("good", ["u1", "s0", "u12", "s18446744073709551615"])
def test_global_ids_accepted(good: str) -> None:
    assert validate_global_id(good) == good


@pytest.mark.parametrize("bad", ["", "u", "x1", "u01", "U1", "u-1", "u1 ", "s18446744073709551616"])
def test_global_ids_rejected(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="GlobalId"):
        validate_global_id(bad)


# -- conversion -------------------------------------------------------------------------------


def test_every_type_survives_rows_ipc_and_parquet() -> None:
    updates = [(SAMPLE_ROW, 3, 2), (NULL_ROW, 4, -1)]
    table = table_from_updates(EVERY_TYPE, updates)
    assert table.schema == EVERY_TYPE.update_schema()
    assert updates_from_table(table) == updates
    assert from_ipc(to_ipc(table)).equals(table)
    assert from_parquet(to_parquet(table), table.schema).equals(table)
    empty = table.slice(0, 0)
    assert from_ipc(to_ipc(empty)).schema == table.schema


def test_large_batches_are_compressed_and_survive_parquet() -> None:
    table = table_from_updates(PAIR, [((i, "same text" * 4), i % 7, 1) for i in range(5000)])
    data = to_parquet(table)
    assert len(data) < table.nbytes / 2
    assert from_parquet(data, table.schema).equals(table)


DECIMALS = RelationSchema(
    [
        Column("small", ColumnType.DECIMAL, precision=5, scale=2),
        Column("price", ColumnType.DECIMAL, precision=15, scale=2),
        Column("wide", ColumnType.DECIMAL, precision=30, scale=4),
    ]
)


def _decimal_rows(count: int) -> list[tuple[tuple[Any, ...], int, int]]:
    return [
        (
            (
                decimal.Decimal(i % 10_000 - 5_000) / 100,
                None if i % 11 == 0 else decimal.Decimal(i * 7919 - 10**6) / 100,
                decimal.Decimal(10**25 + i) / 10**4,
            ),
            i % 3,
            1 if i % 5 else -2,
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("rows", [10, 5000])
def test_decimals_are_stored_as_integers_and_read_back_as_decimals(rows: int) -> None:
    import pyarrow.parquet as pq

    table = table_from_updates(DECIMALS, _decimal_rows(rows))
    data = to_parquet(table)
    group = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0)
    columns = [group.column(i) for i in range(group.num_columns)]
    physical = {column.path_in_schema: column.physical_type for column in columns}
    # Up to 18 digits as integers, what Spark's reader reads fastest; wider ones as bytes.
    assert physical["small"] == "INT32" and physical["price"] == "INT64"
    assert physical["wide"] == "FIXED_LEN_BYTE_ARRAY"
    assert from_parquet(data, table.schema).equals(table)
    assert from_parquet(data).equals(table)  # the decimal types come back without a schema


def test_a_file_of_another_schema_is_read_as_the_schema_asked_for() -> None:
    """A file whose schema is the one asked for is read as it is; one whose columns differ
    (narrower integers, nullability, an extra column) comes back in the schema asked for,
    as the dataset reader reconciles them."""
    wanted = pa.schema([pa.field("a", pa.int64()), pa.field("time", pa.uint64(), nullable=False)])
    same = pa.table({"a": pa.array([1, None], pa.int64()), "time": pa.array([3, 4], pa.uint64())})
    same = same.cast(wanted)
    assert from_parquet(to_parquet(same), wanted).equals(same)
    other = pa.table(
        {
            "a": pa.array([1, None], pa.int32()),
            "time": pa.array([3, 4], pa.uint64()),
            "extra": pa.array(["x", "y"]),
        }
    )
    got = from_parquet(to_parquet(other), wanted)
    assert got.schema.equals(wanted)
    assert got.column("a").to_pylist() == [1, None]
    assert got.column("time").to_pylist() == [3, 4]


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_a_part_written_with_the_former_layout_reads_back_alike(compression: str) -> None:
    import pyarrow.parquet as pq

    # Parts written before decimals became integers: every decimal as fixed-length bytes.
    table = table_from_updates(DECIMALS, _decimal_rows(5000))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression, row_group_size=1 << 20)
    former = sink.getvalue().to_pybytes()
    metadata = pq.ParquetFile(pa.BufferReader(former)).metadata.row_group(0)
    assert {metadata.column(i).physical_type for i in range(3)} == {"FIXED_LEN_BYTE_ARRAY"}
    assert from_parquet(former, table.schema).equals(table)
    assert from_parquet(former, table.schema).equals(from_parquet(to_parquet(table), table.schema))


def test_not_ipc_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="Arrow IPC"):
        from_ipc(b"definitely not arrow")


def test_conform_reorders_and_widens_losslessly() -> None:
    table = pa.table(
        {
            "diff": pa.array([1], pa.int32()),
            "v": pa.array(["a"]),
            "time": pa.array([5], pa.int64()),
            "k": pa.array([3], pa.int16()),
        }
    )
    conformed = conform(table, PAIR)
    assert conformed.schema == PAIR.update_schema()
    assert updates_from_table(conformed) == [((3, "a"), 5, 1)]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (pa.table({"k": [1], "time": [1], "diff": [1]}), "missing"),
        (pa.table({"k": [1], "v": ["a"], "w": [1], "time": [1], "diff": [1]}), "unexpected"),
        (pa.table({"k": ["x"], "v": ["a"], "time": [1], "diff": [1]}), "does not convert"),
        (pa.table({"k": [1], "v": ["a"], "time": [-1], "diff": [1]}), "does not convert"),
        (pa.table({"k": [1], "v": ["a"], "time": [None], "diff": [1]}), "null"),
        (pa.table({"k": [1], "v": ["a"], "time": [1], "diff": [None]}), "null"),
    ],
)
def test_conform_rejects(table: pa.Table, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        conform(table, PAIR)


def test_conform_rejects_null_in_non_nullable_column() -> None:
    schema = RelationSchema([Column("k", ColumnType.INT64, nullable=False)])
    with pytest.raises(InvalidArgument, match="not nullable"):
        conform(pa.table({"k": [None], "time": [1], "diff": [1]}), schema)


# -- the algebra against tidemark.updates -----------------------------------------------------

rows = st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", None]))
update_lists = st.lists(st.tuples(rows, st.integers(0, 6), st.integers(-2, 2)), max_size=40)


def _py(updates: list[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
    """Python consolidation, in the Arrow order (None sorts last)."""
    consolidated = py_consolidate(updates)
    return sorted(consolidated, key=lambda u: ((u[0][0], u[0][1] is None, u[0][1] or ""), u[1]))


@given(update_lists)
def test_consolidate_matches_python(updates: list[tuple[Any, int, int]]) -> None:
    table = consolidate(table_from_updates(PAIR, updates))
    assert updates_from_table(table) == _py(updates)
    assert table.schema == PAIR.update_schema()


@given(update_lists, st.integers(0, 7))
def test_advance_by_matches_python(updates: list[tuple[Any, int, int]], since: int) -> None:
    table = advance_by(table_from_updates(PAIR, updates), u64_frontier(since))
    expected = py_advance_by(updates, u64_frontier(since))
    assert updates_from_table(table) == _py(expected)


def test_advance_by_empty_frontier_only_consolidates() -> None:
    table = table_from_updates(PAIR, [((1, "a"), 3, 1), ((1, "a"), 3, 1), ((2, "b"), 1, 0)])
    assert updates_from_table(advance_by(table, u64_frontier())) == [((1, "a"), 3, 2)]


def test_select_times_at_the_ends_of_u64_and_across_chunks() -> None:
    top = (1 << 64) - 1
    updates = [((1, "a"), 0, 1), ((2, "b"), 5, 1), ((3, "c"), top, 1)]
    one = table_from_updates(PAIR, updates)
    chunked = pa.concat_tables([one.slice(0, 1), one.slice(1, 2)])
    for table in (one, chunked):
        assert updates_from_table(select_times(table, 1, None)) == updates[1:]
        assert updates_from_table(select_times(table, 0, 1 << 64)) == updates
        assert updates_from_table(select_times(table, None, top)) == updates[:2]
        assert select_times(table, 1 << 64, None).num_rows == 0
        assert select_times(table, 0, None) is table  # nothing to select on
        assert select_times(table, None, 1 << 64) is table
        assert select_times(table, 3, 4).num_rows == 0


@given(update_lists, st.integers(0, 7), st.integers(0, 7))
def test_select_times_and_counts(updates: list[tuple[Any, int, int]], lo: int, hi: int) -> None:
    table = consolidate(table_from_updates(PAIR, updates))
    picked = select_times(table, lo, hi)
    expected = [u for u in _py(updates) if lo <= u[1] < hi]
    assert updates_from_table(picked) == expected
    counts: dict[int, int] = {}
    for _, t, _ in expected:
        counts[t] = counts.get(t, 0) + 1
    assert counts_by_time(picked) == sorted(counts.items())
    assert time_range(picked) == ((min(counts), max(counts)) if counts else None)


def test_project_consolidates_rows_that_became_equal() -> None:
    table = table_from_updates(
        PAIR, [((1, "a"), 2, 1), ((1, "b"), 2, 1), ((2, "a"), 2, 1), ((2, "b"), 2, -1)]
    )
    projected = project(table, ["k"])
    assert projected.column_names == ["k", "time", "diff"]
    assert updates_from_table(projected) == [((1,), 2, 2)]
    assert version_from_table(project(table, ["v"])) == {("a",): 2}


def test_with_time_slices_and_concat() -> None:
    table = table_from_updates(PAIR, [((i, "x"), i, 1) for i in range(5)])
    moved = with_time(table, 9)
    assert set(moved.column("time").to_pylist()) == {9}
    assert moved.schema == table.schema
    pieces = list(slices(table, 2))
    assert [p.num_rows for p in pieces] == [2, 2, 1]
    by_size = list(slices(table, 100, max_bytes=table.nbytes // 5 * 2))
    assert [p.num_rows for p in by_size] == [2, 2, 1]
    assert concat(pieces, table.schema).equals(table)
    assert concat([], table.schema).num_rows == 0
    with pytest.raises(InvalidArgument):
        list(slices(table, 0))


FLOATS = RelationSchema.of(("x", ColumnType.FLOAT64), ("s", ColumnType.TEXT))
awkward_rows = st.tuples(
    st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf"), None]),
    st.sampled_from(["a", "b", None]),
)


@given(st.lists(st.tuples(awkward_rows, st.integers(0, 3), st.integers(-1, 2)), min_size=2))
def test_consolidate_by_sorting_agrees_with_grouping(updates: list[tuple[Any, int, int]]) -> None:
    # Sorting is the shortcut taken when no (data, time) repeats; grouping decides otherwise.
    table = table_from_updates(FLOATS, updates)
    assert _exactly(consolidate(table)) == _exactly(_consolidate_by_grouping(table))


def _exactly(table: pa.Table) -> tuple[pa.Schema, list[list[str]]]:
    """The schema and every value, told apart as Arrow would store them (NaN equal to NaN,
    -0.0 unequal to 0.0)."""
    return table.schema, [[repr(v) for v in column.to_pylist()] for column in table.columns]


def test_sorted_batches_are_consolidated_by_summing_runs_not_by_grouping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unique = [((float(i % 3), f"r{i}"), i % 2, 1 - i % 2) for i in range(10)]
    unique.append(((None, None), 1, 1))
    nan = float("nan")
    repeating = [
        *unique,
        ((None, None), 1, 2),
        ((nan, "n"), 0, 1),
        ((nan, "n"), 0, 1),
        ((2.0, "r2"), 0, -1),  # cancels r2 at time 0 in ``unique``
    ]
    expected = {
        "unique": _consolidate_by_grouping(table_from_updates(FLOATS, unique)),
        "repeating": _consolidate_by_grouping(table_from_updates(FLOATS, repeating)),
    }

    def refuse(table: pa.Table) -> pa.Table:
        raise AssertionError("grouped although sorting consolidates this")

    monkeypatch.setattr(columnar_updates, "_consolidate_by_grouping", refuse)
    monkeypatch.setattr(columnar_updates, "_PYTHON_CONSOLIDATE_ROWS", 0)  # the columnar way
    without_repeats = consolidate(table_from_updates(FLOATS, unique))
    assert _exactly(without_repeats) == _exactly(expected["unique"])
    assert without_repeats.num_rows == 6  # the zero diffs are gone
    summed = consolidate(table_from_updates(FLOATS, repeating))
    assert _exactly(summed) == _exactly(expected["repeating"])
    assert updates_from_table(summed)[-1] == ((None, None), 1, 3)
    assert ((2.0, "r2"), 0, 1) not in updates_from_table(summed)
    # -0.0 next to 0.0: sorting cannot keep them apart, so grouping decides.
    with pytest.raises(AssertionError, match="grouped"):
        consolidate(table_from_updates(FLOATS, [((0.0, "z"), 0, 1), ((-0.0, "z"), 0, 1)]))


def test_nan_and_null_group_together() -> None:
    schema = RelationSchema.of(("x", ColumnType.FLOAT64))
    nan = float("nan")
    table = table_from_updates(
        schema, [((nan,), 1, 1), ((nan,), 1, 1), ((None,), 1, 1), ((None,), 1, 2)]
    )
    out = updates_from_table(consolidate(table))
    assert len(out) == 2
    assert out[1] == ((None,), 1, 3)
    assert out[0][2] == 2


# -- small batches are consolidated in Python -------------------------------------------------

every_type_rows = st.tuples(
    st.sampled_from([True, False, None]),
    st.integers(-2, 2),
    st.sampled_from([0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), None]),
    st.sampled_from([decimal.Decimal("-1.50"), decimal.Decimal("2.00"), None]),
    st.sampled_from(["", "a", "é", "z", "a\x00", None]),
    st.sampled_from([b"", b"\x00", b"\xff", b"a", None]),
    st.sampled_from([datetime.date(1970, 1, 1), datetime.date(1969, 12, 31), None]),
    st.sampled_from(
        [datetime.datetime(2024, 1, 1), datetime.datetime(1960, 5, 5, 0, 0, 0, 1), None]
    ),
    st.sampled_from(['{"a": 1}', "[]", None]),
)


def _columnar(table: pa.Table) -> pa.Table:
    with mock.patch.object(columnar_updates, "_PYTHON_CONSOLIDATE_ROWS", 0):
        return consolidate(table)


@given(st.lists(st.tuples(every_type_rows, st.integers(0, 3), st.integers(-2, 2)), max_size=40))
def test_consolidating_in_python_agrees_with_the_columnar_way(
    updates: list[tuple[Any, int, int]],
) -> None:
    table = table_from_updates(EVERY_TYPE, updates)
    in_python = columnar_updates._consolidate_in_python(table) if updates else None
    if in_python is None:  # -0.0 somewhere: left to the columnar way
        assert not updates or any(
            x == 0.0 and str(x).startswith("-") for (_, _, x, *_), _, _ in updates
        )
        return
    assert _exactly(in_python) == _exactly(_columnar(table))
    assert _exactly(consolidate(table)) == _exactly(in_python)


@given(st.lists(st.tuples(awkward_rows, st.integers(0, 3), st.integers(-1, 2)), min_size=1))
def test_consolidating_in_python_agrees_on_awkward_floats(
    updates: list[tuple[Any, int, int]],
) -> None:
    table = table_from_updates(FLOATS, updates)
    assert _exactly(consolidate(table)) == _exactly(_columnar(table))


def test_small_batches_take_the_python_way_and_consolidated_ones_come_back_as_they_are() -> None:
    fresh = [((i, f"n{i}"), 5, 1) for i in range(10)]
    consolidated = table_from_updates(PAIR, fresh)
    assert columnar_updates._consolidate_in_python(consolidated) is consolidated
    assert consolidate(consolidated) is consolidated
    shuffled = table_from_updates(PAIR, [*reversed(fresh), ((3, "n3"), 5, -1), ((0, None), 1, 0)])
    out = columnar_updates._consolidate_in_python(shuffled)
    assert out is not None
    assert updates_from_table(out) == [u for u in fresh if u[0][0] != 3]
    assert out.schema == PAIR.update_schema()
    # time and diff come back last, as the columnar way puts them.
    reordered = shuffled.select(["time", "diff", "v", "k"])
    again = columnar_updates._consolidate_in_python(reordered)
    assert again is not None and again.column_names == ["v", "k", "time", "diff"]
    assert _exactly(again) == _exactly(_columnar(reordered))
    # Where Python could not tell what Arrow would do, it declines.
    negative_zero = table_from_updates(FLOATS, [((-0.0, "z"), 0, 1)])
    assert columnar_updates._consolidate_in_python(negative_zero) is None
    overflowing = table_from_updates(PAIR, [((1, "a"), 0, 2**62), ((1, "a"), 0, 2**62)])
    assert columnar_updates._consolidate_in_python(overflowing) is None
    assert len(consolidate(overflowing)) == 1  # the columnar way, as before
