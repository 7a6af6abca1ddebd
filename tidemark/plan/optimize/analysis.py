"""What the rules need to know about a relation without evaluating it: its number of
columns, a rough size estimate, and whether it can hold more than one row.

Sizes come from ``Statistics`` (row counts of the stored collections, as storage reports
them) and simple guesses for everything above a Get. They only steer choices (which join
first); no answer depends on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidemark.plan.cardinality import Env, at_most_one_row, bind, is_cross_product
from tidemark.v1 import plan_pb2

__all__ = ["Env", "at_most_one_row", "is_cross_product"]

DEFAULT_ROWS = 1_000
"""The size assumed for a collection with no statistics."""
FILTER_SELECTIVITY = 0.25


@dataclass(frozen=True)
class Statistics:
    """Row counts of stored collections, by collection id."""

    rows: Mapping[str, int] = field(default_factory=dict)

    def collection_rows(self, collection_id: str) -> int:
        return max(1, self.rows.get(collection_id, DEFAULT_ROWS))


NO_STATISTICS = Statistics()


def arity(rel: plan_pb2.Relation, env: Env | None = None) -> int:
    """The number of columns ``rel`` produces."""
    kind = rel.WhichOneof("kind")
    if kind == "get":
        return len(rel.get.schema.columns)
    if kind == "constant":
        return len(rel.constant.schema.columns)
    if kind in ("filter", "negate", "threshold", "distinct", "top_k"):
        return arity(getattr(rel, kind).input, env)
    if kind == "map":
        return arity(rel.map.input, env) + len(rel.map.expressions)
    if kind == "project":
        return len(rel.project.columns)
    if kind == "union":
        return arity(rel.union.inputs[0], env)
    if kind == "join":
        return arity(rel.join.left, env) + arity(rel.join.right, env)
    if kind == "reduce":
        return len(rel.reduce.group_key) + len(rel.reduce.aggregates)
    if kind == "let":
        return arity(rel.let.body, bind(env, rel.let))
    if kind == "local_get":
        bound = (env or {}).get(rel.local_get.id)
        if bound is None:
            raise KeyError(f"LocalGet l{rel.local_get.id} outside its Let")
        return arity(bound, env)
    if kind == "window":
        return arity(rel.window.input, env) + len(rel.window.functions)
    raise ValueError(f"unknown relation kind {kind!r}")


def estimate(
    rel: plan_pb2.Relation, stats: Statistics, env: Env | None = None, *, filters: bool = True
) -> float:
    """A rough number of rows (``filters=False``: as if no Filter dropped any, the size of
    the domain a key column of ``rel`` draws from)."""
    kind = rel.WhichOneof("kind")
    if kind == "get":
        return float(stats.collection_rows(rel.get.collection_id))
    if kind == "constant":
        return float(max(1, len(rel.constant.rows)))
    if kind == "filter":
        below = estimate(rel.filter.input, stats, env, filters=filters)
        return max(1.0, below * FILTER_SELECTIVITY) if filters else below
    if kind == "union":
        return sum(estimate(branch, stats, env, filters=filters) for branch in rel.union.inputs)
    if kind == "join":
        left = estimate(rel.join.left, stats, env, filters=filters)
        right = estimate(rel.join.right, stats, env, filters=filters)
        if not rel.join.left_keys:
            return left * right
        return max(left, right)
    if kind == "reduce":
        if not rel.reduce.group_key:
            return 1.0
        return max(1.0, estimate(rel.reduce.input, stats, env, filters=filters) / 2)
    if kind == "top_k":
        below = estimate(rel.top_k.input, stats, env, filters=filters)
        if rel.top_k.HasField("limit") and not rel.top_k.group_key:
            return float(min(below, max(1, rel.top_k.limit)))
        return below
    if kind == "let":
        return estimate(rel.let.body, stats, bind(env, rel.let), filters=filters)
    if kind == "local_get":
        bound = (env or {}).get(rel.local_get.id)
        return DEFAULT_ROWS if bound is None else estimate(bound, stats, env, filters=filters)
    inputs = [getattr(rel, kind).input] if kind is not None else []
    return estimate(inputs[0], stats, env, filters=filters) if inputs else float(DEFAULT_ROWS)
