"""Lattices of times.

Times are plain values (``int`` for the u64 timeline, tuples for product times); the order
and the lattice operations live in a separate ``Lattice`` object, so the same frontier and
update code serves every kind of time and the services can keep using bare integers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

T = TypeVar("T")

U64_MAX = (1 << 64) - 1


class Lattice(ABC, Generic[T]):
    """The lattice laws a timeline's times obey: ``join`` (least upper bound), ``meet``
    (greatest lower bound) and the partial order ``a <= b iff join(a, b) == b``."""

    @abstractmethod
    def join(self, a: T, b: T) -> T: ...

    @abstractmethod
    def meet(self, a: T, b: T) -> T: ...

    @abstractmethod
    def less_equal(self, a: T, b: T) -> bool: ...

    @abstractmethod
    def minimum(self) -> T:
        """The least time ``t0``: ``less_equal(t0, t)`` for every ``t``."""

    def less_than(self, a: T, b: T) -> bool:
        return a != b and self.less_equal(a, b)

    def join_all(self, first: T, *rest: T) -> T:
        acc = first
        for t in rest:
            acc = self.join(acc, t)
        return acc

    def meet_all(self, first: T, *rest: T) -> T:
        acc = first
        for t in rest:
            acc = self.meet(acc, t)
        return acc


class U64Lattice(Lattice[int]):
    """The totally ordered timeline of unsigned 64-bit integers (milliseconds)."""

    def join(self, a: int, b: int) -> int:
        return a if a >= b else b

    def meet(self, a: int, b: int) -> int:
        return a if a <= b else b

    def less_equal(self, a: int, b: int) -> bool:
        return a <= b

    def less_than(self, a: int, b: int) -> bool:
        return a < b

    def minimum(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "U64"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, U64Lattice)

    def __hash__(self) -> int:
        return hash(U64Lattice)


class ProductLattice(Lattice[tuple[object, object]]):
    """Pairs ordered coordinate-wise: ``(a1, a2) <= (b1, b2)`` iff both coordinates are.

    This is the canonical partially ordered time (e.g. an outer timestamp with an iteration
    counter); two pairs may be incomparable, which is what frontiers of several elements are for.
    """

    def __init__(self, first: Lattice[object], second: Lattice[object]) -> None:
        self.first = first
        self.second = second

    def join(self, a: tuple[object, object], b: tuple[object, object]) -> tuple[object, object]:
        return (self.first.join(a[0], b[0]), self.second.join(a[1], b[1]))

    def meet(self, a: tuple[object, object], b: tuple[object, object]) -> tuple[object, object]:
        return (self.first.meet(a[0], b[0]), self.second.meet(a[1], b[1]))

    def less_equal(self, a: tuple[object, object], b: tuple[object, object]) -> bool:
        return self.first.less_equal(a[0], b[0]) and self.second.less_equal(a[1], b[1])

    def minimum(self) -> tuple[object, object]:
        return (self.first.minimum(), self.second.minimum())

    def __repr__(self) -> str:
        return f"Product({self.first!r}, {self.second!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProductLattice)
            and self.first == other.first
            and self.second == other.second
        )

    def __hash__(self) -> int:
        return hash((self.first, self.second))


U64 = U64Lattice()
"""The lattice of the services' timeline."""

U64_PAIRS: Lattice[tuple[int, int]] = ProductLattice(U64, U64)  # type: ignore[arg-type,assignment]
"""Pairs of u64 times, the partially ordered lattice the core's tests exercise."""


def is_u64(t: int) -> bool:
    return isinstance(t, int) and 0 <= t <= U64_MAX
