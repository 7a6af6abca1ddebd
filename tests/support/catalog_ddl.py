"""A one-shot catalog client in its own OS process, for the cross-process anomaly tests.

``python -m tests.support.catalog_ddl create --catalog A --oracle O --timeline T --name N``
creates table ``N`` the adapter's way (retrying lost races) and prints
``{"time": ..., "id": ...}`` once the catalog acknowledged it.

``python -m tests.support.catalog_ddl find ... --name N`` takes ``ReadTs`` and prints
``{"read_ts": ..., "found": true|false}`` for a table ``N`` in ``SnapshotAt(read_ts)``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from tests.support.catalog_items import Draft
from tidemark.clients.catalog import CatalogClient, CatalogUpperMismatch
from tidemark.clients.oracle import OracleClient


async def create(
    catalog: CatalogClient, oracle: OracleClient, timeline: str, name: str
) -> dict[str, object]:
    snapshot = await catalog.snapshot_at(await oracle.read_ts(timeline))
    upper, items = snapshot.upper, snapshot.items
    while True:
        ts = await oracle.write_ts(timeline)
        draft = Draft(items, ts)
        table = draft.table(name)
        try:
            await catalog.compare_and_append(upper, ts + 1, draft.updates())
            return {"time": ts, "id": table.id}
        except CatalogUpperMismatch as lost:
            upper = lost.current_upper
            items = (await catalog.snapshot_at(upper - 1)).items


async def find(
    catalog: CatalogClient, oracle: OracleClient, timeline: str, name: str
) -> dict[str, object]:
    read_ts = await oracle.read_ts(timeline)
    snapshot = await catalog.snapshot_at(read_ts)
    found = any(
        item.WhichOneof("body") == "table" and item.name.item == name for item in snapshot.items
    )
    return {"read_ts": read_ts, "found": found}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["create", "find"])
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--oracle", required=True)
    parser.add_argument("--timeline", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    catalog = CatalogClient(args.catalog)
    oracle = OracleClient(args.oracle)
    try:
        run = create if args.action == "create" else find
        print(json.dumps(await run(catalog, oracle, args.timeline, args.name)), flush=True)
    finally:
        await catalog.close()
        await oracle.close()


if __name__ == "__main__":
    asyncio.run(main())
