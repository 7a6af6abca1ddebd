"""Predicate pushdown: a Filter moves below the nodes it commutes with, so rows are dropped
before joins, reductions and unions see them.

Equivalences (each part of a conjunction moves on its own):
- Project: Filter(Project(x, cols), p) = Project(Filter(x, p over cols), cols).
- Map: Filter(Map(x, e), p) = Map(Filter(x, p), e) when p reads only x's columns.
- Union, Negate, Threshold, Distinct: a filter decides per row, and these act per row (or add
  multiplicities of equal rows), so it moves into every input.
- Reduce, TopK, Window: a predicate on group (partition) key columns only keeps or drops whole
  groups, so it moves below, onto the input's key columns.
- Join: a predicate on one side's columns moves into that side, unless that side is padded
  with NULLs (the null-supplying side of an outer join). A predicate that cannot be TRUE when a
  padded side's columns are NULL removes every padded row, so the join narrows first: LEFT to
  INNER, FULL to LEFT or RIGHT. Predicates on both sides stay (the join ordering rule turns
  equalities into keys); when one is TRUE only where a column of a side is not NULL and that
  column is padded by an outer join inside that side, ``is_not_null`` of it moves into the
  side too (implied, so it changes nothing but lets that outer join narrow).
- Let: a filter over a Let moves into its body.
"""

from __future__ import annotations

from tidemark.plan import builders as pb
from tidemark.plan.derive import true_columns
from tidemark.plan.optimize.analysis import arity
from tidemark.plan.optimize.rewrite import Context, copy, with_inputs
from tidemark.plan.optimize.scalars import columns_of, conjuncts, remapped, shifted
from tidemark.v1 import plan_pb2

INNER = plan_pb2.Join.KIND_INNER
LEFT = plan_pb2.Join.KIND_LEFT_OUTER
RIGHT = plan_pb2.Join.KIND_RIGHT_OUTER
FULL = plan_pb2.Join.KIND_FULL_OUTER


