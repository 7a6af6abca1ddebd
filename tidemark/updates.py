"""Update triples ``(data, time, diff)`` and the algebra on sets of them.

A collection version is a multiset with signed multiplicities, kept as ``{data: multiplicity}``
with zero entries left out. A set of updates describes a whole time-varying collection: its
version at time ``t`` is the sum of the updates at times ``<= t`` (``read_updates``).

Consolidation and compaction (``advance_by``) rewrite an update set without changing what it
reads at the times that matter, so storage can keep it small.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias, TypeVar

from tidemark.frontier import Antichain
from tidemark.lattice import Lattice

D = TypeVar("D")
T = TypeVar("T")

Update: TypeAlias = tuple[D, T, int]
"""``(data, time, diff)``: at ``time`` the multiplicity of ``data`` changes by ``diff``."""

CollectionVersion: TypeAlias = dict[D, int]
"""A collection at one time: ``{data: multiplicity}``, no zero multiplicities."""


def consolidate(updates: Iterable[Update[D, T]]) -> list[Update[D, T]]:
    """Sum the diffs of updates with equal ``(data, time)`` and drop those that sum to zero.

    The result is sorted by ``(data, time)`` whenever those pairs are mutually orderable (the
    normal case: rows, ints, strings, tuples of them), so equal inputs consolidate to equal
    lists however they were batched. If they are not orderable (e.g. ``None`` next to an int),
    the result keeps the order in which each ``(data, time)`` first appeared: still
    deterministic for a given input, just not canonical across re-orderings of it.
    """
    sums: dict[tuple[D, T], int] = {}
    for data, time, diff in updates:
        key = (data, time)
        sums[key] = sums.get(key, 0) + diff
    kept = [(data, time, diff) for (data, time), diff in sums.items() if diff != 0]
    try:
        return sorted(kept, key=_data_time)
    except TypeError:
        return kept


def _data_time(update: Update[D, T]) -> tuple[Any, Any]:
    return (update[0], update[1])


def advance_time(lattice: Lattice[T], t: T, since: Antichain[T]) -> T:
    """The earliest time ``t`` can be moved to without changing any read at or beyond ``since``:
    the meet, over the elements ``s`` of ``since``, of ``join(t, s)``.

    For every time ``r`` with ``since <= r``: ``advance_time(t) <= r`` iff ``t <= r``, so an
    update moved there contributes to exactly the same readable versions. Times already at or
    beyond ``since`` do not move. On the u64 timeline this is ``max(t, since)``.

    An empty ``since`` (``{}``) means no time is readable any more, so every placement is
    equally correct; the meet over no elements does not exist in these lattices, and ``t`` is
    returned unchanged.
    """
    elements = since.elements
    if not elements:
        return t
    advanced = lattice.join(t, elements[0])
    for s in elements[1:]:
        advanced = lattice.meet(advanced, lattice.join(t, s))
    return advanced


def advance_by(updates: Iterable[Update[D, T]], since: Antichain[T]) -> list[Update[D, T]]:
    """Compact ``updates`` to ``since``: advance every time (``advance_time``), then
    consolidate. Reads at times at or beyond ``since`` are unchanged, and the result never has
    more updates than the input. With ``since == {}`` times stay put and this only
    consolidates."""
    lattice = since.lattice
    return consolidate(
        (data, advance_time(lattice, time, since), diff) for data, time, diff in updates
    )


def read_updates(
    lattice: Lattice[T], updates: Iterable[Update[D, T]], t: T
) -> CollectionVersion[D]:
    """The collection version at ``t``: every update at a time ``<= t`` applied to the empty
    collection."""
    version: dict[D, int] = {}
    le = lattice.less_equal
    for data, time, diff in updates:
        if le(time, t):
            version[data] = version.get(data, 0) + diff
    return {data: n for data, n in version.items() if n != 0}


def diff_versions(t: T, before: Mapping[D, int], after: Mapping[D, int]) -> list[Update[D, T]]:
    """The fewest updates at time ``t`` that turn ``before`` into ``after`` (one per piece of
    data whose multiplicity differs). Zero multiplicities count as absent."""
    out: list[Update[D, T]] = []
    for data in dict.fromkeys([*before, *after]):
        change = after.get(data, 0) - before.get(data, 0)
        if change != 0:
            out.append((data, t, change))
    return out
