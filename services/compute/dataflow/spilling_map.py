"""A map of keys to operator state (Reduce's groups, Distinct's counts, top-k's groups) that
spills to a task's ``StateBudget`` like arrangements do, keys and all.

An arrangement keeps every key in memory and spills only the rows under it, which pays when a
key holds many rows. A group of a GROUP BY, or a row of a DISTINCT, is about as small as its
key: keeping the keys in memory would keep most of the state there. So this map spills keys
with their entries, a bucket at a time, and keeps in memory only a directory from key hashes
to buckets: extendible hashing, where a bucket holds the keys whose hashes end in the same
``depth`` bits, and one whose entries grow past ``BUCKET_BYTES`` splits in two on the next bit
(the directory doubles when the bucket's depth reaches its own). A bucket is thus a few KiB
of state (a handful of MIN/MAX groups, or a few dozen DISTINCT rows), so a step touching a
spilled key reads that much back, and what stays in memory for a spilled bucket (its
directory slots, the bucket object, its location in the file: a few hundred bytes) is a few
per cent of the state it stands for.

Buckets go to disk in the order they came into memory, but one touched since the budget last
looked is passed over once and goes to the back (the clock algorithm: a flag set on each
touch, cleared when the budget passes it by), through the task's one ``SpillFile``, so
compaction and the disk limit cover them with the rest. Without a budget the map is one
bucket that never splits: a dict.

Each entry has an estimated size (``entry_bytes``), which the owner keeps the map told of as
entries change (``add``, ``discard``, ``resize``), so that the bytes in memory and on disk are
known without a walk. Touching a bucket brings it back without relieving the budget; the owner
calls ``settle`` once it is done with the entry, which is when the budget may spill (the entry
it just changed included).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from itertools import islice
from typing import Any, Generic, TypeVar

from services.compute.dataflow.spill import Location, StateBudget

V = TypeVar("V")
K = TypeVar("K")

BUCKET_BYTES = 4096
"""A bucket whose entries are estimated past this splits (unless it holds one key). Small
buckets keep a read of one spilled key small, but each costs a bucket object and its
directory slots: at this size they are a few per cent of what they hold."""

MAX_DEPTH = 22
"""Hash bits a bucket may split on. Past them, or when its keys' hashes are equal on all the
bits left to split on, a bucket just grows. The directory has a slot per combination of the
bits split on, so this bounds it (4M slots, 32 MiB): two keys whose hashes share many low bits
(in Python, -1 and -2 hash alike) would otherwise double it once per shared bit."""

ORDER_BITS = 48
"""Hash bits :func:`_bucket_order` sorts on (more than ``MAX_DEPTH``)."""

_SPILL_BATCH = 256
"""Buckets examined per round when choosing what to spill."""

BULK_KEYS = 4096
"""A batch touching at least this many keys visits them bucket after bucket."""

_REVERSED_16 = [int(f"{n:016b}"[::-1], 2) for n in range(1 << 16)]


def _bucket_order(key: Any) -> int:
    """The low ``ORDER_BITS`` bits of the key's hash, reversed: sorted by this, the keys of
    any one bucket are consecutive, at every depth."""
    hashed = hash(key)
    return (
        _REVERSED_16[hashed & 0xFFFF] << 32
        | _REVERSED_16[(hashed >> 16) & 0xFFFF] << 16
        | _REVERSED_16[(hashed >> 32) & 0xFFFF]
    )


def _differ_past(entries: Collection[Any], depth: int) -> bool:
    """Whether the hashes of ``entries``' keys differ in some bit a split may still use (from
    ``depth`` up to ``MAX_DEPTH``)."""
    bits = ((1 << MAX_DEPTH) - 1) & ~((1 << depth) - 1)
    keys = iter(entries)
    first = hash(next(keys)) & bits
    return any(hash(key) & bits != first for key in keys)


class Bucket(Generic[V]):
    """Keys whose hashes share their last ``depth`` bits. ``entries`` is None while on disk."""

    __slots__ = ("__weakref__", "bytes", "depth", "entries", "touched")

    def __init__(self, depth: int, entries: dict[Any, V]) -> None:
        self.depth = depth
        self.entries: dict[Any, V] | None = entries
        self.bytes = 0
        """The entries' estimated size, on disk or not."""
        self.touched = True


