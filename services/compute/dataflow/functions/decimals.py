"""Exact decimal arithmetic at the contract's scales.

Every computed decimal is a DECIMAL(38, s): its value is rounded (half-even) to scale ``s`` and
becomes NULL when it needs more than 38 digits there. Python's default decimal context keeps
only 28 digits, so all arithmetic here runs in a private context wide enough to be exact, and
quotients are rounded from exact integers so that no double rounding can happen.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation

from tidemark.columnar.schema import MAX_DECIMAL_PRECISION

EXACT = Context(prec=400, rounding=ROUND_HALF_EVEN, Emax=10_000, Emin=-10_000, traps=[])
_QUANTUM = [Decimal(1).scaleb(-scale) for scale in range(MAX_DECIMAL_PRECISION + 1)]


def fits(value: Decimal, scale: int, precision: int = MAX_DECIMAL_PRECISION) -> bool:
    """Whether ``value`` (already at ``scale``) has at most ``precision`` digits."""
    return value.is_zero() or value.adjusted() < precision - scale


def at_scale(value: Decimal, scale: int, precision: int = MAX_DECIMAL_PRECISION) -> Decimal | None:
    """``value`` rounded half-even to ``scale``, or None if it then has too many digits."""
    if not value.is_finite():
        return None
    if value.adjusted() >= precision - scale and not value.is_zero():
        return None
    rounded = EXACT.quantize(value, _QUANTUM[scale])
    if not fits(rounded, scale, precision):
        return None
    return rounded


def parts(value: Decimal) -> tuple[int, int]:
    """``(coefficient, scale)`` with ``value == coefficient * 10**-scale`` (scale may be < 0)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)) or "0")
    return (-coefficient if sign else coefficient), -exponent


def divide_half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to the nearest integer, ties to even."""
    if denominator < 0:
        numerator, denominator = -numerator, -denominator
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def from_scaled(coefficient: int, scale: int) -> Decimal | None:
    """The decimal ``coefficient * 10**-scale`` at ``scale``, or None beyond 38 digits."""
    if abs(coefficient) >= 10**MAX_DECIMAL_PRECISION:
        return None
    return Decimal(coefficient).scaleb(-scale, EXACT)


def quotient(a: Decimal, b: Decimal, scale: int) -> Decimal | None:
    """``a / b`` rounded half-even to ``scale``; None when ``b`` is zero or on overflow."""
    if b.is_zero():
        return None
    ca, sa = parts(a)
    cb, sb = parts(b)
    # a / b = (ca / cb) * 10**(sb - sa); scaled by 10**scale.
    shift = scale + sb - sa
    if shift >= 0:
        q = divide_half_even(ca * 10**shift, cb)
    else:
        q = divide_half_even(ca, cb * 10**-shift)
    return from_scaled(q, scale)


def add(a: Decimal, b: Decimal, scale: int) -> Decimal | None:
    return at_scale(EXACT.add(a, b), scale)


def subtract(a: Decimal, b: Decimal, scale: int) -> Decimal | None:
    return at_scale(EXACT.subtract(a, b), scale)


def multiply(a: Decimal, b: Decimal, scale: int) -> Decimal | None:
    return at_scale(EXACT.multiply(a, b), scale)


def remainder(a: Decimal, b: Decimal, scale: int) -> Decimal | None:
    """The remainder of truncated division: its sign is the dividend's."""
    if b.is_zero():
        return None
    try:
        return at_scale(EXACT.remainder(a, b), scale)
    except InvalidOperation:
        return None
