"""Checking an append against the catalog it would change.

:func:`plan_append` turns a request's updates into steps (one per time, consolidated) and checks
that the catalog stays valid at every one of those times, by applying each step to the index
and undoing them all afterwards: the index is left exactly as it was, whether the append is
accepted or not.

The rules, checked at every time the append changes:

- each update's time lies in ``[expected_upper, new_upper)``; a retraction names the current
  row exactly; at most one item per key; every item is well formed on its own;
- names are unique in their namespace (see :mod:`services.catalog.items`), and a schema's
  database and a relation's or index's schema exist;
- every dependency exists (with the right kind where the body names it), and no item is
  dropped, or its name changed, while others still depend on it or live in it;
- an item keeps its kind, and an allocator is never dropped nor moved backwards;
- GlobalIds are never bound twice: an id new to the catalog must be taken from its allocator
  by this very append (at or above the allocator's ``next`` before the append, below it
  after), and cannot be bound twice within the append. Dropped ids therefore stay retired,
  because no allocator will hand them out again.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.catalog.index import CatalogIndex, Step
from services.catalog.items import (
    PREFIX_ALLOCATORS,
    NameKey,
    Row,
    check_item,
    container_key,
    global_id_number,
    namespace_key,
    references,
)
from tidemark.catalog_items import allocator_key, describe
from tidemark.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from tidemark.v1 import catalog_pb2

# An item's description in error messages can be long; an append can name many.
_MAX_NAMED = 3


def _name_text(name: NameKey) -> str:
    """``schema db.public`` for a namespace key."""
    kind, *parts = name
    return f"{kind} {'.'.join(parts)}"


def consolidate_request(
    updates: Iterable[catalog_pb2.CatalogUpdate], expected_upper: int, new_upper: int
) -> list[Step]:
    """The request's updates as steps in time order, after checking the interval, the times
    and each item on its own."""
    if new_upper <= expected_upper:
        raise InvalidArgument(
            f"new upper {new_upper} must be greater than the expected upper {expected_upper}"
        )
    sums: dict[tuple[bytes, int], tuple[Row, int]] = {}
    for update in updates:
        if not expected_upper <= update.time < new_upper:
            raise InvalidArgument(
                f"update of {describe(update.item)} at {update.time} lies outside "
                f"[{expected_upper}, {new_upper})"
            )
        if update.diff == 0:
            continue
        check_item(update.item)
        row = Row.of(update.item)
        key = (row.data, update.time)
        previous = sums.get(key)
        sums[key] = (row, update.diff + (previous[1] if previous else 0))
    by_time: dict[int, tuple[list[Row], list[Row]]] = {}
    for (_, time), (row, diff) in sums.items():
        if diff == 0:
            continue
        if diff not in (1, -1):
            raise InvalidArgument(
                f"{describe(row.item)} changes by {diff} at {time}; a catalog item is inserted "
                "(+1) or retracted (-1)"
            )
        removed, added = by_time.setdefault(time, ([], []))
        (added if diff > 0 else removed).append(row)
    return [
        Step(time, tuple(removed), tuple(added))
        for time, (removed, added) in sorted(by_time.items())
    ]


def plan_append(
    index: CatalogIndex,
    updates: Iterable[catalog_pb2.CatalogUpdate],
    expected_upper: int,
    new_upper: int,
) -> list[Step]:
    """The validated steps of an append to the catalog ``index`` holds (its state at
    ``expected_upper``). Raises a Tidemark error naming the first broken rule; ``index`` is
    unchanged either way."""
    steps = consolidate_request(updates, expected_upper, new_upper)
    allocated_from = _allocator_positions(index)
    bound_here: dict[str, int] = {}
    applied: list[Step] = []
    try:
        for step in steps:
            _check_step(index, step, allocated_from, bound_here)
            applied.append(step)
        allocated_to = _allocator_positions(index)
        for global_id, time in bound_here.items():
            prefix, number = global_id_number(global_id)
            if number >= allocated_to.get(prefix, 0):
                raise InvalidArgument(
                    f"{global_id} (bound at {time}) is not below the "
                    f"{PREFIX_ALLOCATORS[prefix]!r} allocator's next id after this append "
                    f"({allocated_to.get(prefix, 0)}); advance the allocator in the same append"
                )
    finally:
        index.undo_all(applied)
    return steps


def _allocator_positions(index: CatalogIndex) -> dict[str, int]:
    """Each id prefix's next free number."""
    positions: dict[str, int] = {}
    for prefix, name in PREFIX_ALLOCATORS.items():
        row = index.get(allocator_key(name))
        positions[prefix] = row.item.id_allocator.next if row is not None else 0
    return positions


