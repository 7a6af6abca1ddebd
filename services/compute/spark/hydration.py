"""Hydration by Spark: a dataflow's initial state and output computed from storage's parts.

A dataflow that starts (or restarts) at ``as_of`` needs, in every resident task, the state of
each stateful operator for the keys the task's shard owns, and, in its output, the contents
at ``as_of``. Streaming the inputs' snapshots through the driver did both one row at a time
in one process; here Spark does the bulk of it:

1. The inputs are read at ``as_of`` straight from their Parquet parts by the executors
   (:mod:`.parts_source`), and the plan is lowered to DataFrames once (:mod:`.lowering`),
   keeping the relation that feeds each input of each stateful operator: the linear
   operators before it are applied by Spark. It is not consolidated (that would cost a
   shuffle of its own): an operator takes any batch of updates at one time, and sums them.
   A Reduce's input is the exception: it is cut to the columns the Reduce reads and
   consolidated on them, which its per-group state cannot tell apart (:func:`_narrowed`).
   A join's input that is a stored collection, or a projection of one, is not computed
   here at all: each task reads it from the parts itself (:mod:`.part_shares`).
2. One job stages those rows in the blob store for the tasks (:mod:`.staging`). Where the
   operator's key is plain columns (every operator but a join on expressions), each Spark
   partition's rows are stored as they are, one object per partition, and every task reads
   all of them and keeps the rows its shard owns (``part_shares.owned_rows``: the key
   columns hashed whole with ``keys.shards_of``, which gives each row the shard
   ``keys.shard_of`` gives its key in the tasks), as it does with a join's input read from
   the parts: one pass of the rows through Python and no shuffle. A computed key is
   evaluated and hashed row by row in Python by the executors, which route the rows with
   Spark's shuffle so that each shard's rows meet in one partition, staged as that shard's
   object: evaluating it in every task would cost a Python call per row in each.
3. Each resident task loads its objects and feeds every stateful operator its
   input at ``as_of`` in topological order (``ShardHost``). An operator's own output is not
   passed on: Spark computed what the next operator reads from the same plan.
4. The output at ``as_of`` is computed by Spark too, and written by the executors as Parquet
   parts of the output collection (:mod:`.parts_writer`); the caller commits them with
   ``Storage.AppendParts``. With an index, the output is also staged for the tasks, each
   keeping the rows of its index keys, as in step 2.

Only part lists, object keys and counts pass through the driver.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce as fold
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from services.compute.dataflow.graph import Graph
from services.compute.spark import requests as rq
from services.compute.spark.lowering import DIFF, lower_with, release
from services.compute.spark.lowering.aggregates import summed_state
from services.compute.spark.lowering.types import Rel, diff_sum
from services.compute.spark.part_shares import plan_shares, route_columns
from services.compute.spark.parts_source import collection_frame, s3_credentials
from services.compute.spark.parts_writer import write_parts_counted
from services.compute.spark.staging import concatenated, encode, object_key, piece_key, put_all
from tidemark.clients.storage import PartsListing, WrittenPart
from tidemark.columnar import RelationSchema
from tidemark.errors import Internal
from tidemark.logging import get_logger
from tidemark.v1 import plan_pb2

log = get_logger("compute.spark.hydration")

INDEX_TAG = 0
"""The tag of the output routed by the index key; stateful inputs are tagged from 1."""

FLUSH_ROWS = 100_000
"""Rows an executor buffers per shard before handing them to the shuffle."""

KNOWN_KEYS = 1_000_000
"""Keys whose shard an executor remembers while routing one partition by a computed key."""

_ROUTED = StructType(
    [
        StructField("tag", IntegerType(), False),
        StructField("shard", IntegerType(), False),
        StructField("rows", LongType(), False),
        StructField("payload", BinaryType(), False),
    ]
)
_STAGED = StructType(
    [
        StructField("tag", IntegerType(), False),
        StructField("shard", IntegerType(), False),
        StructField("key", StringType(), False),
        StructField("rows", LongType(), False),
    ]
)


@dataclass(frozen=True)
class OutputTarget:
    """Where the output at ``as_of`` goes: parts of ``collection_id`` in ``blob_url``.
    ``existing``: the collection's contents so far, when it already holds some (a restart
    whose inputs moved on); only the difference is written."""

    collection_id: str
    schema: RelationSchema
    blob_url: str
    existing: PartsListing | None = None


@dataclass
class Staged:
    """What one run computed: each shard's load request, and the output's parts."""

    loads: list[rq.Hydrate]
    output_parts: list[WrittenPart] = field(default_factory=list)
    output_rows: int | None = None
    """The output's rows at ``as_of`` with multiplicity (``None``: the index load counts)."""
    staged_rows: int = 0
    staging_seconds: float = 0.0
    """The staging job's wall time (steps 1 and 2: one Spark job)."""
    output_seconds: float = 0.0
    """The output's jobs' wall time (step 4)."""


