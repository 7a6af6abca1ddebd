"""Subqueries inside expressions, joined onto the frame they are used in.

A correlated subquery (one reading the frame's columns) comes planned with the outer values
first and is joined back on them instead of to every row (see correlation.py); the answers
below are then computed per row of outer values, the same way.

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
from services.adapter.sql.correlation import Correlation, join_back
from services.adapter.sql.errors import SYNTAX_ERROR, SqlError, not_supported
from services.adapter.sql.relations import null_safe_keys
from services.adapter.sql.scope import Frame
from services.adapter.sql.typed import Typed
from tidemark.columnar import ColumnType
from tidemark.plan import builders as pb


def _width(correlation: Correlation | None) -> int:
    return correlation.width if correlation is not None else 0


def scalar_subquery(
    frame: Frame,
    rel: r.Rel,
    at_most_one_row: bool,
    position: int,
    correlation: Correlation | None = None,
) -> Typed:
    width = _width(correlation)
    if rel.arity != width + 1:
        raise SqlError(
            SYNTAX_ERROR, "subquery used as an expression must return only one column", position
        )
    if not at_most_one_row:
        raise not_supported(
            "a scalar subquery that may return more than one row (use an aggregate or LIMIT 1)",
            position,
        )
    start = frame.rel.arity
    if correlation is not None:
        frame.replace(join_back(frame.rel, correlation, rel))
    else:
        frame.replace(r.join(frame.rel, rel, kind="left_outer"))
    return frame.column(start + width).at(position)


def exists(
    frame: Frame, rel: r.Rel, position: int, correlation: Correlation | None = None
) -> Typed:
    width = _width(correlation)
    # One row per combination of outer values that has any row (one row if uncorrelated).
    keys = r.project(rel, range(width))
    marker = r.project(r.map_(keys, [t.true_literal()]), range(width + 1))
    if correlation is None:
        marker = r.project(r.map_(rel, [t.true_literal()]), [rel.arity])
    start = frame.rel.arity
    if correlation is not None:
        frame.replace(join_back(frame.rel, correlation, r.distinct(marker)))
    else:
        frame.replace(r.join(frame.rel, r.distinct(marker), kind="left_outer"))
    return t.call("is_not_null", frame.column(start + width), position=position)


def in_subquery(
    frame: Frame,
    needle: Typed,
    rel: r.Rel,
    binding: int,
    position: int,
    correlation: Correlation | None = None,
) -> Typed:
    """``needle IN (subquery)``; ``needle`` is an expression over the frame."""
    width = _width(correlation)
    if rel.arity != width + 1:
        raise SqlError(SYNTAX_ERROR, "subquery in IN must return only one column", position)
    value = t.column(width, rel.types[width])
    needle, value = t.comparable_pair(needle, value, "=", position)
    if value.scalar.WhichOneof("kind") != "column":
        # The subquery's side had to be converted (a date meeting a timestamp).
        mapped = r.map_(rel, [value])
        rel = r.project(mapped, [*range(width), mapped.arity - 1])
        value = t.column(width, rel.types[width])
    shared = r.local_get(binding, rel.types)
    outer_keys = list(range(width))
    values = r.distinct(r.filter_(shared, [t.call("is_not_null", value)]))
    counts = r.reduce(
        shared, outer_keys, [pb.aggregate("count"), pb.aggregate("count", value.scalar)]
    )
    start = frame.rel.arity
    if correlation is None:
        joined = r.join(frame.rel, values, [needle], [value], kind="left_outer")
        joined = r.join(joined, counts, kind="left_outer")
        frame.replace(r.let(binding, rel, joined))
    else:
        outer = correlation.outer_relation()
        nullable = correlation.nullable
        on_outer = null_safe_keys(frame.rel, correlation.positions, nullable)
        joined = r.join(
            outer,
            values,
            [*on_outer, needle],
            [*null_safe_keys(values, outer_keys, nullable), value],
            kind="left_outer",
        )
        joined = r.join(
            joined,
            counts,
            on_outer,
            null_safe_keys(counts, outer_keys, nullable),
            kind="left_outer",
        )
        frame.replace(r.let(correlation.binding, frame.rel, r.let(binding, rel, joined)))
    matched = frame.column(start + width)
    rows, nonnull = (frame.column(start + 2 * width + 1 + i) for i in range(2))
    unknown = t.null(t.BOOL)
    maybe_null = t.call("or", t.call("is_null", needle), t.call("lt", nonnull, rows))
    otherwise = t.case(maybe_null, unknown, t.false_literal())
    otherwise = t.case(t.call("is_null", rows), t.false_literal(), otherwise)
    answer = t.case(t.call("is_not_null", matched), t.true_literal(), otherwise, position)
    assert answer.type.kind is ColumnType.BOOL
    return answer
