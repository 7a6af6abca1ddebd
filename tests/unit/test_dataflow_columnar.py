"""Columnar arrangements: an arrangement loaded from an Arrow table holds, reads and changes
exactly what one loaded row by row into dicts holds, with the engine's key rules (NULLs,
every NaN one value, -0.0 == 0.0, decimals equal but for trailing zeros), also past a
memory budget that moves its batches to disk."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow.columnar import (
    RADIX_KEYS,
    ColumnarBatch,
    build_keyed,
    float_columns_of,
    key_hash,
    key_hashes,
    python_rows,
    stable_order,
    table_hashes,
)
from services.compute.dataflow.guard import row_bytes
from services.compute.dataflow.operators import arrangement as arrangement_module
from services.compute.dataflow.operators.arrangement import Arrangement
from services.compute.dataflow.operators.join import JoinOperator
from services.compute.dataflow.operators.linear import Normalize
from services.compute.dataflow.ordering import NAN
from services.compute.dataflow.spill import StateBudget
from tidemark.errors import ResourceExhausted

# Per key type: the Arrow type of the key column and values that are equal but differ in
# form (a NaN that is not the engine's NaN object, -0.0, 1.5 and 1.50), with NULLs.
KEY_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int": (pa.int64(), st.one_of(st.integers(-3, 3), st.none())),
    "float": (
        pa.float64(),
        st.sampled_from([0.0, -0.0, 1.5, float("nan"), NAN, -2.25, None]),
    ),
    "decimal": (
        pa.decimal128(10, 2),
        st.sampled_from([Decimal("1.5"), Decimal("1.50"), Decimal("-0"), Decimal("2"), None]),
    ),
    "string": (pa.string(), st.sampled_from(["a", "b", "", "é", None])),
}
ROW_WIDTH = 3  # (key, a second key part, a payload)


def engine_row(row: tuple[Any, ...], float_key: bool) -> tuple[Any, ...]:
    """The row as the engine holds it once normalised on the way in."""
    return Normalize([0] if float_key else []).row(row)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(KEY_TYPES)))
    arrow_type, values = KEY_TYPES[kind]
    rows = st.tuples(values, st.integers(0, 1), st.integers(0, 2))
    loaded = draw(st.lists(st.tuples(rows, st.integers(-2, 2)), max_size=40))
    operations = draw(
        st.lists(
            st.tuples(
                st.tuples(values, st.integers(0, 1)),
                st.lists(st.tuples(rows, st.integers(-2, 2)), max_size=3),
                st.booleans(),
            ),
            max_size=30,
        )
    )
    return {
        "kind": kind,
        "arrow_type": arrow_type,
        "loaded": loaded,
        "operations": operations,
        "two_columns": draw(st.booleans()),
        "computed_key": draw(st.booleans()),
        "drop_null_keys": draw(st.booleans()),
        "budget_rows": draw(st.one_of(st.none(), st.integers(1, 8))),
        # Keys with more rows than this in a batch collect their changes beside it.
        "materialise_rows": draw(st.sampled_from([0, 1, 3, 64])),
        # Operations applied a run at a time: the run's reads first, then its changes.
        "run": draw(st.sampled_from([1, 3, 8])),
        # The loaded rows in two batches (by key), whose keys a read takes from either.
        "two_batches": draw(st.booleans()),
    }


def held_row_hashes(batch: ColumnarBatch) -> np.ndarray:
    """The hash over all columns of each row a batch holds, in its order."""
    (hashes,) = table_hashes(batch.table, [range(batch.table.num_columns)])
    return hashes


def staged_table(loaded: list[Any], arrow_type: pa.DataType) -> tuple[pa.Table, np.ndarray]:
    rows = [row for row, _ in loaded]
    columns = [
        pa.array([row[0] for row in rows], type=arrow_type),
        pa.array([row[1] for row in rows], type=pa.int64()),
        pa.array([row[2] for row in rows], type=pa.int64()),
    ]
    table = pa.Table.from_arrays(columns, names=["k", "k2", "v"])
    return table, np.array([diff for _, diff in loaded], dtype=np.int64)


def assert_counts(columnar: Arrangement, reference: Arrangement) -> None:
    """``columnar``'s counts are ``reference``'s distinct ones, but for each key changed
    beside a batch: its batch rows and its changed rows, and the key even when they cancel."""
    extra_rows = extra_keys = 0
    for key, changes in columnar._pending.items():
        in_batches = sum(batch.live_in(lo, hi) for batch, lo, hi in columnar._ranges(key))
        distinct = reference.rows.get(key, {})
        extra_rows += in_batches + len(changes) - len(distinct)
        extra_keys += not distinct
    assert columnar.row_count == reference.row_count + extra_rows
    assert len(columnar) == len(reference) + extra_keys


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_a_columnar_arrangement_holds_what_a_dict_one_holds(scenario: dict[str, Any]) -> None:
    float_key = scenario["kind"] == "float"
    key_columns = (0, 1) if scenario["two_columns"] else (0,)

    def key_of(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(row[c] for c in key_columns)

    drop = scenario["drop_null_keys"]
    loaded = scenario["loaded"]
    parts = [loaded]
    if scenario["two_batches"]:
        # Split by key (each key's rows in one batch, as ``add_batch`` requires).
        def odd(row: tuple[Any, ...]) -> bool:
            return bool(key_hash(key_of(engine_row(row, float_key))) % 2)

        parts = [[item for item in loaded if odd(item[0]) is side] for side in (True, False)]
    batches = []
    for part in parts:
        table, diffs = staged_table(part, scenario["arrow_type"])
        built = build_keyed(
            table, diffs, key_of, None if scenario["computed_key"] else key_columns, drop
        )
        if built is not None:
            batches.append(built)

    reference = Arrangement(ROW_WIDTH)
    for row, diff in scenario["loaded"]:
        row = engine_row(row, float_key)
        if not (drop and None in key_of(row)):
            reference.apply(key_of(row), [(row, diff)])

    budget = None
    columnar = Arrangement(ROW_WIDTH)
    threshold = arrangement_module.MATERIALISE_ROWS
    arrangement_module.MATERIALISE_ROWS = scenario["materialise_rows"]
    if scenario["budget_rows"] is not None:
        budget = StateBudget(scenario["budget_rows"] * row_bytes(ROW_WIDTH))
        columnar.attach(budget)
    try:
        for batch in batches:
            columnar.add_batch(batch)
        assert columnar.row_count == reference.row_count
        assert len(columnar) == len(reference)
        assert dict(columnar.items()) == dict(reference.items())
        operations = scenario["operations"]
        run = scenario["run"]
        for first in range(0, len(operations), run):
            reads: list[tuple[Any, ...]] = []
            changes_by_key: dict[tuple[Any, ...], list[Any]] = {}
            for (key_value, second), changes, read_first in operations[first : first + run]:
                key = (engine_row((key_value,), float_key)[0], second)[: len(key_columns)]
                if read_first:  # reading moves the key out of the batch; changing may not
                    reads.append(key)
                # The changes' rows carry the key (their other columns are drawn).
                changes_by_key.setdefault(key, []).extend(
                    (engine_row((key_value, *key[1:], *row[len(key) :]), float_key), diff)
                    for row, diff in changes
                )
            for key in reads:
                assert columnar.get(key) == reference.get(key)
            for key, changes in changes_by_key.items():
                columnar.apply(key, changes)
                reference.apply(key, changes)
            assert_counts(columnar, reference)
            if budget is not None:
                assert budget.held_bytes == columnar.held_in_memory()
                assert columnar.spilled_rows <= columnar.row_count
        assert dict(columnar.items()) == dict(reference.items())
        for key, rows in reference.items():
            assert columnar.get(key) == rows
        # Once every key changed beside a batch has been read, the counts are distinct ones.
        for key in list(columnar._pending):
            assert columnar.get(key) is None  # every key holding rows was read above
        assert not columnar._pending
        assert columnar.row_count == reference.row_count
        assert len(columnar) == len(reference)
        if budget is not None:
            assert budget.held_bytes == columnar.held_in_memory()
            assert columnar.spilled_rows <= columnar.row_count
    finally:
        arrangement_module.MATERIALISE_ROWS = threshold
        columnar.release()
        if budget is not None:
            budget.close()


@pytest.mark.parametrize(
    ("column", "key"),
    [
        (pa.array([-0.0], type=pa.float64()), (0.0,)),
        (pa.array([0.0], type=pa.float64()), (-0.0,)),
        (pa.array([float("nan")], type=pa.float64()), (NAN,)),
        (pa.array([None], type=pa.int64()), (None,)),
        (pa.array([Decimal("1.50")], type=pa.decimal128(6, 2)), (Decimal("1.5"),)),
        (pa.array([Decimal("1.5")], type=pa.decimal128(6, 1)), (Decimal("1.50"),)),
        (pa.array([-7], type=pa.int64()), (-7,)),
        (pa.array([True], type=pa.bool_()), (True,)),
        (pa.array(["text"], type=pa.string()), ("text",)),
    ],
)
def test_a_column_and_a_python_key_hash_alike(column: pa.Array, key: tuple[Any, ...]) -> None:
    assert int(key_hashes([column], 1)[0]) == key_hash(key)


def test_keys_sharing_a_hash_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key hashing to one value still reads back only its own rows."""
    from services.compute.dataflow import columnar

    monkeypatch.setattr(columnar, "value_hash", lambda value: 1)
    table = pa.table({"k": ["a", "b", "a", "c"], "v": [1, 2, 3, 4]})
    batch = build_keyed(table, np.ones(4, dtype=np.int64), lambda row: (row[0],), None, True)
    assert batch is not None
    arrangement = Arrangement(2)
    arrangement.add_batch(batch)
    assert len(arrangement) == 1  # counted by distinct hash
    assert arrangement.get(("a",)) == {("a", 1): 1, ("a", 3): 1}
    assert arrangement.get(("c",)) == {("c", 4): 1}
    assert arrangement.get(("d",)) is None
    assert arrangement.get(("b",)) == {("b", 2): 1}
    assert arrangement.row_count == 4


