"""``OperatorState.load``: state built for a hydration whose output is computed elsewhere is
the state ``process`` builds. A join's load keeps only its arrangements; what a later step
emits from either state must be the same."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.compute.dataflow.lower import lower
from services.compute.dataflow.operators.join import JoinState
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.plan import builders as pb

LEFT = RelationSchema.of(("k", ColumnType.INT64), ("a", ColumnType.TEXT))
RIGHT = RelationSchema.of(("k", ColumnType.INT64), ("b", ColumnType.INT64))

keys = st.one_of(st.none(), st.integers(0, 3))
left_rows = st.tuples(keys, st.sampled_from(["x", "y", None]))
right_rows = st.tuples(keys, st.integers(0, 2))


def updates(rows: st.SearchStrategy[tuple[Any, ...]], time: int) -> st.SearchStrategy[Any]:
    return st.lists(st.tuples(rows, st.just(time), st.sampled_from([1, 1, 2, -1])), max_size=12)


def _states(kind: pb.JoinKind) -> tuple[JoinState, JoinState]:
    graph = lower(pb.join(pb.get("u1", LEFT), pb.get("u2", RIGHT), [0], [0], kind=kind))
    (node,) = graph.stateful_nodes()
    loaded, processed = node.operator.new_state(), node.operator.new_state()  # type: ignore[union-attr]
    assert isinstance(loaded, JoinState) and isinstance(processed, JoinState)
    return loaded, processed


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["inner", "left_outer", "right_outer", "full_outer"]),
    first=st.tuples(updates(left_rows, 0), updates(right_rows, 0)),
    later=st.tuples(updates(left_rows, 1), updates(right_rows, 1)),
)
def test_a_loaded_join_holds_and_emits_what_a_processed_one_does(
    kind: pb.JoinKind, first: tuple[Any, Any], later: tuple[Any, Any]
) -> None:
    loaded, processed = _states(kind)
    loaded.load(list(first))
    processed.process(list(first))
    assert loaded.left.rows == processed.left.rows
    assert loaded.right.rows == processed.right.rows
    emitted = sorted(loaded.process(list(later)), key=repr)
    assert emitted == sorted(processed.process(list(later)), key=repr)
