"""The optimizer: one pipeline of rewrite rules on the plan IR, used for one-shot queries,
views, materialized views and indexes alike.

Each rule is a function ``(Relation, Context) -> Relation`` in a module of its own, whose
docstring states the equivalence it relies on. ``optimize`` runs them in order, twice (a
second pass finds what the first one exposed), and records which rules changed the plan;
EXPLAIN shows the optimized plan and ``EXPLAIN RAW PLAN`` the one before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemark.plan.optimize.analysis import (
    NO_STATISTICS,
    Statistics,
    at_most_one_row,
    is_cross_product,
)
from tidemark.plan.optimize.fusion import fuse
from tidemark.plan.optimize.join_order import order_joins
from tidemark.plan.optimize.prune import prune_columns
from tidemark.plan.optimize.pushdown import push_predicates
from tidemark.plan.optimize.rewrite import Context, Rule
from tidemark.plan.optimize.share import share_subplans
from tidemark.v1 import plan_pb2

PIPELINE: tuple[tuple[str, Rule], ...] = (
    ("fuse", fuse),
    ("push_predicates", push_predicates),
    ("order_joins", order_joins),
    ("push_predicates", push_predicates),
    ("fuse", fuse),
    ("prune_columns", prune_columns),
    ("fuse", fuse),
)
PASSES = 2


@dataclass(frozen=True)
class Optimized:
    plan: plan_pb2.Plan
    changed_by: list[str] = field(default_factory=list)
    """The rules that changed the plan, in the order they ran."""


def optimize_relation(
    relation: plan_pb2.Relation, stats: Statistics = NO_STATISTICS
) -> tuple[plan_pb2.Relation, list[str]]:
    context = Context(stats)
    changed_by: list[str] = []
    current = relation
    before = current.SerializeToString(deterministic=True)
    for _ in range(PASSES):
        for name, rule in PIPELINE:
            candidate = rule(current, context)
            after = candidate.SerializeToString(deterministic=True)
            if after != before:
                changed_by.append(name)
                current, before = candidate, after
    shared = share_subplans(current, context)
    if shared.SerializeToString(deterministic=True) != before:
        changed_by.append("share_subplans")
        current = shared
    return current, changed_by


def optimize(plan: plan_pb2.Plan, stats: Statistics = NO_STATISTICS) -> Optimized:
    """``plan`` rewritten into an equivalent, cheaper one (same output schema)."""
    root, changed_by = optimize_relation(plan.root, stats)
    result = plan_pb2.Plan()
    result.CopyFrom(plan)
    result.root.CopyFrom(root)
    return Optimized(result, changed_by)


__all__ = [
    "NO_STATISTICS",
    "Optimized",
    "Statistics",
    "at_most_one_row",
    "is_cross_product",
    "optimize",
    "optimize_relation",
]