def test_rows_sharing_a_hash_are_told_apart_when_changed_beside_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Changes collected beside a batch whose rows all hash alike meet each row's own
    multiplicity when the key is read, and the counts, which count what is held until
    then, become distinct ones."""
    from services.compute.dataflow import columnar

    monkeypatch.setattr(columnar, "value_hash", lambda value: 1)
    monkeypatch.setattr(arrangement_module, "MATERIALISE_ROWS", 0)
    table = pa.table({"k": ["b", "a", "a", "b", "a"], "v": ["x", "y", "z", "x", "w"]})
    diffs = np.array([1, 2, 1, 1, 3], dtype=np.int64)
    batch = build_keyed(table, diffs, lambda row: (row[0],), None, True)
    assert batch is not None
    arrangement = Arrangement(2)
    arrangement.add_batch(batch)
    assert arrangement.get(("b",)) == {("b", "x"): 2}  # its rows are dead in the batch now
    arrangement.apply(("a",), [(("a", "z"), -1), (("a", "q"), 1), (("a", "y"), 1)])
    assert arrangement.row_count == 1 + 3 + 3  # b's row, a's batch rows, a's changed rows
    assert arrangement.get(("a",)) == {("a", "y"): 3, ("a", "q"): 1, ("a", "w"): 3}
    assert arrangement.row_count == 4
    assert len(arrangement) == 2


def test_changes_that_empty_a_key_beside_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose changes beside the batch cancel all its rows is held (and counted) until
    read; the read finds it empty and the counts drop it. A row the batch's types cannot
    hold (a value past int64) is kept beside it the same way."""
    monkeypatch.setattr(arrangement_module, "MATERIALISE_ROWS", 0)
    table = pa.table({"k": ["a", "a", "b"], "v": [1, 2, 3]})
    batch = build_keyed(table, np.array([1, 2, 1], dtype=np.int64), lambda r: (r[0],), (0,), True)
    assert batch is not None
    arrangement = Arrangement(2)
    arrangement.add_batch(batch)
    huge = ("a", 1 << 70)
    arrangement.apply(("a",), [(huge, 1), (("a", 2), -2)])
    arrangement.apply(("b",), [(("b", 3), -1)])
    assert (arrangement.row_count, len(arrangement)) == (3 + 3, 2)
    assert ("b",) not in arrangement
    assert (arrangement.row_count, len(arrangement)) == (4, 1)  # b: its row and its change
    assert arrangement.get(("a",)) == {("a", 1): 1, huge: 1}
    assert (arrangement.row_count, len(arrangement)) == (2, 1)


