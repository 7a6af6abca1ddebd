"""Common subplans shared through Let: a subtree that occurs more than once (a view inlined
twice, a CTE planned twice) is bound once at the root and read by LocalGet, so compute
builds and maintains it once.

Equivalence: Let(id, v, body) equals body with every LocalGet(id) replaced by v, when v reads
no Let binding itself (then it means the same at the root as where it stood).
"""

from __future__ import annotations

from collections import Counter

from tidemark.plan import builders as pb
from tidemark.plan.optimize.rewrite import Context, copy, with_inputs
from tidemark.plan.walk import relations
from tidemark.v1 import plan_pb2

_TRIVIAL = {"get", "constant", "local_get"}
MAX_SHARED = 16


def share_subplans(rel: plan_pb2.Relation, context: Context) -> plan_pb2.Relation:
    root = rel
    taken = {node.let.id for node in relations(root) if node.HasField("let")}
    taken |= set(context.env)
    for _ in range(MAX_SHARED):
        repeated = _largest_repeated(root)
        if repeated is None:
            break
        let_id = max(taken, default=0) + 1
        taken.add(let_id)
        key = repeated.SerializeToString(deterministic=True)
        body = _replace(root, key, let_id, context)
        root = pb.let(let_id, copy(repeated), body)
    return root


def _closed(node: plan_pb2.Relation) -> bool:
    return not any(n.HasField("local_get") or n.HasField("let") for n in relations(node))


def _largest_repeated(root: plan_pb2.Relation) -> plan_pb2.Relation | None:
    counts: Counter[bytes] = Counter()
    nodes: dict[bytes, plan_pb2.Relation] = {}
    for node in relations(root):
        if node.WhichOneof("kind") in _TRIVIAL:
            continue
        key = node.SerializeToString(deterministic=True)
        counts[key] += 1
        nodes.setdefault(key, node)
    candidates = [key for key, count in counts.items() if count > 1 and _closed(nodes[key])]
    if not candidates:
        return None
    return nodes[max(candidates, key=lambda k: (len(k), k))]


def _replace(
    rel: plan_pb2.Relation, key: bytes, let_id: int, context: Context
) -> plan_pb2.Relation:
    if rel.WhichOneof("kind") not in _TRIVIAL and rel.SerializeToString(deterministic=True) == key:
        return pb.local_get(let_id)
    return with_inputs(rel, lambda child, ctx: _replace(child, key, let_id, ctx), context)
