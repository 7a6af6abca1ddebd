"""Update batches as Arrow tables: the relation's columns, then ``time`` and ``diff``.

The same algebra as :mod:`tidemark.updates`, done column-at-a-time by Arrow compute so that
no Python code runs per row: consolidation (sum the diffs of equal ``(data, time)``, drop
zeros, sort by data then time), compaction (``advance_by``), time-range selection and the
per-time counts CDCv2 progress statements need. Times are on the u64 timeline.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.columnar.schema import DIFF_COLUMN, TIME_COLUMN, TIME_TYPE, RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain, u64_frontier
from tidemark.lattice import U64_MAX


def data_columns(table: pa.Table) -> list[str]:
    """The names of the data columns: everything but ``time`` and ``diff``."""
    return [name for name in table.column_names if name not in (TIME_COLUMN, DIFF_COLUMN)]


def empty_updates(schema: RelationSchema) -> pa.Table:
    return schema.update_schema().empty_table()


def conform(table: pa.Table, schema: RelationSchema) -> pa.Table:
    """``table`` as an update batch of ``schema``: columns reordered to the schema's order and
    cast to its exact types where that loses nothing (e.g. int32 to int64). Raises
    ``InvalidArgument`` for missing, extra or duplicate columns, lossy casts, and nulls in
    ``time``, ``diff`` or a non-nullable column."""
    target = schema.update_schema()
    names = table.column_names
    if names == target.names:  # the usual case: nothing to look up by name
        columns = table.columns
    else:
        if len(set(names)) != len(names):
            raise InvalidArgument(f"update batch has duplicate column names: {names}")
        missing = [name for name in target.names if name not in names]
        extra = [name for name in names if name not in target.names]
        if missing or extra:
            raise InvalidArgument(
                f"update batch columns {names} do not match the collection's "
                f"{target.names} (missing {missing}, unexpected {extra})"
            )
        columns = [table.column(name) for name in target.names]
    arrays = []
    for field, column in zip(target, columns, strict=True):
        if column.type != field.type:
            try:
                column = pc.cast(column, field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidArgument(
                    f"column {field.name!r} of type {column.type} does not convert to "
                    f"{field.type}: {exc}"
                ) from None
        if not field.nullable and column.null_count:
            what = "time and diff" if field.name in (TIME_COLUMN, DIFF_COLUMN) else "column"
            raise InvalidArgument(
                f"{what} {field.name!r} has {column.null_count} null value(s) but is not nullable"
            )
        arrays.append(column)
    return pa.Table.from_arrays(arrays, schema=target)


def consolidate(table: pa.Table) -> pa.Table:
    """Sum the diffs of rows with equal data and time, drop the zero sums, and sort by the data
    columns then time. Nulls group with nulls (and NaN with NaN) and sort last. Equal update
    multisets consolidate to equal tables, however they were batched."""
    if table.num_rows == 0:
        return table
    if table.num_rows <= _PYTHON_CONSOLIDATE_ROWS:
        small = _consolidate_in_python(table)
        if small is not None:
            return small
    if table.num_rows == 1:
        return table.select([*data_columns(table), TIME_COLUMN, DIFF_COLUMN]).filter(
            pc.not_equal(table.column(DIFF_COLUMN), 0)
        )
    keys = [*data_columns(table), TIME_COLUMN]
    # Sorted first, rows with equal (data, time) sit next to each other and are summed as runs:
    # much cheaper than hash grouping, above all when nothing repeats (appends of fresh rows).
    ordered = table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
    repeats = _repeats_previous(ordered, keys)
    if repeats is not None:
        if _sorting_may_split_runs(table, keys):
            return _consolidate_by_grouping(table)
        ordered = _sum_runs(ordered, repeats)
    kept = ordered.filter(pc.not_equal(ordered.column(DIFF_COLUMN), 0))
    columns = [kept.column(key) for key in keys]
    columns.append(kept.column(DIFF_COLUMN))
    return pa.Table.from_arrays(columns, schema=_layout(table))


_NEGATIVE_ZERO_BITS = -(1 << 63)

# Up to this many rows, consolidating in Python costs less than the dozen Arrow kernels of
# the columnar way, each with its fixed set-up cost (a 10-row append: ~15 us against ~165 us).
_PYTHON_CONSOLIDATE_ROWS = 128
_DIFF_BOUND = 1 << 63

# Sort keys standing in for the values Arrow orders after every number (NaN) and after
# everything (null); a present value ``v`` becomes ``(0, v)`` in columns that may hold them.
_NAN_KEY = (1, 0)
_NULL_KEY = (2, 0)


def _consolidate_in_python(table: pa.Table) -> pa.Table | None:
    """:func:`consolidate` of a small table, done in Python, with the same result; ``None``
    where Python could order or compare some key differently from Arrow (a key type not
    handled here, -0.0 in a float key, a sum that overflows the diff type), which leaves the
    table to the columnar way. An already consolidated table comes back as it is."""
    names = table.column_names
    time_at, diff_at = names.index(TIME_COLUMN), names.index(DIFF_COLUMN)
    positions = [i for i in range(len(names)) if i != time_at and i != diff_at]
    layout = [names[i] for i in positions] + [TIME_COLUMN, DIFF_COLUMN]
    positions.append(time_at)
    columns = table.columns
    key_columns = []
    for position in positions:
        values = _python_sort_keys(columns[position])
        if values is None:
            return None
        key_columns.append(values)
    diff = columns[diff_at]
    if diff.null_count or not pa.types.is_integer(diff.type):
        return None
    diffs = diff.to_pylist()
    rows = list(zip(*key_columns, strict=True))
    order = sorted(range(len(rows)), key=rows.__getitem__)  # stable, as Arrow's sort is
    firsts: list[int] = []
    sums: list[int] = []
    for index in order:
        if firsts and rows[firsts[-1]] == rows[index]:
            sums[-1] += diffs[index]
        else:
            firsts.append(index)
            sums.append(diffs[index])
    kept = [(index, total) for index, total in zip(firsts, sums, strict=True) if total]
    if any(not -_DIFF_BOUND <= total < _DIFF_BOUND for _, total in kept):
        return None  # the columnar way wraps around; keep its answer
    if len(kept) == len(rows) and all(i == n for n, (i, _) in enumerate(kept)):
        # In order, no (data, time) twice, no zero diff: consolidated already.
        return table if names == layout else table.select(layout)
    picked = table.take(pa.array([index for index, _ in kept], pa.int64()))
    field = picked.schema.field(diff_at)
    summed = pa.array([total for _, total in kept], field.type)
    return picked.set_column(diff_at, field, summed).select(layout)


def _python_sort_keys(column: pa.ChunkedArray) -> list[object] | None:
    """``column``'s values as Python values that order and compare as Arrow's sort and
    consolidation do them (nulls equal to each other and last, NaN equal to NaN and after
    every number); ``None`` for types where that is not certain, and for -0.0 (Arrow sorts
    it as 0.0, yet consolidation keeps them apart)."""
    kind = column.type
    if pa.types.is_date32(kind):
        column = column.cast(pa.int32())
    elif pa.types.is_date64(kind) or pa.types.is_timestamp(kind):
        column = column.cast(pa.int64())
    elif kind.id not in _PYTHON_ORDERED_TYPES:
        return None
    values: list[object] = column.to_pylist()
    floating = pa.types.is_floating(column.type)
    if not floating and not column.null_count:
        return values
    keys: list[object] = []
    for value in values:
        if value is None:
            keys.append(_NULL_KEY)
        elif floating and value != value:  # NaN
            keys.append(_NAN_KEY)
        elif floating and value == 0.0 and math.copysign(1.0, value) < 0:  # type: ignore[arg-type]
            return None
        else:
            keys.append((0, value))
    return keys


# Types whose values Python orders and compares exactly as Arrow does: numbers (float16
# aside), booleans, decimals, and text and bytes (Arrow compares both bytewise, and UTF-8
# keeps the code point order Python compares ``str`` by).
_PYTHON_ORDERED_TYPES = frozenset(
    kind.id
    for kind in (
        *(pa.int8(), pa.int16(), pa.int32(), pa.int64()),
        *(pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()),
        *(pa.float32(), pa.float64(), pa.bool_()),
        *(pa.decimal128(1), pa.decimal256(1)),
        *(pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.binary(1)),
    )
)


def _sorting_may_split_runs(table: pa.Table, keys: Sequence[str]) -> bool:
    """Whether a float key holds -0.0 (or is not float64): sorting cannot tell -0.0 from 0.0,
    so rows that agree but for those two could interleave, while consolidation keeps them
    apart. (Where no neighbours compare equal, not even 0.0 and -0.0 do, every row stands
    alone whatever the sort did.)"""
    for key in keys:
        column = table.column(key)
        if pa.types.is_floating(column.type):
            if not pa.types.is_float64(column.type):
                return True
            bits = column.combine_chunks().view(pa.int64())
            if pc.any(pc.equal(bits, _NEGATIVE_ZERO_BITS)).as_py():
                return True
    return False


def _repeats_previous(table: pa.Table, keys: Sequence[str]) -> pa.Array | None:
    """For a table (of at least two rows) sorted by ``keys``: whether each row after the first
    agrees with the one before it on every key, as consolidation compares them (null matches
    null, NaN matches NaN; 0.0 matches -0.0 here, see :func:`_sorting_may_split_runs`);
    ``None`` when no row does."""
    repeats: pa.Array | None = None
    for key in keys:
        values = table.column(key).combine_chunks()
        before, after = values.slice(0, len(values) - 1), values.slice(1)
        same = pc.equal(before, after)
        if pa.types.is_floating(values.type):
            nans = pc.is_nan(values)
            same = pc.or_kleene(same, pc.and_kleene(nans.slice(0, len(nans) - 1), nans.slice(1)))
        if values.null_count:
            same = pc.or_kleene(same, pc.and_(pc.is_null(before), pc.is_null(after)))
        # A null left in ``same`` means one side is null and the other is not: no repeat.
        same = pc.fill_null(same, False)
        repeats = same if repeats is None else pc.and_(repeats, same)
        if not pc.any(repeats).as_py():
            return None
    return repeats


def _sum_runs(table: pa.Table, repeats: pa.Array) -> pa.Table:
    """One row per run of repeating rows (its first), with the run's diffs summed."""
    # Row i ends a run where row i + 1 does not repeat it; the last row ends the last run.
    ends = pa.concat_arrays(
        [
            pc.indices_nonzero(pc.invert(repeats)).cast(pa.int64()),
            pa.array([table.num_rows - 1], pa.int64()),
        ]
    )
    starts = pa.concat_arrays([pa.array([0], pa.int64()), pc.add(ends.slice(0, len(ends) - 1), 1)])
    running = pc.cumulative_sum(table.column(DIFF_COLUMN)).combine_chunks().take(ends)
    before = pa.concat_arrays([pa.array([0], pa.int64()), running.slice(0, len(running) - 1)])
    firsts = table.take(starts)
    index = firsts.schema.get_field_index(DIFF_COLUMN)
    return firsts.set_column(index, firsts.schema.field(index), pc.subtract(running, before))


