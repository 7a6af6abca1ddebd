"""Which names a query's expressions can use, and where those columns sit.

A :class:`Frame` is the relation a clause works on (FROM's output, then aggregation's) and
the :class:`Scope` naming its columns, position by position. Lowering an expression may add
columns to the frame (a subquery's result joined on); those are unnamed. A scope knows its
enclosing query's scope to resolve correlated references (see correlation.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.adapter.sql.correlation import Correlation
from services.adapter.sql.errors import (
    AMBIGUOUS_COLUMN,
    UNDEFINED_COLUMN,
    UNDEFINED_TABLE,
    SqlError,
    not_supported,
)
from services.adapter.sql.relations import Rel, map_
from services.adapter.sql.typed import Typed, column


@dataclass(frozen=True)
class ScopeColumn:
    # "" for columns no name reaches (helpers added while planning).
    name: str
    # The table name or alias that qualifies it, if any.
    table: str | None = None
    # Reached only as table.name: the inputs of a USING join, whose merged column takes the
    # bare name.
    qualified_only: bool = False


@dataclass
class Scope:
    columns: list[ScopeColumn]
    parent: Scope | None = None
    # The positions a bare * expands to, when not simply every named, unqualified-reachable
    # column (USING joins put the merged columns first).
    star: list[int] | None = None
    tables: set[str] = field(default_factory=set)
    # In a correlated subquery: where names not found here are looked up (the query around
    # it), read through the subquery's first columns (see correlation.py).
    correlation: Correlation | None = None

    def _matches(self, name: str, table: str | None) -> list[int]:
        found = []
        for index, entry in enumerate(self.columns):
            if not entry.name or entry.name != name:
                continue
            if table is None and entry.qualified_only:
                continue
            if table is not None and entry.table != table:
                continue
            found.append(index)
        return found

    def resolve(self, name: str, table: str | None, position: int) -> int:
        """The position of column ``[table.]name``: 42703 if there is none, 42702 if it is
        ambiguous, 0A000 if it belongs to an enclosing query (a correlated reference)."""
        found = self._matches(name, table)
        if len(found) == 1:
            return found[0]
        label = f"{table}.{name}" if table else name
        if len(found) > 1:
            raise SqlError(AMBIGUOUS_COLUMN, f'column reference "{label}" is ambiguous', position)
        outer = self.parent
        while outer is not None:
            if outer._matches(name, table):
                raise not_supported(
                    f'correlated subqueries (the reference to outer column "{label}")',
                    position,
                )
            outer = outer.parent
        if self.correlation is not None:
            return self.correlation.resolve(name, table, position)
        if table is not None and table not in self.tables:
            raise SqlError(
                UNDEFINED_TABLE, f'missing FROM-clause entry for table "{table}"', position
            )
        raise SqlError(UNDEFINED_COLUMN, f'column "{label}" does not exist', position)

    def star_positions(self, table: str | None, position: int) -> list[int]:
        """What ``*`` (or ``table.*``) expands to."""
        if table is not None:
            found = [i for i, c in enumerate(self.columns) if c.name and c.table == table]
            if not found:
                raise SqlError(
                    UNDEFINED_TABLE, f'missing FROM-clause entry for table "{table}"', position
                )
            return found
        if self.star is not None:
            return list(self.star)
        return [i for i, c in enumerate(self.columns) if c.name and not c.qualified_only]

    def with_unnamed(self, count: int) -> Scope:
        return Scope(
            [*self.columns, *(ScopeColumn("") for _ in range(count))],
            self.parent,
            self.star,
            set(self.tables),
            self.correlation,
        )

    def behind(self, count: int, correlation: Correlation) -> Scope:
        """This scope with ``count`` unnamed columns in front (a correlated subquery's D),
        outer names resolved through ``correlation``."""
        return Scope(
            [*(ScopeColumn("") for _ in range(count)), *self.columns],
            None,
            None if self.star is None else [count + i for i in self.star],
            set(self.tables),
            correlation,
        )


@dataclass
class Frame:
    """The relation a clause works on and the names of its columns."""

    rel: Rel
    scope: Scope

    def add(self, expressions: Sequence[Typed]) -> list[Typed]:
        """Appends computed columns (unnamed); returns references to them."""
        start = self.rel.arity
        self.rel = map_(self.rel, expressions)
        self.scope = self.scope.with_unnamed(len(expressions))
        return [column(start + i, e.type) for i, e in enumerate(expressions)]

    def replace(self, rel: Rel) -> None:
        """Takes ``rel``, whose first columns are the current ones and the rest unnamed."""
        extra = rel.arity - self.rel.arity
        assert extra >= 0
        self.rel = rel
        self.scope = self.scope.with_unnamed(extra)

    def column(self, position: int) -> Typed:
        return column(position, self.rel.types[position])