def test_loading_sums_equal_rows_and_drops_what_cancels() -> None:
    table = pa.table({"k": [1, 1, 1, 2, 2], "v": [5.0, 5.0, -0.0, 0.0, 7.0]})
    diffs = np.array([1, 2, 1, 1, -1], dtype=np.int64)
    batch = build_keyed(table, diffs, lambda row: (row[0],), (0,), True)
    assert batch is not None
    arrangement = Arrangement(2)
    arrangement.add_batch(batch)
    assert arrangement.row_count == 4
    assert arrangement.get((1,)) == {(1, 5.0): 3, (1, 0.0): 1}
    cancelled = build_keyed(
        table.slice(3, 1), np.array([0], dtype=np.int64), lambda r: (r[0],), (0,), True
    )
    assert cancelled is None


def test_batches_move_to_disk_past_the_budget_and_read_back(tmp_path: Any) -> None:
    count = 5_000
    table = pa.table({"k": np.arange(count) % 100, "v": np.arange(count, dtype=np.float64)})
    batch = build_keyed(table, np.ones(count, dtype=np.int64), lambda r: (r[0],), (0,), True)
    assert batch is not None
    budget = StateBudget(row_bytes(2) * 10, directory=str(tmp_path))
    arrangement = Arrangement(2)
    arrangement.attach(budget)
    try:
        arrangement.add_batch(batch)
        assert batch.on_disk and list(tmp_path.iterdir())
        assert budget.bytes_on_disk == batch.file_bytes > 0
        assert arrangement.spilled_rows == count
        assert arrangement.get((7,)) == {(7, float(v)): 1 for v in range(7, count, 100)}
        assert arrangement.row_count == count
        assert budget.held_bytes == arrangement.held_in_memory()
    finally:
        arrangement.release()
        budget.close()
    assert budget.columnar_disk_bytes == 0
    assert not list(tmp_path.iterdir())


