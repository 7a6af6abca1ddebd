"""Partial time-varying collections (pTVCs) and the two ways of writing a collection down.

A pTVC is exact for the times between two frontiers: at or beyond ``since`` (older versions
have been compacted away) and not at or beyond ``upper`` (newer versions are not known yet).
``PartialTVC`` keeps the update-set form; ``append`` moves ``upper`` forward and ``compact``
moves ``since`` forward, and both keep every readable version as it was.

The time-function form maps each time of a finite set to its collection version;
``updates_from_time_function`` and ``time_function_from_updates`` convert between the forms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, TypeAlias, TypeVar

from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.frontier import Antichain
from tidemark.lattice import Lattice
from tidemark.updates import (
    CollectionVersion,
    Update,
    advance_by,
    consolidate,
    diff_versions,
    read_updates,
)

__all__ = [
    "PartialTVC",
    "TimeFunction",
    "read_updates",
    "time_function_from_updates",
    "updates_from_time_function",
]

D = TypeVar("D")
T = TypeVar("T")

TimeFunction: TypeAlias = Mapping[T, Mapping[D, int]]
"""The time-function form over a finite set of times: ``{time: {data: multiplicity}}``."""


class PartialTVC(Generic[D, T]):
    """A pTVC in update-set form: ``updates`` read correctly at every time ``t`` with
    ``since <= t`` and not ``upper <= t``.

    It starts as the empty pTVC ``({}, since={t0}, upper={t0})``, which nothing can be read
    from yet. Neither frontier ever moves backwards, and a rejected call changes nothing.
    ``since`` may pass ``upper``; then no time is readable until ``upper`` catches up.
    """

    __slots__ = ("_since", "_updates", "_upper", "lattice")

    def __init__(self, lattice: Lattice[T]) -> None:
        self.lattice = lattice
        self._since: Antichain[T] = Antichain.minimum(lattice)
        self._upper: Antichain[T] = Antichain.minimum(lattice)
        self._updates: list[Update[D, T]] = []

    @property
    def since(self) -> Antichain[T]:
        return self._since.copy()

    @property
    def upper(self) -> Antichain[T]:
        return self._upper.copy()

    @property
    def updates(self) -> tuple[Update[D, T], ...]:
        return tuple(self._updates)

    def is_readable(self, t: T) -> bool:
        return self._since.less_equal(t) and not self._upper.less_equal(t)

    def read(self, t: T) -> CollectionVersion[D]:
        """The collection version at ``t``. Raises ``FailedPrecondition`` when ``t`` is not
        readable: before ``since`` (compacted away) or at or beyond ``upper`` (not complete)."""
        if not self._since.less_equal(t):
            raise FailedPrecondition(
                f"cannot read at {t!r}: it is not at or beyond since {self._since!r}"
            )
        if self._upper.less_equal(t):
            raise FailedPrecondition(
                f"cannot read at {t!r}: it is at or beyond upper {self._upper!r}"
            )
        return read_updates(self.lattice, self._updates, t)

    def append(self, new_upper: Antichain[T], updates: Iterable[Update[D, T]]) -> None:
        """Add every update with a time in ``[upper, new_upper)`` and advance ``upper`` to
        ``new_upper``. The caller promises these are all of the collection's updates in that
        range; an empty batch with a later ``new_upper`` just advances time.

        Raises ``FailedPrecondition`` when ``new_upper`` is not at or beyond ``upper`` and
        ``InvalidArgument`` for an update outside ``[upper, new_upper)`` or a non-integer diff.
        """
        self._require_own_lattice(new_upper, "new_upper")
        if not self._upper.frontier_less_equal(new_upper):
            raise FailedPrecondition(
                f"new upper {new_upper!r} is not at or beyond the upper {self._upper!r}"
            )
        batch = list(updates)
        for data, time, diff in batch:
            if not self._upper.less_equal(time) or new_upper.less_equal(time):
                raise InvalidArgument(
                    f"update ({data!r}, {time!r}, {diff!r}) is outside "
                    f"[{self._upper!r}, {new_upper!r})"
                )
            if not isinstance(diff, int) or isinstance(diff, bool):
                raise InvalidArgument(f"update ({data!r}, {time!r}, {diff!r}): diff is not an int")
        self._updates.extend(consolidate(batch))
        self._upper = new_upper.copy()

    def compact(self, new_since: Antichain[T]) -> None:
        """Advance ``since`` to ``new_since``, moving updates forward and merging them so that
        every read at or beyond ``new_since`` is unchanged and the update count does not grow.

        Raises ``FailedPrecondition`` when ``new_since`` is not at or beyond ``since``.
        """
        self._require_own_lattice(new_since, "new_since")
        if not self._since.frontier_less_equal(new_since):
            raise FailedPrecondition(
                f"new since {new_since!r} is not at or beyond the since {self._since!r}"
            )
        self._updates = advance_by(self._updates, new_since)
        self._since = new_since.copy()

    def _require_own_lattice(self, frontier: Antichain[T], what: str) -> None:
        if frontier.lattice != self.lattice:
            raise InvalidArgument(
                f"{what} is over {frontier.lattice!r}, this collection over {self.lattice!r}"
            )

    def __repr__(self) -> str:
        return (
            f"PartialTVC(since={self._since!r}, upper={self._upper!r}, "
            f"updates={len(self._updates)})"
        )


def updates_from_time_function(
    lattice: Lattice[T], versions: TimeFunction[T, D]
) -> list[Update[D, T]]:
    """The update-set form of a time function: at each time, the difference between its
    version and the sum of the updates at all earlier times (the formalism's
    ``diff(t, apply(cv0, prior-updates(t)), read(t))``), consolidated.

    Reading the result back at any time of ``versions`` gives that time's version exactly.
    When the times form a downward-closed set (every time below one of them is one of them,
    e.g. ``0..n`` on the u64 timeline) this is the only consolidated update set at those times
    that does so, which makes the two forms interchangeable there.
    """
    times = list(versions)
    le = lattice.less_equal
    # A time strictly below another has strictly fewer times at or below it, so this order
    # handles every time after all of its predecessors.
    ordered = sorted(times, key=lambda t: sum(1 for s in times if le(s, t)))
    out: list[Update[D, T]] = []
    for t in ordered:
        # Only earlier times have updates in ``out`` so far, so this is the prior sum.
        before = read_updates(lattice, out, t)
        out.extend(diff_versions(t, before, versions[t]))
    return consolidate(out)


def time_function_from_updates(
    lattice: Lattice[T], updates: Iterable[Update[D, T]], times: Iterable[T]
) -> dict[T, CollectionVersion[D]]:
    """The time-function form of ``updates`` over ``times``: each time's version."""
    held = list(updates)
    return {t: read_updates(lattice, held, t) for t in times}
