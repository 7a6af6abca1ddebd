"""Two clusters: two compute processes (each its own Spark application) over one storage and
one catalog. Each follows the catalog through its controller; killing one leaves the other's
views serving and advancing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.compute import Collections, Stack, contents_at, eventually, running_stack
from tests.support.reference_eval import canonical, evaluate
from tidemark.clients.compute import ComputeClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import DeadlineExceeded, Unavailable
from tidemark.plan import builders as pb
from tidemark.plan import check_plan
from tidemark.retry import RetryPolicy
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

KV = RelationSchema.of(("k", T.INT64), ("v", T.INT64))
PATIENT_MS = 180_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("clusters")
    with running_stack(directory, clusters=("default", "b"), catalog=True) as running:
        yield running


async def test_each_cluster_follows_the_catalog(stack: Stack) -> None:
    default = ComputeClient(stack.compute("default").address, timeout=60.0)
    other = ComputeClient(stack.compute("b").address, timeout=60.0)
    for client in (default, other):
        applied = await client.advance_catalog_frontier(1, wait_ms=PATIENT_MS)
        assert applied > 1
        status = await client.status()
        assert status.catalog_applied_upper >= applied
        with pytest.raises(DeadlineExceeded):
            await client.advance_catalog_frontier(applied + 10**9, wait_ms=200)
    # The catalog made the cluster "default" when it was created; "b" has no cluster item.
    assert (await default.status()).cluster_id
    assert not (await other.status()).cluster_id

    storage = StorageClient(stack.storage.address)
    collections = Collections(storage)
    values = await collections.create(KV)
    plan = pb.plan(pb.project(pb.get(values, KV), 1))
    await default.maintain_view(
        "projected", plan, [await collections.read_capability(values)], index_key_columns=[0]
    )
    await collections.append(values, [((1, 2), 0, 1)], 1)
    applied = (await default.status()).catalog_applied_upper
    peeked = await default.peek("projected", 0, catalog_ts=applied - 1, wait_ms=PATIENT_MS)
    assert peeked.rows == [((2,), 1)]
    with pytest.raises(DeadlineExceeded):
        await default.peek("projected", 0, catalog_ts=applied + 10**9, wait_ms=200)
    info = (await default.status()).dataflow("projected")
    assert info is not None and not info.from_catalog
    await default.drop_view("projected")
    for client in (default, other):
        await client.close()
    await storage.close()


async def test_a_dead_cluster_leaves_the_other_serving(stack: Stack) -> None:
    storage = StorageClient(stack.storage.address)
    collections = Collections(storage)
    values = await collections.create(KV)
    by_key = pb.plan(
        pb.reduce(pb.get(values, KV), [0], [pb.aggregate("count"), pb.aggregate("max", 1)])
    )
    distinct_values = pb.plan(pb.distinct(pb.project(pb.get(values, KV), 1)))
    output = await collections.create(check_plan(distinct_values))
    a = ComputeClient(stack.compute("default").address, timeout=180.0)
    b = ComputeClient(stack.compute("b").address, timeout=180.0)

    await a.maintain_view(
        "by-key", by_key, [await collections.read_capability(values)], index_key_columns=[0]
    )
    await b.maintain_view(
        "by-key", by_key, [await collections.read_capability(values)], index_key_columns=[0]
    )
    await b.maintain_view(
        "distinct",
        distinct_values,
        [await collections.read_capability(values)],
        output=await collections.write_capability(output),
        index_key_columns=[0],
    )
    await collections.append(values, [((1, 5), 0, 1), ((2, 5), 1, 1), ((1, 7), 2, 1)], 3)

    def expected(plan: plan_pb2.Plan, time: int, history: list[Any]) -> dict[Any, int]:
        return canonical(evaluate(plan, {values: contents_at(history, time)}))

    history = await collections.history(values, 3)
    for client in (a, b):
        peeked = await client.peek("by-key", 2, wait_ms=PATIENT_MS)
        assert canonical(dict(peeked.rows)) == expected(by_key, 2, history)
    status_a, status_b = await a.status(), await b.status()
    assert (status_a.cluster, status_b.cluster) == ("default", "b")
    assert status_a.spark_application_id and status_b.spark_application_id
    assert status_a.spark_application_id != status_b.spark_application_id

    stack.kill_compute("default")
    await collections.append(values, [((2, 5), 3, -1), ((3, 1), 4, 1), ((1, 9), 5, 1)], 7)
    history = await collections.history(values, 7)
    for time in range(7):
        peeked = await b.peek("by-key", time, wait_ms=PATIENT_MS)
        assert canonical(dict(peeked.rows)) == expected(by_key, time, history)
        distinct = await b.peek("distinct", time)
        assert canonical(dict(distinct.rows)) == expected(distinct_values, time, history)

    async def written() -> None:
        assert (await storage.describe(output)).upper.elements == (7,)

    await eventually(written)
    out = await collections.history(output, 7)
    for time in range(7):
        assert canonical(contents_at(out, time)) == expected(distinct_values, time, history)
    info = (await b.status()).dataflow("by-key")
    assert info is not None and info.state == "running"
    assert info.upper.elements == (7,)

    impatient = ComputeClient(
        stack.compute("default").address, timeout=2.0, retry=RetryPolicy(total_seconds=1.0)
    )
    with pytest.raises(Unavailable):
        await impatient.status()
    for client in (impatient, a, b):
        await client.close()
    await storage.close()
