"""Scalar expressions as the optimizer moves them: the columns an expression reads, the same
expression over other column positions, conjunctions split and joined, literal tests.

Moving an expression is always safe in this IR: evaluation is deterministic and never fails
(plan.proto: an error is NULL), so an expression may be evaluated earlier, later or more often
without changing any answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2


def columns_of(expr: plan_pb2.Scalar) -> set[int]:
    """The input column positions ``expr`` reads."""
    found: set[int] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        kind = node.WhichOneof("kind")
        if kind == "column":
            found.add(node.column)
        elif kind == "call":
            stack.extend(node.call.args)
        elif kind == "case":
            stack.extend((node.case.cond, node.case.then, node.case.otherwise))
        elif kind == "cast":
            stack.append(node.cast.input)
    return found


def replaced(expr: plan_pb2.Scalar, column: Callable[[int], plan_pb2.Scalar]) -> plan_pb2.Scalar:
    """``expr`` with every column reference ``c`` replaced by ``column(c)``."""
    kind = expr.WhichOneof("kind")
    if kind == "column":
        result = plan_pb2.Scalar()
        result.CopyFrom(column(expr.column))
        return result
    result = plan_pb2.Scalar()
    if kind == "call":
        result.call.function = expr.call.function
        result.call.args.extend(replaced(arg, column) for arg in expr.call.args)
    elif kind == "case":
        result.case.cond.CopyFrom(replaced(expr.case.cond, column))
        result.case.then.CopyFrom(replaced(expr.case.then, column))
        result.case.otherwise.CopyFrom(replaced(expr.case.otherwise, column))
    elif kind == "cast":
        result.cast.input.CopyFrom(replaced(expr.cast.input, column))
        result.cast.to.CopyFrom(expr.cast.to)
    else:
        result.CopyFrom(expr)
    return result


def remapped(expr: plan_pb2.Scalar, mapping: Mapping[int, int] | Sequence[int]) -> plan_pb2.Scalar:
    """``expr`` reading column ``mapping[c]`` wherever it read ``c``."""
    return replaced(expr, lambda c: pb.column(mapping[c]))


def shifted(expr: plan_pb2.Scalar, offset: int) -> plan_pb2.Scalar:
    return replaced(expr, lambda c: pb.column(c + offset))


def conjuncts(expr: plan_pb2.Scalar) -> list[plan_pb2.Scalar]:
    """The parts of a conjunction (``and`` nested any way), or ``[expr]``."""
    if expr.WhichOneof("kind") == "call" and expr.call.function == "and":
        return [part for arg in expr.call.args for part in conjuncts(arg)]
    return [expr]


def all_conjuncts(predicates: Iterable[plan_pb2.Scalar]) -> list[plan_pb2.Scalar]:
    return [part for predicate in predicates for part in conjuncts(predicate)]


def bool_literal(expr: plan_pb2.Scalar) -> bool | str | None:
    """``True``/``False``/``None`` for a BOOL literal (None is NULL); ``"?"`` otherwise."""
    if expr.WhichOneof("kind") != "literal" or expr.literal.type != ColumnType.BOOL.value:
        return "?"
    if expr.literal.WhichOneof("value") is None:
        return None
    return bool(expr.literal.bool_value)


def true_literal() -> plan_pb2.Scalar:
    return pb.literal(True, ColumnType.BOOL)


def false_literal() -> plan_pb2.Scalar:
    return pb.literal(False, ColumnType.BOOL)


def equality_sides(expr: plan_pb2.Scalar) -> tuple[plan_pb2.Scalar, plan_pb2.Scalar] | None:
    """``(a, b)`` for ``eq(a, b)``."""
    if (
        expr.WhichOneof("kind") == "call"
        and expr.call.function == "eq"
        and len(expr.call.args) == 2
    ):
        return expr.call.args[0], expr.call.args[1]
    return None


def key_of(expr: plan_pb2.Scalar) -> bytes:
    """A stable identity for an expression (equal bytes: the same expression)."""
    return expr.SerializeToString(deterministic=True)
