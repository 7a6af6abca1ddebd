"""The interface between the ingestion loop and a kind of source (load generator, PostgreSQL).

A reader turns an upstream into a sequence of batches, each ending at an *offset*: opaque
bytes the reader alone interprets (a tick count, an LSN), totally ordered along the upstream's
history. The ingestion loop (:mod:`tidemark.sources.ingest`) binds each batch to one data time
and records the binding, so the reader needs no durable state of its own.

Contract (what :class:`~tidemark.sources.ingest.Ingestion` relies on):

1. ``await start(resume_offset)`` is called once, after recovery (which may have called
   ``replay``) and before ``batches()``. ``schemas()`` must answer before it (from the
   catalog's subsource items if the upstream is not reachable yet). ``resume_offset`` is
   the offset of the last batch that is durably recorded in every subsource (``None``: nothing
   was ever recorded; begin at the very start, including any initial snapshot). The reader
   must produce exactly the upstream's changes after ``resume_offset``, nothing before it.
2. ``batches()`` yields :class:`SourceBatch` values in offset order, each with an offset
   strictly greater than the previous one's (the first one's greater than
   ``resume_offset``). A batch holds every change in ``(previous offset, offset]``, keyed by
   the subsource (upstream table) name, as ``(row, diff)`` pairs whose rows match the
   subsource's schema (:meth:`schemas`). A batch without changes is allowed (it just moves
   the offset). The iterator may wait as long as the upstream is quiet; it ends only if the
   upstream ends for good.
3. ``await replay(from_offset, to_offset)`` returns the changes of ``(from_offset,
   to_offset]`` exactly as the batch that ended at ``to_offset`` held them (the same
   multiset of ``(row, diff)`` per subsource), for a ``from_offset``/``to_offset`` pair that
   the reader earlier yielded as consecutive batch bounds (``from_offset`` ``None``: the
   start). It is called after a crash, before ``start``, to rebuild a batch whose binding
   was recorded but whose data reached only some subsources. Readers whose upstream can
   forget history must keep it until :meth:`confirm` says it is safe to.
4. ``await confirm(offset)`` is called once every subsource durably holds everything up to
   ``offset`` (after each batch is recorded, and after recovery). The reader may then release
   the upstream's history at or below ``offset`` (PostgreSQL: acknowledge the slot's flush
   LSN): no later ``start`` or ``replay`` asks for anything at or below the last confirmed
   offset, because a batch whose data may be missing somewhere was never confirmed (its
   ``from_offset`` is at most the last confirmed offset).
5. ``await close()`` releases connections; called exactly once, also after errors.

A reader that raises makes the ingestion stop and start over (a new reader, recovery, then
``start``), so transient upstream errors need no special handling beyond raising.
"""

from __future__ import annotations

import abc
import struct
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from tidemark.columnar import RelationSchema, Row

Changes = Mapping[str, list[tuple[Row, int]]]
"""Subsource (upstream table) name -> ``(row, diff)`` pairs."""


@dataclass(frozen=True)
class SourceBatch:
    """The changes of ``(previous offset, offset]``."""

    offset: bytes
    changes: Changes = field(default_factory=dict)

    def row_count(self) -> int:
        return sum(len(rows) for rows in self.changes.values())


class SourceReader(abc.ABC):
    """One upstream; see the module docstring for the contract."""

    @abc.abstractmethod
    def schemas(self) -> Mapping[str, RelationSchema]:
        """The upstream relations this reader produces, by subsource name."""

    @abc.abstractmethod
    async def start(self, resume_offset: bytes | None) -> None:
        """Begin after ``resume_offset`` (``None``: from the beginning)."""

    @abc.abstractmethod
    def batches(self) -> AsyncIterator[SourceBatch]:
        """The batches after the resume offset, in offset order."""

    @abc.abstractmethod
    async def replay(self, from_offset: bytes | None, to_offset: bytes) -> Changes:
        """Exactly the changes of the batch ``(from_offset, to_offset]``."""

    async def confirm(self, offset: bytes) -> None:  # noqa: B027 (optional for readers)
        """Every subsource durably holds the data up to ``offset``."""

    async def close(self) -> None:  # noqa: B027 (optional for readers)
        """Release the upstream connection."""

    def position(self, offset: bytes) -> int:
        """A number that grows with the offset, for people (the progress relation's
        ``offset`` column): by default the offset read as a big-endian u64."""
        return decode_u64(offset)


def encode_u64(value: int) -> bytes:
    """An offset that is a u64 (a tick count, an LSN): 8 bytes, big-endian, so that byte
    order is numeric order."""
    return struct.pack(">Q", value)


def decode_u64(offset: bytes) -> int:
    (value,) = struct.unpack(">Q", offset)
    return int(value)