@dataclass(frozen=True)
class _Target:
    tag: int
    node_id: int | None  # None: the output, for the index
    input_index: int
    frame: DataFrame
    columns: tuple[int, ...] | None
    """The key's columns when the route is a plain projection (every task then keeps its
    own rows of the objects staged unrouted); ``None``: routed by Spark's shuffle."""
    states: bool = False
    """The frame holds a Reduce's groups' partial aggregates, not its input rows."""


def stage(
    spark: SparkSession,
    plan: plan_pb2.Plan | plan_pb2.Relation,
    graph: Graph,
    *,
    dataflow_id: str,
    as_of: int,
    shards: int,
    index_key_columns: Sequence[int] | None,
    listings: Mapping[str, PartsListing],
    staging_url: str,
    prefix: str,
    output: OutputTarget | None,
    count_output: bool,
    environment: Mapping[str, str] | None = None,
    only_shard: int | None = None,
    preloaded: Collection[int] = (),
) -> Staged:
    """Runs steps 1, 2 and 4 of the module docstring (Spark jobs on this thread) and returns
    the per-shard requests for step 3. ``count_output``: count the output's rows by a job of
    their own when no part write counts them (an index load counts them too).
    ``only_shard``: stage that shard's rows alone, dropped before the shuffle (a task that
    replaces a lost one; the others keep their state). ``preloaded``: the nodes the tasks
    loaded already (:func:`early_loads`), left out of the requests."""
    frames = {
        cid: collection_frame(spark, listing, consolidate=False, environment=environment)
        for cid, listing in listings.items()
    }
    wanted: list[tuple[int, int, plan_pb2.Relation]] = []
    shares = plan_shares(graph, listings)
    summed = _summed_reduces(graph, spark)
    for node in graph.stateful_nodes():
        if node.id in summed or node.id in preloaded:
            continue
        for position, input_id in enumerate(node.inputs):
            if shares.get(node.id, (None,) * len(node.inputs))[position] is not None:
                continue
            relation = graph.nodes[input_id].relation
            if relation is None:
                raise Internal(f"{node.label}: input {position} has no plan relation")
            wanted.append((node.id, position, relation))
    cached: list[DataFrame] = []
    try:
        root, targets = _lowered(spark, plan, graph, frames, wanted, summed, cached)
        return _run(
            spark,
            plan,
            graph,
            targets,
            root,
            dataflow_id=dataflow_id,
            as_of=as_of,
            shards=shards,
            index_key_columns=index_key_columns,
            shares={n: slots for n, slots in shares.items() if n not in preloaded},
            staging_url=staging_url,
            prefix=prefix,
            output=output,
            count_output=count_output,
            environment=environment,
            only_shard=only_shard,
        )
    finally:
        release(cached)


def _lowered(
    spark: SparkSession,
    plan: plan_pb2.Plan | plan_pb2.Relation,
    graph: Graph,
    frames: Mapping[str, DataFrame],
    wanted: list[tuple[int, int, plan_pb2.Relation]],
    summed: Mapping[int, plan_pb2.Relation],
    cached: list[DataFrame],
) -> tuple[DataFrame, list[_Target]]:
    """The plan lowered once (what it caches appended to ``cached``): its output, and the
    frames to stage for ``wanted`` inputs and ``summed`` Reduces' groups."""
    replace = _narrowed_once(plan, graph, wanted, cached)
    root, captured, aggregated = lower_with(
        plan,
        frames,
        [r for _, _, r in wanted],
        spark,
        replace,
        states=list(summed.values()),
        kept=cached,
    )
    targets = [
        _Target(
            tag,
            node_id,
            position,
            frame
            if relation.SerializeToString(deterministic=True) in replace
            else _narrowed(graph.nodes[node_id].relation, frame),
            route_columns(graph, node_id, position),
        )
        for tag, ((node_id, position, relation), frame) in enumerate(
            zip(wanted, captured, strict=True), start=1
        )
    ]
    for node_id, frame in zip(summed, aggregated, strict=True):
        key_width = len(graph.nodes[node_id].relation.reduce.group_key)  # type: ignore[union-attr]
        targets.append(
            _Target(len(targets) + 1, node_id, 0, frame, tuple(range(key_width)), states=True)
        )
    return root, targets


