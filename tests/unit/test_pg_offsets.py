"""A PostgreSQL source's offsets and the initial snapshot's parts."""

from __future__ import annotations

import random

from tidemark.sources.postgres.offsets import (
    FINAL_PART,
    decode_offset,
    encode_offset,
    part_index,
    part_offsets,
    row_size,
    snapshot_parts,
)
from tidemark.sources.postgres.replication import Batch


def snapshot(rows_a: list[tuple[object, ...]], rows_b: list[tuple[object, ...]]) -> Batch:
    batch = Batch(0x1000)
    batch.changes["public.a"] = [(r, 1) for r in rows_a]
    batch.changes["public.b"] = [(r, 1) for r in rows_b]
    return batch


def test_offsets_order_as_the_history_does() -> None:
    history = [
        encode_offset(0x1000, 1),
        encode_offset(0x1000, 2),
        encode_offset(0x1000, FINAL_PART),
        encode_offset(0x1001),
        encode_offset(0x2_0000_0000),
    ]
    assert sorted(history) == history
    assert [decode_offset(o) for o in history][2] == (0x1000, FINAL_PART)
    assert part_offsets(0x1000, 3) == history[:3]
    assert part_offsets(0x1000, 1) == [encode_offset(0x1000, FINAL_PART)]
    assert [part_index(p, 3) for p in (1, 2, FINAL_PART)] == [0, 1, 2]


def test_parts_depend_on_the_contents_only() -> None:
    rows_a = [(i, f"row {i}") for i in range(300)] + [(7, "row 7")]
    rows_b = [(i, None) for i in range(50)]
    parts = snapshot_parts(snapshot(rows_a, rows_b), ["public.a", "public.b"], limit=1000)
    assert len(parts) > 5
    shuffled_a, shuffled_b = rows_a[:], rows_b[:]
    random.Random(3).shuffle(shuffled_a)
    random.Random(4).shuffle(shuffled_b)
    assert (
        snapshot_parts(snapshot(shuffled_a, shuffled_b), ["public.a", "public.b"], limit=1000)
        == parts
    )
    # Every row once (the duplicate twice), nothing else.
    held = [(key, row) for part in parts for key, pairs in part.items() for row, _ in pairs]
    assert sorted(held, key=repr) == sorted(
        [("public.a", r) for r in rows_a] + [("public.b", r) for r in rows_b], key=repr
    )
    assert all(sum(row_size(r) for p in part.values() for r, _ in p) <= 1000 for part in parts)


def test_a_snapshot_that_fits_is_one_part_as_it_came() -> None:
    batch = snapshot([(2, "b"), (1, "a")], [(None, None)])
    assert snapshot_parts(batch, ["public.a", "public.b"]) == [batch.changes]


def test_one_part_names_every_table_even_when_empty() -> None:
    assert snapshot_parts(snapshot([], []), ["public.a", "public.b"]) == [
        {"public.a": [], "public.b": []}
    ]
