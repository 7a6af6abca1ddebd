"""The catalog's contents at one time, indexed for the checks an append needs.

:class:`CatalogIndex` is a set of rows, at most one per key, plus the lookups validation asks
for without scanning every item: which item owns a name, which items depend on an id, how many
items a database or schema contains. A :class:`Step` is the change at one time (rows removed,
rows added); applying a step and then its inverse restores the index exactly, which is how
validation tries an append out and how history is rewound.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from services.catalog.items import NameKey, Row, container_key, namespace_key
from tidemark.errors import Internal


@dataclass(frozen=True)
class Step:
    """The catalog's change at ``time``: ``removed`` rows go, then ``added`` rows come."""

    time: int
    removed: tuple[Row, ...]
    added: tuple[Row, ...]

    def inverse(self) -> Step:
        return Step(self.time, self.added, self.removed)

    def updates(self) -> Iterator[tuple[bytes, int, int]]:
        """The step as update triples ``(data, time, diff)``."""
        for row in self.removed:
            yield (row.data, self.time, -1)
        for row in self.added:
            yield (row.data, self.time, 1)

    def __len__(self) -> int:
        return len(self.removed) + len(self.added)


def steps_from_updates(updates: Iterable[tuple[bytes, int, int]]) -> list[Step]:
    """Consolidated updates grouped into steps in time order. Every consolidated diff must be
    +1 or -1 (a catalog is a set); anything else means the stored log is corrupt."""
    sums: dict[tuple[bytes, int], int] = {}
    for data, time, diff in updates:
        key = (data, time)
        sums[key] = sums.get(key, 0) + diff
    by_time: dict[int, tuple[list[Row], list[Row]]] = {}
    for (data, time), diff in sums.items():
        if diff == 0:
            continue
        if diff not in (1, -1):
            raise Internal(f"catalog log has a row with multiplicity change {diff} at {time}")
        removed, added = by_time.setdefault(time, ([], []))
        (added if diff > 0 else removed).append(Row.decode(data))
    return [
        Step(time, tuple(removed), tuple(added))
        for time, (removed, added) in sorted(by_time.items())
    ]


class CatalogIndex:
    """Rows by key, with name, dependency and containment lookups kept up to date."""

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.rows: dict[str, Row] = {}
        self.names: dict[NameKey, str] = {}
        self.dependents: dict[str, set[str]] = {}
        self.children: dict[NameKey, int] = {}
        self.apply(Step(0, (), tuple(rows)))

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, key: str) -> Row | None:
        return self.rows.get(key)

    def owner_of(self, name: NameKey) -> str | None:
        """The key of the item holding ``name``, if any."""
        return self.names.get(name)

    def contained(self, container: NameKey) -> int:
        """How many items live in the database or schema named ``container``."""
        return self.children.get(container, 0)

    def dependents_of(self, global_id: str) -> set[str]:
        return self.dependents.get(global_id, set())

    def apply(self, step: Step) -> None:
        """Remove then add, without checks: the caller knows the step fits (it was validated,
        or it comes from the durable log). A removed row must be present."""
        for row in step.removed:
            self._remove(row)
        for row in step.added:
            self._add(row)

    def apply_all(self, steps: Sequence[Step]) -> None:
        for step in steps:
            self.apply(step)

    def undo_all(self, steps: Sequence[Step]) -> None:
        for step in reversed(steps):
            self.apply(step.inverse())

    def _add(self, row: Row) -> None:
        self.rows[row.key] = row
        name = namespace_key(row.item)
        if name is not None:
            self.names[name] = row.key
        container = container_key(row.item)
        if container is not None:
            self.children[container] = self.children.get(container, 0) + 1
        for dependency in row.item.depends_on:
            self.dependents.setdefault(dependency, set()).add(row.key)

    def _remove(self, row: Row) -> None:
        current = self.rows.get(row.key)
        if current is None or current.data != row.data:
            raise Internal(f"catalog index: removing {row.key}, which is not the current row")
        del self.rows[row.key]
        name = namespace_key(row.item)
        if name is not None and self.names.get(name) == row.key:
            del self.names[name]
        container = container_key(row.item)
        if container is not None:
            left = self.children[container] - 1
            if left:
                self.children[container] = left
            else:
                del self.children[container]
        for dependency in row.item.depends_on:
            holders = self.dependents[dependency]
            holders.discard(row.key)
            if not holders:
                del self.dependents[dependency]