def push_predicates(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    """Every Filter pushed as far down as it validly goes."""
    if rel.WhichOneof("kind") != "filter":
        return with_inputs(rel, push_predicates, context)
    predicates = [part for p in rel.filter.predicates for part in conjuncts(p)]
    below = rel.filter.input
    pushed, kept = _push(below, predicates, context)
    result = (
        push_predicates(pushed, context)
        if pushed is not below
        else (with_inputs(below, push_predicates, context))
    )
    return pb.filter(result, *kept) if kept else result


def _filtered(rel: plan_pb2.Relation, predicates: list[plan_pb2.Scalar]) -> plan_pb2.Relation:
    return pb.filter(rel, *predicates) if predicates else rel


def _push(
    below: plan_pb2.Relation, predicates: list[plan_pb2.Scalar], context: Context
) -> tuple[plan_pb2.Relation, list[plan_pb2.Scalar]]:
    """``(new input, predicates left above it)``; the new input carries what moved."""
    kind = below.WhichOneof("kind")
    if kind == "project":
        columns = list(below.project.columns)
        moved = [remapped(p, columns) for p in predicates]
        return pb.project(pb.filter(below.project.input, *moved), *columns), []
    if kind == "map":
        # Only predicates on the input's columns move: one on a computed column stays, as it
        # also tells the schema that the column is not NULL where it holds.
        width = arity(below.map.input, context.env)
        movable = [p for p in predicates if all(c < width for c in columns_of(p))]
        if not movable:
            return below, predicates
        kept = [p for p in predicates if not all(c < width for c in columns_of(p))]
        expressions = list(below.map.expressions)
        return pb.map(pb.filter(below.map.input, *movable), *expressions), kept
    if kind == "union":
        branches = [pb.filter(branch, *predicates) for branch in below.union.inputs]
        return pb.union(*branches), []
    if kind in ("negate", "threshold", "distinct"):
        result = copy(below)
        getattr(result, kind).input.CopyFrom(pb.filter(getattr(below, kind).input, *predicates))
        return result, []
    if kind == "reduce":
        keys = list(below.reduce.group_key)
        return _push_on_keys(below, "reduce", predicates, {i: k for i, k in enumerate(keys)})
    if kind == "top_k":
        keys = list(below.top_k.group_key)
        return _push_on_keys(below, "top_k", predicates, {k: k for k in keys})
    if kind == "window":
        keys = list(below.window.partition_key)
        return _push_on_keys(below, "window", predicates, {k: k for k in keys})
    if kind == "join":
        return _push_join(below, predicates, context)
    if kind == "let":
        result = copy(below)
        result.let.body.CopyFrom(pb.filter(below.let.body, *predicates))
        return result, []
    return below, predicates


def _add_once(predicates: list[plan_pb2.Scalar], predicate: plan_pb2.Scalar) -> None:
    if predicate not in predicates:
        predicates.append(predicate)


def _padded_columns(rel: plan_pb2.Relation, context: Context) -> set[int]:
    """Columns of ``rel`` that an outer join inside it may pad with NULLs."""
    kind = rel.WhichOneof("kind")
    if kind == "project":
        below = _padded_columns(rel.project.input, context)
        return {i for i, c in enumerate(rel.project.columns) if c in below}
    if kind in ("filter", "map", "negate", "threshold", "distinct", "top_k"):
        return _padded_columns(getattr(rel, kind).input, context)
    if kind != "join":  # a Let's body is not followed: its LocalGets need the Let's scope
        return set()
    join = rel.join
    width = arity(join.left, context.env)
    total = width + arity(join.right, context.env)
    left = _padded_columns(join.left, context)
    right = {width + c for c in _padded_columns(join.right, context)}
    if join.kind in (LEFT, FULL):
        right = set(range(width, total))
    if join.kind in (RIGHT, FULL):
        left = set(range(width))
    return left | right


def _push_on_keys(
    below: plan_pb2.Relation, kind: str, predicates: list[plan_pb2.Scalar], keys: dict[int, int]
) -> tuple[plan_pb2.Relation, list[plan_pb2.Scalar]]:
    """Predicates reading only key columns (output position -> input position) move below."""
    movable = [p for p in predicates if columns_of(p) <= keys.keys()]
    if not movable:
        return below, predicates
    kept = [p for p in predicates if not columns_of(p) <= keys.keys()]
    result = copy(below)
    node = getattr(result, kind)
    node.input.CopyFrom(
        pb.filter(getattr(below, kind).input, *(remapped(p, keys) for p in movable))
    )
    return result, kept


def _push_join(
    below: plan_pb2.Relation, predicates: list[plan_pb2.Scalar], context: Context
) -> tuple[plan_pb2.Relation, list[plan_pb2.Scalar]]:
    join = below.join
    width = arity(join.left, context.env)
    total = width + arity(join.right, context.env)
    left_columns, right_columns = set(range(width)), set(range(width, total))
    kind = join.kind
    for predicate in predicates:
        rejects = true_columns(predicate)
        if rejects & right_columns:
            kind = {LEFT: INNER, FULL: RIGHT}.get(kind, kind)
        if rejects & left_columns:
            kind = {RIGHT: INNER, FULL: LEFT}.get(kind, kind)
    to_left: list[plan_pb2.Scalar] = []
    to_right: list[plan_pb2.Scalar] = []
    kept: list[plan_pb2.Scalar] = []
    padded_left = _padded_columns(join.left, context) if kind in (INNER, LEFT) else set()
    padded_right = _padded_columns(join.right, context) if kind in (INNER, RIGHT) else set()
    for predicate in predicates:
        used = columns_of(predicate)
        if used and used <= left_columns and kind in (INNER, LEFT):
            to_left.append(predicate)
        elif used and used <= right_columns and kind in (INNER, RIGHT):
            to_right.append(shifted(predicate, -width))
        else:
            kept.append(predicate)
            for c in sorted(true_columns(predicate)):
                if c in padded_left:
                    _add_once(to_left, pb.call("is_not_null", pb.column(c)))
                elif c - width in padded_right:
                    _add_once(to_right, pb.call("is_not_null", pb.column(c - width)))
    if kind == join.kind and not to_left and not to_right:
        return below, predicates
    result = copy(below)
    result.join.kind = kind
    result.join.left.CopyFrom(_filtered(join.left, to_left))
    result.join.right.CopyFrom(_filtered(join.right, to_right))
    return result, kept
