"""Projection pushdown: each node computes only the columns something above it reads, so
joins and reductions arrange narrower rows and maps skip unused expressions.

``prune(rel, demanded)`` returns a relation whose columns are exactly ``demanded`` (sorted
positions of ``rel``'s output), in that order. Equivalences:
- Project, Filter, Map, Join (every kind), Union and Negate act column-wise, so dropping a
  column nobody reads (keeping what predicates, keys and kept expressions read) changes
  nothing else.
- Reduce keeps all its group key columns (they define the groups) but drops aggregates nobody
  reads; its input needs only the key and the kept aggregates' columns.
- Distinct, Threshold, TopK and Window compare whole rows (merging or ordering them), so
  their inputs keep every column; a Project above them drops what is not read.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.plan import builders as pb
from tidemark.plan.optimize.analysis import arity
from tidemark.plan.optimize.rewrite import Context, copy, with_inputs
from tidemark.plan.optimize.scalars import columns_of, remapped
from tidemark.v1 import plan_pb2


def prune_columns(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    """``rel`` with every node narrowed to the columns read above it."""
    return prune(rel, list(range(arity(rel, context.env))), context)


def _positions(columns: Sequence[int]) -> dict[int, int]:
    return {c: i for i, c in enumerate(columns)}


def _nonempty(columns: set[int]) -> list[int]:
    """At least one column: a relation needs one, even when nothing above reads it."""
    return sorted(columns) or [0]


def _projected(rel: plan_pb2.Relation, columns: list[int], context: Context) -> plan_pb2.Relation:
    if columns == list(range(arity(rel, context.env))):
        return rel
    return pb.project(rel, *columns)


def prune(rel: plan_pb2.Relation, demanded: list[int], context: Context) -> plan_pb2.Relation:
    kind = rel.WhichOneof("kind")
    if kind == "project":
        columns = [rel.project.columns[i] for i in demanded]
        needed = _nonempty(set(columns))
        inner = prune(rel.project.input, needed, context)
        position = _positions(needed)
        return _projected(inner, [position[c] for c in columns], context)
    if kind == "filter":
        needed = _nonempty(set(demanded).union(*map(columns_of, rel.filter.predicates)))
        position = _positions(needed)
        inner = prune(rel.filter.input, needed, context)
        filtered = pb.filter(inner, *(remapped(p, position) for p in rel.filter.predicates))
        return _projected(filtered, [position[c] for c in demanded], context)
    if kind == "map":
        return _prune_map(rel, demanded, context)
    if kind == "join":
        return _prune_join(rel, demanded, context)
    if kind == "reduce":
        return _prune_reduce(rel, demanded, context)
    if kind == "union":
        return pb.union(*(prune(branch, demanded, context) for branch in rel.union.inputs))
    if kind == "negate":
        return pb.negate(prune(rel.negate.input, demanded, context))
    if kind == "let":
        result = copy(rel)
        result.let.value.CopyFrom(prune_columns(rel.let.value, context))
        result.let.body.CopyFrom(prune(rel.let.body, demanded, context.binding(rel.let)))
        return result
    whole = with_inputs(rel, prune_columns, context)
    return _projected(whole, demanded, context)


def _prune_map(rel: plan_pb2.Relation, demanded: list[int], context: Context) -> plan_pb2.Relation:
    width = arity(rel.map.input, context.env)
    expressions = list(rel.map.expressions)
    kept: set[int] = set()
    from_input = {c for c in demanded if c < width}
    pending = [c for c in demanded if c >= width]
    while pending:
        column = pending.pop()
        if column in kept:
            continue
        kept.add(column)
        for used in columns_of(expressions[column - width]):
            (pending.append if used >= width else from_input.add)(used)
    needed = _nonempty(from_input)
    position = _positions(needed)
    for rank, column in enumerate(sorted(kept)):
        position[column] = len(needed) + rank
    inner = prune(rel.map.input, needed, context)
    mapped = [remapped(expressions[c - width], position) for c in sorted(kept)]
    result = pb.map(inner, *mapped) if mapped else inner
    return _projected(result, [position[c] for c in demanded], context)


def _prune_join(rel: plan_pb2.Relation, demanded: list[int], context: Context) -> plan_pb2.Relation:
    join = rel.join
    width = arity(join.left, context.env)
    left_need = {c for c in demanded if c < width}.union(*map(columns_of, join.left_keys))
    right_need = {c - width for c in demanded if c >= width}.union(
        *map(columns_of, join.right_keys)
    )
    left_columns, right_columns = _nonempty(left_need), _nonempty(right_need)
    left_position, right_position = _positions(left_columns), _positions(right_columns)
    result = copy(rel)
    result.join.left.CopyFrom(prune(join.left, left_columns, context))
    result.join.right.CopyFrom(prune(join.right, right_columns, context))
    del result.join.left_keys[:]
    del result.join.right_keys[:]
    result.join.left_keys.extend(remapped(k, left_position) for k in join.left_keys)
    result.join.right_keys.extend(remapped(k, right_position) for k in join.right_keys)
    output = [
        left_position[c] if c < width else len(left_columns) + right_position[c - width]
        for c in demanded
    ]
    return _projected(result, output, context)


def _prune_reduce(
    rel: plan_pb2.Relation, demanded: list[int], context: Context
) -> plan_pb2.Relation:
    reduce = rel.reduce
    keys = len(reduce.group_key)
    aggregates = sorted({c - keys for c in demanded if c >= keys})
    if not keys and not aggregates:
        aggregates = [0]
    needed_columns = set(reduce.group_key)
    for index in aggregates:
        aggregate = reduce.aggregates[index]
        if aggregate.HasField("expression"):
            needed_columns |= columns_of(aggregate.expression)
    needed = _nonempty(needed_columns)
    position = _positions(needed)
    result = copy(rel)
    result.reduce.input.CopyFrom(prune(reduce.input, needed, context))
    del result.reduce.group_key[:]
    result.reduce.group_key.extend(position[k] for k in reduce.group_key)
    del result.reduce.aggregates[:]
    for index in aggregates:
        aggregate = plan_pb2.Aggregate()
        aggregate.CopyFrom(reduce.aggregates[index])
        if aggregate.HasField("expression"):
            aggregate.expression.CopyFrom(remapped(aggregate.expression, position))
        result.reduce.aggregates.append(aggregate)
    rank = {index: keys + i for i, index in enumerate(aggregates)}
    output = [c if c < keys else rank[c - keys] for c in demanded]
    return _projected(result, output, context)
