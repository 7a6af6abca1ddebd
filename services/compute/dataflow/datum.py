"""Plan literals (``Datum``) as the engine's Python values, with their types.

Reading and validating a Datum is the shared library's (``tidemark.plan.datum``); the engine
only names the node in errors and canonicalises floats the way every engine value is.
"""

from __future__ import annotations

from typing import Any

from services.compute.dataflow.ordering import canonical_float
from tidemark.errors import InvalidArgument
from tidemark.plan.datum import datum_type, from_datum
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import plan_pb2


def datum_value(datum: plan_pb2.Datum, where: str) -> tuple[Any, ScalarType]:
    """The value a Datum holds (None for NULL) and its type. Raises ``InvalidArgument``, naming
    ``where``, when the value does not match the type."""
    try:
        value = from_datum(datum)
        value_type = datum_type(datum)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc.message}") from None
    if isinstance(value, float):
        value = canonical_float(value)
    return value, value_type
