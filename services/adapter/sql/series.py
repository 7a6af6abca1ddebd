"""``generate_series(start, stop [, step])`` in FROM, over integer constants.

The series is computed while planning and carried in the plan as a constant relation, so its
arguments must be constants (literals, possibly negated or cast) and its length is capped at
:data:`MAX_SERIES_ROWS`: a dataflow or a materialized view built on it holds every row in its
plan. As in PostgreSQL the series includes ``stop`` when the steps reach it exactly, is empty
when ``start`` is already past ``stop`` in the step's direction, and is empty when an argument
is NULL (the function is strict). PostgreSQL types it int4 or int8 after its arguments; every
integer in Tidemark is a bigint, so the column is a bigint (never NULL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from services.adapter.sql import relations as r
from services.adapter.sql import typed as t
from services.adapter.sql.errors import INVALID_PARAMETER, SqlError, not_supported
from services.adapter.sql.expressions import Lowerer, contains_subquery
from services.adapter.sql.names import position
from services.adapter.sql.scope import Frame, Scope, ScopeColumn
from services.adapter.sql.types import type_name
from tidemark.columnar import ColumnType

if TYPE_CHECKING:
    from services.adapter.sql.expressions import SubqueryPlanner

PROGRAM_LIMIT_EXCEEDED = "54000"

# About 12 MB of plan and a few seconds of planning at the cap; a larger table is loaded with
# COPY or with several INSERTs.
MAX_SERIES_ROWS = 1_000_000

NAME = "generate_series"


def series_length(start: int, stop: int, step: int) -> int:
    """How many values ``start, start + step, ...`` reach without passing ``stop``."""
    if step > 0:
        return 0 if start > stop else (stop - start) // step + 1
    return 0 if start < stop else (start - stop) // -step + 1


def generate_series(planner: SubqueryPlanner, node: exp.ExplodingGenerateSeries) -> r.Rel:
    """The series' rows as a one-column constant relation."""
    where = position(node)
    arguments = [node.args.get("start"), node.args.get("end"), node.args.get("step")]
    values = [_integer_constant(planner, a) for a in arguments if a is not None]
    column_type = t.INT64.with_nullable(False)
    if any(v is None for v in values):
        return r.constant([column_type], [])
    start, stop = values[0], values[1]
    step = values[2] if len(values) == 3 else 1
    assert start is not None and stop is not None and step is not None
    if step == 0:
        raise SqlError(INVALID_PARAMETER, "step size cannot equal zero", where)
    length = series_length(start, stop, step)
    if length > MAX_SERIES_ROWS:
        raise SqlError(
            PROGRAM_LIMIT_EXCEEDED,
            f"generate_series would produce {length} rows, more than the limit of "
            f"{MAX_SERIES_ROWS:,}",
            where,
            hint="the series is planned as constant rows; load larger tables with COPY, or "
            "insert the series in parts",
        )
    return r.constant([column_type], [(start + i * step,) for i in range(length)])


def _integer_constant(planner: SubqueryPlanner, node: exp.Expr) -> int | None:
    """An argument's value (None for NULL); 0A000 for anything but an integer constant."""
    where = position(node)
    if contains_subquery(node) or node.find(exp.Column) is not None:
        raise not_supported(f"{NAME} with arguments other than constants", where)
    # No column is in reach: the arguments read no row.
    frame = Frame(r.one_row(), Scope([ScopeColumn("")]))
    value = Lowerer(frame, planner, f"{NAME} arguments").lower(node)
    if value.unknown_text is not None:
        value = t.coerce(value, t.INT64, where)
    if value.unknown_null:
        return None
    if value.type.kind is not ColumnType.INT64:
        kind = "numeric" if value.type.kind is ColumnType.DECIMAL else type_name(value.type)
        raise not_supported(f"{NAME} over {kind}", where)
    if not t.is_literal(value):
        raise not_supported(f"{NAME} with arguments other than constants", where)
    result = t.literal_value(value)
    assert result is None or isinstance(result, int)
    return result
