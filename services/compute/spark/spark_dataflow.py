"""A ``Dataflow`` whose operator state lives in resident Spark tasks.

Same lifecycle and outputs as the in-process ``Dataflow`` (``hydrate``, then ``step``), so
the service can use either. A step is one request round: the driver deals the step's source
updates out to the P tasks in contiguous slices (where input starts does not matter: linear
operators run on any part, and the exchange before each stateful node moves every update to
the shard owning its key), and each task runs the whole graph on its share, exchanging
updates with the other tasks directly (``mesh.py``). The driver gets each task's share of the
output back and consolidates it; it never sees the updates between operators.

Optionally the tasks also keep the output in a sharded ``Index`` (``index_key_columns``): the
step's last exchange sends each output update to the task owning its index key. ``peek``
reads it at past times from its since on; ``compact_index`` moves that since.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from time import perf_counter

from services.compute.dataflow.batch import Row, Update, consolidate
from services.compute.dataflow.dataflow import Batches, Dataflow
from services.compute.dataflow.exchange import partition
from services.compute.dataflow.graph import Graph
from services.compute.dataflow.guard import UNGUARDED, Guard, row_bytes
from services.compute.dataflow.lower import columns_key
from services.compute.dataflow.work import StateSize, Work
from services.compute.dataflow.worker import ShardWorker
from services.compute.spark.part_shares import keyed_sources
from services.compute.spark.parts_source import missing_part
from services.compute.spark.requests import (
    ApplyIndex,
    Hydrate,
    LoadRows,
    Request,
    Step,
    StepIO,
    StepWritten,
)
from services.compute.spark.resident import ResidentCluster, install_request
from services.compute.spark.transport import normalizer
from tidemark.clients.storage import WrittenPart
from tidemark.columnar import RelationSchema
from tidemark.errors import FailedPrecondition, Internal, InvalidArgument, TidemarkError
from tidemark.logging import get_logger
from tidemark.v1 import plan_pb2

log = get_logger("compute.spark.dataflow")

ShardRebuild = Callable[[int, int, Callable[[Request], object]], None]
"""Rebuilds a dataflow's state of one shard as of a time on a replacing task, by the bulk
path (``engines.SparkEngineDataflow``): called with the shard, the time and the function
that sends that task a request."""


@dataclass(frozen=True)
class PartWindow:
    """An input part to read in a step: its updates at times in ``[lower, upper)``."""

    key: str
    lower: int
    upper: int
    bytes: int


@dataclass(frozen=True)
class OutputSink:
    """Where the tasks write the output's parts: a collection of ``schema`` in the blob
    store at ``blob_url``."""

    collection_id: str
    blob_url: str
    schema: RelationSchema

    @functools.cached_property
    def schema_bytes(self) -> bytes:
        """The serialized schema every step's request carries, made once per sink."""
        return self.schema.to_proto().SerializeToString()


@dataclass
class IoStep:
    """A step run by :meth:`SparkDataflow.step_io`: the output's upper; its parts written
    by the tasks (with a sink), the least and greatest time in them and the sum of the
    output's diffs; and the output updates, when asked for, or without a sink unless the
    tasks' index keeps them (else None)."""

    upper: int
    updates: list[Update] | None
    parts: list[WrittenPart] = field(default_factory=list)
    least: int | None = None
    greatest: int | None = None
    diffs: int = 0


@dataclass
class IoCounters:
    """What passed through the driver in ``step_io`` steps: input rows it dealt (the rows
    path), input parts it dealt (of which dealt to every task by key partition), output rows
    the tasks sent it."""

    input_rows: int = 0
    input_parts: int = 0
    input_parts_by_key: int = 0
    output_rows: int = 0


