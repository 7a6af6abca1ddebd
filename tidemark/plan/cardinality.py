"""Which relations can hold at most one row, and so which keyless joins are cross products.

A join with no keys pairs every row of one side with every row of the other. When one side
can never hold more than one row (a global aggregate, a LIMIT 1, a one-row constant) that only
adds its columns to each row; otherwise it is a cross product, which EXPLAIN names as such.
"""

from __future__ import annotations

from typing import Any

from tidemark.v1 import plan_pb2

Env = dict[int, plan_pb2.Relation]
"""Let bindings in scope: id -> the bound value, closed over the scope it was bound in (see
:func:`bind`), so a LocalGet in it resolves in whatever scope it is read from."""


def bind(env: Env | None, let: plan_pb2.Let) -> Env:
    """``env`` inside ``let``'s body. A Let may rebind an id an outer Let bound; a LocalGet of
    that id in the new value (which cannot refer to its own Let) or in a value bound before
    means the outer binding, so those LocalGets are replaced by the outer value first. Without
    a rebinding nothing is copied."""
    scope = dict(env or {})
    outer = scope.get(let.id)
    if outer is None:
        scope[let.id] = let.value
        return scope
    closed = {key: _substituted(value, let.id, outer) for key, value in scope.items()}
    closed[let.id] = _substituted(let.value, let.id, outer)
    return closed


def _substituted(
    rel: plan_pb2.Relation, let_id: int, value: plan_pb2.Relation
) -> plan_pb2.Relation:
    """``rel`` with every LocalGet of ``let_id`` not bound inside it replaced by ``value``."""
    if not _reads(rel, let_id):
        return rel
    copy = plan_pb2.Relation()
    copy.CopyFrom(rel)
    _replace(copy, let_id, value)
    return copy


def _reads(message: Any, let_id: int) -> bool:
    if isinstance(message, plan_pb2.Relation):
        kind = message.WhichOneof("kind")
        if kind == "local_get":
            return message.local_get.id == let_id
        if kind == "let" and message.let.id == let_id:
            return _reads(message.let.value, let_id)
    return any(_reads(child, let_id) for child in _children(message))


def _replace(message: Any, let_id: int, value: plan_pb2.Relation) -> None:
    if isinstance(message, plan_pb2.Relation):
        kind = message.WhichOneof("kind")
        if kind == "local_get":
            if message.local_get.id == let_id:
                message.CopyFrom(value)
            return
        if kind == "let" and message.let.id == let_id:
            _replace(message.let.value, let_id, value)  # its body reads its own binding
            return
    for child in _children(message):
        _replace(child, let_id, value)


def _children(message: Any) -> list[Any]:
    children: list[Any] = []
    for descriptor, field_value in message.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.is_repeated:
            children.extend(field_value)
        else:
            children.append(field_value)
    return children


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
        return at_most_one_row(rel.let.body, bind(env, rel.let))
    if kind == "local_get":
        bound = (env or {}).get(rel.local_get.id)
        return bound is not None and at_most_one_row(bound, env)
    return False


def is_cross_product(join: plan_pb2.Join, env: Env | None = None) -> bool:
    """A keyless join of two relations that may each hold many rows."""
    if join.left_keys:
        return False
    return not (at_most_one_row(join.left, env) or at_most_one_row(join.right, env))
