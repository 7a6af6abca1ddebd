"""A Reduce loaded from its groups' partial aggregates (``ReduceState.load_group_states``,
what hydration by Spark stages for COUNT, SUM and AVG) holds the state that loading its
input rows builds: the same output rows, and the same output for any later step. The
partial aggregates are computed here in Python, as the Spark lowering lays them out
(``spark/lowering/aggregates.py``), for the rows cut into arbitrary chunks, so a group
may come in several rows."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow.lower import lower
from services.compute.dataflow.operators.reduce import ReduceOperator, ReduceState
from services.compute.dataflow.ordering import NAN
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.errors import FailedPrecondition
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

T = ColumnType
SCHEMA = RelationSchema(
    [
        Column("g", T.INT64, True),
        Column("f", T.FLOAT64, True),
        Column("x", T.INT64, True),
        Column("d", T.DECIMAL, True, 10, 2),
    ]
)
AGGREGATES = [
    pb.aggregate("count"),
    pb.aggregate("count", 2),
    pb.aggregate("sum", 2),
    pb.aggregate("avg", 2),
    pb.aggregate("sum", 3),
    pb.aggregate("avg", 3),
]
Row = tuple[Any, ...]


def _state() -> ReduceState:
    root = pb.reduce(pb.get("t", SCHEMA), [0, 1], AGGREGATES)
    graph = lower(pb.plan(root, derive_schema(root)))
    (node,) = [n for n in graph.stateful_nodes() if isinstance(n.operator, ReduceOperator)]
    state = node.operator.new_state()
    assert isinstance(state, ReduceState)
    return state


def _partials(chunk: Sequence[tuple[Row, int]]) -> list[Row]:
    """Per group of ``chunk``: its key, sum of diffs and each aggregate's partial aggregates,
    in the order and types the Spark lowering gives them."""
    groups: dict[Row, list[tuple[Row, int]]] = {}
    for row, diff in chunk:
        groups.setdefault((row[0], row[1]), []).append((row, diff))
    found = []
    for key, rows in groups.items():
        total = sum(diff for _, diff in rows)
        xs = [(row[2], diff) for row, diff in rows if row[2] is not None]
        ds = [(row[3], diff) for row, diff in rows if row[3] is not None]
        x_total = Decimal(sum(v * diff for v, diff in xs)) if xs else None
        d_total = sum((v * diff for v, diff in ds), Decimal("0.00")) if ds else None
        x_count = sum(diff for _, diff in xs)
        d_count = sum(diff for _, diff in ds)
        found.append(
            (
                *key,
                total,
                total,
                x_count,
                *(x_total, x_count, None) * 2,
                *(d_total, d_count, None) * 2,
            )
        )
    return found


def _table(rows: list[Row]) -> pa.Table:
    dec = pa.decimal128(38, 0)
    dec2 = pa.decimal128(38, 2)
    types = [pa.int64(), pa.float64(), pa.int64(), pa.int64(), pa.int64()]
    types += [dec, pa.int64(), pa.int32()] * 2 + [dec2, pa.int64(), pa.int32()] * 2
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(types)
    return pa.table(
        [pa.array(list(c), t) for c, t in zip(columns, types, strict=True)],
        names=[f"c{i}" for i in range(len(types))],
    )


def _outputs(state: ReduceState) -> dict[Row, Row | None]:
    return {key: group.output for key, group in state.groups.items()}


def _canonical(updates: list[tuple[Row, int, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row, time, diff in updates:
        text = repr((tuple(0.0 if v == 0.0 and isinstance(v, float) else v for v in row), time))
        totals[text] = totals.get(text, 0) + diff
    return {k: v for k, v in totals.items() if v}


values = st.tuples(
    st.sampled_from([None, 0, 1, 2]),
    st.sampled_from([None, 0.0, -0.0, 1.5, NAN]),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-5, 5)),
    st.one_of(st.none(), st.decimals(-(10**8), 10**8, places=2, allow_nan=False)),
)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.dictionaries(values, st.integers(1, 4), max_size=25),
    cuts=st.lists(st.integers(0, 25), max_size=3),
    inserted=st.lists(values, max_size=6),
    retracted=st.lists(st.integers(0, 24), max_size=6),
)
def test_group_states_load_the_state_rows_do(
    rows: dict[Row, int], cuts: list[int], inserted: list[Row], retracted: list[int]
) -> None:
    items = list(rows.items())
    by_rows = _state()
    by_rows.load([[(row, 0, diff) for row, diff in items]])
    bounds = sorted({0, len(items), *(min(c, len(items)) for c in cuts)})
    partials = [row for lo, hi in pairwise(bounds) for row in _partials(items[lo:hi])]
    by_states = _state()
    by_states.load_group_states(_table(partials), 2)
    assert by_states.key_count() == by_rows.key_count()
    assert by_states.held_bytes() == by_rows.held_bytes()
    assert _outputs(by_states) == _outputs(by_rows)

    step = [(row, 1, 1) for row in inserted]
    step += [(items[i][0], 1, -1) for i in sorted(set(retracted)) if i < len(items)]
    assert _canonical(by_states.process([step])) == _canonical(by_rows.process([step]))
    assert _outputs(by_states) == _outputs(by_rows)


def test_a_global_aggregate_over_no_rows_loads_no_group() -> None:
    """Spark's aggregate without a group key gives one row of NULLs over no input."""
    root = pb.reduce(pb.get("t", SCHEMA), [], [pb.aggregate("count"), pb.aggregate("sum", 2)])
    graph = lower(pb.plan(root, derive_schema(root)))
    (node,) = [n for n in graph.stateful_nodes() if isinstance(n.operator, ReduceOperator)]
    state = node.operator.new_state()
    assert isinstance(state, ReduceState)
    table = pa.table(
        {
            "total": pa.array([None], pa.int64()),
            "rows": pa.array([None], pa.int64()),
            "sum": pa.array([None], pa.decimal128(38, 0)),
            "count": pa.array([None], pa.int64()),
            "flag": pa.array([None], pa.int32()),
        }
    )
    state.load_group_states(table, 0)
    assert state.key_count() == 0
    assert state.process([[((1, 1.5, 7, None), 1, 1)]]) == [((1, Decimal(7)), 1, 1)]


def test_a_sum_whose_total_spark_lost_is_refused() -> None:
    state = _state()
    row = (1, 1.5, 1, 1, 1, *(None, 1, 1) * 2, *(None, 0, None) * 2)
    with pytest.raises(FailedPrecondition, match="38 digits"):
        state.load_group_states(_table([row]), 2)
