"""The gRPC face of the catalog."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio

from services.catalog.catalog import Catalog
from services.catalog.items import Row
from tidemark.cdc.proto import to_proto
from tidemark.clients.catalog import UPPER_METADATA_KEY, CatalogUpperMismatch
from tidemark.rpc import Service
from tidemark.rpc.authorization import CallerPolicy, kinds
from tidemark.v1 import catalog_pb2, catalog_pb2_grpc, common_pb2

Context = grpc.aio.ServicerContext[object, object]


# With mTLS on: everyone that follows the catalog reads it; only adapters change it.
CATALOG_CALLERS = CallerPolicy(
    default=kinds("adapter", "compute", "sources"),
    methods={"CompareAndAppend": kinds("adapter")},
)


class CatalogServicer(catalog_pb2_grpc.CatalogServicer):
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        # The items of the last snapshot served, for as long as the catalog's contents do not
        # change: most snapshots are of the current contents, and copying 10,000 messages into
        # a response is most of the work of answering one.
        self._cached_rows: list[Row] | None = None
        self._cached_items: catalog_pb2.SnapshotAtResponse | None = None

    async def CompareAndAppend(
        self, request: catalog_pb2.CompareAndAppendRequest, context: Context
    ) -> catalog_pb2.CompareAndAppendResponse:
        try:
            upper = await self.catalog.compare_and_append(
                request.expected_upper,
                request.new_upper,
                request.updates,
                timeout=context.time_remaining(),
            )
        except CatalogUpperMismatch as exc:
            # Machine-readable beside the message; the error mapping keeps trailing metadata.
            trailing = tuple(context.trailing_metadata() or ())
            context.set_trailing_metadata((*trailing, (UPPER_METADATA_KEY, str(exc.current_upper))))
            raise
        return catalog_pb2.CompareAndAppendResponse(upper=upper)

    async def SnapshotAt(
        self, request: catalog_pb2.SnapshotAtRequest, context: Context
    ) -> catalog_pb2.SnapshotAtResponse:
        snapshot = await self.catalog.snapshot_at(
            request.timestamp, timeout=context.time_remaining()
        )
        response = catalog_pb2.SnapshotAtResponse()
        response.CopyFrom(self._items_message(snapshot.rows))
        response.as_of = snapshot.as_of
        response.since = snapshot.since
        response.upper = snapshot.upper
        return response

    def _items_message(self, rows: list[Row]) -> catalog_pb2.SnapshotAtResponse:
        if rows is not self._cached_rows or self._cached_items is None:
            self._cached_items = catalog_pb2.SnapshotAtResponse(items=[row.item for row in rows])
            self._cached_rows = rows
        return self._cached_items

    async def SubscribeAt(
        self, request: catalog_pb2.SubscribeAtRequest, context: Context
    ) -> AsyncIterator[common_pb2.CdcMessage]:
        async for message in self.catalog.subscribe_at(request.timestamp):
            yield to_proto(message)


def catalog_service(catalog: Catalog) -> Service[CatalogServicer]:
    return Service(
        catalog_pb2.DESCRIPTOR.services_by_name["Catalog"],
        CatalogServicer(catalog),
        catalog_pb2_grpc.add_CatalogServicer_to_server,
        callers=CATALOG_CALLERS,
    )
