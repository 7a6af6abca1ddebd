"""Total orders over row values: for top-k, min/max and canonical output order.

The contract's order is the natural one per type (text by code point, bytes bytewise, false <
true) except that a float NaN sorts after every other float, and NULLs go first or last as
asked. Python's own ``<`` gets NaN wrong and cannot compare None, so sorting goes through keys
built here. Within one column all values share a type, which keeps the keys comparable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from services.compute.dataflow.types import ScalarType
from tidemark.columnar.schema import ColumnType

NAN = math.nan
"""The one NaN object rows carry. Dict lookups and tuple equality check identity before
``==``, so with a single NaN object rows holding NaN group, join and consolidate as equal,
which is what the contract asks (NaN equals itself)."""

Row = tuple[Any, ...]
SortKey = Callable[[Row], tuple[Any, ...]]

_NULL_FIRST = (0,)
_NULL_LAST = (2,)


def canonical_float(value: float) -> float:
    """The contract's normal form: every NaN is ``NAN`` and -0.0 is 0.0."""
    if value != value:
        return NAN
    return value if value else 0.0


def float_key(value: float) -> tuple[bool, float]:
    """Orders floats with NaN above +inf; -0.0 and 0.0 compare equal, as they should."""
    if value != value:
        return (True, 0.0)
    return (False, value)


def value_key(value: Any) -> Any:
    """The ascending key of one non-NULL value (floats handle NaN, the rest order natively;
    ``natively_ordered`` relies on that)."""
    if value.__class__ is float:
        return float_key(value)
    return value


class Descending:
    """Wraps a key so that it sorts in reverse."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Descending) and bool(self.key == other.key)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __lt__(self, other: Descending) -> bool:
        return bool(other.key < self.key)

    def __le__(self, other: Descending) -> bool:
        return bool(other.key <= self.key)

    def __gt__(self, other: Descending) -> bool:
        return bool(other.key > self.key)

    def __ge__(self, other: Descending) -> bool:
        return bool(other.key >= self.key)

    def __hash__(self) -> int:
        return hash(self.key)


def _component(column: int, kind: ColumnType, descending: bool, nulls_first: bool) -> Any:
    null_key = _NULL_FIRST if nulls_first else _NULL_LAST
    is_float = kind is ColumnType.FLOAT64

    def key(row: Row) -> Any:
        value = row[column]
        if value is None:
            return null_key
        inner = float_key(value) if is_float else value
        return (1, Descending(inner) if descending else inner)

    return key


def compile_sort_key(
    order: Sequence[tuple[int, bool, bool]], types: Sequence[ScalarType]
) -> SortKey:
    """A key for rows (with columns of ``types``) sorted by ``order`` (``(column, descending,
    nulls_first)`` each), ties broken by the whole row ascending with NULLs last. Two rows get
    equal keys only if they are equal, so the order is total and deterministic."""
    order_key = compile_order_key(order, types)

    def key(row: Row) -> tuple[Any, ...]:
        return (*order_key(row), *row_key(row))

    return key


def compile_order_key(
    order: Sequence[tuple[int, bool, bool]], types: Sequence[ScalarType]
) -> SortKey:
    """A key for rows sorted by ``order`` alone, without the tie-break: rows get equal keys
    exactly when they are equal on every order column (NULL equal to NULL), that is, when
    they are peers for window functions."""
    parts = [
        _component(column, types[column].kind, descending, nulls_first)
        for column, descending, nulls_first in order
    ]

    def key(row: Row) -> tuple[Any, ...]:
        return tuple([part(row) for part in parts])

    return key


def row_key(row: Row) -> tuple[Any, ...]:
    """Ascending, NULLs last, for any row: the canonical order of output batches."""
    return tuple(_NULL_LAST if value is None else (1, value_key(value)) for value in row)


def natively_ordered(row: Row) -> bool:
    """Whether ``row_key`` orders ``row`` among rows like it as Python orders the rows
    themselves: true when it holds no NULL (Python cannot compare one) and no NaN (Python
    orders it inconsistently), since ``value_key`` leaves every other value as it is. A
    value that ``value_key`` gives a key of its own must be caught here too."""
    for value in row:
        if value is None or value != value:
            return False
    return True
