"""Rows after a trip over the wire (``wire.py``): restoring what the engine relies on."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from services.compute.dataflow.operators.linear import Normalize
from tidemark.columnar.schema import ColumnType
from tidemark.plan.scalar_types import ScalarType


def normalizer(types: Sequence[ScalarType]) -> Normalize:
    """Maps every float NaN in rows of ``types`` back to the engine's one NaN object (and
    -0.0 to 0.0): decoding makes a new NaN object each time, and NaN never equals
    itself, so without this equal rows would stop meeting in dictionaries."""
    return _normalizer(tuple(i for i, t in enumerate(types) if t.kind is ColumnType.FLOAT64))


@lru_cache(maxsize=1024)
def _normalizer(float_columns: tuple[int, ...]) -> Normalize:
    return Normalize(float_columns)
