"""Client of the catalog service.

Writing DDL, the way the adapter does it::

    snapshot = await catalog.snapshot_at(await oracle.read_ts("catalog"))
    while True:
        ts = await oracle.write_ts("catalog")
        try:
            await catalog.compare_and_append(upper, ts + 1, [insert(item, ts), ...])
            break
        except CatalogUpperMismatch as lost:
            upper = lost.current_upper   # someone else appended: re-read, re-plan, retry

An upper mismatch raises :class:`CatalogUpperMismatch` (a ``FailedPrecondition``) carrying the
catalog's current upper; every other failure raises the Tidemark error for its status.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc.aio

from tidemark.cdc import CdcReader
from tidemark.cdc.proto import from_proto
from tidemark.errors import FailedPrecondition, Internal
from tidemark.frontier import Antichain
from tidemark.lattice import U64
from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, GrpcClient, call, stream
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import catalog_pb2, catalog_pb2_grpc

# Trailing metadata of a CompareAndAppend that lost on its expected upper: the current upper.
UPPER_METADATA_KEY = "tidemark-catalog-upper"
_UPPER_IN_MESSAGE = re.compile(r"the catalog's upper is (\d+)")


class CatalogUpperMismatch(FailedPrecondition):
    """A compare-and-append whose expected upper was not the catalog's upper. Re-read the
    catalog (at least up to ``current_upper - 1``) and retry with ``current_upper``."""

    def __init__(self, expected_upper: int | None, current_upper: int) -> None:
        expected = "" if expected_upper is None else f"expected upper {expected_upper}, but "
        super().__init__(
            f"catalog upper mismatch: {expected}the catalog's upper is {current_upper}"
        )
        self.expected_upper = expected_upper
        self.current_upper = current_upper


def upper_mismatch_from(error: FailedPrecondition) -> CatalogUpperMismatch | None:
    """The typed mismatch a ``FailedPrecondition`` from CompareAndAppend stands for, if it is
    one: read from the trailing metadata, or else from the message."""
    cause = error.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        trailing = cast("Iterable[tuple[str, Any]]", cause.trailing_metadata() or ())
        for key, value in trailing:
            if key == UPPER_METADATA_KEY:
                return CatalogUpperMismatch(None, int(value))
    match = _UPPER_IN_MESSAGE.search(error.message)
    return CatalogUpperMismatch(None, int(match.group(1))) if match else None


def insert(item: catalog_pb2.CatalogItem, time: int) -> catalog_pb2.CatalogUpdate:
    """The update adding ``item`` at ``time``."""
    return catalog_pb2.CatalogUpdate(item=item, time=time, diff=1)


def retract(item: catalog_pb2.CatalogItem, time: int) -> catalog_pb2.CatalogUpdate:
    """The update removing ``item`` (exactly as the catalog holds it) at ``time``."""
    return catalog_pb2.CatalogUpdate(item=item, time=time, diff=-1)


@dataclass(frozen=True)
class CatalogSnapshot:
    """Every item as of ``as_of``, and the catalog's since and upper when it was read."""

    as_of: int
    since: int
    upper: int
    items: list[catalog_pb2.CatalogItem]

    def by_id(self) -> dict[str, catalog_pb2.CatalogItem]:
        """Items with a GlobalId, by id (allocators have none)."""
        return {item.id: item for item in self.items if item.id}

    def allocator_next(self, name: str) -> int:
        """The next id the allocator ``name`` ("user", "system") hands out."""
        for item in self.items:
            if item.WhichOneof("body") == "id_allocator" and item.id_allocator.name == name:
                return item.id_allocator.next
        raise KeyError(name)


@dataclass(frozen=True)
class CatalogChange:
    item: catalog_pb2.CatalogItem
    time: int
    diff: int


@dataclass(frozen=True)
class CatalogProgress:
    """Changes whose times just completed; the catalog is now known through ``frontier``
    (every time below it). The first report of a subscription holds its snapshot."""

    changes: list[CatalogChange]
    frontier: int


class CatalogClient(GrpcClient):
    """``compare_and_append`` / ``snapshot_at`` / ``subscribe_at`` against a catalog."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = CLIENT_RETRY,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, timeout=timeout, retry=retry, tls=tls)
        self.stub = catalog_pb2_grpc.CatalogStub(self.channel)

    async def compare_and_append(
        self,
        expected_upper: int,
        new_upper: int,
        updates: Sequence[catalog_pb2.CatalogUpdate],
    ) -> int:
        """Append ``updates`` iff the catalog's upper is ``expected_upper``; returns the new
        upper. Raises :class:`CatalogUpperMismatch` when the upper differs."""
        request = catalog_pb2.CompareAndAppendRequest(
            expected_upper=expected_upper, new_upper=new_upper, updates=updates
        )
        try:
            response = await self._call(self.stub.CompareAndAppend, request)
        except FailedPrecondition as exc:
            mismatch = upper_mismatch_from(exc)
            if mismatch is None:
                raise
            raise CatalogUpperMismatch(expected_upper, mismatch.current_upper) from exc
        return response.upper

    async def snapshot_at(
        self,
        timestamp: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the gRPC deadline, passed through)
    ) -> CatalogSnapshot:
        """Every item as of ``timestamp``, waiting (up to the timeout) for it to complete."""
        request = catalog_pb2.SnapshotAtRequest(timestamp=timestamp)
        response = await call(
            self.stub.SnapshotAt,
            request,
            timeout=self.timeout if timeout is None else timeout,
            retry=self.retry,
            repeatable=True,
        )
        return CatalogSnapshot(response.as_of, response.since, response.upper, list(response.items))

    async def subscribe_at(self, timestamp: int) -> AsyncIterator[CatalogProgress]:
        """The snapshot at ``timestamp`` (first report), then every later change as its time
        completes. The stream lasts until the caller stops iterating or the server goes."""
        request = catalog_pb2.SubscribeAtRequest(timestamp=timestamp)
        reader: CdcReader[bytes, int] = CdcReader(U64, Antichain(U64, [timestamp]))
        async for message in stream(self.stub.SubscribeAt, request):
            for updates, frontier in reader.push(from_proto(message)):
                yield CatalogProgress(
                    [
                        CatalogChange(catalog_pb2.CatalogItem.FromString(data), time, diff)
                        for data, time, diff in updates
                    ],
                    _frontier_time(frontier),
                )


def _frontier_time(frontier: Antichain[int]) -> int:
    elements = frontier.elements
    if len(elements) != 1:
        raise Internal(f"the catalog reported the frontier {list(elements)}; it never closes")
    return elements[0]
