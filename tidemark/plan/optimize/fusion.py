"""Canonical forms that make the other rules' patterns meet: adjacent filters, maps and
projects merged, conjunctions split, constant predicates folded, identity projects removed.

Equivalences:
- Filter(Filter(x, p), q) = Filter(x, p ∧ q); a conjunction's parts are separate predicates.
- In a predicate, TRUE parts of ``and`` drop, a FALSE part makes it FALSE (``or`` dually);
  ``not`` of a literal folds. A Filter with a TRUE predicate drops it; one with a FALSE or NULL
  predicate keeps no row: it becomes an empty Constant of the same schema.
- (x AND a) OR (x AND b) = x AND (a OR b), also in SQL's three-valued logic: conjuncts
  common to every branch of a disjunction come out of it, so a join equality written in each
  branch (TPC-H Q19) becomes a conjunct the join ordering can use.
- Project(Project(x, a), b) = Project(x, [a[i] for i in b]).
- Map(Map(x, e), f) = Map(x, e ++ f): f's expressions already see e's columns where Map's
  contract puts them.
- Project(x, [0, 1, ..., arity-1]) = x.
"""

from __future__ import annotations

from tidemark.errors import InvalidArgument
from tidemark.plan import builders as pb
from tidemark.plan.derive import derive_schema
from tidemark.plan.optimize.analysis import arity
from tidemark.plan.optimize.rewrite import Context, bottom_up
from tidemark.plan.optimize.scalars import (
    all_conjuncts,
    bool_literal,
    conjuncts,
    false_literal,
    key_of,
    true_literal,
)
from tidemark.v1 import plan_pb2


def fold_predicate(expr: plan_pb2.Scalar) -> plan_pb2.Scalar:
    """Folds literal TRUE/FALSE through ``and``, ``or`` and ``not`` (SQL's three-valued rules)."""
    if expr.WhichOneof("kind") != "call":
        return expr
    name = expr.call.function
    if name not in ("and", "or", "not"):
        return expr
    args = [fold_predicate(arg) for arg in expr.call.args]
    if name == "not":
        value = bool_literal(args[0])
        if value is True:
            return false_literal()
        if value is False:
            return true_literal()
        return pb.call("not", args[0])
    absorbing, neutral = (False, True) if name == "and" else (True, False)
    kept = []
    for arg in args:
        value = bool_literal(arg)
        if value is absorbing:
            return false_literal() if absorbing is False else true_literal()
        if value is neutral:
            continue
        kept.append(arg)
    if not kept:
        return true_literal() if neutral is True else false_literal()
    if len(kept) == 1 and bool_literal(kept[0]) == "?":
        return kept[0]
    if len(kept) == 1:
        kept.append(true_literal() if neutral is True else false_literal())
    return pb.call(name, *kept)


def factor_disjunction(expr: plan_pb2.Scalar) -> list[plan_pb2.Scalar]:
    """``expr`` as conjuncts, with the conjuncts every branch of an ``or`` shares taken out."""
    if expr.WhichOneof("kind") != "call" or expr.call.function != "or":
        return [expr]
    branches = [conjuncts(arg) for arg in expr.call.args]
    keys = [[key_of(part) for part in branch] for branch in branches]
    common = [part for part in branches[0] if all(key_of(part) in k for k in keys[1:])]
    if not common:
        return [expr]
    shared = {key_of(part) for part in common}
    rests = []
    for branch in branches:
        rest = [part for part in branch if key_of(part) not in shared]
        if not rest:
            return common  # a branch that is only the common part: the OR is implied
        rests.append(rest[0] if len(rest) == 1 else pb.call("and", *rest))
    return [*common, pb.call("or", *rests)]


def _fuse(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    kind = rel.WhichOneof("kind")
    if kind == "filter":
        below = rel.filter.input
        predicates = list(rel.filter.predicates)
        while below.WhichOneof("kind") == "filter":
            predicates = [*below.filter.predicates, *predicates]
            below = below.filter.input
        folded = [
            part
            for p in all_conjuncts(predicates)
            for part in factor_disjunction(fold_predicate(p))
        ]
        kept = []
        for predicate in folded:
            value = bool_literal(predicate)
            if value is True:
                continue
            if value is False or value is None:
                return _empty_like(rel, below, context)
            kept.append(predicate)
        if not kept:
            return below
        return pb.filter(below, *kept)
    if kind == "project":
        below = rel.project.input
        columns = list(rel.project.columns)
        while below.WhichOneof("kind") == "project":
            columns = [below.project.columns[c] for c in columns]
            below = below.project.input
        if columns == list(range(arity(below, context.env))):
            return below
        return pb.project(below, *columns)
    if kind == "map":
        below = rel.map.input
        expressions = list(rel.map.expressions)
        while below.WhichOneof("kind") == "map":
            expressions = [*below.map.expressions, *expressions]
            below = below.map.input
        if not expressions:
            return below
        return pb.map(below, *expressions)
    return rel


def _empty_like(
    rel: plan_pb2.Relation, below: plan_pb2.Relation, context: Context
) -> plan_pb2.Relation:
    """No rows, with the filter's schema (its predicates may make columns NOT NULL); the
    filter kept, folded to FALSE, where the schema cannot be derived here (a LocalGet of an
    enclosing Let)."""
    try:
        schema = derive_schema(_closed(rel, context))
    except (InvalidArgument, KeyError):
        return pb.filter(below, false_literal())
    return pb.constant(schema, [])


def _closed(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    """``rel`` wrapped in the Lets it reads, so its schema can be derived on its own."""
    closed = rel
    for let_id, value in reversed(list(context.env.items())):
        closed = pb.let(let_id, value, closed)
    return closed


fuse = bottom_up(_fuse)
"""Merges adjacent filters, projects and maps and folds constant predicates, everywhere."""
