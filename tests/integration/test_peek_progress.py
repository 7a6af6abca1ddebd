"""Peeks that wait for dataflows still hydrating, against a real compute process (in-process
engine) and storage: compute's Status lists each such peek as waiting for that dataflow,
with the dataflow's hydration progress, until the hydration is done and the peek answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.support.compute import Collections, Stack, eventually, running_stack
from tidemark.clients.compute import ComputeClient, QueryInfo, one_shot
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb

KV = RelationSchema.of(("k", T.INT64), ("v", T.INT64))
AS_OF = 10
ROWS = [((k, k * 10), 1, 1) for k in range(5)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("peek-progress"), engine="local") as running:
        yield running


async def test_peeks_waiting_for_hydration_report_it(stack: Stack) -> None:
    async with (
        StorageClient(stack.storage.address) as storage,
        ComputeClient(stack.compute().address, timeout=60.0) as compute,
    ):
        collections = Collections(storage)
        source = await collections.create(KV)
        await collections.append(source, ROWS, 5)
        output = await collections.create(KV)
        plan = pb.plan(pb.get(source, KV))
        # Both start at AS_OF, which the input has not passed: they stay hydrating.
        index = Collections.new_id()
        await compute.maintain_view(
            index,
            plan,
            [await collections.read_capability(source)],
            index_key_columns=[0],
            as_of=AS_OF,
        )
        view = Collections.new_id()
        await compute.maintain_view(
            view,
            plan,
            [await collections.read_capability(source)],
            output=await collections.write_capability(output),
            as_of=AS_OF,
        )
        index_peek = asyncio.create_task(
            compute.peek(index, AS_OF, wait_ms=60_000, query_id="on-the-index")
        )
        view_peek = asyncio.create_task(
            compute.peek(
                one_shot(pb.plan(pb.get(output, KV)), [await collections.read_capability(output)]),
                AS_OF,
                wait_ms=60_000,
                query_id="on-the-view",
            )
        )

        async def waiting(query_id: str, dataflow_id: str) -> QueryInfo:
            query = await compute.query_progress(query_id)
            assert query is not None and query.state == "waiting", query
            assert query.waiting_for == [dataflow_id], query
            return query

        on_index = await eventually(lambda: waiting("on-the-index", index), 60)
        on_view = await eventually(lambda: waiting("on-the-view", view), 60)
        assert on_index.spark_job_group == on_view.spark_job_group == ""
        # The whole Status lists both, and the dataflows they wait for as hydrating, with the
        # same progress as the peeks report.
        status = await compute.status()
        assert {q.query_id for q in status.queries} >= {"on-the-index", "on-the-view"}
        for query_id, dataflow_id in (("on-the-index", index), ("on-the-view", view)):
            info = status.dataflow(dataflow_id)
            assert info is not None and info.state == "hydrating"
            assert info.hydration_rows_total == len(ROWS)
            query = await compute.query_progress(query_id)
            assert query is not None
            assert (query.rows_done, query.rows_total) == (
                info.hydrated_rows,
                info.hydration_rows_total,
            )
            assert (query.parts_done, query.parts_total) == (
                info.hydration_parts_done,
                info.hydration_parts_total,
            )
        # The input passes AS_OF: both hydrate, both peeks answer, and leave Status.
        await collections.advance(source, AS_OF + 1)
        expected = sorted(((row, 1) for row, _, _ in ROWS))
        assert sorted((await index_peek).rows) == expected
        assert sorted((await view_peek).rows) == expected
        assert await compute.query_progress("on-the-index") is None
        assert await compute.query_progress("on-the-view") is None
        await compute.drop_view(index)
        await compute.drop_view(view)