def early_loads(
    graph: Graph,
    listings: Mapping[str, PartsListing],
    *,
    dataflow_id: str,
    as_of: int,
    shards: int,
    environment: Mapping[str, str] | None = None,
) -> tuple[list[rq.Hydrate], frozenset[int]]:
    """The requests (one per shard) loading the stateful nodes every input of which the
    tasks read from the parts themselves (``part_shares``: a join of stored collections),
    and those nodes. They wait for no Spark job, so the tasks load them while the jobs run
    (pass the nodes to :func:`stage` as ``preloaded``); the index waits for the rest
    (``Hydrate.complete``)."""
    shares = {
        node_id: slots
        for node_id, slots in plan_shares(graph, listings).items()
        if all(slot is not None for slot in slots)
    }
    if not shares:
        return [], frozenset()
    credentials = s3_credentials(environment)
    blob_url = next(iter(listings.values())).blob_url
    load = rq.Hydrate(dataflow_id, blob_url, credentials, as_of, {}, (), shares, (), False)
    return [load] * shards, frozenset(shares)


def _run(
    spark: SparkSession,
    plan: plan_pb2.Plan | plan_pb2.Relation,
    graph: Graph,
    targets: list[_Target],
    root: DataFrame,
    *,
    dataflow_id: str,
    as_of: int,
    shards: int,
    index_key_columns: Sequence[int] | None,
    shares: dict[int, tuple[rq.PartsShare | None, ...]],
    staging_url: str,
    prefix: str,
    output: OutputTarget | None,
    count_output: bool,
    environment: Mapping[str, str] | None,
    only_shard: int | None,
) -> Staged:
    """:func:`stage`'s jobs, once the plan is lowered and its targets chosen."""
    credentials = s3_credentials(environment)
    width = len(root.columns) - 1
    positional = root.toDF(*(f"c{i}" for i in range(width)), DIFF)
    if index_key_columns is not None:
        targets.append(_Target(INDEX_TAG, None, 0, positional, tuple(index_key_columns)))

    plan_bytes = plan.SerializeToString()
    is_relation = isinstance(plan, plan_pb2.Relation)
    # A key of plain columns: each partition's rows are staged as they are, one object per
    # partition, and every task keeps its own rows of them (``part_shares.owned_rows``), as
    # it does with a join's input read from the parts: one Python pass over the rows and no
    # shuffle. A computed key is routed by Spark's shuffle instead (each task gets its own
    # object), since evaluating it in every task would cost a Python call per row each.
    routed = [
        target.frame.mapInArrow(
            _router(plan_bytes, is_relation, target, shards),
            _ROUTED,
        )
        for target in targets
        if target.columns is None
    ]
    whole = [
        target.frame.mapInArrow(
            _piece_stager(staging_url, prefix, credentials, target.tag), _STAGED
        )
        for target in targets
        if target.columns is not None
    ]
    started = time.perf_counter()
    staged: list[Any] = []
    if only_shard is not None:
        routed = [frame.where(F.col("shard") == only_shard) for frame in routed]
    if routed:
        union = fold(lambda a, b: a.unionByName(b), routed)
        shuffled = union.repartition(shards, F.col("shard"))
        whole.append(shuffled.mapInArrow(_stager(staging_url, prefix, credentials), _STAGED))
    if whole:
        staged = fold(lambda a, b: a.unionByName(b), whole).collect()

    # (tag, shard) -> objects; shard -1: every shard's rows, each task keeping its own.
    objects: dict[tuple[int, int], list[str]] = {}
    staged_rows = 0
    for row in sorted(staged, key=lambda r: r["key"]):
        objects.setdefault((row["tag"], row["shard"]), []).append(row["key"])
        staged_rows += row["rows"]

    def staged_for(tag: int, shard: int) -> tuple[str, ...]:
        return (*objects.get((tag, -1), ()), *objects.get((tag, shard), ()))

    loads = []
    for shard in range(shards):
        nodes: dict[int, list[tuple[str, ...]]] = {}
        for target in targets:
            if target.node_id is None:
                continue
            arity = len(graph.nodes[target.node_id].inputs)
            staged_keys = nodes.setdefault(target.node_id, [()] * arity)
            staged_keys[target.input_index] = staged_for(target.tag, shard)
        loads.append(
            rq.Hydrate(
                dataflow_id,
                staging_url,
                credentials,
                as_of,
                {node_id: tuple(keys) for node_id, keys in nodes.items()},
                staged_for(INDEX_TAG, shard),
                shares,
                tuple(sorted(t.node_id for t in targets if t.states and t.node_id is not None)),
            )
        )
    result = Staged(loads, staged_rows=staged_rows, staging_seconds=time.perf_counter() - started)
    log.info(
        "hydration_staged",
        dataflow=dataflow_id,
        objects=len(staged),
        read_by_tasks=sum(1 for slots in shares.values() for s in slots if s is not None),
        rows=staged_rows,
        seconds=round(result.staging_seconds, 3),
    )
    started = time.perf_counter()

    if output is not None:
        written = positional
        if output.existing is not None:
            previous = collection_frame(
                spark, output.existing, consolidate=False, environment=environment
            )
            negated = previous.toDF(*positional.columns).withColumn(DIFF, -F.col(DIFF))
            keys = [F.col(f"c{i}") for i in range(width)]
            union = positional.unionByName(negated)
            summed = union.groupBy(*keys).agg(F.sum(DIFF).alias(DIFF))
            written = summed.where(F.col(DIFF) != 0)
        named = written.toDF(*(c.name for c in output.schema.columns), DIFF)
        parts, total = write_parts_counted(
            named,
            output.schema,
            output.collection_id,
            output.blob_url,
            as_of,
            environment=environment,
        )
        result.output_parts = parts
        if output.existing is None:
            result.output_rows = total
    if output is not None:
        log.info(
            "hydration_output_written",
            dataflow=dataflow_id,
            parts=len(result.output_parts),
            seconds=round(time.perf_counter() - started, 3),
        )
    if result.output_rows is None and count_output:
        counted = positional.agg(F.sum(DIFF)).collect()[0][0]
        result.output_rows = int(counted or 0)
    result.output_seconds = time.perf_counter() - started
    return result


