"""Correlated subqueries, decorrelated: a subquery that names columns of the query around it
is planned once over the distinct values of those columns, then joined back.

For a subquery over an outer relation R that reads R's columns P:

* D = Distinct(Project(R, P)): every combination of outer values the subquery can see.
* The subquery is planned with D's columns first in its FROM (D joined to its FROM items
  with no keys), outer references reading them. Every clause keeps them first: GROUP BY
  groups by them too, a global aggregate is one group per D row (a D row whose group is
  empty gets the aggregates of no rows: 0 for counts, NULL otherwise), LIMIT keeps its rows
  per D row, DISTINCT and set operations compare them with the rest of the row.
* The result, with D's columns first, is joined back to R (left outer) on D's columns with a
  NULL-safe equality: keys ``is_null(c)`` and ``coalesce(c, a fixed value)`` on both sides,
  since an outer value may be NULL and must still find its own answer.

Equalities between D's columns and the subquery's (``l_orderkey = o_orderkey``) sit in a
filter over D and FROM; the optimizer turns them into join keys. R is bound once by a Let and
read both for D and for the join back.

The outer columns a subquery reads are found while planning it: resolving a name that is
not its own records the outer column and restarts the planning with D widened
(:class:`CorrelationGrew`), until nothing new is found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.errors import not_supported
from services.adapter.sql.relations import null_safe_keys
from tidemark.columnar import ColumnType


class CorrelationGrew(Exception):
    """The subquery reads an outer column its D does not have yet: plan it again."""

    def __init__(self, correlation: Correlation) -> None:
        super().__init__("correlation grew")
        self.correlation = correlation


OuterResolver = Callable[[str, "str | None", int], int]
"""Finds ``[table.]name`` among the outer frame's columns (through GROUP BY's substitution
when the outer frame is grouped); raises SqlError as name resolution does."""


@dataclass
class Correlation:
    """A subquery's view of the query around it: how its names resolve, the outer frame's
    relation (bound as ``binding``), and the outer columns read so far, in D's order."""

    outer: OuterResolver
    outer_types: r.Types
    binding: int
    positions: list[int] = field(default_factory=list)

    @property
    def width(self) -> int:
        return len(self.positions)

    def resolve(self, name: str, table: str | None, where: int) -> int:
        """The position of an outer column among D's columns (the first ones of every frame of
        the subquery)."""
        outer_position = self.outer(name, table, where)
        if outer_position in self.positions:
            return self.positions.index(outer_position)
        if self.outer_types[outer_position].kind is ColumnType.JSON:
            raise not_supported(f'a correlated reference to the jsonb column "{name}"', where)
        self.positions.append(outer_position)
        raise CorrelationGrew(self)

    @property
    def nullable(self) -> list[bool]:
        """Per D column, whether the outer column it holds may be NULL."""
        return [self.outer_types[p].nullable for p in self.positions]

    def outer_relation(self) -> r.Rel:
        return r.local_get(self.binding, self.outer_types)

    def values(self) -> r.Rel:
        """D: the distinct combinations of the outer columns read."""
        return r.distinct(r.project(self.outer_relation(), self.positions))

    def with_values(self, rel: r.Rel) -> r.Rel:
        """D joined with ``rel`` (no keys): D's columns first."""
        return r.join(self.values(), rel)


def join_back(outer: r.Rel, correlation: Correlation, result: r.Rel) -> r.Rel:
    """``outer`` (the relation the correlation's binding names) left-joined with ``result``
    (D's columns first) on the correlated columns, under the Let that binds it."""
    joined = r.join(
        correlation.outer_relation(),
        result,
        null_safe_keys(outer, correlation.positions, correlation.nullable),
        null_safe_keys(result, list(range(correlation.width)), correlation.nullable),
        kind="left_outer",
    )
    return r.let(correlation.binding, outer, joined)


def all_groups(reduced: r.Rel, correlation: Correlation, counts: list[bool]) -> r.Rel:
    """A correlated global aggregate (grouped by D's columns) with a row for every D row:
    a D row whose group is empty gets the aggregates of no rows (counts 0, the rest NULL)."""
    width = correlation.width
    values = correlation.values()
    joined = r.join(
        values,
        reduced,
        null_safe_keys(values, list(range(width)), correlation.nullable),
        null_safe_keys(reduced, list(range(width)), correlation.nullable),
        kind="left_outer",
    )
    fixed = [t.column(i, joined.types[i]) for i in range(width)]
    for index, is_count in enumerate(counts):
        value = t.column(2 * width + index, joined.types[2 * width + index])
        if is_count:
            value = t.call("coalesce", value, t.literal(0, t.INT64))
        fixed.append(value)
    mapped = r.map_(joined, fixed)
    return r.project(mapped, range(joined.arity, mapped.arity))
