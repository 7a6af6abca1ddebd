"""What a dataflow is, independent of who asked for it.

Two parties install dataflows in a compute process: a client through ``MaintainView`` (it hands
over the capabilities), and the cluster's catalog controller (it names collections only; the
host acquires capabilities itself). Both describe the dataflow with a ``DataflowSpec`` and hand
it to a ``DataflowHost``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tidemark.v1 import plan_pb2, storage_pb2


@dataclass(frozen=True)
class DataflowInputSpec:
    collection_id: str
    read_capability: storage_pb2.CapabilityRef | None = None
    """``None``: the host acquires a read capability itself."""


@dataclass(frozen=True)
class DataflowSpec:
    dataflow_id: str
    plan: plan_pb2.Plan
    inputs: tuple[DataflowInputSpec, ...]
    output_collection_id: str | None = None
    """A materialized view's storage collection, or ``None``."""
    output_write_capability: storage_pb2.CapabilityRef | None = None
    """``None`` with an output collection: the host acquires the write capability itself."""
    index_key_columns: tuple[int, ...] | None = None
    """Keep an in-memory index keyed by these output columns (answers ``Peek``)."""
    as_of: int | None = None
    """``None``: chosen from the inputs' sinces and the output's upper (see compute.proto)."""
    from_catalog: bool = False


class DataflowHost(Protocol):
    """The part of the compute process that runs dataflows (implemented by the service)."""

    async def install(self, spec: DataflowSpec) -> None:
        """Installs ``spec``; raises ``AlreadyExists`` if its id is in use."""
        ...

    async def drop(self, dataflow_id: str) -> None:
        """Stops the dataflow and releases its holds; unknown ids are ignored."""
        ...

    def dataflow_ids(self) -> set[str]:
        """The ids of every installed dataflow."""
        ...
