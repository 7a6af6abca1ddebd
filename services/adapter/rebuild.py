"""``ALTER MATERIALIZED VIEW name REBUILD``: recompute a materialized view from its inputs.

The way back for a view whose stored history was lost (its collection's since ran away to
``{}``: every read of it fails with 55000), and usable on any view whose stored contents are in
doubt. Storage starts the output collection's history afresh at its upper
(``ResetHistory``): its batches are discarded, every capability on it revoked, and the catalog
gets its durable read hold back there. Revoking the dataflow's write capability makes its next
append fail, so compute restarts the dataflow, which finds the output empty and writes the
view's full contents at a fresh ``as_of`` (the later of the inputs' since and the output's
upper). Reads of the view meanwhile wait for its upper to pass their timestamp, as for a view
just created; nothing before the new since can be read.

The catalog does not change: the view keeps its id, name and dependents.
"""

from __future__ import annotations

from services.adapter.catalog_cache import CatalogState
from services.adapter.catalog_names import resolve
from services.adapter.holds import CollectionHolds
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from tidemark.catalog_items import CATALOG_HOLDER, collection_of
from tidemark.clients.storage import StorageClient
from tidemark.logging import get_logger

log = get_logger("services.adapter.rebuild")

TAG = "ALTER MATERIALIZED VIEW"


async def rebuild_materialized_view(
    statement: ast.RebuildMaterializedView,
    state: CatalogState,
    settings: Settings,
    storage: StorageClient,
    holds: CollectionHolds,
) -> str:
    """Reset the view's output collection (see the module docs); the command tag."""
    item = resolve(state, settings, statement.name, ("materialized_view",), statement.position)
    collection_id = collection_of(item)
    hold = await storage.reset_history(collection_id, CATALOG_HOLDER)
    # This process's capabilities on it were revoked with all others.
    holds.forget(collection_id)
    log.warning(
        "materialized_view_rebuild",
        view=item.id,
        collection=collection_id,
        since=sorted(hold.frontier),
    )
    return TAG
