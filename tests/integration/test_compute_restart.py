"""A dataflow that fails while its resident Spark cluster stays healthy: the compute process
restarts it on the same tasks (its failed state dropped there first), its output stays exact
at every time, and the other dataflows on those tasks keep running untouched. Then a task
that falls silent: a new task takes its shard, rebuilt there, and nothing is restarted.

The failure is injected by the tasks' test-only fault hook (``shard_host.FAULT_ENV``): every
task fails one ``Process`` round of the one dataflow it names, once."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from services.compute.spark.shard_host import FAULT_ENV
from tests.support.compute import (
    Collections,
    Stack,
    contents_at,
    current_task_pids,
    eventually,
    resident_task_pids,
    running_stack,
)
from tests.support.reference_eval import canonical, evaluate
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.plan import check_plan
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

KV = RelationSchema.of(("k", T.INT64), ("v", T.INT64))
PATIENT_MS = 120_000
FAULTY = "restart-faulty"
# Its first Process is its hydration's; the second is a step's.
FAULT = f"{FAULTY}@2"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("restart"), compute_env={FAULT_ENV: FAULT}
    ) as running:
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


def sums_by_key(collection_id: str) -> plan_pb2.Plan:
    """``SELECT k, count(*), sum(v) FROM c GROUP BY k``."""
    relation = pb.reduce(
        pb.get(collection_id, KV), [0], [pb.aggregate("count"), pb.aggregate("sum", 1)]
    )
    return pb.plan(relation)


async def test_a_dataflow_failing_on_a_healthy_cluster_restarts_on_the_same_tasks(
    stack: Stack, storage: StorageClient, compute: ComputeClient
) -> None:
    collections = Collections(storage)
    values = await collections.create(KV)
    plan = sums_by_key(values)
    history = [((1, 1), 0, 1)]
    await collections.append(values, history, 2)
    outputs: dict[str, str] = {}
    for dataflow_id in ("restart-steady", FAULTY):
        outputs[dataflow_id] = await collections.create(check_plan(plan), initial=0)
        await compute.maintain_view(
            dataflow_id,
            plan,
            [await collections.read_capability(values)],
            output=await collections.write_capability(outputs[dataflow_id]),
            index_key_columns=[0],
        )
        assert (await compute.peek(dataflow_id, 1, wait_ms=PATIENT_MS)).rows == [((1, 1, 1), 1)]
    pids = resident_task_pids(stack.compute())

    more = [((1, 1), 2, 1), ((2, 5), 2, 1)]
    await collections.append(values, more, 3)
    history += more

    async def restarted() -> None:
        info = (await compute.status()).dataflow(FAULTY)
        assert info is not None and info.restarts == 1
        assert "injected fault" in info.last_failure
        assert info.state == "running" and not info.error

    await eventually(restarted)
    later = [((2, 5), 3, -1), ((3, 7), 4, 1)]
    await collections.append(values, later, 5)
    history += later
    for dataflow_id, output in outputs.items():
        assert sorted((await compute.peek(dataflow_id, 2, wait_ms=PATIENT_MS)).rows) == [
            ((1, 2, 2), 1),
            ((2, 1, 5), 1),
        ]
        assert sorted((await compute.peek(dataflow_id, 4, wait_ms=PATIENT_MS)).rows) == [
            ((1, 2, 2), 1),
            ((3, 1, 7), 1),
        ]
        # Nothing the failed dataflow wrote is missing or written twice.
        written = await collections.history(output, 5)
        for time in range(5):
            expected = canonical(evaluate(plan, {values: contents_at(history, time)}))
            assert canonical(contents_at(written, time)) == expected, f"{dataflow_id} at {time}"

    steady = (await compute.status()).dataflow("restart-steady")
    assert steady is not None and (steady.restarts, steady.last_failure) == (0, "")
    # Same tasks: no cluster was started after the first, and none failed.
    records = stack.compute().records()
    started = [r for r in records if r.get("event") == "resident_cluster_started"]
    assert len(started) == 1 and resident_task_pids(stack.compute()) == pids
    events = {r.get("event") for r in records}
    assert not events & {"resident_cluster_failed", "resident_cluster_replaced"}
    assert not events & {"dataflow_restart_failed", "engine_drop_failed"}
    restarts = [r["dataflow"] for r in records if r.get("event") == "dataflow_restarted"]
    assert restarts == [FAULTY]
    for dataflow_id in outputs:
        await compute.drop_view(dataflow_id)


async def test_a_stopped_task_is_replaced_and_its_shard_rebuilt_without_a_restart(
    stack: Stack, storage: StorageClient, compute: ComputeClient
) -> None:
    """A task that goes silent (SIGSTOP: its socket stays open) while the dataflows are idle:
    the driver's keepalive gives it up after the deadline, starts a new task for its shard and
    rebuilds the dataflow's shard there; the dataflow is not restarted and stays exact."""
    collections = Collections(storage)
    values = await collections.create(KV)
    plan = sums_by_key(values)
    history = [((1, 1), 0, 1)]
    await collections.append(values, history, 2)
    output = await collections.create(check_plan(plan), initial=0)
    dataflow_id = "silenced"
    await compute.maintain_view(
        dataflow_id,
        plan,
        [await collections.read_capability(values)],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    assert (await compute.peek(dataflow_id, 1, wait_ms=PATIENT_MS)).rows == [((1, 1, 1), 1)]
    survivor, victim = current_task_pids(stack.compute())
    os.kill(victim, signal.SIGSTOP)
    try:

        async def replaced() -> None:
            info = (await compute.status()).dataflow(dataflow_id)
            assert info is not None and info.shard_restores == 1 and info.restarts == 0
            assert info.state == "running" and not info.error
            assert current_task_pids(stack.compute())[0] == survivor
            assert victim not in current_task_pids(stack.compute())

        await eventually(replaced, 300.0)
        [lost] = [r for r in stack.compute().records() if r.get("event") == "resident_task_lost"]
        assert "shard 1 said nothing for" in lost["reason"]
    finally:
        # Cancelling the lost task's job may have ended its process already.
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    more = [((1, 1), 2, 1), ((2, 5), 3, 1)]
    await collections.append(values, more, 4)
    history += more
    assert sorted((await compute.peek(dataflow_id, 3, wait_ms=PATIENT_MS)).rows) == [
        ((1, 2, 2), 1),
        ((2, 1, 5), 1),
    ]
    written = await collections.history(output, 4)
    for time in range(4):
        expected = canonical(evaluate(plan, {values: contents_at(history, time)}))
        assert canonical(contents_at(written, time)) == expected, f"output at {time}"
    await compute.drop_view(dataflow_id)
