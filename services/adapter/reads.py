"""Reading a query's answer at one data time ``r`` from compute.

Before the read, every table the plan depends on (directly, or through materialized views)
gets an upper beyond ``r`` (``Timestamps.make_readable``); materialized views and sources move
on their own and compute waits for them.

The read itself is an index peek when indexes of one cluster hold everything the plan reads
(``index_match``): the session's cluster first, then any other cluster this adapter can reach.
Otherwise it is a one-shot peek on the session's cluster, over this adapter's read
capabilities. An index peek carries the catalog time the plan was made at, so compute answers
only once it knows the catalog that far (and so has the index); a one-shot plan is
self-contained and does not wait for the cluster's catalog. An index that turns out to be gone,
or compacted past ``r``, falls back to a one-shot peek.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from services.adapter.backends import Backends
from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.catalog_names import full_name, kind_name
from services.adapter.holds import CollectionGone, CollectionHolds, HistoryLost
from services.adapter.index_match import IndexPeek, indexed_relations, match_indexes
from services.adapter.progress import peek_name
from services.adapter.sql.errors import SqlError
from services.adapter.timestamps import Timestamps
from tidemark.clients.compute import ComputeClient, PeekResult, one_shot
from tidemark.clients.storage import Capability
from tidemark.columnar import Row
from tidemark.errors import FailedPrecondition, NotFound, PermissionDenied
from tidemark.logging import get_logger
from tidemark.plan.optimize import optimize
from tidemark.plan.walk import collections_read
from tidemark.v1 import plan_pb2

log = get_logger("services.adapter.reads")

UNDEFINED_OBJECT = "42704"
UNDEFINED_TABLE = "42P01"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"


def history_lost(state: CatalogState, collection_id: str) -> SqlError:
    """55000 for an object whose storage collection lost its history (its since is ``{}``),
    saying how to get it back."""
    item = state.get(collection_id)
    if item is None:
        return SqlError(UNDEFINED_TABLE, f"collection {collection_id} can no longer be read")
    name = full_name(item)
    kind = kind_name(item)
    message = (
        f'{kind} "{name}" has lost its stored history (its collection {collection_id} can no '
        "longer be read at any time)"
    )
    if kind_of(item) == "materialized_view":
        hint = f"recompute it from its inputs with ALTER MATERIALIZED VIEW {name} REBUILD"
    else:
        hint = f"its contents cannot be recovered: drop the {kind} and create it again"
    return SqlError(OBJECT_NOT_IN_PREREQUISITE_STATE, message, hint=hint)


async def read_capability(
    holds: CollectionHolds, state: CatalogState, collection_id: str
) -> Capability:
    """This process's read capability on ``collection_id``; 55000 (:func:`history_lost`) when
    the collection's history is lost."""
    try:
        return await holds.read(collection_id)
    except HistoryLost:
        raise history_lost(state, collection_id) from None


@dataclass(frozen=True)
class PlanInputs:
    """The storage collections a plan reads, and the tables and sources underneath them
    (through materialized views): what a read must wait for, and what a read-then-write
    must find unchanged."""

    collections: frozenset[str]
    tables: frozenset[str]
    sources: frozenset[str]


def plan_inputs(plan: plan_pb2.Plan, state: CatalogState) -> PlanInputs:
    direct = frozenset(collections_read(plan))
    tables: set[str] = set()
    sources: set[str] = set()
    seen: set[str] = set()
    pending = list(direct)
    while pending:
        collection_id = pending.pop()
        if collection_id in seen:
            continue
        seen.add(collection_id)
        item = state.get(collection_id)
        kind = kind_of(item) if item is not None else ""
        if kind == "table":
            tables.add(collection_id)
        elif kind == "source":
            sources.add(collection_id)
        elif kind == "materialized_view" and item is not None:
            stored = plan_pb2.Plan.FromString(item.materialized_view.plan)
            pending.extend(sorted(collections_read(stored)))
        else:
            raise SqlError(
                UNDEFINED_TABLE,
                f"collection {collection_id} read by the query is not in the catalog at "
                f"catalog time {state.time} (dropped concurrently?)",
            )
    return PlanInputs(direct, frozenset(tables), frozenset(sources))


@dataclass(frozen=True)
class ReadResult:
    rows: list[tuple[Row, int]]
    timestamp: int
    via: str
    """``"index <id>"`` or ``"one-shot"``: how the answer was computed."""


