"""Columnar arrangements: an arrangement loaded from an Arrow table holds, reads and changes
exactly what one loaded row by row into dicts holds, with the engine's key rules (NULLs,
every NaN one value, -0.0 == 0.0, decimals equal but for trailing zeros), also past a
memory budget that moves its batches to disk."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.compute.dataflow.columnar import (
    RADIX_KEYS,
    build_keyed,
    key_hash,
    key_hashes,
    stable_order,
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
    }


def staged_table(loaded: list[Any], arrow_type: pa.DataType) -> tuple[pa.Table, np.ndarray]:
    rows = [row for row, _ in loaded]
    columns = [
        pa.array([row[0] for row in rows], type=arrow_type),
        pa.array([row[1] for row in rows], type=pa.int64()),
        pa.array([row[2] for row in rows], type=pa.int64()),
    ]
    table = pa.Table.from_arrays(columns, names=["k", "k2", "v"])
    return table, np.array([diff for _, diff in loaded], dtype=np.int64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_a_columnar_arrangement_holds_what_a_dict_one_holds(scenario: dict[str, Any]) -> None:
    float_key = scenario["kind"] == "float"
    key_columns = (0, 1) if scenario["two_columns"] else (0,)

    def key_of(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(row[c] for c in key_columns)

    drop = scenario["drop_null_keys"]
    table, diffs = staged_table(scenario["loaded"], scenario["arrow_type"])
    batch = build_keyed(
        table, diffs, key_of, None if scenario["computed_key"] else key_columns, drop
    )

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
        if batch is not None:
            columnar.add_batch(batch)
        assert columnar.row_count == reference.row_count
        assert len(columnar) == len(reference)
        assert dict(columnar.items()) == dict(reference.items())
        for (key_value, second), changes, read_first in scenario["operations"]:
            key = (engine_row((key_value,), float_key)[0], second)[: len(key_columns)]
            if read_first:  # reading moves the key out of the batch; changing may not
                assert columnar.get(key) == reference.get(key)
            # The changes' rows carry the key (their other columns are drawn).
            changes = [
                (engine_row((key_value, *key[1:], *row[len(key) :]), float_key), diff)
                for row, diff in changes
            ]
            columnar.apply(key, changes)
            reference.apply(key, changes)
            assert columnar.row_count == reference.row_count
            assert len(columnar) == len(reference)
            if budget is not None:
                assert budget.held_bytes == columnar.held_in_memory()
                assert columnar.spilled_rows <= columnar.row_count
        assert dict(columnar.items()) == dict(reference.items())
        for key, rows in reference.items():
            assert columnar.get(key) == rows
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
)
def test_a_join_loaded_from_tables_steps_like_one_loaded_from_rows(
    left: list[Any],
    right: list[Any],
    step_left: list[Any],
    step_right: list[Any],
    keep: tuple[bool, bool],
    computed: bool,
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
    step = [
        [(normalize.row(row), 6, diff) for row, diff in side] for side in (step_left, step_right)
    ]
    expected = from_rows.process(step)
    actual = from_tables.process(step)
    assert _summed(actual) == _summed(expected)
    assert from_tables.row_count() == from_rows.row_count()


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
