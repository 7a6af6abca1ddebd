"""Values in PostgreSQL's text form, as psql shows them and COPY writes them."""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any


def format_value(value: Any, null: str = "") -> str:
    """A value as PostgreSQL prints it in text form."""
    if value is None:
        return null
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, decimal.Decimal):
        # Plain notation, keeping the scale: 1E+2 would surprise anyone expecting 100.
        return format(value, "f")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)