def _consolidate_by_grouping(table: pa.Table) -> pa.Table:
    """:func:`consolidate` for any table of at least two rows, by hash grouping."""
    keys = [*data_columns(table), TIME_COLUMN]
    grouped = table.group_by(keys, use_threads=False).aggregate([(DIFF_COLUMN, "sum")])
    sums = grouped.column(grouped.num_columns - 1)
    kept = grouped.filter(pc.not_equal(sums, 0))
    ordered = kept.take(pc.sort_indices(kept, sort_keys=[(key, "ascending") for key in keys]))
    columns = [ordered.column(key) for key in keys]
    columns.append(ordered.column(ordered.num_columns - 1))
    return pa.Table.from_arrays(columns, schema=_layout(table))


def _layout(table: pa.Table) -> pa.Schema:
    """``table``'s schema with ``time`` and ``diff`` moved last, as consolidation emits them."""
    schema = table.schema
    fields = [schema.field(name) for name in data_columns(table)]
    fields.append(schema.field(TIME_COLUMN))
    fields.append(schema.field(DIFF_COLUMN))
    return pa.schema(fields)


def frontier_bound(frontier: Antichain[int]) -> int | None:
    """The one element of a u64 frontier, or ``None`` for the empty frontier ``{}``."""
    elements = frontier.elements
    if len(elements) > 1:
        raise InvalidArgument(f"a u64 frontier has at most one element, got {frontier!r}")
    return elements[0] if elements else None


