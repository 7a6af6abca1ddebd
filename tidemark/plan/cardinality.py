"""Which relations can hold at most one row, and so which keyless joins are cross products.

A join with no keys pairs every row of one side with every row of the other. When one side
can never hold more than one row (a global aggregate, a LIMIT 1, a one-row constant) that only
adds its columns to each row; otherwise it is a cross product, which EXPLAIN names as such.
"""

from __future__ import annotations

from tidemark.v1 import plan_pb2

Env = dict[int, plan_pb2.Relation]
"""Let bindings in scope: id -> the bound value."""


def at_most_one_row(rel: plan_pb2.Relation, env: Env | None = None) -> bool:
    """True when ``rel`` can never hold more than one row (counting multiplicity): a global
    aggregate, a LIMIT 1, a single-row constant, and what keeps or shrinks those. A join with
    such a relation and no keys is no cross product: it adds columns to each row."""
    kind = rel.WhichOneof("kind")
    if kind == "reduce":
        return not rel.reduce.group_key
    if kind == "top_k":
        top = rel.top_k
        return not top.group_key and top.HasField("limit") and top.limit <= 1
    if kind == "constant":
        return sum(abs(row.diff or 1) for row in rel.constant.rows) <= 1
    if kind in ("filter", "map", "project", "distinct", "threshold", "window"):
        return at_most_one_row(getattr(rel, kind).input, env)
    if kind == "join":
        return at_most_one_row(rel.join.left, env) and at_most_one_row(rel.join.right, env)
    if kind == "let":
        inner = dict(env or {})
        inner[rel.let.id] = rel.let.value
        return at_most_one_row(rel.let.body, inner)
    if kind == "local_get":
        bound = (env or {}).get(rel.local_get.id)
        return bound is not None and at_most_one_row(bound, env)
    return False


def is_cross_product(join: plan_pb2.Join, env: Env | None = None) -> bool:
    """A keyless join of two relations that may each hold many rows."""
    if join.left_keys:
        return False
    return not (at_most_one_row(join.left, env) or at_most_one_row(join.right, env))
