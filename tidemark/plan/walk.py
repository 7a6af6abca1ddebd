"""Walking a plan's relation tree, and the storage collections its Gets read.

Every relation node holds its inputs as ``Relation`` fields (single or repeated), so the walk
finds them by the fields' message type: it stays correct when node kinds are added.
"""

from __future__ import annotations

from collections.abc import Iterator

from tidemark.v1 import plan_pb2

_RELATION = plan_pb2.Relation.DESCRIPTOR


def inputs(relation: plan_pb2.Relation) -> list[plan_pb2.Relation]:
    """The relations ``relation`` reads directly, in field order (none for a leaf)."""
    kind = relation.WhichOneof("kind")
    if kind is None:
        return []
    found: list[plan_pb2.Relation] = []
    for field, value in getattr(relation, kind).ListFields():
        if field.message_type is not _RELATION:
            continue
        if isinstance(value, plan_pb2.Relation):
            found.append(value)
        else:
            found.extend(value)
    return found


def relations(relation: plan_pb2.Relation) -> Iterator[plan_pb2.Relation]:
    """Every relation node of the tree, ``relation`` first, depth first. The nodes are the
    tree's own messages: changing one changes the tree."""
    stack = [relation]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(inputs(node))


def collections_read(plan: plan_pb2.Plan | plan_pb2.Relation) -> set[str]:
    """The ids of the storage collections the Get nodes of ``plan`` read."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    return {node.get.collection_id for node in relations(root) if node.HasField("get")}


def columns_read(plan: plan_pb2.Plan | plan_pb2.Relation) -> dict[str, set[int] | None]:
    """Per collection read, the positions of its columns the plan ever looks at: ``None``
    (every column) unless each of its Gets sits right under a Project, whose columns are then
    the only ones read. The optimizer's projection pushdown puts such Projects in place, so a
    one-shot query can fetch just these columns from storage."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    read: dict[str, set[int] | None] = {}

    def note(collection_id: str, columns: set[int] | None) -> None:
        if collection_id in read:
            before = read[collection_id]
            read[collection_id] = None if before is None or columns is None else before | columns
        else:
            read[collection_id] = columns

    for node in relations(root):
        if node.HasField("project") and node.project.input.HasField("get"):
            note(node.project.input.get.collection_id, set(node.project.columns))
        for child in inputs(node):
            if child.HasField("get") and not node.HasField("project"):
                note(child.get.collection_id, None)
    if root.HasField("get"):
        note(root.get.collection_id, None)
    return read
