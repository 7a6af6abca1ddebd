"""SUBSCRIBE: a query's contents as of a time, then every change, until the client goes.

Where the changes come from, cheapest first:

- the query is one collection read whole (a table, source or materialized view): storage's
  own subscription to it;
- an index of a reachable cluster holds exactly the query's relation: compute's subscription to
  that index;
- otherwise a temporary dataflow on the session's cluster (``MaintainView`` with an index
  output, over clones of this adapter's read capabilities, which the dataflow then owns),
  dropped (``DropView``) when the stream ends.

Messages are CDCv2, reassembled in order with a ``CdcReader``; each completed interval goes to
the client as its changes, then a progress message. While the stream lasts, the tables it
depends on are advanced every tick, so progress moves even when nobody writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from services.adapter.backends import Backends
from services.adapter.catalog_cache import CatalogState
from services.adapter.holds import CollectionHolds
from services.adapter.reads import PlanInputs, QueryReader, plan_inputs, read_capability
from services.adapter.results import output_columns, sql_row
from services.adapter.sql.errors import SqlError
from services.adapter.sql.planned import Finishing, PlannedQuery
from services.adapter.timestamps import Timestamps
from tidemark.cdc import CdcReader, Message
from tidemark.cdc.proto import frontier_to_proto
from tidemark.clients.compute import ComputeClient
from tidemark.columnar import Row
from tidemark.errors import TidemarkError
from tidemark.frontier import Antichain
from tidemark.lattice import U64
from tidemark.logging import get_logger
from tidemark.tasks import cancel_and_wait
from tidemark.v1 import adapter_pb2, plan_pb2

log = get_logger("services.adapter.subscribe")

# Changes per SqlChanges message.
CHANGES_PER_MESSAGE = 1000


@dataclass(frozen=True)
class ChangeSource:
    """Where a subscription's CDCv2 messages come from."""

    messages: AsyncIterator[Message[Row, int]]
    description: str
    cleanup: tuple[str, ComputeClient] | None = None
    """A temporary dataflow to drop when the stream ends."""


def project_row(row: Row, finishing: Finishing) -> Row:
    columns = finishing.project
    if len(row) == len(columns) and columns == tuple(range(len(columns))):
        return row
    return tuple(row[c] for c in columns)


class Subscriptions:
    def __init__(
        self,
        backends: Backends,
        timestamps: Timestamps,
        holds: CollectionHolds,
        reader: QueryReader,
        *,
        tick_seconds: float,
    ) -> None:
        self.backends = backends
        self.timestamps = timestamps
        self.holds = holds
        self.reader = reader
        self.tick_seconds = tick_seconds

    async def open_source(
        self,
        planned: PlannedQuery,
        state: CatalogState,
        cluster: str,
        as_of: int,
    ) -> ChangeSource:
        plan = planned.plan
        root = planned.unoptimized.root
        if root.WhichOneof("kind") == "get":
            capability = await read_capability(self.holds, state, root.get.collection_id)
            messages = self.backends.storage.subscribe(capability, as_of=as_of)
            return ChangeSource(messages, f"collection {root.get.collection_id}")
        chosen = self.reader.choose_index(planned.unoptimized, state, cluster)
        if chosen is not None and chosen[1].finishing is None:
            name, peek = chosen
            compute = self.backends.compute[name]
            messages = compute.subscribe(peek.dataflow_id, as_of=as_of)
            return ChangeSource(messages, f"index {peek.dataflow_id}")
        return await self._temporary_dataflow(plan, state, cluster, as_of)

    async def _temporary_dataflow(
        self, plan: plan_pb2.Plan, state: CatalogState, cluster: str, as_of: int
    ) -> ChangeSource:
        compute = self.reader.compute_for(state, cluster)
        inputs = plan_inputs(plan, state)
        clones = []
        for collection_id in sorted(inputs.collections):
            capability = await read_capability(self.holds, state, collection_id)
            clones.append(await self.backends.storage.clone(capability, self.holds.holder))
        dataflow_id = f"subscribe-{uuid.uuid4().hex}"
        width = len(plan.output_schema.columns)
        await compute.maintain_view(
            dataflow_id, plan, clones, index_key_columns=list(range(width)), as_of=as_of
        )
        messages = compute.subscribe(dataflow_id, as_of=as_of)
        return ChangeSource(
            messages, f"temporary dataflow {dataflow_id}", cleanup=(dataflow_id, compute)
        )

    async def stream(
        self,
        planned: PlannedQuery,
        state: CatalogState,
        cluster: str,
        as_of: int,
    ) -> AsyncIterator[adapter_pb2.SubscribeSqlResponse]:
        """The subscription's messages: header, then changes and progress."""
        inputs = plan_inputs(planned.plan, state)
        await self.timestamps.make_readable(inputs.tables, as_of)
        source = await self.open_source(planned, state, cluster, as_of)
        ticker = asyncio.create_task(self._tick(inputs), name="subscribe-ticker")
        try:
            yield adapter_pb2.SubscribeSqlResponse(
                header=adapter_pb2.SubscribeHeader(
                    columns=output_columns(planned),
                    as_of=as_of,
                )
            )
            reader: CdcReader[Row, int] = CdcReader(U64, Antichain(U64, [as_of]))
            async for message in source.messages:
                for updates, frontier in reader.push(message):
                    for chunk in _chunks(updates, CHANGES_PER_MESSAGE):
                        yield adapter_pb2.SubscribeSqlResponse(
                            changes=adapter_pb2.SqlChanges(
                                changes=[
                                    adapter_pb2.SqlChange(
                                        timestamp=time,
                                        diff=diff,
                                        row=sql_row(project_row(row, planned.finishing)),
                                    )
                                    for row, time, diff in sorted(chunk, key=lambda u: u[1])
                                ]
                            )
                        )
                    yield adapter_pb2.SubscribeSqlResponse(progress=frontier_to_proto(frontier))
                    if frontier.is_empty():
                        return
        finally:
            await cancel_and_wait(ticker)
            await _close(source)

    async def _tick(self, inputs: PlanInputs) -> None:
        if not inputs.tables:
            return
        while True:
            await asyncio.sleep(self.tick_seconds)
            try:
                now = await self.timestamps.read_ts()
                await self.timestamps.make_readable(inputs.tables, now)
            except SqlError as exc:
                log.info("subscribe_tick_failed", error=exc.message)
            except TidemarkError as exc:
                log.info("subscribe_tick_failed", error=exc.message)


def _chunks(
    updates: Sequence[tuple[Row, int, int]], size: int
) -> list[Sequence[tuple[Row, int, int]]]:
    return [updates[i : i + size] for i in range(0, len(updates), size)] if updates else []


async def _close(source: ChangeSource) -> None:
    closer = getattr(source.messages, "aclose", None)
    if closer is not None:
        with contextlib.suppress(Exception):
            await closer()
    if source.cleanup is not None:
        dataflow_id, compute = source.cleanup
        try:
            await compute.drop_view(dataflow_id)
        except TidemarkError as exc:
            log.warning("temporary_dataflow_not_dropped", dataflow=dataflow_id, error=exc.message)
