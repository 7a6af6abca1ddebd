"""Comparisons of two non-NULL values of one (promoted) type.

Every type orders natively in Python (text by code point, bytes bytewise, false < true)
except float64, where the contract follows PostgreSQL: NaN equals NaN and is greater than
every other float.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from tidemark.columnar.schema import ColumnType

Comparison = Callable[[Any, Any], bool]

_NATIVE: dict[str, Comparison] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


def _float_eq(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def _float_ne(a: float, b: float) -> bool:
    return not _float_eq(a, b)


def _float_lt(a: float, b: float) -> bool:
    if b != b:
        return a == a
    return a < b


def _float_le(a: float, b: float) -> bool:
    return _float_lt(a, b) or _float_eq(a, b)


def _float_gt(a: float, b: float) -> bool:
    return _float_lt(b, a)


def _float_ge(a: float, b: float) -> bool:
    return _float_le(b, a)


_FLOAT: dict[str, Comparison] = {
    "eq": _float_eq,
    "ne": _float_ne,
    "lt": _float_lt,
    "le": _float_le,
    "gt": _float_gt,
    "ge": _float_ge,
}

COMPARISONS = frozenset(_NATIVE)


def comparison(op: str, kind: ColumnType) -> Comparison:
    return (_FLOAT if kind is ColumnType.FLOAT64 else _NATIVE)[op]