def test_a_batch_past_the_disk_limit_is_refused(tmp_path: Any) -> None:
    count = 5_000
    table = pa.table({"k": np.arange(count), "v": np.arange(count)})
    batch = build_keyed(table, np.ones(count, dtype=np.int64), lambda r: (r[0],), (0,), True)
    assert batch is not None
    budget = StateBudget(row_bytes(2), disk_limit_bytes=1_000, directory=str(tmp_path))
    arrangement = Arrangement(2)
    arrangement.attach(budget)
    try:
        with pytest.raises(ResourceExhausted):
            arrangement.add_batch(batch)
    finally:
        arrangement.release()
        budget.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    left=st.lists(
        st.tuples(
            st.tuples(st.sampled_from([1.5, -0.0, 0.0, NAN, None]), st.integers(0, 2)),
            st.integers(-1, 2),
        ),
        max_size=15,
    ),
    right=st.lists(
        st.tuples(
            st.tuples(st.sampled_from([1.5, 0.0, float("nan"), None]), st.text(max_size=1)),
            st.integers(-1, 2),
        ),
        max_size=15,
    ),
    step_left=st.lists(
        st.tuples(
            st.tuples(st.sampled_from([1.5, 0.0, NAN, None]), st.integers(0, 2)), st.integers(-1, 1)
        ),
        max_size=6,
    ),
    step_right=st.lists(
        st.tuples(
            st.tuples(st.sampled_from([1.5, 0.0, NAN, None]), st.text(max_size=1)),
            st.integers(-1, 1),
        ),
        max_size=6,
    ),
    keep=st.tuples(st.booleans(), st.booleans()),
    computed=st.booleans(),
    # 0: every changed key keeps its rows in the batch, its changes beside it.
    materialise_rows=st.sampled_from([0, 64]),
    times=st.lists(st.sampled_from([6, 7]), min_size=12, max_size=12),
)
def test_a_join_loaded_from_tables_steps_like_one_loaded_from_rows(
    left: list[Any],
    right: list[Any],
    step_left: list[Any],
    step_right: list[Any],
    keep: tuple[bool, bool],
    computed: bool,
    materialise_rows: int,
    times: list[int],
) -> None:
    def key(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return (row[0],)

    columns = (None, None) if computed else ((0,), (0,))
    spec = JoinOperator(key, key, 2, 2, keep[0], keep[1], key_columns=columns)
    from_rows, from_tables = spec.new_state(), spec.new_state()
    normalize = Normalize([0])
    from_rows.load(
        [[(normalize.row(row), 5, diff) for row, diff in side] for side in (left, right)]
    )
    tables = [
        pa.table(
            {
                "k": pa.array([row[0] for row, _ in side], type=pa.float64()),
                "v": pa.array([row[1] for row, _ in side], type=t),
                "diff": pa.array([diff for _, diff in side], type=pa.int64()),
            }
        )
        for side, t in ((left, pa.int64()), (right, pa.string()))
    ]
    from_tables.load_columnar(tables, 5)
    assert from_tables.row_count() == from_rows.row_count()
    # Each update at one of two times: a key's changes at the first are beside the batch
    # (or moved it out) when the second's are looked up.
    step = [
        [(normalize.row(row), times[i + 6 * s], diff) for i, (row, diff) in enumerate(side)]
        for s, side in enumerate((step_left, step_right))
    ]
    threshold = arrangement_module.MATERIALISE_ROWS
    arrangement_module.MATERIALISE_ROWS = materialise_rows
    try:
        expected = from_rows.process(step)
        actual = from_tables.process(step)
    finally:
        arrangement_module.MATERIALISE_ROWS = threshold
    assert _summed(actual) == _summed(expected)
    # A key changed beside its batch counts what it holds there until it is read: its batch
    # rows and its changed rows. Reading those keys makes the counts distinct ones.
    assert from_tables.row_count() >= from_rows.row_count()
    assert from_tables.key_count() >= from_rows.key_count()
    for arrangement in (from_tables.left, from_tables.right):
        for changed in list(arrangement._pending):
            arrangement.get(changed)
    assert from_tables.row_count() == from_rows.row_count()
    assert from_tables.key_count() == from_rows.key_count()


def _summed(updates: list[Any]) -> dict[Any, int]:
    totals: dict[Any, int] = {}
    for row, time, diff in updates:
        totals[(row, time)] = totals.get((row, time), 0) + diff
    return {update: diff for update, diff in totals.items() if diff}


def test_nan_rows_read_from_a_batch_are_the_engine_nan() -> None:
    table = pa.table({"k": [float("nan")], "v": [float("nan")]})
    batch = build_keyed(table, np.ones(1, dtype=np.int64), lambda r: (r[0],), (0,), True)
    assert batch is not None
    arrangement = Arrangement(2)
    arrangement.add_batch(batch)
    rows = arrangement.get((NAN,))
    assert rows is not None
    ((row, count),) = rows.items()
    assert row[0] is NAN and row[1] is NAN and count == 1
    assert math.isnan(row[1])


@pytest.mark.parametrize("distinct", [1, 7, 1_000, RADIX_KEYS, RADIX_KEYS + 1])
@pytest.mark.parametrize("rows", [10, RADIX_KEYS + 5, 3 * RADIX_KEYS])
def test_stable_order_is_a_stable_argsort(distinct: int, rows: int) -> None:
    """The ranks sorted by radix put equal values in their first order, as a stable sort of
    the 64-bit values does, whatever the number of distinct values (past 2^16 the values
    are sorted as they are)."""
    rng = np.random.default_rng(distinct * 31 + rows)
    # Values spread over the whole 64-bit range, the top bit too (key hashes are uint64).
    values = rng.integers(0, 2**64 - 1, distinct, dtype=np.uint64, endpoint=True)
    drawn = values[rng.integers(0, distinct, rows)]
    drawn[: min(rows, distinct)] = values[: min(rows, distinct)]
    expected = np.argsort(drawn, kind="stable")
    assert np.array_equal(stable_order(drawn), expected)


# -- the build against a row-by-row model --------------------------------------------------------

# Values per column kind: equal values in other forms (NaN, -0.0, 1.5 and 1.50) and NULLs.
_BUILD_COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "int": (pa.int64(), st.one_of(st.none(), st.integers(-2, 2), st.just(2**63 - 1))),
    "int32": (pa.int32(), st.one_of(st.none(), st.integers(-2, 2))),
    "float": (pa.float64(), st.sampled_from([None, 0.0, -0.0, float("nan"), NAN, 1.5])),
    "bool": (pa.bool_(), st.one_of(st.none(), st.booleans())),
    "string": (pa.string(), st.sampled_from([None, "", "a", "é"])),
    "decimal": (pa.decimal128(6, 2), st.sampled_from([None, Decimal("1.5"), Decimal("1.50")])),
}


