"""The incremental dataflow engine: plans in, exact update streams out.

``Dataflow`` maintains one plan (see ``dataflow.py`` for the lifecycle), ``Index`` answers
reads of its output at past times, ``compile_scalar`` evaluates scalar expressions, and
``shard_of`` is the stable key hashing the Spark runtime partitions by (``encode_key``: a
key's canonical bytes).
"""

from services.compute.dataflow.batch import Row, Update, consolidate
from services.compute.dataflow.dataflow import Dataflow
from services.compute.dataflow.index import Index
from services.compute.dataflow.keys import encode_key, shard_of
from services.compute.dataflow.scalar import CompiledScalar, compile_scalar
from services.compute.dataflow.work import Work

__all__ = [
    "CompiledScalar",
    "Dataflow",
    "Index",
    "Row",
    "Update",
    "Work",
    "compile_scalar",
    "consolidate",
    "encode_key",
    "shard_of",
]
