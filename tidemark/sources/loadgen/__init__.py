"""Load generators: synthetic upstreams for demos and benchmarks, as Materialize has them
(``CREATE SOURCE s FROM LOAD GENERATOR COUNTER | AUCTION | TPCH``).

Every generator is a pure function of the tick number (:class:`~tidemark.sources.loadgen.
base.Generator`), so a batch replays exactly (:meth:`~tidemark.sources.reader.SourceReader.
replay`) and ingestion is exactly once without any state besides the progress binding.
"""

from tidemark.sources.loadgen.base import Generator, LoadGeneratorReader, LoadGeneratorSpec
from tidemark.sources.loadgen.registry import GENERATORS, generator_for, spec_from_proto

__all__ = [
    "GENERATORS",
    "Generator",
    "LoadGeneratorReader",
    "LoadGeneratorSpec",
    "generator_for",
    "spec_from_proto",
]