@st.composite
def build_inputs(draw: st.DrawFn) -> dict[str, Any]:
    kinds = draw(st.lists(st.sampled_from(sorted(_BUILD_COLUMNS)), min_size=1, max_size=4))
    rows = draw(st.integers(0, 40))
    columns = [
        draw(st.lists(_BUILD_COLUMNS[kind][1], min_size=rows, max_size=rows)) for kind in kinds
    ]
    width = len(kinds)
    key_columns = draw(st.lists(st.integers(0, width - 1), min_size=1, max_size=width, unique=True))
    return {
        "kinds": kinds,
        "columns": columns,
        "diffs": draw(st.lists(st.integers(-2, 2), min_size=rows, max_size=rows)),
        "key_columns": tuple(key_columns),
        "computed_key": draw(st.booleans()),
        "drop_null_keys": draw(st.booleans()),
        # Chunks of a row or a few: hashing crosses chunk boundaries in small tables too.
        "hash_chunk": draw(st.sampled_from([1, 3, 32_768])),
        # Where the table is cut into two chunks (a table gathered from parts).
        "cut": draw(st.one_of(st.none(), st.integers(0, rows))),
        # 64: no room for packed ranks, the rows are ordered by the two sorts instead.
        "prefix_bits": draw(st.sampled_from([16, 64])),
    }


