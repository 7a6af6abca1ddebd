"""Arithmetic on int64, decimal and float64 values (both operands already promoted).

int64 results outside the int64 range are NULL; int64 division truncates toward zero and the
remainder takes the dividend's sign; dividing by zero gives NULL for every type. float64 is
IEEE double (an overflow gives an infinity, inf - inf a NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from services.compute.dataflow.functions import decimals
from services.compute.dataflow.ordering import NAN, canonical_float
from services.compute.dataflow.types import ScalarType, computed_decimal
from tidemark.columnar.schema import MAX_DECIMAL_PRECISION, ColumnType

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

Binary = Callable[[Any, Any], Any]
Unary = Callable[[Any], Any]


def checked_int(value: int) -> int | None:
    return value if INT64_MIN <= value <= INT64_MAX else None


def _int_add(a: int, b: int) -> int | None:
    return checked_int(a + b)


def _int_sub(a: int, b: int) -> int | None:
    return checked_int(a - b)


def _int_mul(a: int, b: int) -> int | None:
    return checked_int(a * b)


def _int_div(a: int, b: int) -> int | None:
    if b == 0:
        return None
    q = abs(a) // abs(b)
    return checked_int(q if (a < 0) == (b < 0) else -q)


def _int_mod(a: int, b: int) -> int | None:
    if b == 0:
        return None
    r = abs(a) % abs(b)
    return -r if a < 0 else r


_float = canonical_float


def _float_add(a: float, b: float) -> float:
    return _float(a + b)


def _float_sub(a: float, b: float) -> float:
    return _float(a - b)


def _float_mul(a: float, b: float) -> float:
    return _float(a * b)


def _float_div(a: float, b: float) -> float | None:
    if b == 0.0:
        return None
    return _float(a / b)


def _float_mod(a: float, b: float) -> float | None:
    if b == 0.0:
        return None
    if math.isinf(a) or a != a or b != b:
        return NAN
    return math.fmod(a, b)


def decimal_result_scale(op: str, left: ScalarType, right: ScalarType) -> int:
    """The scale of a decimal ``op``'s result (an int64 operand counts as scale 0)."""
    s1 = left.scale if left.kind is ColumnType.DECIMAL else 0
    s2 = right.scale if right.kind is ColumnType.DECIMAL else 0
    if op == "mul":
        return min(MAX_DECIMAL_PRECISION, s1 + s2)
    if op == "div":
        return min(MAX_DECIMAL_PRECISION, max(s1, s2, 6))
    return max(s1, s2)


def binary_op(op: str, kind: ColumnType, scale: int) -> Binary:
    """The implementation of ``op`` on two non-NULL values of ``kind``."""
    if kind is ColumnType.INT64:
        return {"add": _int_add, "sub": _int_sub, "mul": _int_mul, "div": _int_div}.get(
            op, _int_mod
        )
    if kind is ColumnType.FLOAT64:
        return {
            "add": _float_add,
            "sub": _float_sub,
            "mul": _float_mul,
            "div": _float_div,
        }.get(op, _float_mod)
    exact = {
        "add": decimals.add,
        "sub": decimals.subtract,
        "mul": decimals.multiply,
        "div": decimals.quotient,
        "mod": decimals.remainder,
    }[op]

    def on_decimals(a: Decimal, b: Decimal) -> Decimal | None:
        return exact(a, b, scale)

    return on_decimals


def result_type(op: str, left: ScalarType, right: ScalarType, kind: ColumnType) -> ScalarType:
    """The type of ``op`` on operands promoted to ``kind`` (nullability per the contract)."""
    if kind is ColumnType.DECIMAL:
        return computed_decimal(decimal_result_scale(op, left, right))
    if kind is ColumnType.INT64:
        return ScalarType(kind, True)
    nullable = left.nullable or right.nullable or op in ("div", "mod")
    return ScalarType(kind, nullable)


def _int_neg(a: int) -> int | None:
    return checked_int(-a)


def _int_abs(a: int) -> int | None:
    return checked_int(abs(a))


def unary_op(op: str, kind: ColumnType) -> Unary:
    if kind is ColumnType.INT64:
        return _int_neg if op == "neg" else _int_abs
    if kind is ColumnType.FLOAT64:
        return (lambda a: _float(-a)) if op == "neg" else (lambda a: _float(abs(a)))
    if op == "neg":
        return lambda a: decimals.EXACT.minus(a)
    return lambda a: decimals.EXACT.abs(a)


def promote(value: Any, source: ColumnType, target: ColumnType) -> Any:
    """Converts a non-NULL numeric value up the promotion order."""
    if source is target:
        return value
    if target is ColumnType.FLOAT64:
        return float(value)
    return Decimal(value)
