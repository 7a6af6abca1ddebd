"""The load generators by name, and their spec from the catalog's proto."""

from __future__ import annotations

from tidemark.sources.loadgen.auction import Auction
from tidemark.sources.loadgen.base import DEFAULT_TICK_INTERVAL_MS, Generator, LoadGeneratorSpec
from tidemark.sources.loadgen.counter import Counter
from tidemark.sources.loadgen.tpch import Tpch
from tidemark.v1 import catalog_pb2

GENERATORS: dict[str, type[Generator]] = {"COUNTER": Counter, "AUCTION": Auction, "TPCH": Tpch}
"""Generators whose data goes to one relation, the source itself, and those with subsources
(``FOR ALL TABLES``): see :data:`SINGLE_OUTPUT`."""

SINGLE_OUTPUT = frozenset({"COUNTER"})


def generator_for(spec: LoadGeneratorSpec) -> Generator:
    try:
        kind = GENERATORS[spec.generator.upper()]
    except KeyError:
        raise ValueError(f"unknown load generator {spec.generator!r}") from None
    return kind(spec)


def spec_from_proto(proto: catalog_pb2.LoadGeneratorSpec) -> LoadGeneratorSpec:
    return LoadGeneratorSpec(
        generator=proto.generator.upper(),
        tick_interval_ms=proto.tick_interval_ms or DEFAULT_TICK_INTERVAL_MS,
        max_cardinality=proto.max_cardinality,
        scale_factor=proto.scale_factor or 0.01,
        start_time_ms=proto.start_time_ms,
        up_to=proto.up_to,
    )


def spec_to_proto(spec: LoadGeneratorSpec) -> catalog_pb2.LoadGeneratorSpec:
    return catalog_pb2.LoadGeneratorSpec(
        generator=spec.generator,
        tick_interval_ms=spec.tick_interval_ms,
        max_cardinality=spec.max_cardinality,
        scale_factor=spec.scale_factor,
        start_time_ms=spec.start_time_ms,
        up_to=spec.up_to,
    )
