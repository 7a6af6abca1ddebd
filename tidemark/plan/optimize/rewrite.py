"""The plumbing every rule shares: a rule's context (statistics and the Let bindings in
scope), and rebuilding a node with its inputs rewritten.

Rules never modify a message they were given: they build new ones, so a plan held elsewhere
(the catalog's copy of a view) is never changed under its holder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tidemark.plan.cardinality import bind
from tidemark.plan.optimize.analysis import NO_STATISTICS, Env, Statistics
from tidemark.plan.walk import inputs
from tidemark.v1 import plan_pb2

_RELATION = plan_pb2.Relation.DESCRIPTOR


@dataclass(frozen=True)
class Context:
    stats: Statistics = NO_STATISTICS
    env: Env = field(default_factory=dict)

    def binding(self, let: plan_pb2.Let) -> Context:
        """The context inside a Let's body."""
        return Context(self.stats, bind(self.env, let))


Rule = Callable[[plan_pb2.Relation, Context], plan_pb2.Relation]


def copy(rel: plan_pb2.Relation) -> plan_pb2.Relation:
    result = plan_pb2.Relation()
    result.CopyFrom(rel)
    return result


def with_inputs(rel: plan_pb2.Relation, rewrite: Rule, context: Context) -> plan_pb2.Relation:
    """A copy of ``rel`` whose inputs are ``rewrite(input)``; a Let's body is rewritten with
    its binding in scope."""
    kind = rel.WhichOneof("kind")
    if kind is None or not inputs(rel):
        return copy(rel)
    result = copy(rel)
    node = getattr(result, kind)
    if kind == "let":
        node.value.CopyFrom(rewrite(rel.let.value, context))
        node.body.CopyFrom(rewrite(rel.let.body, context.binding(rel.let)))
        return result
    for described, value in getattr(rel, kind).ListFields():
        if described.message_type is not _RELATION:
            continue
        target = getattr(node, described.name)
        if isinstance(value, plan_pb2.Relation):
            target.CopyFrom(rewrite(value, context))
        else:
            del target[:]
            target.extend(rewrite(child, context) for child in value)
    return result


def bottom_up(rule: Rule) -> Rule:
    """``rule`` applied to every node, inputs first."""

    def apply(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
        return rule(with_inputs(rel, apply, context), context)

    return apply


def top_down(rule: Rule) -> Rule:
    """``rule`` applied to a node, then to the inputs of what it returned."""

    def apply(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
        return with_inputs(rule(rel, context), apply, context)

    return apply
