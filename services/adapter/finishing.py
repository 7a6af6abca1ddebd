"""ORDER BY, OFFSET, LIMIT and the final projection of the outermost query, applied by the
adapter to the rows compute returns.

The order of values is plan.proto's: numbers by value (NaN above every other float), text by
code point, bytes bytewise, false before true, dates and timestamps chronologically. NULLs come
last ascending and first descending unless the key says otherwise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from services.adapter.sql.planned import Finishing, SortSpec
from tidemark.columnar import Row


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare_values(a: Any, b: Any) -> int:
    """-1, 0 or 1 for two non-NULL values of one column."""
    a_nan, b_nan = _is_nan(a), _is_nan(b)
    if a_nan or b_nan:
        return (a_nan > b_nan) - (a_nan < b_nan)
    if a < b:
        return -1
    if b < a:
        return 1
    return 0


def _compare_rows(keys: Sequence[SortSpec], left: Row, right: Row) -> int:
    for key in keys:
        a, b = left[key.column], right[key.column]
        if a is None or b is None:
            if a is None and b is None:
                continue
            # Ascending puts NULLs last, descending first; nulls_first asks for first.
            null_last = not key.nulls_first
            outcome = 1 if a is None else -1
            if not null_last:
                outcome = -outcome
            return outcome
        outcome = compare_values(a, b)
        if outcome:
            return -outcome if key.descending else outcome
    return 0


def apply_finishing(rows: list[Row], finishing: Finishing) -> list[Row]:
    """``rows`` (each already repeated by its multiplicity) sorted, sliced and projected."""
    ordered = rows
    if finishing.order_by:
        keys = finishing.order_by

        def compare(left: Row, right: Row) -> int:
            return _compare_rows(keys, left, right)

        ordered = sorted(rows, key=functools.cmp_to_key(compare))
    start = finishing.offset
    end = None if finishing.limit is None else start + finishing.limit
    sliced = ordered[start:end]
    columns = finishing.project
    if columns == tuple(range(len(columns))) and all(len(row) == len(columns) for row in sliced):
        return sliced
    return [tuple(row[c] for c in columns) for row in sliced]
