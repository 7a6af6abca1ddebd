"""A source's progress relation: one row, the binding of its latest batch.

Materialize exposes ``<source>_progress`` with the offset ingested up to; here the row also
carries what recovery needs to rebuild that batch (:mod:`tidemark.sources.ingest`):

- ``offset``: the reader's position of the offset (ticks, an LSN), for people;
- ``offset_bytes``: the exact offset the data is bound up to;
- ``previous_bytes``: the offset the batch started after (``NULL``: the start);
- ``bound_at``: the data time the batch is bound to.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemark.columnar import Column, ColumnType, RelationSchema, Row

PROGRESS_SCHEMA = RelationSchema(
    [
        Column("offset", ColumnType.INT64, nullable=False),
        Column("offset_bytes", ColumnType.BYTES, nullable=False),
        Column("previous_bytes", ColumnType.BYTES, nullable=True),
        Column("bound_at", ColumnType.INT64, nullable=False),
    ]
)


@dataclass(frozen=True)
class Binding:
    """A batch ``(previous, offset]`` bound to the data time ``bound_at``."""

    offset: bytes
    previous: bytes | None
    bound_at: int
    position: int

    def row(self) -> Row:
        return (self.position, self.offset, self.previous, self.bound_at)

    @classmethod
    def from_row(cls, row: Row) -> Binding:
        position, offset, previous, bound_at = row
        return cls(bytes(offset), None if previous is None else bytes(previous), bound_at, position)