def _summed_reduces(graph: Graph, spark: SparkSession) -> dict[int, plan_pb2.Relation]:
    """The Reduce nodes every aggregate of which keeps a summed state
    (``lowering.aggregates.summed_state``: COUNT, and SUM or AVG computed exactly), by node
    id, with their relations. Spark stages such a Reduce's state itself, its groups' partial
    aggregates, instead of its input: one aggregation by the group key, as a recompute of
    the view runs, where consolidating the input on the columns the aggregates read
    (:func:`_narrowed`) hashes every input row by more columns into many more groups."""
    found: dict[int, plan_pb2.Relation] = {}
    for node in graph.stateful_nodes():
        relation = node.relation
        if relation is None or not relation.HasField("reduce"):
            continue
        types = graph.nodes[node.inputs[0]].types
        if all(summed_state(a, types, spark) for a in relation.reduce.aggregates):
            found[node.id] = relation
    return found


def _narrowed_once(
    plan: plan_pb2.Plan | plan_pb2.Relation,
    graph: Graph,
    wanted: Sequence[tuple[int, int, plan_pb2.Relation]],
    cached: list[DataFrame],
) -> dict[bytes, Callable[[Rel], Rel]]:
    """Replacements (for ``lower_with``) that narrow a Reduce's input once, cached, for both
    the staging job and the Reduce in the output's job: the Reduce's answer depends only on
    the columns it reads, so the output job aggregates the few narrowed rows instead of
    computing the Reduce's input (a join of every input row, say) a second time. Only for
    a relation that occurs once in the plan and feeds that Reduce alone: any other reader
    needs the whole rows. The cached frames are appended to ``cached`` (unpersist them after
    the jobs)."""
    root = plan.root if isinstance(plan, plan_pb2.Plan) else plan
    occurrences = Counter(
        relation.SerializeToString(deterministic=True) for relation in _relations(root)
    )
    replace: dict[bytes, Callable[[Rel], Rel]] = {}
    for node_id, _, relation in wanted:
        consumer = graph.nodes[node_id].relation
        key = relation.SerializeToString(deterministic=True)
        if consumer is None or not consumer.HasField("reduce") or occurrences[key] != 1:
            continue

        def narrowed(rel: Rel, consumer: plan_pb2.Relation = consumer) -> Rel:
            frame = _narrowed(consumer, rel.df).persist()
            cached.append(frame)
            # Consolidated on the columns kept; the others are NULL, so no narrower key
            # the lowered form knew still holds.
            return Rel(frame, rel.types, True)

        replace[key] = narrowed
    return replace


