"""What planning a query yields: :class:`PlannedQuery` for the adapter, and :class:`Planned`,
the planner's own record of a (sub)query while it is being put together."""

from __future__ import annotations

from dataclasses import dataclass

from services.adapter.sql.relations import Rel
from services.adapter.sql.typed import Typed
from services.adapter.sql.types import type_name
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2


@dataclass(frozen=True)
class OutputColumn:
    """A result column: its SQL name (not necessarily unique), SQL type name and nullability."""

    name: str
    type: ScalarType

    @property
    def sql_type(self) -> str:
        return type_name(self.type)

    @property
    def nullable(self) -> bool:
        return self.type.nullable


@dataclass(frozen=True)
class SortSpec:
    """One ORDER BY key over the plan's output columns."""

    column: int
    descending: bool = False
    nulls_first: bool = False


@dataclass(frozen=True)
class Finishing:
    """What the adapter applies to the plan's rows (each repeated by its multiplicity): sort
    by ``order_by`` (then anything, ties are unordered), skip ``offset`` rows, keep ``limit``
    (None: all), then keep the columns ``project`` lists. The plan's output ends with any
    columns ORDER BY needs beyond the selected ones; ``project`` drops them."""

    order_by: tuple[SortSpec, ...]
    limit: int | None
    offset: int
    project: tuple[int, ...]

    @property
    def is_trivial(self) -> bool:
        """Nothing to do besides returning the rows (in any order). Columns beyond the
        selected ones exist only for an ORDER BY, so there is nothing to drop either."""
        return not self.order_by and self.limit is None and self.offset == 0


@dataclass(frozen=True)
class PlannedQuery:
    """A query lowered to the plan IR.

    ``plan`` reads only storage collections (views are inlined) and declares its output
    schema (names made unique). ``columns`` describe the result the client sees (after
    ``finishing``). ``depends_on`` holds the catalog ids of the relations named (views
    included), ``collections`` the storage collections the plan reads.
    """

    plan: plan_pb2.Plan
    columns: tuple[OutputColumn, ...]
    depends_on: frozenset[str]
    collections: frozenset[str]
    finishing: Finishing
    raw_plan: plan_pb2.Plan | None = None
    """The plan before optimization (``plan`` when none ran): what EXPLAIN RAW PLAN shows and
    what index matching compares with views' stored plans, which are kept unoptimized."""
    changed_by: tuple[str, ...] = ()
    """The optimizer rules that changed the plan."""

    @property
    def unoptimized(self) -> plan_pb2.Plan:
        return self.raw_plan if self.raw_plan is not None else self.plan


@dataclass
class Planned:
    """A (sub)query under construction. The relation's first ``visible`` columns are the
    selected ones; any after them are ORDER BY keys. ``order``/``limit``/``offset`` are still
    to be applied (by TopK, or left to the adapter for the outermost query)."""

    rel: Rel
    names: list[str]
    visible: int
    # Per selected column, the untyped literal it is (so a UNION or INSERT can still type it).
    unknowns: list[Typed | None]
    order: list[plan_pb2.SortKey]
    limit: int | None = None
    offset: int = 0
    # Known to have at most one row (a global aggregate, LIMIT 1, ...); in a correlated
    # subquery, at most one per row of outer values.
    at_most_one_row: bool = False
    # A correlated subquery's leading columns: the outer values (see correlation.py), which
    # LIMIT applies per combination of.
    correlation_width: int = 0
