"""Antichains (frontiers) of times and their counted, mutable form.

A frontier ``F`` bounds a set of times: ``t`` is *at or beyond* ``F`` (``F <= t``) when some
element of ``F`` is less than or equal to ``t``. The empty frontier ``{}`` is the latest one:
no time is beyond it, so a collection whose upper is ``{}`` is complete forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from tidemark.lattice import U64, Lattice

T = TypeVar("T")


class Antichain(Generic[T]):
    """A set of mutually incomparable times, kept minimal as elements are inserted."""

    __slots__ = ("_elements", "lattice")

    def __init__(self, lattice: Lattice[T], elements: Iterable[T] = ()) -> None:
        self.lattice = lattice
        self._elements: list[T] = []
        for t in elements:
            self.insert(t)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def empty(cls, lattice: Lattice[T]) -> Antichain[T]:
        """The final frontier ``{}``."""
        return cls(lattice)

    @classmethod
    def minimum(cls, lattice: Lattice[T]) -> Antichain[T]:
        """The earliest frontier ``{t0}``: every time is beyond it."""
        return cls(lattice, (lattice.minimum(),))

    def insert(self, t: T) -> bool:
        """Add ``t`` unless an element is already at or before it; drop elements it precedes.
        Returns whether the antichain changed."""
        le = self.lattice.less_equal
        if any(le(e, t) for e in self._elements):
            return False
        self._elements = [e for e in self._elements if not le(t, e)]
        self._elements.append(t)
        return True

    def copy(self) -> Antichain[T]:
        out: Antichain[T] = Antichain(self.lattice)
        out._elements = list(self._elements)
        return out

    # -- a time against the frontier ----------------------------------------------------
    def less_equal(self, t: T) -> bool:
        """``F <= t``: some element is at or before ``t`` (``t`` is not yet complete)."""
        le = self.lattice.less_equal
        return any(le(e, t) for e in self._elements)

    def less_than(self, t: T) -> bool:
        """``F < t``: some element is strictly before ``t``."""
        lt = self.lattice.less_than
        return any(lt(e, t) for e in self._elements)

    # -- frontiers against each other ---------------------------------------------------
    def frontier_less_equal(self, other: Antichain[T]) -> bool:
        """``self <= other``: every element of ``other`` is at or beyond ``self``, i.e.
        ``other`` is the same as or later than ``self``. ``{}`` is the greatest frontier."""
        return all(self.less_equal(t) for t in other._elements)

    def frontier_less_than(self, other: Antichain[T]) -> bool:
        return self != other and self.frontier_less_equal(other)

    def meet(self, other: Antichain[T]) -> Antichain[T]:
        """The greatest frontier at or before both: the minimal elements of their union."""
        out = self.copy()
        for t in other._elements:
            out.insert(t)
        return out

    def join(self, other: Antichain[T]) -> Antichain[T]:
        """The least frontier at or beyond both: the minimal pairwise joins."""
        join = self.lattice.join
        return Antichain(
            self.lattice, (join(a, b) for a in self._elements for b in other._elements)
        )

    # -- the container ------------------------------------------------------------------
    @property
    def elements(self) -> tuple[T, ...]:
        return tuple(self._elements)

    def is_empty(self) -> bool:
        return not self._elements

    def __iter__(self) -> Iterator[T]:
        return iter(self._elements)

    def __len__(self) -> int:
        return len(self._elements)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Antichain):
            return NotImplemented
        return len(self._elements) == len(other._elements) and set(self._elements) == set(
            other._elements
        )

    def __hash__(self) -> int:
        return hash(frozenset(self._elements))

    def __repr__(self) -> str:
        inner = ", ".join(repr(e) for e in sorted(self._elements, key=repr))
        return "{" + inner + "}"


class MutableAntichain(Generic[T]):
    """A multiset of times with signed counts; its frontier is the antichain of minimal
    times whose count is positive. Used to track outstanding work (CDCv2 counts, held
    capabilities) where the same time may be held several times over."""

    __slots__ = ("_counts", "_frontier", "lattice")

    def __init__(self, lattice: Lattice[T], updates: Iterable[tuple[T, int]] = ()) -> None:
        self.lattice = lattice
        self._counts: dict[T, int] = {}
        self._frontier: Antichain[T] | None = Antichain(lattice)
        self.update_iter(updates)

    def update(self, t: T, delta: int) -> None:
        if delta == 0:
            return
        n = self._counts.get(t, 0) + delta
        if n == 0:
            del self._counts[t]
        else:
            self._counts[t] = n
        self._frontier = None

    def update_iter(self, updates: Iterable[tuple[T, int]]) -> None:
        for t, delta in updates:
            self.update(t, delta)

    def count(self, t: T) -> int:
        return self._counts.get(t, 0)

    def frontier(self) -> Antichain[T]:
        """The minimal times with a positive count (recomputed only after a change). The
        result is the caller's own copy."""
        if self._frontier is None:
            self._frontier = Antichain(self.lattice, (t for t, n in self._counts.items() if n > 0))
        return self._frontier.copy()

    def less_equal(self, t: T) -> bool:
        if self._frontier is None:
            self.frontier()
        assert self._frontier is not None
        return self._frontier.less_equal(t)

    def is_empty(self) -> bool:
        return not self._counts

    def counts(self) -> dict[T, int]:
        return dict(self._counts)

    def __repr__(self) -> str:
        return f"MutableAntichain({self._counts!r})"


def u64_frontier(*elements: int) -> Antichain[int]:
    """A u64 frontier: ``u64_frontier()`` is ``{}``, ``u64_frontier(5)`` is ``{5}``."""
    return Antichain(U64, elements)