def _relations(relation: plan_pb2.Relation) -> Iterator[plan_pb2.Relation]:
    """``relation`` and every relation inside it."""
    yield relation
    kind = relation.WhichOneof("kind")
    if kind is None:
        return
    body = getattr(relation, kind)
    for descriptor, value in body.ListFields():
        if descriptor.message_type is not plan_pb2.Relation.DESCRIPTOR:
            continue
        for child in value if descriptor.is_repeated else [value]:
            yield from _relations(child)


def _narrowed(consumer: plan_pb2.Relation | None, frame: DataFrame) -> DataFrame:
    """A Reduce's input as its state sees it: a Reduce keeps per group only its row count and
    its aggregates' states, which depend on the columns its group key and aggregates read, so
    the other columns are NULL here and the rows consolidated on what is left (a join's
    10^7 rows become the few distinct (group, value) pairs). Later steps' full rows land in
    the same groups and states. Other operators keep whole rows: their input as it is."""
    if consumer is None or not consumer.HasField("reduce"):
        return frame
    reduce = consumer.reduce
    read = set(reduce.group_key)
    for aggregate in reduce.aggregates:
        if aggregate.HasField("expression"):
            read |= _columns_of(aggregate.expression)
    names = frame.columns[:-1]
    kept = [F.col(n) for i, n in enumerate(names) if i in read]
    grouped = frame.groupBy(*kept) if kept else frame.groupBy()
    summed = grouped.agg(diff_sum(F.col(DIFF)).alias(DIFF)).where(F.col(DIFF) != 0)
    types = {field.name: field.dataType for field in frame.schema.fields}
    return summed.select(
        *(
            F.col(n) if i in read else F.lit(None).cast(types[n]).alias(n)
            for i, n in enumerate(names)
        ),
        F.col(DIFF),
    )


def _columns_of(message: Any) -> set[int]:
    """The input columns a scalar expression reads."""
    if isinstance(message, plan_pb2.Scalar) and message.WhichOneof("kind") == "column":
        return {message.column}
    found: set[int] = set()
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        for child in value if descriptor.is_repeated else [value]:
            found |= _columns_of(child)
    return found


# -- executors --------------------------------------------------------------------------------

_graphs: dict[bytes, Graph] = {}


def _graph(plan_bytes: bytes, is_relation: bool) -> Graph:
    """The plan's operator graph, lowered once per executor process (node ids are the same
    in every process that lowers the same plan)."""
    digest = hashlib.sha256(plan_bytes).digest()
    graph = _graphs.get(digest)
    if graph is None:
        from services.compute.dataflow.lower import lower

        plan: plan_pb2.Plan | plan_pb2.Relation = (
            plan_pb2.Relation() if is_relation else plan_pb2.Plan()
        )
        plan.ParseFromString(plan_bytes)
        graph = lower(plan)
        if len(_graphs) > 64:
            _graphs.clear()
        _graphs[digest] = graph
    return graph