class QueryReader:
    def __init__(
        self,
        backends: Backends,
        timestamps: Timestamps,
        holds: CollectionHolds,
        *,
        wait_ms: int = 30_000,
    ) -> None:
        self.backends = backends
        self.timestamps = timestamps
        self.holds = holds
        self.wait_ms = wait_ms

    def choose_index(
        self, plan: plan_pb2.Plan, state: CatalogState, cluster: str
    ) -> tuple[str, IndexPeek] | None:
        """``(cluster name, peek)`` if indexes of one reachable cluster answer ``plan``."""
        names = [cluster, *sorted(n for n in self.backends.compute if n != cluster)]
        for name in names:
            if name not in self.backends.compute:
                continue
            item = state.cluster_named(name)
            if item is None:
                continue
            key = f"indexes:{item.id}"
            indexes = state.memo.get(key)
            if indexes is None:
                indexes = state.memo[key] = indexed_relations(state, item.id)
            if not indexes:
                continue
            peek = match_indexes(plan, indexes)
            if peek is not None:
                return name, _optimized_peek(peek)
        return None

    async def read(
        self,
        plan: plan_pb2.Plan,
        state: CatalogState,
        timestamp: int,
        cluster: str,
        *,
        inputs: PlanInputs | None = None,
        match: plan_pb2.Plan | None = None,
        memory_budget_bytes: int = 0,
    ) -> ReadResult:
        """The plan's answer at ``timestamp`` (``(row, multiplicity)`` pairs). ``match`` is
        the same query before optimization, which indexes are matched against (views keep
        their plans unoptimized). ``memory_budget_bytes``: compute's budget for evaluating it
        (0: the cluster's)."""
        inputs = inputs or plan_inputs(plan, state)
        await self.timestamps.make_readable(inputs.tables, timestamp)
        chosen = self.choose_index(match or plan, state, cluster)
        if chosen is not None:
            name, peek = chosen
            compute = self.backends.compute[name]
            try:
                with peek_name(compute) as query_id:
                    result = await compute.peek(
                        peek.dataflow_id,
                        timestamp,
                        catalog_ts=state.time,
                        finishing=peek.finishing,
                        wait_ms=self.wait_ms,
                        memory_budget_bytes=memory_budget_bytes,
                        query_id=query_id,
                    )
                return ReadResult(result.rows, timestamp, f"index {peek.dataflow_id}")
            except (NotFound, FailedPrecondition) as exc:
                log.info("index_peek_fell_back", index=peek.dataflow_id, error=exc.message)
        compute = self.compute_for(state, cluster)
        result = await self._one_shot(compute, plan, inputs, state, timestamp, memory_budget_bytes)
        return ReadResult(result.rows, timestamp, "one-shot")

    def compute_for(self, state: CatalogState, cluster: str) -> ComputeClient:
        if state.cluster_named(cluster) is None:
            raise SqlError(
                UNDEFINED_OBJECT,
                f'unknown cluster "{cluster}"',
                hint="SET cluster to an existing cluster (SHOW CLUSTERS lists them)",
            )
        return self.backends.compute_for(cluster)

    async def _one_shot(
        self,
        compute: ComputeClient,
        plan: plan_pb2.Plan,
        inputs: PlanInputs,
        state: CatalogState,
        timestamp: int,
        memory_budget_bytes: int,
    ) -> PeekResult:
        for attempt in (1, 2):
            capabilities = []
            for collection_id in sorted(inputs.collections):
                try:
                    capabilities.append(await read_capability(self.holds, state, collection_id))
                except CollectionGone as exc:
                    raise SqlError(
                        UNDEFINED_TABLE, f"{exc.message} (dropped concurrently?)"
                    ) from None
            # A one-shot plan names everything it reads and comes with its capabilities:
            # nothing of the cluster's catalog state is involved, so it need not wait for the
            # controller.
            try:
                with peek_name(compute) as query_id:
                    return await compute.peek(
                        one_shot(plan, capabilities),
                        timestamp,
                        catalog_ts=0,
                        wait_ms=self.wait_ms,
                        memory_budget_bytes=memory_budget_bytes,
                        query_id=query_id,
                    )
            except PermissionDenied:
                if attempt == 2:
                    raise
                # A lease lapsed between renewals (a long stall): acquire afresh, once.
                for collection_id in inputs.collections:
                    self.holds.forget(collection_id)
        raise AssertionError("unreachable")


def _optimized_peek(peek: IndexPeek) -> IndexPeek:
    """The index peek with its finishing plan (what remains of the query over the indexes)
    optimized."""
    if peek.finishing is None:
        return peek
    return replace(peek, finishing=optimize(peek.finishing).plan)
