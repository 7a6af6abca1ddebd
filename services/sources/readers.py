"""Which reader ingests a source of each format."""

from __future__ import annotations

from collections.abc import Callable

from tidemark.sources.loadgen import LoadGeneratorReader, generator_for, spec_from_proto
from tidemark.sources.plan import SourcePlan
from tidemark.sources.reader import SourceReader
from tidemark.v1 import catalog_pb2

ReaderFactory = Callable[[SourcePlan], SourceReader]


def load_generator_reader(plan: SourcePlan) -> SourceReader:
    spec = spec_from_proto(plan.primary.source.load_generator)
    return LoadGeneratorReader(generator_for(spec))


READERS: dict[int, ReaderFactory] = {
    catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR: load_generator_reader,
}
"""The formats the sources process ingests; a new kind of source registers its reader here."""
