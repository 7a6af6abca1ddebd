"""A sorted list of distinct keys, each with a positive weight, where an update and a search
by cumulative weight cost O(log n).

One flat sorted list would shift every later entry on an insert or a removal, so an update to a
group of n rows costs O(n). Here the keys live in blocks of at most ``2 * LOAD`` (the shift is
bounded by the block), a bisection over the blocks' last keys finds a key's block, and a
Fenwick tree over the blocks' total weights finds the block holding the p-th unit of weight.
The tree is rebuilt (O(number of blocks)) only when blocks split or merge, which happens once
per O(LOAD) updates, so its cost spreads to O(1) per update.

A top-k asks for the rows at positions [offset, offset + limit) counting multiplicities, which
is why the weights: a row with multiplicity m takes m positions but one entry.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

LOAD = 256
"""Blocks split above ``2 * LOAD`` keys and merge with a neighbour below ``LOAD // 2``."""


class SortedWeights:
    """Keys must be mutually comparable and the caller says whether a key is present: the
    structure never compares keys for equality, only for order, so keys only need a total
    order (``ordering.py`` keys are)."""

    __slots__ = ("_keys", "_len", "_maxes", "_sums", "_tree", "_weights", "total")

    def __init__(self) -> None:
        self._keys: list[list[Any]] = []
        self._weights: list[list[int]] = []
        self._maxes: list[Any] = []
        self._sums: list[int] = []
        # Fenwick tree (1-based) over _sums; None when it must be rebuilt.
        self._tree: list[int] | None = None
        self._len = 0
        self.total = 0
        """The sum of all weights."""

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    # -- updates ---------------------------------------------------------------------------

    def insert(self, key: Any, weight: int) -> None:
        """Adds ``key`` (not present) with ``weight`` (> 0)."""
        if not self._keys:
            self._keys.append([key])
            self._weights.append([weight])
            self._maxes.append(key)
            self._sums.append(weight)
            self._tree = None
        else:
            block = self._block(key)
            keys = self._keys[block]
            at = bisect_left(keys, key)
            keys.insert(at, key)
            self._weights[block].insert(at, weight)
            if at == len(keys) - 1:
                self._maxes[block] = key
            self._grow(block, weight)
            if len(keys) > 2 * LOAD:
                self._split(block)
        self._len += 1
        self.total += weight

    def remove(self, key: Any) -> int:
        """Removes ``key`` (present) and returns its weight."""
        block = self._block(key)
        keys = self._keys[block]
        at = bisect_left(keys, key)
        del keys[at]
        weight = self._weights[block].pop(at)
        self._len -= 1
        self.total -= weight
        if not keys:
            self._drop_block(block)
            return weight
        self._grow(block, -weight)
        if at == len(keys):
            self._maxes[block] = keys[-1]
        if len(keys) < LOAD // 2 and len(self._keys) > 1:
            self._merge(block - 1 if block else block)
        return weight

    def reweight(self, key: Any, weight: int) -> None:
        """Sets the weight of ``key`` (present) to ``weight`` (> 0)."""
        block = self._block(key)
        at = bisect_left(self._keys[block], key)
        weights = self._weights[block]
        change = weight - weights[at]
        weights[at] = weight
        self.total += change
        self._grow(block, change)

    # -- reads -----------------------------------------------------------------------------

    def first(self) -> Any:
        """The smallest key (the structure must not be empty)."""
        return self._keys[0][0]

    def last(self) -> Any:
        """The largest key (the structure must not be empty)."""
        return self._keys[-1][-1]

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        """Every ``(key, weight)`` in order."""
        for keys, weights in zip(self._keys, self._weights, strict=True):
            yield from zip(keys, weights, strict=True)

    def between(self, low: int, high: int | None) -> list[tuple[Any, int]]:
        """The keys with units at positions [low, high) of the cumulative weight (0-based;
        None: to the end), in order, each with how many of its units fall there. Finding the
        first costs O(log n); each next one O(1)."""
        end = self.total if high is None else min(high, self.total)
        if low >= end:
            return []
        # A top-k without an offset reads from the front: no tree walk, no prefix sums.
        block, offset = (0, low) if low < self._sums[0] else self._find(low)
        at, start = 0, low - offset
        if offset:
            cumulative = list(accumulate(self._weights[block]))
            at = bisect_right(cumulative, offset)
            start += cumulative[at - 1] if at else 0
        found = []
        while True:  # ends by the last key's units, since end <= total
            keys, weights = self._keys[block], self._weights[block]
            for index in range(at, len(keys)):
                stop = start + weights[index]
                found.append((keys[index], min(stop, end) - max(start, low)))
                if stop >= end:
                    return found
                start = stop
            block, at = block + 1, 0

    # -- blocks ----------------------------------------------------------------------------

    def _block(self, key: Any) -> int:
        maxes = self._maxes
        block = bisect_left(maxes, key)
        return block if block < len(maxes) else len(maxes) - 1

    def _grow(self, block: int, change: int) -> None:
        self._sums[block] += change
        tree = self._tree
        if tree is not None:
            size = len(tree) - 1
            node = block + 1
            while node <= size:
                tree[node] += change
                node += node & -node

    def _split(self, block: int) -> None:
        keys, weights = self._keys[block], self._weights[block]
        half = len(keys) // 2
        self._keys[block : block + 1] = [keys[:half], keys[half:]]
        self._weights[block : block + 1] = [weights[:half], weights[half:]]
        self._maxes[block : block + 1] = [keys[half - 1], keys[-1]]
        self._sums[block : block + 1] = [sum(weights[:half]), sum(weights[half:])]
        self._tree = None

    def _merge(self, block: int) -> None:
        """Joins ``block`` and the next one."""
        keys = self._keys[block] + self._keys[block + 1]
        weights = self._weights[block] + self._weights[block + 1]
        self._keys[block : block + 2] = [keys]
        self._weights[block : block + 2] = [weights]
        self._maxes[block : block + 2] = [keys[-1]]
        self._sums[block : block + 2] = [sum(weights)]
        self._tree = None
        if len(keys) > 2 * LOAD:
            self._split(block)

    def _drop_block(self, block: int) -> None:
        del self._keys[block]
        del self._weights[block]
        del self._maxes[block]
        del self._sums[block]
        self._tree = None

    def _fenwick(self) -> list[int]:
        tree = self._tree
        if tree is None:
            size = len(self._sums)
            tree = [0, *self._sums]
            for node in range(1, size + 1):
                parent = node + (node & -node)
                if parent <= size:
                    tree[parent] += tree[node]
            self._tree = tree
        return tree

    def _find(self, position: int) -> tuple[int, int]:
        """The block holding unit ``position`` (< total) and the unit's offset in it."""
        tree = self._fenwick()
        size = len(tree) - 1
        node = 0
        step = 1 << (size.bit_length() - 1)
        while step:
            ahead = node + step
            if ahead <= size and tree[ahead] <= position:
                node = ahead
                position -= tree[ahead]
            step >>= 1
        return node, position