def _check_step(
    index: CatalogIndex,
    step: Step,
    allocated_from: dict[str, int],
    bound_here: dict[str, int],
) -> None:
    """Check ``step`` against ``index`` and apply it; on failure ``index`` is unchanged."""
    removed = {row.key: row for row in step.removed}
    added: dict[str, Row] = {}
    for row in step.removed:
        current = index.get(row.key)
        if current is None or current.data != row.data:
            found = "it does not exist" if current is None else "the current row differs"
            raise FailedPrecondition(
                f"retraction of {describe(row.item)} at {step.time} does not match the "
                f"catalog: {found}"
            )
    for row in step.added:
        if row.key in added:
            raise InvalidArgument(
                f"two items with key {row.key} at {step.time}: {describe(added[row.key].item)} "
                f"and {describe(row.item)}"
            )
        added[row.key] = row
        current = index.get(row.key)
        if current is not None and row.key not in removed:
            raise AlreadyExists(f"{row.key} is already bound to {describe(current.item)}")
    _check_replacements(removed, added, step.time)
    _check_new_ids(index, removed, added, step.time, allocated_from, bound_here)
    _check_names(index, removed, added)
    index.apply(step)
    try:
        _check_containment(index, step)
        _check_dependencies(index, removed, added)
    except BaseException:
        index.apply(step.inverse())
        raise


def _check_replacements(removed: dict[str, Row], added: dict[str, Row], time: int) -> None:
    for key, old in removed.items():
        new = added.get(key)
        if new is None:
            if old.kind == "id_allocator":
                raise InvalidArgument(f"{describe(old.item)} cannot be dropped")
            continue
        if new.kind != old.kind:
            raise InvalidArgument(
                f"{key} cannot change kind at {time}: {describe(old.item)} -> {describe(new.item)}"
            )
        if old.kind == "id_allocator":
            before, after = old.item.id_allocator.next, new.item.id_allocator.next
            if after < before:
                raise InvalidArgument(
                    f"{describe(old.item)} cannot move backwards, from {before} to {after}"
                )


def _check_new_ids(
    index: CatalogIndex,
    removed: dict[str, Row],
    added: dict[str, Row],
    time: int,
    allocated_from: dict[str, int],
    bound_here: dict[str, int],
) -> None:
    for key, row in added.items():
        if key in removed or row.kind == "id_allocator":
            continue
        prefix, number = global_id_number(row.item.id)
        if key in bound_here:
            raise AlreadyExists(
                f"{key} was already bound at {bound_here[key]} in this append; an id is never "
                "bound twice"
            )
        if number < allocated_from[prefix]:
            raise AlreadyExists(
                f"{key} ({describe(row.item)}) was allocated before this append (the "
                f"{PREFIX_ALLOCATORS[prefix]!r} allocator was at {allocated_from[prefix]}); an "
                "id is never bound twice, so new items take ids the same append allocates"
            )
        bound_here[key] = time


def _check_names(index: CatalogIndex, removed: dict[str, Row], added: dict[str, Row]) -> None:
    claimed: dict[NameKey, Row] = {}
    for row in added.values():
        name = namespace_key(row.item)
        if name is None:
            continue
        other = claimed.get(name)
        if other is not None:
            raise AlreadyExists(
                f"{_name_text(name)} is claimed twice: by {describe(other.item)} and "
                f"{describe(row.item)}"
            )
        claimed[name] = row
        owner = index.owner_of(name)
        if owner is not None and owner not in removed:
            current = index.get(owner)
            holder = describe(current.item) if current is not None else owner
            raise AlreadyExists(f"{_name_text(name)} already exists: {holder}")


def _check_containment(index: CatalogIndex, step: Step) -> None:
    for row in step.added:
        container = container_key(row.item)
        if container is not None and index.owner_of(container) is None:
            raise FailedPrecondition(
                f"{describe(row.item)}: {_name_text(container)} does not exist"
            )
    for row in step.removed:
        name = namespace_key(row.item)
        if name is None or index.owner_of(name) is not None:
            continue
        left = index.contained(name)
        if left:
            raise FailedPrecondition(
                f"cannot drop or rename {describe(row.item)}: {left} item(s) still live in it"
            )


def _check_dependencies(
    index: CatalogIndex, removed: dict[str, Row], added: dict[str, Row]
) -> None:
    for row in added.values():
        for dependency in row.item.depends_on:
            if index.get(dependency) is None:
                raise FailedPrecondition(
                    f"{describe(row.item)} depends on {dependency}, which does not exist"
                )
        for ref, kinds, what in references(row.item):
            target = index.get(ref)
            if target is not None and target.kind not in kinds:
                raise FailedPrecondition(
                    f"{describe(row.item)}: its {what} {ref} is a {target.kind.replace('_', ' ')}"
                )
    for key, row in removed.items():
        if key in added:
            continue
        holders = sorted(index.dependents_of(key))
        if holders:
            named = [_describe_key(index, holder) for holder in holders[:_MAX_NAMED]]
            more = f" and {len(holders) - _MAX_NAMED} more" if len(holders) > _MAX_NAMED else ""
            raise FailedPrecondition(
                f"cannot drop {describe(row.item)}: {', '.join(named)}{more} depend(s) on it"
            )


def _describe_key(index: CatalogIndex, key: str) -> str:
    row = index.get(key)
    return describe(row.item) if row is not None else key
