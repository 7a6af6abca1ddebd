"""A compute process on Spark (resident tasks), with storage, as real processes over gRPC:
maintained views agree with the reference evaluator at every time, frontiers and read holds
follow the contract, peeks wait or refuse as they should, subscriptions replay the output,
every error code, and a lost Spark task fails its dataflows while the process keeps
serving."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from services.compute.planning import rename_collections
from tests.support.compute import (
    Collections,
    Stack,
    contents_at,
    eventually,
    resident_task_pids,
    running_stack,
)
from tests.support.random_plans import Scenario, batches, inputs_at, scenarios
from tests.support.reference_eval import canonical, evaluate
from tidemark.cdc import CdcReader
from tidemark.clients.compute import ComputeClient, one_shot
from tidemark.clients.storage import Capability, StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from tidemark.frontier import u64_frontier
from tidemark.lattice import U64
from tidemark.plan import builders as pb
from tidemark.plan import check_plan
from tidemark.plan.walk import collections_read
from tidemark.v1 import plan_pb2, storage_pb2

pytestmark = pytest.mark.spark

Row = tuple[Any, ...]
KV = RelationSchema.of(("k", T.INT64), ("v", T.INT64))
NAMES = RelationSchema.of(("k", T.INT64), ("name", T.TEXT))
PATIENT_MS = 120_000
INDEX_HISTORY_MS = 60_000  # compute's default --index-history-ms


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("compute")) as running:
        yield running


@pytest.fixture
async def storage(stack: Stack) -> AsyncIterator[StorageClient]:
    client = StorageClient(stack.storage.address)
    yield client
    await client.close()


@pytest.fixture
async def compute(stack: Stack) -> AsyncIterator[ComputeClient]:
    client = ComputeClient(stack.compute().address, timeout=180.0)
    yield client
    await client.close()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def sums_by_key(collection_id: str) -> plan_pb2.Plan:
    """``SELECT k, count(*), sum(v) FROM c GROUP BY k``."""
    relation = pb.reduce(
        pb.get(collection_id, KV), [0], [pb.aggregate("count"), pb.aggregate("sum", 1)]
    )
    return pb.plan(relation)


def named_totals(values: str, names: str) -> plan_pb2.Plan:
    """``SELECT name, sum(v) FROM values JOIN names USING (k) GROUP BY name``."""
    joined = pb.join(pb.get(values, KV), pb.get(names, NAMES), [0], [0])
    return pb.plan(pb.reduce(joined, [3], [pb.aggregate("sum", 1)]))


def reference(plan: plan_pb2.Plan, histories: dict[str, list[Any]], time: int) -> dict[Row, int]:
    return canonical(evaluate(plan, {cid: contents_at(h, time) for cid, h in histories.items()}))


async def output_collection(collections: Collections, plan: plan_pb2.Plan) -> str:
    return await collections.create(check_plan(plan), initial=0)


# -- random plans --------------------------------------------------------------------------------


async def check_scenario(stack: Stack, scenario: Scenario) -> None:
    async with (
        StorageClient(stack.storage.address) as storage,
        ComputeClient(stack.compute().address, timeout=180.0) as compute,
    ):
        collections = Collections(storage)
        names = {}
        for name, schema in scenario.schemas.items():
            names[name] = await collections.create(schema)
        plan = rename_collections(scenario.plan, names)
        output = await output_collection(collections, plan)
        dataflow_id = new_id("random")

        async def install() -> None:
            read = collections_read(plan)
            caps = [await collections.read_capability(cid) for cid in names.values() if cid in read]
            write = await collections.write_capability(output)
            result = await compute.maintain_view(
                dataflow_id, plan, caps, output=write, index_key_columns=[0]
            )
            assert result.as_of == 0

        history = scenario.history
        # The first batch is there before the view; the rest arrive while it runs, each
        # batch spanning several times.
        for position, (_, upper, updates) in enumerate(batches(history)):
            if position == 1:
                await install()
            for name, held in updates.items():
                await collections.append(names[name], held, upper)
        if len(history.batch_uppers) == 1:
            await install()
        last = history.max_time
        await compute.peek(dataflow_id, last, wait_ms=PATIENT_MS)
        written = await collections.history(output, last + 1)
        for time in range(last + 1):
            expected = canonical(evaluate(plan, _renamed_inputs(inputs_at(history, time), names)))
            assert canonical(contents_at(written, time)) == expected, f"collection at {time}"
            peeked = await compute.peek(dataflow_id, time)
            assert canonical(dict(peeked.rows)) == expected, f"index at {time}"
        await compute.drop_view(dataflow_id)


def _renamed_inputs(inputs: dict[str, dict[Row, int]], names: dict[str, str]) -> dict[str, Any]:
    return {names[name]: contents for name, contents in inputs.items()}


# No shrinking: every example costs real processes' round trips; a failure prints its case.
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(scenario=scenarios(max_depth=3, max_time=8))
def test_random_views_agree_with_the_reference_at_every_time(
    stack: Stack, scenario: Scenario
) -> None:
    asyncio.run(check_scenario(stack, scenario))


# -- frontiers and holds -------------------------------------------------------------------------


def _held_frontier(info: Any, capability: Capability) -> int | None:
    for summary in info.capabilities:
        if capability.id.startswith(summary.id_prefix):
            elements = summary.frontier.elements
            return elements[0] if elements else None
    return None


async def test_output_upper_and_read_holds_follow_the_inputs(
    storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    values = await collections.create(KV)
    names = await collections.create(NAMES)
    plan = named_totals(values, names)
    output = await output_collection(collections, plan)
    value_cap = await collections.read_capability(values)
    name_cap = await collections.read_capability(names)
    write = await collections.write_capability(output)
    dataflow_id = new_id("holds")
    await compute.maintain_view(dataflow_id, plan, [value_cap, name_cap], output=write)

    await collections.append(names, [((1, "one"), 0, 1), ((2, "two"), 1, 1)], 4)
    await collections.append(values, [((1, 10), 0, 1), ((2, 5), 2, 1), ((1, 3), 7, 1)], 9)

    async def caught_up() -> None:
        info = await storage.describe(output)
        assert info.upper == u64_frontier(4)

    await eventually(caught_up)
    # The slower input bounds the output: it never passes an input's upper.
    for _ in range(5):
        out_upper = (await storage.describe(output)).upper.elements[0]
        for cid in (values, names):
            assert out_upper <= (await storage.describe(cid)).upper.elements[0]
        await asyncio.sleep(0.1)

    async def holds_moved() -> None:
        for cid, cap in ((values, value_cap), (names, name_cap)):
            assert _held_frontier(await storage.describe(cid), cap) == 3

    await eventually(holds_moved)
    await collections.advance(names, 12)
    await collections.advance(values, 12)

    async def followed() -> None:
        assert (await storage.describe(output)).upper == u64_frontier(12)
        for cid, cap in ((values, value_cap), (names, name_cap)):
            assert _held_frontier(await storage.describe(cid), cap) == 11

    await eventually(followed)
    written = await collections.history(output, 12)
    histories = {
        values: await collections.history(values, 12),
        names: await collections.history(names, 12),
    }
    for time in range(12):
        assert canonical(contents_at(written, time)) == reference(plan, histories, time)

    await compute.drop_view(dataflow_id)
    for cid, cap in ((values, value_cap), (names, name_cap), (output, write)):
        assert _held_frontier(await storage.describe(cid), cap) is None
    status = await compute.status()
    assert status.dataflow(dataflow_id) is None


# -- peeks ---------------------------------------------------------------------------------------


async def test_index_peeks_wait_refuse_and_finish(
    storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    values = await collections.create(KV, initial=5)
    plan = sums_by_key(values)
    await collections.append(values, [((1, 10), 5, 1), ((2, 4), 6, 1), ((1, 1), 7, 1)], 8)
    dataflow_id = new_id("index")
    result = await compute.maintain_view(
        dataflow_id, plan, [await collections.read_capability(values)], index_key_columns=[0]
    )
    assert result.as_of == 5
    assert result.output_schema == check_plan(plan)

    at_7 = await compute.peek(dataflow_id, 7, wait_ms=PATIENT_MS)
    assert at_7.timestamp == 7
    assert sorted(at_7.rows) == [((1, 2, 11), 1), ((2, 1, 4), 1)]
    at_5 = await compute.peek(dataflow_id, 5)
    assert at_5.rows == [((1, 1, 10), 1)]
    with pytest.raises(FailedPrecondition):
        await compute.peek(dataflow_id, 4)
    with pytest.raises(DeadlineExceeded):
        await compute.peek(dataflow_id, 8, wait_ms=300)

    # A peek beyond the upper waits for it to pass, then answers.
    waiting = asyncio.create_task(compute.peek(dataflow_id, 9, wait_ms=PATIENT_MS))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await collections.append(values, [((2, 6), 9, 1), ((1, 10), 8, -1)], 10)
    at_9 = await waiting
    assert sorted(at_9.rows) == [((1, 1, 1), 1), ((2, 2, 10), 1)]

    # A finishing plan over the index: keys whose sum is at least 5, and their count.
    schema = check_plan(plan)
    over_index = pb.filter(
        pb.get(dataflow_id, schema), pb.call("ge", pb.column(2), pb.literal(5, T.INT64))
    )
    finishing = pb.plan(pb.reduce(over_index, [], [pb.aggregate("count")]))
    finished = await compute.peek(dataflow_id, 9, finishing=finishing)
    assert finished.rows == [((1,), 1)]
    assert finished.schema.names == ["count"]
    finished_at_7 = await compute.peek(dataflow_id, 7, finishing=finishing)
    assert finished_at_7.rows == [((1,), 1)]
    at_6 = await compute.peek(dataflow_id, 6, finishing=pb.plan(pb.project(over_index, 0)))
    assert at_6.rows == [((1,), 1)]

    table = (await compute.peek_arrow(dataflow_id, 9)).table
    assert table.column_names == ["k", "count", "sum", "time", "diff"]
    assert set(table.column("time").to_pylist()) == {9}

    status = (await compute.status()).dataflow(dataflow_id)
    assert status is not None
    assert status.state == "running"
    assert status.has_index and status.since == u64_frontier(5)
    assert status.input_collection_ids == [values] and status.output_collection_ids == []
    assert status.index_rows == 2 and status.arrangement_keys > 0
    # The resident tasks' state, summed: the Reduce's two groups (count and sum keep no values).
    assert status.state_rows == status.arrangement_keys == 2 and status.state_bytes > 0
    assert status.hydrated_rows == status.hydration_rows_total == 1

    # Many steps later the index is compacted: its since trails the latest complete time by
    # the history window, older times are refused, and the since itself still reads exactly.
    for step in range(1, 7):
        at = step * INDEX_HISTORY_MS // 3
        changes = [((1, step), at, 1), ((3, step), at, 1)]
        if step > 1:
            changes.append(((3, step - 1), at, -1))
        await collections.append(values, changes, at + 1)
    latest = 6 * INDEX_HISTORY_MS // 3
    compacted_to = latest - INDEX_HISTORY_MS

    async def compacted() -> None:
        moved = (await compute.status()).dataflow(dataflow_id)
        assert moved is not None and moved.since == u64_frontier(compacted_to)

    await eventually(compacted)
    with pytest.raises(FailedPrecondition, match="before the since"):
        await compute.peek(dataflow_id, compacted_to - 1)
    with pytest.raises(FailedPrecondition):
        await compute.peek(dataflow_id, 9)
    at_since = await compute.peek(dataflow_id, compacted_to)
    assert sorted(at_since.rows) == [((1, 4, 7), 1), ((2, 2, 10), 1), ((3, 1, 3), 1)]
    at_latest = await compute.peek(dataflow_id, latest)
    assert sorted(at_latest.rows) == [((1, 7, 22), 1), ((2, 2, 10), 1), ((3, 1, 6), 1)]
    await compute.drop_view(dataflow_id)


async def test_one_shot_peeks_read_snapshots_without_a_dataflow(
    storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    values = await collections.create(KV)
    names = await collections.create(NAMES)
    await collections.append(names, [((1, "one"), 0, 1), ((2, "two"), 0, 1)], 3)
    await collections.append(values, [((1, 4), 1, 2), ((2, 1), 1, 1), ((1, 4), 2, -1)], 3)
    plan = named_totals(values, names)
    readers = [collections.read(values), collections.read(names)]
    for time in range(3):
        result = await compute.peek(one_shot(plan, readers), time)
        histories = {
            values: await collections.history(values, 3),
            names: await collections.history(names, 3),
        }
        assert canonical(dict(result.rows)) == reference(plan, histories, time)
    with pytest.raises(DeadlineExceeded):
        await compute.peek(one_shot(plan, readers), 3, wait_ms=300)
    # Nothing stays installed, and the caller's capabilities are untouched.
    for info in (await compute.status()).dataflows:
        assert values not in info.input_collection_ids
    assert (await storage.describe(values)).since == u64_frontier(0)


# -- subscriptions -------------------------------------------------------------------------------


async def _read_until(
    messages: AsyncIterator[Any], upper: int, lower: int = 0
) -> list[tuple[Row, int, int]]:
    reader: CdcReader[Row, int] = CdcReader(U64)
    updates: list[tuple[Row, int, int]] = []
    async for message in messages:
        for batch, frontier in reader.push(message):
            updates.extend(batch)
            if not frontier.less_equal(upper - 1):
                return updates
    raise AssertionError("the subscription ended early")


async def test_subscribe_replays_the_output(storage: StorageClient, compute: ComputeClient) -> None:
    collections = Collections(storage)
    values = await collections.create(KV)
    plan = sums_by_key(values)
    output = await output_collection(collections, plan)
    await collections.append(values, [((1, 1), 0, 1), ((2, 2), 1, 1)], 3)
    indexed, written = new_id("sub-index"), new_id("sub-mv")
    await compute.maintain_view(
        indexed, plan, [await collections.read_capability(values)], index_key_columns=[0]
    )
    await compute.maintain_view(
        written,
        plan,
        [await collections.read_capability(values)],
        output=await collections.write_capability(output),
    )
    await compute.peek(indexed, 2, wait_ms=PATIENT_MS)

    from_index = compute.subscribe(indexed, as_of=1)
    from_collection = compute.subscribe(written, as_of=1)
    await collections.append(values, [((1, 1), 3, 1), ((2, 2), 4, -1), ((3, 3), 4, 1)], 6)
    history = await collections.history(values, 6)
    expected: list[tuple[Row, int, int]] = []
    previous: dict[Row, int] = {}
    for time in range(1, 6):
        now = reference(plan, {values: history}, time)
        if time == 1:
            expected += [(row, 1, n) for row, n in now.items()]
        else:
            for row in now.keys() | previous.keys():
                if now.get(row, 0) != previous.get(row, 0):
                    expected.append((row, time, now.get(row, 0) - previous.get(row, 0)))
        previous = now
    for stream in (from_index, from_collection):
        got = await _read_until(stream, 6)
        assert sorted(got) == sorted(expected)
        await stream.aclose()  # type: ignore[attr-defined]

    # Without the snapshot: only what changes after as_of.
    later = compute.subscribe(indexed, as_of=5, snapshot=False)
    await collections.append(values, [((3, 3), 6, -1)], 8)
    assert await _read_until(later, 8) == [((3, 1, 3), 6, -1)]
    await later.aclose()  # type: ignore[attr-defined]
    await compute.drop_view(indexed)
    await compute.drop_view(written)


# -- errors --------------------------------------------------------------------------------------


async def test_every_error_code(storage: StorageClient, compute: ComputeClient) -> None:
    collections = Collections(storage)
    values = await collections.create(KV, initial=5)
    await collections.advance(values, 6)
    plan = sums_by_key(values)

    async def cap() -> Capability:
        return await collections.read_capability(values)

    bad_column = pb.plan(pb.project(pb.get(values, KV), 7))
    nondeterministic = pb.plan(pb.map(pb.get(values, KV), pb.call("random")))
    for bad in (bad_column, nondeterministic, plan_pb2.Plan()):
        with pytest.raises(InvalidArgument):
            await compute.maintain_view(new_id("bad"), bad, [await cap()], index_key_columns=[0])
    with pytest.raises(InvalidArgument, match="random"):
        await compute.maintain_view(
            new_id("bad"), nondeterministic, [await cap()], index_key_columns=[0]
        )
    other = await collections.create(KV)
    with pytest.raises(InvalidArgument):  # an input the plan does not read
        await compute.maintain_view(
            new_id("bad"),
            plan,
            [await cap(), await collections.read_capability(other)],
            index_key_columns=[0],
        )
    with pytest.raises(InvalidArgument):  # no output
        await compute.maintain_view(new_id("bad"), plan, [await cap()])
    mismatched = await collections.create(KV)
    with pytest.raises(InvalidArgument):  # the output's schema is not the plan's
        await compute.maintain_view(
            new_id("bad"),
            plan,
            [await cap()],
            output=await collections.write_capability(mismatched),
        )
    with pytest.raises(InvalidArgument):
        await compute.maintain_view(new_id("bad"), plan, [await cap()], index_key_columns=[3])

    forged = storage_pb2.CapabilityRef(collection_id=values, id="0" * 32)
    with pytest.raises(PermissionDenied):
        await compute.maintain_view(new_id("bad"), plan, [forged], index_key_columns=[0])
    with pytest.raises(PermissionDenied):  # a write capability as an input
        await compute.maintain_view(
            new_id("bad"), plan, [await collections.write_capability(values)], index_key_columns=[0]
        )
    with pytest.raises(FailedPrecondition):  # before the inputs' since
        await compute.maintain_view(
            new_id("bad"), plan, [await cap()], index_key_columns=[0], as_of=2
        )

    dataflow_id = new_id("errors")
    await compute.maintain_view(dataflow_id, plan, [await cap()], index_key_columns=[0])
    with pytest.raises(AlreadyExists):
        await compute.maintain_view(dataflow_id, plan, [await cap()], index_key_columns=[0])
    for unknown in (
        compute.drop_view("no-such-dataflow"),
        compute.peek("no-such-dataflow", 5),
    ):
        with pytest.raises(NotFound):
            await unknown
    with pytest.raises(NotFound):
        await anext(aiter(compute.subscribe("no-such-dataflow")))
    with pytest.raises(FailedPrecondition):
        await compute.peek(dataflow_id, 4, wait_ms=PATIENT_MS)
    with pytest.raises(DeadlineExceeded):
        await compute.peek(dataflow_id, 6, wait_ms=200)
    with pytest.raises(InvalidArgument):  # a finishing plan reading a non-index
        await compute.peek(dataflow_id, 5, finishing=pb.plan(pb.get(values, KV)))
    with pytest.raises(FailedPrecondition):  # started without --catalog
        await compute.advance_catalog_frontier(1, wait_ms=100)
    with pytest.raises(FailedPrecondition):  # a one-shot read before the since
        await compute.peek(one_shot(plan, [collections.read(values)]), 2)
    await compute.drop_view(dataflow_id)


# -- a lost Spark task (last: it costs the process a resident task) ------------------------------


async def test_a_lost_spark_task_is_replaced_and_its_dataflows_go_on_without_a_restart(
    stack: Stack, storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    values = await collections.create(KV)
    plan = sums_by_key(values)
    output = await output_collection(collections, plan)
    history = [((1, 1), 0, 1)]
    await collections.append(values, history, 2)
    doomed = new_id("doomed")
    await compute.maintain_view(
        doomed,
        plan,
        [await collections.read_capability(values)],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    assert (await compute.peek(doomed, 1, wait_ms=PATIENT_MS)).rows == [((1, 1, 1), 1)]
    holds_before = await read_holds(storage, values)

    os.kill(resident_task_pids(stack.compute())[0], signal.SIGKILL)
    more = [((1, 1), 2, 1), ((2, 5), 2, 1)]
    await collections.append(values, more, 3)
    history += more

    # The process starts a new task for the lost shard and rebuilds the dataflow's shard
    # there: the dataflow does not fail and is not restarted, nothing to do by hand.
    async def restored() -> None:
        info = (await compute.status()).dataflow(doomed)
        assert info is not None and info.shard_restores == 1
        assert (info.restarts, info.last_failure) == (0, "")
        assert info.state == "running" and not info.error

    await eventually(restored)
    assert sorted((await compute.peek(doomed, 2, wait_ms=PATIENT_MS)).rows) == [
        ((1, 2, 2), 1),
        ((2, 1, 5), 1),
    ]
    # It goes on following its input, and its output collection holds the exact history:
    # nothing is missing or written twice.
    later = [((2, 5), 3, -1), ((3, 7), 4, 1)]
    await collections.append(values, later, 5)
    history += later
    assert sorted((await compute.peek(doomed, 4, wait_ms=PATIENT_MS)).rows) == [
        ((1, 2, 2), 1),
        ((3, 1, 7), 1),
    ]
    written = await collections.history(output, 5)
    for time in range(5):
        expected = canonical(evaluate(plan, {values: contents_at(history, time)}))
        assert canonical(contents_at(written, time)) == expected, f"output at {time}"
    # Its capabilities are the same ones: no more, no fewer holds.
    assert await read_holds(storage, values) == holds_before
    await compute.drop_view(doomed)


async def read_holds(storage: StorageClient, collection_id: str) -> int:
    return sum(c.kind == "read" for c in (await storage.describe(collection_id)).capabilities)
