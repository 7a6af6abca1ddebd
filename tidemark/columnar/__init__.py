"""Columnar update batches: relation schemas, Arrow update tables and their algebra, and
their bytes (Arrow IPC on the wire, Parquet at rest).

An update batch is an Arrow table with one column per relation column, then ``time``
(uint64) and ``diff`` (int64). Operations on it run in Arrow compute, not per row in Python.
"""

from tidemark.columnar.io import from_ipc, from_parquet, to_ipc, to_parquet
from tidemark.columnar.rows import (
    Row,
    RowUpdate,
    rows_from_table,
    table_from_updates,
    updates_from_table,
    version_from_table,
)
from tidemark.columnar.schema import (
    DIFF_COLUMN,
    TIME_COLUMN,
    Column,
    ColumnType,
    RelationSchema,
)
from tidemark.columnar.updates import (
    advance_by,
    advance_times,
    bound_frontier,
    concat,
    conform,
    consolidate,
    counts_by_time,
    data_columns,
    empty_updates,
    frontier_bound,
    project,
    select_times,
    slices,
    time_range,
    with_time,
)

__all__ = [
    "DIFF_COLUMN",
    "TIME_COLUMN",
    "Column",
    "ColumnType",
    "RelationSchema",
    "Row",
    "RowUpdate",
    "advance_by",
    "advance_times",
    "bound_frontier",
    "concat",
    "conform",
    "consolidate",
    "counts_by_time",
    "data_columns",
    "empty_updates",
    "from_ipc",
    "from_parquet",
    "frontier_bound",
    "project",
    "rows_from_table",
    "select_times",
    "slices",
    "table_from_updates",
    "time_range",
    "to_ipc",
    "to_parquet",
    "updates_from_table",
    "version_from_table",
    "with_time",
]