def bound_frontier(bound: int | None) -> Antichain[int]:
    """The u64 frontier ``{bound}``, or ``{}`` for ``None`` (the inverse of
    ``frontier_bound``)."""
    return u64_frontier() if bound is None else u64_frontier(bound)


def advance_times(table: pa.Table, since: Antichain[int]) -> pa.Table:
    """Every time moved to ``max(time, since)`` (unchanged for ``since == {}``), without
    consolidating."""
    bound = frontier_bound(since)
    if bound is None or table.num_rows == 0:
        return table
    index = table.schema.get_field_index(TIME_COLUMN)
    advanced = pc.max_element_wise(table.column(index), pa.scalar(bound, TIME_TYPE))
    return table.set_column(index, table.schema.field(index), advanced)


def advance_by(table: pa.Table, since: Antichain[int]) -> pa.Table:
    """Compact to ``since``: advance every time, then consolidate. Reads at times at or beyond
    ``since`` are unchanged."""
    return consolidate(advance_times(table, since))


def with_time(table: pa.Table, time: int) -> pa.Table:
    """Every row placed at ``time``."""
    index = table.schema.get_field_index(TIME_COLUMN)
    times = pa.repeat(pa.scalar(time, TIME_TYPE), table.num_rows)
    return table.set_column(index, table.schema.field(index), times)


