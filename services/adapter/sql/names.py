"""Identifiers and source positions of sqlglot syntax trees.

PostgreSQL folds unquoted identifiers to lower case and keeps quoted ones as written. Every
tree the parser builds comes from tokens of the whole request, so the character offsets sqlglot
records are offsets in the request: positions reported to the client are 1-based.
"""

from __future__ import annotations

from sqlglot import exp

QualifiedName = tuple[str, ...]


def identifier(node: exp.Expr | str | None) -> str:
    """The name an identifier stands for: as written when quoted, else lower case."""
    if node is None:
        return ""
    if isinstance(node, str):
        return node.lower()
    if isinstance(node, exp.Identifier):
        return str(node.this) if node.quoted else str(node.this).lower()
    if isinstance(node, exp.Star):
        return "*"
    return str(node.name).lower()


def table_name(table: exp.Table) -> QualifiedName:
    """The parts of a table reference, outermost first: ``(db, schema, name)`` or shorter."""
    parts = [table.args.get("catalog"), table.args.get("db"), table.this]
    return tuple(identifier(p) for p in parts if p is not None and identifier(p) != "")


def dotted(name: QualifiedName) -> str:
    return ".".join(name)


def _earliest(node: exp.Expr) -> int | None:
    best: int | None = None
    for part in node.walk():
        meta = part.meta if isinstance(part, exp.Expr) else None
        if meta and "start" in meta:
            start = int(meta["start"])
            best = start if best is None else min(best, start)
    return best


def position(node: exp.Expr | None) -> int:
    """The 1-based offset of the first character of ``node`` in the request (sqlglot records
    offsets of names, literals and function calls; a node without any is placed at its
    nearest enclosing node that has one), 0 if unknown."""
    while node is not None:
        start = _earliest(node)
        if start is not None:
            return start + 1
        node = node.parent
    return 0