class SparkDataflow(Dataflow):
    def __init__(
        self,
        plan: plan_pb2.Plan | plan_pb2.Relation,
        *,
        as_of: int,
        cluster: ResidentCluster,
        dataflow_id: str | None = None,
        index_key_columns: Sequence[int] | None = None,
        guard: Guard = UNGUARDED,
    ) -> None:
        super().__init__(plan, as_of=as_of, shards=cluster.shards, guard=guard)
        self.plan = plan
        self.workers = []  # the shards' state is in the cluster's tasks
        self.cluster = cluster
        self.dataflow_id = dataflow_id or f"dataflow-{secrets.token_hex(8)}"
        self.index_key_columns = None if index_key_columns is None else tuple(index_key_columns)
        self._keyed_sources = frozenset(keyed_sources(self.graph))
        """The sources whose big parts the tasks read by key partition (``_deal``)."""
        cluster.install(
            self.dataflow_id, plan, index_key_columns=self.index_key_columns, index_since=as_of
        )
        self._dropped = False
        # The upper the step being run gives the tasks' index (set before ``_run``).
        self._index_upper = as_of + 1
        self._ran = False
        self.io_counters = IoCounters()
        self.rebuild: ShardRebuild | None = None
        """How a lost shard's state is rebuilt (None: it cannot be; the cluster fails)."""
        self.shard_restores = 0
        """Shards of this dataflow rebuilt on a task that replaced a lost one."""
        self.index_floor = as_of
        """The index answers from here on: a restored shard's index starts at the time its
        state was rebuilt at, so the whole index's since moves up to it."""
        self._index_since = as_of
        """The since last sent to the tasks' index shards (``compact_index``)."""
        self._early_loads: list[Hydrate] = []
        """The loads of a hydration by Spark the tasks took before its last (``load_staged``
        with loads not ``complete``): a task replacing a lost one before the last takes
        them again."""
        cluster.register(self.dataflow_id, self._restore_shard)

    def _restore_shard(self, shard: int, ask: Callable[[Request], object]) -> None:
        """Installs this dataflow on a task replacing a lost one and rebuilds its shard
        there as of before the round in flight (the upper only moves once a round is done):
        a step in flight, sent again to the task, then runs from the same state as on the
        others. Not hydrated yet: installed empty, for the hydration to fill (with the loads
        of it the lost task had taken already)."""
        if self.upper is None:
            ask(self._install_request(self.as_of))
            for load in self._early_loads[shard :: self.shards]:
                ask(load)
            return
        if not self.graph.inputs:
            self._restore_constants(shard, ask)
            return
        time = self.upper - 1
        if self.rebuild is None:
            raise FailedPrecondition(
                f"dataflow {self.dataflow_id!r} cannot rebuild a lost shard's state"
            )
        started = perf_counter()
        installed = False

        def ask_installed(request: Request) -> object:
            # Installed right before the first request to the task, not before the
            # rebuild's Spark job: a rebuild outside the round in flight waits for the lock
            # at each request, and its job runs meanwhile.
            nonlocal installed
            if not installed:
                ask(self._install_request(time))
                installed = True
            return ask(request)

        self.rebuild(shard, time, ask_installed)
        if not installed:
            ask(self._install_request(time))  # a rebuild that had nothing to load
        self.shard_restores += 1
        if self.index_key_columns is not None:
            self.index_floor = max(self.index_floor, time)
        log.info(
            "dataflow_shard_rebuilt",
            dataflow=self.dataflow_id,
            shard=shard,
            time=time,
            seconds=round(perf_counter() - started, 3),
        )

    def _restore_constants(self, shard: int, ask: Callable[[Request], object]) -> None:
        """A plan of constants: nothing but its hydration ever changed its state (no input,
        so no step reaches the operators), and its rows are in the plan. The driver runs
        that hydration again in process and sends the new task its shard's part of every
        stateful node's input and of the output (``LoadRows``): no Spark job, no parts. The
        output is the same at every time from ``as_of`` on, so the index keeps its since."""
        started = perf_counter()
        upper = self.upper
        assert upper is not None
        inputs, output = hydrated_shard(self.plan, self.as_of, shard, self.shards)
        since = min(self._index_since, upper - 1)
        index: list[Update] = []
        if self.index_key_columns is not None:
            owned = index_share(output, self.index_key_columns, shard, self.shards)
            index = [(row, since, diff) for row, _, diff in owned]
        ask(self._install_request(since))
        ask(LoadRows(self.dataflow_id, inputs, index, upper))
        self.shard_restores += 1
        log.info(
            "dataflow_shard_rebuilt",
            dataflow=self.dataflow_id,
            shard=shard,
            constants=True,
            seconds=round(perf_counter() - started, 3),
        )

    def _install_request(self, index_since: int) -> Request:
        return install_request(self.dataflow_id, self.plan, self.index_key_columns, index_since)

    def work(self) -> Work:
        return self.cluster.stats(self.dataflow_id)[1]

    def key_count(self) -> int:
        return self.cluster.stats(self.dataflow_id)[0]

    def state_size(self) -> StateSize:
        return self.cluster.stats(self.dataflow_id)[2]

    def hydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        self._index_upper = self.as_of + 1
        return super().hydrate(snapshots)

    def step(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        self._index_upper = input_upper
        self._ran = False
        output, upper = super().step(batches, input_upper)
        if not self._ran and self.index_key_columns is not None:
            # No input at all: no step round, but the index's upper still moves.
            self.cluster.apply_index(self.dataflow_id, [[] for _ in range(self.shards)], upper)
        return output, upper

    def load_staged(self, loads: Sequence[Hydrate]) -> tuple[int, int]:
        """Ends a hydration by Spark (``hydration.py``): every task loads its shard's staged
        inputs (``loads[p]`` is shard ``p``'s request), and the dataflow is hydrated at
        ``as_of`` from then on (unless ``loads`` are not ``complete``: the nodes the tasks
        read from parts alone, loaded while Spark's jobs run). Returns the updates loaded
        and the index's rows."""
        if self.upper is not None:
            raise FailedPrecondition("the dataflow is already hydrated")
        if self._dropped:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} was dropped")
        try:
            results = self.cluster.call(loads)
        except TidemarkError as exc:
            if not missing_part(exc):
                raise
            # Tasks read inputs from parts themselves (``part_shares``): one that found a
            # part gone loaded nothing, but the others may have loaded their shards, so
            # listing again and loading once more could count rows twice. The dataflow
            # fails instead, and its restart starts from empty state.
            raise Internal(
                f"dataflow {self.dataflow_id!r}: an input's part was compacted away while "
                "the tasks loaded it; the dataflow restarts"
            ) from exc
        if all(load.complete for load in loads):
            self._upper = self.as_of + 1
        else:
            self._early_loads.extend(loads)
        loaded = index_rows = 0
        for result in results:
            assert isinstance(result, tuple)
            loaded += result[0]
            index_rows += result[1]
        return loaded, index_rows

    async def ahydrate(self, snapshots: Batches) -> tuple[list[Update], int]:
        return await asyncio.to_thread(self.hydrate, snapshots)

    async def astep(self, batches: Batches, input_upper: int) -> tuple[list[Update], int]:
        return await asyncio.to_thread(self.step, batches, input_upper)

    def peek(self, time: int) -> dict[Row, int]:
        """The output's contents at ``time`` (within the index's readable range)."""
        if self.index_key_columns is None:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        return self.cluster.peek(self.dataflow_id, time)

    def compact_index(self, since: int) -> None:
        """Refuses peeks before ``since`` from now on, and lets the tasks fold the index's
        history up to it into one consolidated version (the index no longer grows with
        every step's updates)."""
        if self.index_key_columns is None:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        # A rebuilt shard's index starts at its floor: the whole index answers from there.
        since = max(since, self.index_floor)
        self.cluster.compact_index(self.dataflow_id, since)
        self._index_since = max(self._index_since, since)

    def drop(self) -> None:
        """Frees the dataflow's state in the tasks (the cluster keeps running)."""
        if not self._dropped:
            self._dropped = True
            self.cluster.unregister(self.dataflow_id)
            self.cluster.drop(self.dataflow_id)

    def _run(self, sources: Mapping[int, list[Update]], constants_at: int | None) -> list[Update]:
        if self._dropped:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} was dropped")
        self._ran = True
        nodes = self.graph.nodes
        # The driver's share of the budget: the step's input it holds (the tasks' batches and
        # arrangements are theirs).
        self.guard.held_bytes = sum(
            len(updates) * row_bytes(len(nodes[i].types)) for i, updates in sources.items()
        )
        self.guard.check()
        shares: list[dict[int, list[Update]]] = [{} for _ in range(self.shards)]
        for node_id, updates in sources.items():
            size = -(-len(updates) // self.shards)  # contiguous slices, the last maybe short
            for shard, share in enumerate(shares):
                part = updates[shard * size : (shard + 1) * size]
                if part:
                    share[node_id] = part
        results = self.cluster.step(self.dataflow_id, shares, constants_at, self._index_upper)
        return consolidate(
            normalizer(self.graph.output_types).apply(
                [[update for result in results for update in result]]
            )
        )

    def step_io(
        self,
        batches: Batches,
        parts: Mapping[str, Sequence[PartWindow]],
        input_upper: int,
        *,
        blob_url: str,
        environment: Mapping[str, str],
        sink: OutputSink | None,
        return_rows: bool,
    ) -> IoStep:
        """``step`` where the tasks read the inputs' ``parts`` (per collection; with any
        ``batches`` of rows besides) from the blob store at ``blob_url`` themselves, and,
        with a ``sink``, write the output's parts there (not committed); the output's
        updates come back only with ``return_rows`` or without a sink. The driver deals
        parts, not rows (``_deal``)."""
        requests, finish = self._io_round(
            batches, parts, input_upper, blob_url, environment, sink, return_rows
        )
        return finish(self.cluster.call(requests) if requests else [])

    async def astep_io(
        self,
        batches: Batches,
        parts: Mapping[str, Sequence[PartWindow]],
        input_upper: int,
        *,
        blob_url: str,
        environment: Mapping[str, str],
        sink: OutputSink | None,
        return_rows: bool,
    ) -> IoStep:
        """``step_io`` for asyncio callers. A step from parts alone whose tasks write the
        output's parts and send no rows back has small requests and answers, and little
        planning: its round runs on the event loop (``ResidentCluster.acall``). Any other
        (rows to deal, rows to take back) runs in a thread, its planning and its output
        too. A caller cancelled mid-round leaves ``_upper`` where it was although the
        tasks stepped: cancelling is how a dataflow is stopped, and it is dropped next."""
        if sink is None or return_rows or any(batches.values()):
            return await asyncio.to_thread(
                functools.partial(
                    self.step_io,
                    batches,
                    parts,
                    input_upper,
                    blob_url=blob_url,
                    environment=environment,
                    sink=sink,
                    return_rows=return_rows,
                )
            )
        requests, finish = self._io_round(
            batches, parts, input_upper, blob_url, environment, sink, return_rows
        )
        return finish(await self.cluster.acall(requests) if requests else [])

    def _io_round(
        self,
        batches: Batches,
        parts: Mapping[str, Sequence[PartWindow]],
        input_upper: int,
        blob_url: str,
        environment: Mapping[str, str],
        sink: OutputSink | None,
        return_rows: bool,
    ) -> tuple[list[Request], Callable[[list[object]], IoStep]]:
        """A ``step_io`` step planned: the requests of its round (one per shard; none when
        nothing is to be done), and what makes the step's result of their answers (and
        moves the dataflow on)."""
        lower = self._upper
        if lower is None:
            raise FailedPrecondition("hydrate the dataflow before stepping it")
        if self._dropped:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} was dropped")
        if not lower <= input_upper:
            raise InvalidArgument(f"input upper {input_upper} is before the dataflow's {lower}")
        rows = {n: held for n, held in self._step_rows(batches, lower, input_upper).items() if held}
        windows = [
            (
                self._input_node(cid).id,
                PartWindow(w.key, max(w.lower, lower), min(w.upper, input_upper), w.bytes),
            )
            for cid, listed in parts.items()
            for w in listed
            if max(w.lower, lower) < min(w.upper, input_upper)
        ]
        if sink is not None and sink.blob_url != blob_url and windows:
            raise InvalidArgument("the inputs' parts and the output's live in one blob store")
        if not rows and not windows:
            kept = sink is not None or self._rows_kept(return_rows)

            def nothing_done(_answers: list[object]) -> IoStep:
                self._upper = input_upper
                return IoStep(input_upper, None if kept and not return_rows else [])

            if self.index_key_columns is None:
                return [], nothing_done
            # Only the index's upper moves.
            moves: list[Request] = [
                ApplyIndex(self.dataflow_id, [], input_upper) for _ in range(self.shards)
            ]
            return moves, nothing_done
        dealt = _deal(windows, self.shards, self._keyed_sources)
        by_key = sum(1 for listed in dealt[0].values() for window in listed if not window[4])
        shares: list[dict[int, list[Update]]] = [{} for _ in range(self.shards)]
        for node_id, updates in rows.items():
            size = -(-len(updates) // self.shards)
            for shard, share in enumerate(shares):
                if piece := updates[shard * size : (shard + 1) * size]:
                    share[node_id] = piece
        schema = b"" if sink is None else sink.schema_bytes
        requests: list[Request] = [
            Step(
                self.dataflow_id,
                shares[shard],
                None,
                input_upper,
                StepIO(
                    blob_url if sink is None else sink.blob_url,
                    dict(environment),
                    dealt[shard],
                    "" if sink is None else sink.collection_id,
                    schema,
                    return_rows,
                ),
            )
            for shard in range(self.shards)
        ]

        def stepped(results: list[object]) -> IoStep:
            self._upper = input_upper
            self.io_counters.input_rows += sum(len(updates) for updates in rows.values())
            self.io_counters.input_parts += len(windows)
            self.io_counters.input_parts_by_key += by_key
            if sink is None and not self._rows_kept(return_rows):
                output = self._consolidated(
                    [update for result in results for update in result]  # type: ignore[attr-defined]
                )
                self.io_counters.output_rows += len(output)
                return IoStep(input_upper, output)
            written = [r for r in results if isinstance(r, StepWritten)]
            assert len(written) == len(results)
            done = IoStep(input_upper, None)
            for result in written:
                # A share kept in the index has no part: only its diffs count.
                done.diffs += result.diffs
                if result.part is not None:
                    done.parts.append(WrittenPart(*result.part))
                    done.least = (
                        result.least if done.least is None else min(done.least, result.least)
                    )
                    done.greatest = max(done.greatest or 0, result.greatest)
            if return_rows:
                # Disjoint by row across the tasks: nothing to consolidate.
                done.updates = normalizer(self.graph.output_types).apply(
                    [[update for result in written for update in result.updates or ()]]
                )
                self.io_counters.output_rows += len(done.updates)
            return done

        return requests, stepped

    def _rows_kept(self, return_rows: bool) -> bool:
        """Whether a step without a sink keeps its output on the tasks: in the index, when
        nobody asked for the rows (a subscriber that comes later reads them from the index's
        history, ``index_changes``)."""
        return self.index_key_columns is not None and not return_rows

    def index_changes(self, lower: int, upper: int) -> list[Update]:
        """The output's changes at times in ``[lower, upper)``, from the tasks' index."""
        if self.index_key_columns is None:
            raise FailedPrecondition(f"dataflow {self.dataflow_id!r} keeps no index")
        return self._consolidated(self.cluster.index_changes(self.dataflow_id, lower, upper))

    def _consolidated(self, updates: list[Update]) -> list[Update]:
        return consolidate(normalizer(self.graph.output_types).apply([updates]))


class _RecordingWorker(ShardWorker):
    """A shard's worker that keeps what each stateful node was given (its inputs after the
    exchange that routed them to this shard)."""

    def __init__(self, graph: Graph, shard: int) -> None:
        super().__init__(graph, shard)
        self.received: dict[int, tuple[list[Update], ...]] = {}

    def process(self, node_id: int, inputs: Sequence[list[Update]]) -> list[Update]:
        held = self.received.get(node_id, tuple([] for _ in inputs))
        self.received[node_id] = tuple(
            [*before, *updates] for before, updates in zip(held, inputs, strict=True)
        )
        return super().process(node_id, inputs)

    def process_combined(self, node_id: int, partials: list[Update]) -> list[Update]:
        # Partial rows are not updates a shard could be loaded from (``LoadRows``).
        raise Internal(f"node {node_id}: a recording of a shard's inputs takes no partial rows")


def hydrated_shard(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    as_of: int,
    shard: int,
    shards: int,
    snapshots: Batches | None = None,
) -> tuple[dict[int, tuple[list[Update], ...]], list[Update]]:
    """The plan hydrated at ``as_of`` in process from ``snapshots`` (none for a plan of
    constants), over ``shards`` shards routed as the tasks route them (the same
    ``shard_of`` of the same keys): what each stateful node of ``shard`` was given (a
    ``LoadRows``'s ``nodes``), and the whole output. Only for small inputs: the driver
    holds all of it."""
    # The updates themselves, not partial rows: a shard is loaded from what its nodes hold.
    flow = Dataflow(plan, as_of=as_of, shards=shards, combine=False)
    recorder = _RecordingWorker(flow.graph, shard)
    flow.workers[shard] = recorder
    output, _ = flow.hydrate(snapshots or {})
    return recorder.received, output


def index_share(
    output: Sequence[Update], key_columns: Sequence[int], shard: int, shards: int
) -> list[Update]:
    """The updates of ``output`` whose index key ``shard`` owns (as a step's last exchange
    routes them)."""
    return partition(output, columns_key(key_columns), shards)[shard]


def _deal(
    windows: Sequence[tuple[int, PartWindow]], shards: int, keyed: Collection[int] = ()
) -> list[dict[int, list[tuple[str, int, int, int, int]]]]:
    """Each part to the shard with the fewest bytes dealt so far (then the fewest parts),
    largest first: a balanced share of the reading, decoding and linear work. A part larger
    than a shard's even share of the step (a step's one new part, typically) is dealt to
    every shard instead, each decoding one slice of its rows: one task alone would decode
    it and run the linear operators on it while the others waited at the first exchange.
    For a source in ``keyed`` (``part_shares.keyed_sources``) the slice is the task's key
    partition rather than a run of rows, so the exchange after it moves none of them."""
    dealt: list[dict[int, list[tuple[str, int, int, int, int]]]] = [{} for _ in range(shards)]
    load = [(0, 0)] * shards
    even = sum(window.bytes for _, window in windows) / shards
    for node_id, window in sorted(windows, key=lambda item: -item[1].bytes):
        if shards > 1 and window.bytes > even:
            by_key = node_id in keyed
            for shard in range(shards):
                dealt[shard].setdefault(node_id, []).append(
                    (
                        window.key,
                        window.lower,
                        window.upper,
                        0 if by_key else shard,
                        0 if by_key else shards,
                    )
                )
                load[shard] = (load[shard][0] + window.bytes // shards, load[shard][1] + 1)
            continue
        shard = min(range(shards), key=load.__getitem__)
        dealt[shard].setdefault(node_id, []).append((window.key, window.lower, window.upper, 0, 1))
        load[shard] = (load[shard][0] + window.bytes, load[shard][1] + 1)
    return dealt