# Up to this many rows, Python reads a column faster than an Arrow kernel is set up for it.
_PYTHON_ROWS = 64


def time_range(table: pa.Table) -> tuple[int, int] | None:
    """The least and greatest time in ``table``, or ``None`` if it is empty."""
    if table.num_rows == 0:
        return None
    if table.num_rows <= _PYTHON_ROWS:
        times = table.column(TIME_COLUMN).to_pylist()
        return min(times), max(times)
    extremes = pc.min_max(table.column(TIME_COLUMN))
    return int(extremes["min"].as_py()), int(extremes["max"].as_py())


def select_times(table: pa.Table, lower: int | None, upper: int | None) -> pa.Table:
    """The rows with ``lower <= time < upper``; ``None`` leaves that side open."""
    if lower is not None and lower <= 0:
        lower = None
    if upper is not None and upper > U64_MAX:
        upper = None
    if lower is None and upper is None:
        return table
    if lower is not None and lower > U64_MAX:
        return table.slice(0, 0)
    # Compared in numpy, and the table kept whole when every row is in: a batch read for
    # one step usually lies inside the step's window, and Arrow's comparisons and filter
    # cost about 70 us on 1,000 rows where this costs 9.
    times = table.column(TIME_COLUMN).to_numpy()
    inside = np.ones(len(times), dtype=np.bool_)
    if lower is not None:
        inside &= times >= np.uint64(lower)
    if upper is not None:
        inside &= times < np.uint64(upper)
    return table if inside.all() else table.filter(pa.array(inside))


def counts_by_time(table: pa.Table) -> list[tuple[int, int]]:
    """``(time, number of rows at it)`` for every time present, in time order: the counts of a
    CDCv2 progress statement when ``table`` is consolidated."""
    if table.num_rows == 0:
        return []
    counted = pc.value_counts(table.column(TIME_COLUMN))
    times = counted.field("values").to_pylist()
    numbers = counted.field("counts").to_pylist()
    return sorted(zip(times, numbers, strict=True))


def project(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Only the data columns ``columns`` (in that order), with ``time`` and ``diff``,
    consolidated: rows that differed only in dropped columns merge."""
    if list(columns) == data_columns(table):
        return table
    return consolidate(table.select([*columns, TIME_COLUMN, DIFF_COLUMN]))


def slices(table: pa.Table, max_rows: int, max_bytes: int | None = None) -> Iterator[pa.Table]:
    """``table`` in consecutive pieces of at most ``max_rows`` rows and, going by the average
    row, about ``max_bytes`` bytes (one piece if empty)."""
    if max_rows < 1:
        raise InvalidArgument(f"max_rows must be at least 1, got {max_rows}")
    if max_bytes is not None and table.num_rows:
        per_row = max(1, table.nbytes // table.num_rows)
        max_rows = max(1, min(max_rows, max_bytes // per_row))
    if table.num_rows <= max_rows:
        yield table
        return
    for start in range(0, table.num_rows, max_rows):
        yield table.slice(start, max_rows)


def concat(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    """One table of ``schema`` with every row of ``tables`` (whose columns must have the
    schema's types; differences in nullability flags are smoothed over)."""
    alike = [t if t.schema.equals(schema) else t.cast(schema) for t in tables]
    if not alike:
        return schema.empty_table()
    if len(alike) == 1:
        return alike[0]
    return pa.concat_tables(alike)
