"""The catalog's items as a subscription reports them, kept in memory by a follower (compute's
controller, the sources process)."""

from __future__ import annotations

from tidemark.clients.catalog import CatalogProgress
from tidemark.v1 import catalog_pb2


class CatalogContents:
    """Every item as of ``frontier - 1``, built from one subscription's reports.

    Rows are keyed by their canonical encoding, so a retraction removes exactly the row the
    catalog held and a change (retraction plus insertion at one time) replaces it.
    """

    def __init__(self) -> None:
        # Every catalog time below this is reflected (0: nothing received yet).
        self.frontier = 0
        self._counts: dict[bytes, int] = {}
        self._items: dict[bytes, catalog_pb2.CatalogItem] = {}

    def apply(self, progress: CatalogProgress, *, snapshot: bool) -> None:
        """Take in one report. ``snapshot``: it is the first report of a subscription, which
        holds the complete contents at its start, so it replaces what was known."""
        if snapshot:
            self._counts.clear()
            self._items.clear()
        # A report's changes may come in any order (a retraction after the insertion it
        # cancels, or before): only the sums at the end of the report matter.
        for change in progress.changes:
            key = change.item.SerializeToString(deterministic=True)
            count = self._counts.get(key, 0) + change.diff
            if count == 0:
                self._counts.pop(key, None)
                self._items.pop(key, None)
            else:
                self._counts[key] = count
                self._items.setdefault(key, change.item)
        self.frontier = progress.frontier

    def items(self) -> list[catalog_pb2.CatalogItem]:
        """The items present (count above zero)."""
        return [item for key, item in self._items.items() if self._counts[key] > 0]
