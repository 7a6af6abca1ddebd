"""A PostgreSQL source's offsets, and the initial snapshot cut into parts.

An offset is 16 bytes, big-endian ``(lsn, part)``, so that byte order is the order of the
source's history:

- the initial snapshot at the slot's consistent point ``L`` is one batch ``(L, FINAL_PART)``,
  or, beyond ``SNAPSHOT_PART_BYTES`` (more than the sources process should hold at once),
  several ``(L, 1)``, ``(L, 2)``, ..., the last one ``(L, FINAL_PART)``;
- every later batch ends at an upstream commit (or a keepalive's LSN) ``(lsn, 0)``, lsn > L.

Each part is its own batch at its own time, so while a snapshot larger than one part loads,
a read can see the parts recorded so far; a snapshot within one part (up to 1 GiB of row
text: one storage append of any size, sent in chunks) is never seen partly. The parts are a
function of the snapshot's contents alone (rows sorted, then cut by size), so a snapshot
rebuilt after a crash (``Replication.replay_snapshot``) cuts into the same parts, and a part
can be derived again or the remaining parts made after a restart.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from tidemark.columnar import Row
from tidemark.sources.postgres.replication import Batch

FINAL_PART = 2**64 - 1
STREAM_PART = 0
# What one part holds at most, estimated from the rows' text: what the sources process holds
# in memory at once (one part is one append, whatever its size: storage takes it in chunks).
SNAPSHOT_PART_BYTES = 2**30

Part = dict[str, list[tuple[Row, int]]]


def encode_offset(lsn: int, part: int = STREAM_PART) -> bytes:
    return struct.pack(">QQ", lsn, part)


def decode_offset(offset: bytes) -> tuple[int, int]:
    lsn, part = struct.unpack(">QQ", offset)
    return int(lsn), int(part)


def row_size(row: Row) -> int:
    """About how many bytes a row takes: its text and bytes, 8 for anything else."""
    return 16 + sum(len(v) if isinstance(v, str | bytes) else 8 for v in row)


def _order(row: Row) -> tuple[tuple[bool, object], ...]:
    # A column's values share a type; NULLs sort last.
    return tuple((v is None, v) for v in row)


def snapshot_parts(snapshot: Batch, keys: Sequence[str], limit: int | None = None) -> list[Part]:
    """The snapshot's rows cut into parts of about ``limit`` bytes (at least one part, which
    names every table, so the first batch reaches every subsource). Within a part order does
    not matter, so a snapshot that fits in one is not sorted."""
    budget = SNAPSHOT_PART_BYTES if limit is None else limit
    total = sum(row_size(row) * diff for pairs in snapshot.changes.values() for row, diff in pairs)
    if total <= budget:
        return [{key: list(snapshot.changes.get(key, [])) for key in keys}]
    parts: list[Part] = [{key: [] for key in keys}]
    used = 0
    for key in keys:
        rows = [row for row, diff in snapshot.changes.get(key, []) for _ in range(diff)]
        rows.sort(key=_order)
        for row in rows:
            size = row_size(row)
            if used and used + size > budget:
                parts.append({})
                used = 0
            parts[-1].setdefault(key, []).append((row, 1))
            used += size
    return parts


def part_offsets(lsn: int, count: int) -> list[bytes]:
    """The offsets of a snapshot's ``count`` parts."""
    return [encode_offset(lsn, n if n < count else FINAL_PART) for n in range(1, count + 1)]


def part_index(part: int, count: int) -> int:
    """Where the part with number ``part`` sits in the list of ``count`` parts."""
    return count - 1 if part == FINAL_PART else part - 1
