"""Where a collection's Parquet parts live in the blob store, and how their keys read.

A part is one immutable Parquet object of updates (the collection's columns, ``time``,
``diff``). Storage writes the parts of its own appends and compactions; a Spark job writes
parts too and hands them to storage (``Storage.AppendParts``). Both name them alike:
``shards/<collection>/<ms>-<uuid>.parquet``, a key no other write will ever use, whose
wall-clock milliseconds let storage's orphan sweep tell a part nobody committed (deleted
after a grace period) from one whose append is still on its way.
"""

from __future__ import annotations

import re
import uuid

_KEY = re.compile(r"shards/([^/]+)/(\d{13})-[0-9a-f]{32}\.parquet")


def part_prefix(collection_id: str) -> str:
    return f"shards/{collection_id}/"


def new_part_key(collection_id: str, now_ms: int) -> str:
    """A fresh key for a part of ``collection_id`` written at ``now_ms``."""
    return f"{part_prefix(collection_id)}{now_ms:013d}-{uuid.uuid4().hex}.parquet"


def written_ms(key: str) -> int | None:
    """When the part ``key`` was written, or ``None`` if it is not a part key."""
    match = _KEY.fullmatch(key)
    return int(match.group(2)) if match else None


def part_of(key: str) -> str | None:
    """The collection the part ``key`` belongs to, or ``None`` if it is not a part key."""
    match = _KEY.fullmatch(key)
    return match.group(1) if match else None
