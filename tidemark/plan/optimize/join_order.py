"""Join ordering: a tree of inner joins and the filters over it becomes one n-way join, which
is rebuilt greedily so that every join has keys (no cross product while the join graph is
connected), equalities between two inputs become join keys, and each remaining predicate sits
at the lowest join where all its columns are present.

Equivalence: inner joins and filters commute and associate. Join(a, b, keys k) equals
Filter(Join(a, b, no keys), eq(k_left, k_right) for each key), since a key pair matches exactly
when ``eq`` is TRUE (a NULL key matches nothing, like a NULL predicate). So the whole tree
equals Filter(cross product of the inputs, all predicates); any order of the inputs, with a
Project restoring the column order, gives the same multiset (multiplicities multiply either
way).

The order: start from the largest input (the fact table of a star), then repeatedly join the
connected input whose estimated result is smallest; an input with no connection joins last.
Estimates: the equalities between a joined input X and the candidate R keep 1 / min(D(X),
D(R)) of the pairs, where D is an input's size before its filters: the key of the smaller
side, as foreign keys are, whose values the larger side draws from. So joining a fact to an
unfiltered dimension keeps the fact's size and a filtered dimension shrinks it by the
filter's selectivity (the fact is probed through the selective dimensions first), and
several equalities between the same two inputs (a composite key) count once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidemark.plan import builders as pb
from tidemark.plan.optimize.analysis import arity, at_most_one_row, estimate
from tidemark.plan.optimize.rewrite import Context, with_inputs
from tidemark.plan.optimize.scalars import (
    columns_of,
    conjuncts,
    equality_sides,
    key_of,
    remapped,
    shifted,
)
from tidemark.v1 import plan_pb2

INNER = plan_pb2.Join.KIND_INNER


@dataclass
class _Cluster:
    leaves: list[plan_pb2.Relation]
    widths: list[int]
    predicates: list[plan_pb2.Scalar]  # over the leaves' columns side by side


def order_joins(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    """Every cluster of inner joins reordered (clusters below are done first)."""
    if not _is_cluster_root(rel):
        return with_inputs(rel, order_joins, context)
    cluster = _Cluster([], [], [])
    view = _flatten(rel, cluster, context)
    leaves = [order_joins(leaf, context) for leaf in cluster.leaves]
    cluster.leaves = leaves
    if len(leaves) < 2:
        return rel
    return _build(cluster, context, view)


def _is_inner_join(rel: plan_pb2.Relation) -> bool:
    return rel.WhichOneof("kind") == "join" and rel.join.kind == INNER


def _is_cluster_root(rel: plan_pb2.Relation) -> bool:
    while rel.WhichOneof("kind") == "filter":
        rel = rel.filter.input
    return _is_inner_join(rel)


def _flatten(rel: plan_pb2.Relation, cluster: _Cluster, context: Context) -> list[int]:
    """Adds ``rel``'s leaves and predicates; the cluster columns that ``rel``'s columns are.
    A projection of inner joins inside the cluster is seen through (its joins join the
    cluster; the final projection keeps only what it kept)."""
    kind = rel.WhichOneof("kind")
    if kind == "filter" and _is_cluster_root(rel):
        view = _flatten(rel.filter.input, cluster, context)
        for predicate in rel.filter.predicates:
            cluster.predicates.extend(remapped(p, view) for p in conjuncts(predicate))
        return view
    if kind == "project" and _is_cluster_root(rel.project.input):
        view = _flatten(rel.project.input, cluster, context)
        return [view[c] for c in rel.project.columns]
    if _is_inner_join(rel):
        join = rel.join
        left = _flatten(join.left, cluster, context)
        right = _flatten(join.right, cluster, context)
        for lk, rk in zip(join.left_keys, join.right_keys, strict=True):
            cluster.predicates.append(pb.call("eq", remapped(lk, left), remapped(rk, right)))
        return left + right
    start = sum(cluster.widths)
    width = arity(rel, context.env)
    cluster.leaves.append(rel)
    cluster.widths.append(width)
    return list(range(start, start + width))


def _build(cluster: _Cluster, context: Context, view: list[int]) -> plan_pb2.Relation:
    starts = []
    position = 0
    for width in cluster.widths:
        starts.append(position)
        position += width
    owner = [leaf for leaf, width in enumerate(cluster.widths) for _ in range(width)]
    count = len(cluster.leaves)

    def leaves_of(expr: plan_pb2.Scalar) -> frozenset[int]:
        return frozenset(owner[c] for c in columns_of(expr))

    # Single-input predicates go into their input; the rest wait for their inputs to meet.
    local: list[list[plan_pb2.Scalar]] = [[] for _ in range(count)]
    pending: list[tuple[plan_pb2.Scalar, frozenset[int]]] = []
    implied = _implied_equalities(cluster.predicates, owner)
    implied_keys = {key_of(p) for p in implied}
    for predicate in [*cluster.predicates, *implied]:
        used = leaves_of(predicate)
        if len(used) == 1:
            (leaf,) = used
            local[leaf].append(shifted(predicate, -starts[leaf]))
        else:
            pending.append((predicate, used))
    leaves = [
        pb.filter(leaf, *local[i]) if local[i] else leaf for i, leaf in enumerate(cluster.leaves)
    ]
    sizes = [estimate(leaf, context.stats, context.env) for leaf in leaves]
    domains = [estimate(leaf, context.stats, context.env, filters=False) for leaf in leaves]
    edges = _equalities(pending, leaves_of)

    def connected(joined: set[int], candidate: int) -> list[tuple[int, bool]]:
        """The joined inputs an equality links to ``candidate``, each with whether the
        equality is only implied."""
        return [
            (a if b == candidate else b, key_of(predicate) in implied_keys)
            for (a, b), predicate in edges
            if (a in joined and b == candidate) or (b in joined and a == candidate)
        ]

    def result_size(current: float, joined: set[int], candidate: int) -> float:
        size = current * sizes[candidate]
        links = connected(joined, candidate)
        # Implied equalities count only where no stated one links the candidate already.
        stated = {mine for mine, implied in links if not implied}
        for mine in stated or {mine for mine, _ in links}:
            size /= min(domains[mine], domains[candidate])
        return size

    linked = {leaf for (a, b), _ in edges for leaf in (a, b)}
    first = max(linked or range(count), key=lambda i: (sizes[i], -i))
    order = [first]
    joined = {first}
    current = sizes[first]
    while len(order) < count:
        rest = [i for i in range(count) if i not in joined]
        reachable = [i for i in rest if connected(joined, i)]
        choices = reachable or [i for i in rest if at_most_one_row(leaves[i], context.env)] or rest
        chosen = min(choices, key=lambda i: (result_size(current, joined, i), sizes[i], i))
        current = max(1.0, result_size(current, joined, chosen))
        order.append(chosen)
        joined.add(chosen)
    return _assemble(leaves, order, starts, cluster.widths, pending, leaves_of, view, implied_keys)


def _implied_equalities(
    predicates: list[plan_pb2.Scalar], owner: list[int]
) -> list[plan_pb2.Scalar]:
    """Equalities between columns of two inputs that the column equalities imply (a = b and
    b = c: a = c; TRUE only for non-NULL equal values, so transitive) and that no predicate
    states: they let the order join, say, lineitem to a set of order keys before orders,
    when both are equal to ``o_orderkey``."""
    parent: dict[int, int] = {}

    def find(c: int) -> int:
        while parent.get(c, c) != c:
            c = parent[c]
        return c

    stated: set[tuple[int, int]] = set()
    for predicate in predicates:
        sides = equality_sides(predicate)
        if sides is None or not all(side.WhichOneof("kind") == "column" for side in sides):
            continue
        a, b = sides[0].column, sides[1].column
        stated.add((min(a, b), max(a, b)))
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        parent[find(a)] = find(b)
    classes: dict[int, list[int]] = {}
    for column in sorted(parent):
        classes.setdefault(find(column), []).append(column)
    implied = []
    for members in classes.values():
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                if owner[a] != owner[b] and (a, b) not in stated:
                    implied.append(pb.call("eq", pb.column(a), pb.column(b)))
    return implied


def _equalities(
    pending: list[tuple[plan_pb2.Scalar, frozenset[int]]],
    leaves_of: Callable[[plan_pb2.Scalar], frozenset[int]],
) -> list[tuple[tuple[int, int], plan_pb2.Scalar]]:
    """Predicates ``eq(a, b)`` where ``a`` reads one input and ``b`` another."""
    found = []
    for predicate, _ in pending:
        sides = equality_sides(predicate)
        if sides is None:
            continue
        a, b = (leaves_of(side) for side in sides)
        if len(a) == 1 and len(b) == 1 and a != b:
            found.append(((next(iter(a)), next(iter(b))), predicate))
    return found


def _assemble(
    leaves: list[plan_pb2.Relation],
    order: list[int],
    starts: list[int],
    widths: list[int],
    pending: list[tuple[plan_pb2.Scalar, frozenset[int]]],
    leaves_of: Callable[[plan_pb2.Scalar], frozenset[int]],
    view: list[int],
    implied_keys: set[bytes],
) -> plan_pb2.Relation:
    """The left-deep join in ``order``: keys from equalities between the joined inputs and
    the new one, other predicates as soon as their inputs are all joined, and a Project back
    to the cluster root's columns (``view``: the cluster columns they are). An implied
    equality (``implied_keys``) is a key only where no stated one joins the new input, and
    never a filter: the stated equalities it follows from are all applied anyway."""
    layout: list[int] = []  # cluster column at each position of the tree built so far
    first = order[0]
    tree = leaves[first]
    layout.extend(range(starts[first], starts[first] + widths[first]))
    joined = {first}
    waiting = list(pending)
    for leaf in order[1:]:
        local = {starts[leaf] + i: i for i in range(widths[leaf])}
        here = {column: position for position, column in enumerate(layout)}
        keys: list[tuple[plan_pb2.Scalar, plan_pb2.Scalar, bool]] = []
        still = []
        for predicate, used in waiting:
            sides = equality_sides(predicate)
            if sides is not None and leaf in used and used <= joined | {leaf}:
                a, b = sides
                a_leaves, b_leaves = leaves_of(a), leaves_of(b)
                is_implied = key_of(predicate) in implied_keys
                if b_leaves == {leaf} and a_leaves and a_leaves <= joined:
                    keys.append((remapped(a, here), remapped(b, local), is_implied))
                    continue
                if a_leaves == {leaf} and b_leaves and b_leaves <= joined:
                    keys.append((remapped(b, here), remapped(a, local), is_implied))
                    continue
            still.append((predicate, used))
        chosen = [(x, y) for x, y, is_implied in keys if not is_implied] or [
            (x, y) for x, y, _ in keys
        ]
        tree = pb.join(tree, leaves[leaf], [x for x, _ in chosen], [y for _, y in chosen])
        layout.extend(range(starts[leaf], starts[leaf] + widths[leaf]))
        joined.add(leaf)
        here = {column: position for position, column in enumerate(layout)}
        ready = [p for p, used in still if used <= joined and key_of(p) not in implied_keys]
        waiting = [(p, used) for p, used in still if not used <= joined]
        if ready:
            tree = pb.filter(tree, *(remapped(p, here) for p in ready))
    here = {column: position for position, column in enumerate(layout)}
    waiting = [(p, used) for p, used in waiting if key_of(p) not in implied_keys]
    if waiting:  # predicates on no input's columns (constants)
        tree = pb.filter(tree, *(remapped(p, here) for p, _ in waiting))
    return pb.project(tree, *(here[c] for c in view))