def _router(
    plan_bytes: bytes, is_relation: bool, target: _Target, shards: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor function sorting a relation's rows by the shard owning their key, a
    computed one (a join on expressions: a key of plain columns is staged unrouted)."""
    tag, node_id, position = target.tag, target.node_id, target.input_index
    assert node_id is not None and target.columns is None

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from services.compute.dataflow.keys import shard_of
        from services.compute.spark.transport import normalizer

        graph = _graph(plan_bytes, is_relation)
        node = graph.nodes[node_id]
        key = node.operator.routes[position]  # type: ignore[union-attr]
        types = graph.nodes[node.inputs[position]].types
        normalize = normalizer(types)
        known: dict[tuple[Any, ...], int] = {}

        def owners_by_row(batch: pa.RecordBatch) -> np.ndarray:
            """A computed key (a join on expressions): evaluated row by row in Python."""
            width = batch.num_columns - 1
            values = [batch.column(i).to_pylist() for i in range(width)]
            rows: Iterable[tuple[Any, ...]] = (
                zip(*values, strict=True) if values else [()] * batch.num_rows
            )
            if normalize.float_columns:
                rows = (normalize.row(row) for row in rows)
            # Keys repeat (a join's foreign keys, a reduce's groups): a dict lookup is
            # cheaper than encoding and hashing again. A key column holds one type, so
            # values equal in Python (1 and True) never meet in one route.
            owners = []
            for row in rows:
                owner_key = key(row)
                owner = known.get(owner_key)
                if owner is None:
                    if len(known) >= KNOWN_KEYS:
                        known.clear()
                    owner = known[owner_key] = shard_of(owner_key, shards)
                owners.append(owner)
            return np.array(owners, dtype=np.int64)

        buffered: dict[int, list[pa.RecordBatch]] = {}
        held = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if shards == 1:
                buffered.setdefault(0, []).append(batch)
            else:
                for shard, part in _split(batch, owners_by_row(batch), shards):
                    buffered.setdefault(shard, []).append(part)
            held += batch.num_rows
            if held >= FLUSH_ROWS:
                yield from _flush(tag, buffered)
                buffered, held = {}, 0
        yield from _flush(tag, buffered)

    return route


def _split(
    batch: pa.RecordBatch, owners: np.ndarray, shards: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``batch``'s rows grouped by their shard in ``owners``: one take, then slices."""
    counts = np.bincount(owners, minlength=shards)
    if np.count_nonzero(counts) == 1:
        yield int(owners[0]), batch
        return
    ordered = batch.take(pa.array(np.argsort(owners, kind="stable")))
    start = 0
    for shard, count in enumerate(counts.tolist()):
        if count:
            yield shard, ordered.slice(start, count)
            start += count


def _flush(tag: int, buffered: Mapping[int, list[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
    for shard, batches in buffered.items():
        rows = sum(b.num_rows for b in batches)
        payload = encode([pa.Table.from_batches(batches)])
        yield pa.record_batch(
            [
                pa.array([tag], pa.int32()),
                pa.array([shard], pa.int32()),
                pa.array([rows], pa.int64()),
                pa.array([payload], pa.binary()),
            ],
            names=["tag", "shard", "rows", "payload"],
        )


def _stager(
    staging_url: str, prefix: str, credentials: Mapping[str, str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor function storing each (tag, shard)'s rows, gathered by the shuffle into
    its partition, as one object."""

    def store(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pieces: dict[tuple[int, int], list[bytes]] = {}
        counts: dict[tuple[int, int], int] = {}
        for batch in batches:
            tags = batch.column(0).to_pylist()
            shards = batch.column(1).to_pylist()
            rows = batch.column(2).to_pylist()
            payloads = batch.column(3)
            for i, (tag, shard) in enumerate(zip(tags, shards, strict=True)):
                slot = (tag, shard)
                pieces.setdefault(slot, []).append(payloads[i].as_py())
                counts[slot] = counts.get(slot, 0) + rows[i]
        if not pieces:
            return
        objects = {
            object_key(prefix, tag, shard): concatenated(streams)
            for (tag, shard), streams in pieces.items()
        }
        put_all(staging_url, objects, credentials)
        slots = list(pieces)
        yield pa.record_batch(
            [
                pa.array([tag for tag, _ in slots], pa.int32()),
                pa.array([shard for _, shard in slots], pa.int32()),
                pa.array([object_key(prefix, tag, shard) for tag, shard in slots]),
                pa.array([counts[slot] for slot in slots], pa.int64()),
            ],
            names=["tag", "shard", "key", "rows"],
        )

    return store


def _piece_stager(
    staging_url: str, prefix: str, credentials: Mapping[str, str], tag: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor function storing a partition's rows of input ``tag`` as they are, as one
    object that every task reads (shard -1: each keeps the rows its shard owns)."""

    def store(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        kept = [batch for batch in batches if batch.num_rows]
        if not kept:
            return
        context = TaskContext.get()
        piece = 0 if context is None else context.partitionId()
        key = piece_key(prefix, tag, piece)
        data = concatenated([encode([pa.Table.from_batches(kept)])])
        put_all(staging_url, {key: data}, credentials)
        yield pa.record_batch(
            [
                pa.array([tag], pa.int32()),
                pa.array([-1], pa.int32()),
                pa.array([key]),
                pa.array([sum(batch.num_rows for batch in kept)], pa.int64()),
            ],
            names=["tag", "shard", "key", "rows"],
        )

    return store
