"""``ALTER MATERIALIZED VIEW name REBUILD``: recompute a materialized view from its inputs.

The way back for a view whose stored history was lost (its collection's since ran away to
``{}``: every read of it fails with 55000), and usable on any view whose stored contents are in
doubt. Storage starts the output collection's history afresh at its upper
(``ResetHistory``): its batches are discarded, every capability on it revoked, and the catalog
gets its durable read hold back there. Revoking the dataflow's write capability makes its next
append fail, so compute restarts the dataflow, which finds the output empty and writes the
view's full contents at a fresh ``as_of`` (the later of the inputs' since and the output's
upper). The oracle's data read timestamp is moved up to the new since (``ApplyWrite``), so
reads happen there or later; they wait for the view's upper to pass their timestamp, as for a
view just created. Nothing before the new since can be read.

The catalog does not change: the view keeps its id, name and dependents.
"""

from __future__ import annotations

from services.adapter.catalog_cache import CatalogState
from services.adapter.catalog_names import resolve
from services.adapter.holds import CollectionHolds
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.timestamps import Timestamps
from tidemark.catalog_items import CATALOG_HOLDER, collection_of
from tidemark.clients.storage import StorageClient
from tidemark.columnar import frontier_bound
from tidemark.logging import get_logger

log = get_logger("services.adapter.rebuild")

TAG = "ALTER MATERIALIZED VIEW"


async def rebuild_materialized_view(
    statement: ast.RebuildMaterializedView,
    state: CatalogState,
    settings: Settings,
    storage: StorageClient,
    holds: CollectionHolds,
    timestamps: Timestamps,
) -> str:
    """Reset the view's output collection (see the module docs); the command tag."""
    item = resolve(state, settings, statement.name, ("materialized_view",), statement.position)
    collection_id = collection_of(item)
    hold = await storage.reset_history(collection_id, CATALOG_HOLDER)
    # This process's capabilities on it were revoked with all others.
    holds.forget(collection_id)
    since = frontier_bound(hold.frontier)
    if since is not None:
        # Reads happen at the oracle's read timestamp, which must reach the new since, or
        # the view could not be read until the next write. (The view's upper never passes its
        # inputs', so every time up to it is complete.)
        await timestamps.apply_write(since)
    log.warning(
        "materialized_view_rebuild",
        view=item.id,
        collection=collection_id,
        since=sorted(hold.frontier),
    )
    return TAG
