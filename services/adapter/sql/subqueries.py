"""Uncorrelated subqueries inside expressions, joined onto the frame they are used in.

Each subquery's result is computed once and joined to every row of the frame (left outer
joins keep every row), then the expression reads the joined columns:

* ``(SELECT ...)``: at most one row; a left join with no keys gives its value, or NULL when it
  has no row.
* ``EXISTS (...)``: the subquery reduced to one TRUE row if it has any; joined, NOT NULL means
  it exists.
* ``x IN (...)``: SQL's three-valued answer. The distinct non-NULL values are joined on ``x``
  (a match means TRUE); the subquery's row count and non-NULL count (joined without keys)
  tell FALSE (no rows, or ``x`` is not NULL and no NULL in the subquery) from NULL.
"""

from __future__ import annotations

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError, not_supported
from services.adapter.sql.scope import Frame
from services.adapter.sql.typed import Typed
from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb


def _single_column(rel: r.Rel, what: str, position: int) -> None:
    if rel.arity != 1:
        raise SqlError(SYNTAX_ERROR, f"subquery {what} must return only one column", position)


def scalar_subquery(frame: Frame, rel: r.Rel, at_most_one_row: bool, position: int) -> Typed:
    _single_column(rel, "used as an expression", position)
    if not at_most_one_row:
        raise not_supported(
            "a scalar subquery that may return more than one row (use an aggregate or LIMIT 1)",
            position,
        )
    start = frame.rel.arity
    frame.replace(r.join(frame.rel, rel, kind="left_outer"))
    return frame.column(start).at(position)


def exists(frame: Frame, rel: r.Rel, position: int) -> Typed:
    marker = r.project(r.map_(rel, [t.true_literal()]), [rel.arity])
    start = frame.rel.arity
    frame.replace(r.join(frame.rel, r.distinct(marker), kind="left_outer"))
    return t.call("is_not_null", frame.column(start), position=position)


def in_subquery(frame: Frame, needle: Typed, rel: r.Rel, binding: int, position: int) -> Typed:
    """``needle IN (subquery)``; ``needle`` is an expression over the frame."""
    _single_column(rel, "in IN", position)
    value = t.column(0, rel.types[0])
    needle, value = t.comparable_pair(needle, value, "=", position)
    if value.scalar.WhichOneof("kind") != "column":
        # The subquery's side had to be converted (a date meeting a timestamp).
        rel = r.project(r.map_(rel, [value]), [1])
        value = t.column(0, rel.types[0])
    shared = r.local_get(binding, rel.types)
    values = r.distinct(r.filter_(shared, [t.call("is_not_null", value)]))
    counts = r.reduce(shared, [], [pb.aggregate("count"), pb.aggregate("count", value.scalar)])
    start = frame.rel.arity
    joined = r.join(frame.rel, values, [needle], [value], kind="left_outer")
    joined = r.join(joined, counts, kind="left_outer")
    frame.replace(r.let(binding, rel, joined))
    matched, rows, nonnull = (frame.column(start + i) for i in range(3))
    unknown = t.null(t.BOOL)
    maybe_null = t.call("or", t.call("is_null", needle), t.call("lt", nonnull, rows))
    otherwise = t.case(maybe_null, unknown, t.false_literal())
    otherwise = t.case(t.call("is_null", rows), t.false_literal(), otherwise)
    answer = t.case(t.call("is_not_null", matched), t.true_literal(), otherwise, position)
    assert answer.type.kind is ColumnType.BOOL
    return answer