def _model(
    table: pa.Table, diffs: list[int], key_columns: tuple[int, ...], drop: bool
) -> dict[tuple[int, int], dict[tuple[Any, ...], int]]:
    """The batch as a row-by-row build defines it: equal rows (the engine's values) summed,
    zero sums and (``drop``) NULL keys left out, grouped by (key hash, row hash) computed per
    row in Python."""
    totals: dict[tuple[Any, ...], int] = {}
    for row, diff in zip(python_rows(table, float_columns_of(table.schema)), diffs, strict=True):
        if drop and None in tuple(row[c] for c in key_columns):
            continue
        totals[row] = totals.get(row, 0) + diff
    grouped: dict[tuple[int, int], dict[tuple[Any, ...], int]] = {}
    for row, total in totals.items():
        if total:
            key = tuple(row[c] for c in key_columns)
            grouped.setdefault((key_hash(key), key_hash(row)), {})[row] = total
    return grouped


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=build_inputs())
def test_a_built_batch_is_the_row_by_row_model(inputs: dict[str, Any]) -> None:
    """Hashes, order, consolidation and lookups of a batch are those of the model: sorted by
    key hash then row hash, each distinct row once with its summed multiplicity."""
    from services.compute.dataflow import columnar

    arrays = [
        pa.array(values, type=_BUILD_COLUMNS[kind][0])
        for kind, values in zip(inputs["kinds"], inputs["columns"], strict=True)
    ]
    table = pa.Table.from_arrays(arrays, names=[f"c{i}" for i in range(len(arrays))])
    if inputs["cut"] is not None:
        cut = inputs["cut"]
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    key_columns = inputs["key_columns"]

    def key_of(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(row[c] for c in key_columns)

    diffs = np.array(inputs["diffs"], dtype=np.int64)
    drop = inputs["drop_null_keys"]
    with (
        mock.patch.object(columnar, "_HASH_CHUNK", inputs["hash_chunk"]),
        mock.patch.object(columnar, "_PREFIX_BITS", inputs["prefix_bits"]),
    ):
        batch = build_keyed(
            table, diffs, key_of, None if inputs["computed_key"] else key_columns, drop
        )
    expected = _model(table, inputs["diffs"], key_columns, drop)
    if not expected:
        assert batch is None
        return
    assert batch is not None
    pairs = sorted((pair for pair, rows in expected.items() for _ in rows))
    assert batch.hashes.tolist() == [key for key, _ in pairs]
    row_hashes = held_row_hashes(batch)
    assert row_hashes.tolist() == [row for _, row in pairs]
    assert batch.live_rows == len(pairs)
    assert batch.keys == len({key for key, _ in pairs})
    held: dict[tuple[int, int], dict[tuple[Any, ...], int]] = {}
    rows = python_rows(batch.table, float_columns_of(batch.table.schema))
    for position, row in enumerate(rows):
        pair = (int(batch.hashes[position]), int(row_hashes[position]))
        held.setdefault(pair, {})[row] = int(batch.diffs[position])
    assert held == expected
    for (hashed, _), group in expected.items():
        lo, hi = batch.key_range(hashed)
        assert batch.hashes[lo:hi].tolist() == [hashed] * (hi - lo) and hi > lo
        found = batch._find(key_of(next(iter(group))), hashed)
        assert found is not None
        assert found[1] == {
            row: total
            for (other, _), rows_of in expected.items()
            if other == hashed
            for row, total in rows_of.items()
            if key_of(row) == key_of(next(iter(group)))
        }


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 400),
    keys=st.integers(1, 50),
    shape=st.sampled_from(["random", "shared_high_bits", "duplicates", "top_bit"]),
    prefix_bits=st.sampled_from([16, 64]),
    chunk=st.sampled_from([1, 7, 32_768]),
    seed=st.integers(0, 2**32 - 1),
)
def test_arranged_order_sorts_by_key_hash_then_row_hash(
    rows: int, keys: int, shape: str, prefix_bits: int, chunk: int, seed: int
) -> None:
    """Whatever the row hashes (agreeing in their leading bits, where the packed sort keeps
    only those and must sort ties again; repeated; the top bit set), the order is that of a
    lexicographic sort."""
    from services.compute.dataflow import columnar

    rng = np.random.default_rng(seed)
    distinct = rng.integers(0, 2**64 - 1, keys, dtype=np.uint64, endpoint=True)
    hashes = distinct[rng.integers(0, keys, rows)]
    row_hashes = rng.integers(0, 2**64 - 1, rows, dtype=np.uint64, endpoint=True)
    if shape == "shared_high_bits":  # equal but for the low 12 bits: past the bits packed
        row_hashes = np.uint64(0xABCD_EF01_2345_6000) | (row_hashes & np.uint64(0xFFF))
    elif shape == "duplicates":
        row_hashes = row_hashes[rng.integers(0, max(1, rows // 4), rows)]
    elif shape == "top_bit":
        row_hashes |= np.uint64(1 << 63)
    with (
        mock.patch.object(columnar, "_PREFIX_BITS", prefix_bits),
        mock.patch.object(columnar, "_HASH_CHUNK", chunk),
    ):
        order, sorted_keys, sorted_rows = columnar.arranged_order(hashes, row_hashes)
    assert sorted(order.tolist()) == list(range(rows))
    assert np.array_equal(hashes[order], sorted_keys)
    assert np.array_equal(row_hashes[order], sorted_rows)
    expected = np.lexsort((row_hashes, hashes))
    assert np.array_equal(sorted_keys, hashes[expected])
    assert np.array_equal(sorted_rows, row_hashes[expected])


def test_a_large_build_is_the_row_by_row_model() -> None:
    """Past one hashing chunk, in two large chunks as parts read by a task (hashed where
    they lie), with 1,000 keys, repeated rows and rows that cancel."""
    count = 100_000
    rng = np.random.default_rng(5)
    cust = rng.integers(0, 1_000, count)
    amount = rng.integers(0, 2, count)
    o_id = rng.integers(0, 40, count)  # 80,000 distinct rows: many repeat
    whole = pa.table({"o_id": o_id, "cust": cust, "amount": amount})
    table = pa.concat_tables([whole.slice(0, 40_000), whole.slice(40_000)])
    assert table.column(0).num_chunks == 2
    diffs = rng.choice(np.array([-1, 1, 1, 2], dtype=np.int64), count)
    batch = build_keyed(table, diffs, lambda row: (row[1],), (1,), True)
    assert batch is not None
    expected = _model(table, diffs.tolist(), (1,), True)
    pairs = sorted((pair for pair, rows in expected.items() for _ in rows))
    assert batch.hashes.tolist() == [key for key, _ in pairs]
    row_hashes = held_row_hashes(batch)
    assert row_hashes.tolist() == [row for _, row in pairs]
    assert len(pairs) < count - 10_000  # rows were summed and cancelled
    held: dict[tuple[int, int], dict[tuple[Any, ...], int]] = {}
    for position, row in enumerate(python_rows(batch.table, ())):
        pair = (int(batch.hashes[position]), int(row_hashes[position]))
        held.setdefault(pair, {})[row] = int(batch.diffs[position])
    assert held == expected


def test_key_and_row_hashes_from_one_pass_are_each_alone() -> None:
    """A key column hashed once for the key and the row gives both hashes as hashed apart."""
    from services.compute.dataflow.columnar import combined_hashes, hash_input

    table = pa.table(
        {
            "a": pa.array([1, None, 3, 4, 5], pa.int64()),
            "b": pa.array(["x", "y", None, "x", "z"]),
            "c": pa.array([0.0, -0.0, float("nan"), None, 2.5]),
        }
    )
    sources = [hash_input(column) for column in table.columns]
    keyed, whole = combined_hashes(sources, table.num_rows, [(2, 0), range(3)])
    assert keyed.tolist() == key_hashes([table.column(2), table.column(0)], 5).tolist()
    assert whole.tolist() == key_hashes(table.columns, 5).tolist()
    rows = python_rows(table, (2,))
    assert whole.tolist() == [key_hash(row) for row in rows]
    assert keyed.tolist() == [key_hash((row[2], row[0])) for row in rows]
