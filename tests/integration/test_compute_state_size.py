"""Each dataflow's state size through the public Status call (a compute process on the
in-process engine, with storage): it grows as rows are inserted and shrinks as they are
deleted, and the ``dataflow_state`` log line follows it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.compute import Collections, Stack, eventually, running_stack
from tidemark.clients.compute import ComputeClient, DataflowInfo
from tidemark.clients.storage import StorageClient
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb

KV = RelationSchema.of(("k", T.INT64), ("v", T.INT64))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("state-size"), engine="local") as running:
        yield running


async def test_state_size_grows_with_inserts_and_shrinks_with_deletes(stack: Stack) -> None:
    async with (
        StorageClient(stack.storage.address) as storage,
        ComputeClient(stack.compute().address, timeout=60.0) as compute,
    ):
        collections = Collections(storage)
        source = await collections.create(KV)
        await collections.append(source, [((1, 1), 0, 1)], 1)
        # MIN/MAX keep each group's values; the top-3 per group keeps each group's rows.
        values = pb.get(source, KV)
        plan = pb.plan(
            pb.union(
                pb.reduce(values, [0], [pb.aggregate("min", 1), pb.aggregate("max", 1)]),
                pb.project(pb.top_k(values, [0], [1], limit=3), 0, 1, 1),
            )
        )
        dataflow_id = Collections.new_id()
        await compute.maintain_view(
            dataflow_id, plan, [await collections.read_capability(source)], index_key_columns=[0]
        )

        async def at(upper: int) -> DataflowInfo:
            info = (await compute.status()).dataflow(dataflow_id)
            assert info is not None and info.state == "running", info
            assert info.upper.elements == (upper,), info
            return info

        small = await eventually(lambda: at(1), 60)
        # One group, one row: MIN/MAX keep the value once each, top-k keeps the row.
        assert (small.arrangement_keys, small.state_rows) == (2, 4)
        assert small.state_bytes > 0

        inserts = [((k % 4, k), 1, 1) for k in range(2, 400)]
        await collections.append(source, inserts, 2)
        large = await eventually(lambda: at(2), 60)
        # Four groups; 399 distinct values held twice by MIN/MAX (once per aggregate) and the
        # 399 rows held by top-k.
        assert large.arrangement_keys == 8
        assert large.state_rows == 4 + 2 * 399 + 399
        assert large.state_bytes > 100 * small.state_bytes

        deletes = [(row, 2, -1) for row, _, _ in inserts if row[1] >= 40]
        await collections.append(source, deletes, 3)
        shrunk = await eventually(lambda: at(3), 60)
        assert shrunk.arrangement_keys == 8
        assert shrunk.state_rows == 4 + 3 * 39
        assert small.state_bytes < shrunk.state_bytes < large.state_bytes / 5

        at_1 = (await compute.peek(dataflow_id, 1)).rows
        assert ((0, 4, 396), 1) in at_1 and ((0, 4, 4), 1) in at_1
        at_2 = (await compute.peek(dataflow_id, 2)).rows
        assert ((0, 4, 36), 1) in at_2 and ((0, 12, 12), 1) in at_2