class SpillingMap(Generic[V]):
    __slots__ = (
        "__weakref__",
        "_bucket_bytes",
        "_budget",
        "_cold",
        "_cold_bytes",
        "_directory",
        "_entry_bytes",
        "_hot",
        "_hot_bytes",
        "_len",
        "_mask",
        "_member_id",
        "_split_past",
    )

    def __init__(
        self, entry_bytes: Callable[[Any, V], int], *, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        self._entry_bytes = entry_bytes
        """The estimated size of an entry (used when a bucket splits)."""
        first: Bucket[V] = Bucket(0, {})
        self._directory: list[Bucket[V]] = [first]
        self._mask = 0
        self._hot: dict[Bucket[V], None] = {first: None}
        """Buckets in memory, in the order they came in (the clock's hand is the front)."""
        self._cold: dict[Any, Location] = {}
        """Buckets on disk (those with entries) and where."""
        self._hot_bytes = 0
        self._cold_bytes = 0
        self._len = 0
        self._split_past = bucket_bytes
        self._bucket_bytes = 0
        """Past this a bucket splits (0: never, without a budget)."""
        self._budget: StateBudget | None = None
        self._member_id = 0

    # -- the owner's operations ------------------------------------------------------------------

    def bucket(self, key: Any) -> Bucket[V]:
        """The bucket ``key`` belongs in, in memory (read back if it was spilled): read and
        change its ``entries`` directly, telling the map of changes to their number or size."""
        bucket = self._directory[hash(key) & self._mask]
        bucket.touched = True
        if bucket.entries is None:
            self._unspill(bucket)
        return bucket

    def get(self, key: Any) -> V | None:
        entries = self.bucket(key).entries
        assert entries is not None
        return entries.get(key)

    def add(self, bucket: Bucket[V], key: Any, value: V, size: int) -> None:
        """Puts ``key`` (absent) in ``bucket`` (its bucket, in memory) with ``value`` of
        estimated ``size`` bytes."""
        entries = bucket.entries
        assert entries is not None
        entries[key] = value
        self._len += 1
        self.resize(bucket, size)

    def discard(self, bucket: Bucket[V], key: Any, size: int) -> None:
        """Removes ``key`` (present, of estimated ``size`` bytes) from ``bucket``."""
        entries = bucket.entries
        assert entries is not None
        del entries[key]
        self._len -= 1
        self.resize(bucket, -size)

    def resize(self, bucket: Bucket[V], change: int) -> None:
        """An entry of ``bucket`` (in memory) changed size by ``change`` bytes."""
        bucket.bytes += change
        self._hot_bytes += change
        budget = self._budget
        if budget is not None:
            budget.held_bytes += change
            if bucket.bytes > self._bucket_bytes and change > 0:
                self._split(bucket)

    def settle(self) -> None:
        """The owner is done with the entries it touched: the budget may spill now."""
        budget = self._budget
        if budget is not None and budget.held_bytes > budget.budget_bytes:
            budget.relieve()

    def __len__(self) -> int:
        return self._len

    def in_bucket_order(self, keys: Collection[K]) -> Iterable[K]:
        """``keys`` (of one batch, each to be touched once) in the order to touch them: for
        many keys (a hydration), bucket after bucket, so that a bucket spilled once the batch
        has moved past it is not read back by the batch (a new key in a spilled bucket needs
        the bucket read, to know the key is new). A step's few keys, or keys without a budget,
        are touched as they are."""
        if self._budget is None or len(keys) < BULK_KEYS:
            return keys
        return sorted(keys, key=_bucket_order)

    def items(self) -> Iterator[tuple[Any, V]]:
        """Every entry, spilled ones included (for tests and diagnostics; spilled ones are
        copies)."""
        for bucket in dict.fromkeys(self._directory):
            entries = bucket.entries
            if entries is None:
                location = self._cold.get(bucket)
                if location is None:
                    continue  # spilled empty: never written
                assert self._budget is not None
                entries = self._budget.file.read(location)
            assert entries is not None
            yield from entries.items()

    def values(self) -> Iterator[V]:
        for _, value in self.items():
            yield value

    @property
    def spilled_bytes(self) -> int:
        """The estimated size of the entries on disk."""
        return self._cold_bytes

    # -- the budget ------------------------------------------------------------------------------

    def attach(self, budget: StateBudget) -> None:
        """Counts the entries in memory against ``budget`` from now on, splitting buckets so
        that they can spill a few keys at a time."""
        if self._budget is not None:
            return
        self._bucket_bytes = self._split_past
        for bucket in list(self._hot):
            if bucket.bytes > self._bucket_bytes:
                self._split(bucket)
        self._budget = budget
        self._member_id = budget.attach(self)

    def release(self) -> None:
        """Stops counting against the budget; what was spilled becomes garbage."""
        budget = self._budget
        if budget is not None:
            budget.detach(self, self._member_id)
            self._budget = None

    def held_in_memory(self) -> int:
        return self._hot_bytes

    @property
    def spilled(self) -> dict[Any, Location]:
        return self._cold

    def spill_oldest(self, bytes_wanted: int) -> int:
        budget = self._budget
        if budget is None:
            return 0
        hot = self._hot
        freed = 0
        while freed < bytes_wanted and hot:
            chosen: list[Bucket[V]] = []
            passed = []
            for bucket in islice(hot, _SPILL_BATCH):
                if bucket.touched:
                    bucket.touched = False
                    passed.append(bucket)
                    continue
                chosen.append(bucket)
                freed += bucket.bytes
                if freed >= bytes_wanted:
                    break
            for bucket in passed:
                # A second chance: to the back of the line.
                del hot[bucket]
                hot[bucket] = None
            for bucket in chosen:
                del hot[bucket]
            full = [bucket for bucket in chosen if bucket.entries]
            locations = budget.file.put([bucket.entries for bucket in full])
            for bucket, location in zip(full, locations, strict=True):
                self._cold[bucket] = location
                budget.spilled_keys += len(bucket.entries or ())
            for bucket in chosen:
                bucket.entries = None
                self._hot_bytes -= bucket.bytes
                self._cold_bytes += bucket.bytes
        return freed

    def _unspill(self, bucket: Bucket[V]) -> None:
        budget = self._budget
        assert budget is not None
        location = self._cold.pop(bucket, None)
        # An empty bucket was never written.
        bucket.entries = {} if location is None else budget.file.take(location)
        self._hot[bucket] = None
        self._hot_bytes += bucket.bytes
        self._cold_bytes -= bucket.bytes
        # Counted without relieving: the owner is about to use the bucket.
        budget.held_bytes += bucket.bytes

    def _split(self, bucket: Bucket[V]) -> None:
        """Splits ``bucket`` (in memory) on its next hash bits until every part fits (or
        holds one key, or its keys' hashes are equal as far as they split)."""
        pending = [bucket]
        while pending:
            bucket = pending.pop()
            entries = bucket.entries
            assert entries is not None
            if bucket.bytes <= self._bucket_bytes or len(entries) < 2 or bucket.depth >= MAX_DEPTH:
                continue
            depth = bucket.depth
            if not _differ_past(entries, depth):
                continue  # no split can part these keys: the bucket grows
            if (1 << depth) > self._mask:
                self._directory = self._directory + self._directory
                self._mask = len(self._directory) - 1
            bit = 1 << depth
            # The directory slots that point at the bucket: those ending in its bits.
            low = hash(next(iter(entries))) & (bit - 1)
            moved = {key: value for key, value in entries.items() if hash(key) & bit}
            for key in moved:
                del entries[key]
            sibling: Bucket[V] = Bucket(depth + 1, moved)
            bucket.depth = depth + 1
            entry_bytes = self._entry_bytes
            sibling.bytes = sum(entry_bytes(key, value) for key, value in moved.items())
            bucket.bytes -= sibling.bytes
            self._hot[sibling] = None
            directory = self._directory
            for slot in range(low | bit, len(directory), bit << 1):
                directory[slot] = sibling
            pending += (bucket, sibling)
