"""The compute controller following a real catalog process (on real oracle and storage
processes, etcd and an S3 endpoint), through a restart of the catalog, with a host that records
what it is asked to run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from services.compute.controller import CatalogController, ControllerRetry
from services.compute.spec import DataflowSpec
from tests.integration.test_catalog_service import PATIENT, Deployment, latest
from tests.support.compute_catalog import (
    AB,
    RecordingHost,
    index,
    inputs,
    materialized_view,
    table_plan,
)
from tests.support.etcd import EtcdServer
from tests.support.s3 import S3Server
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.plan import builders as pb

WAIT = 30.0


@pytest.fixture
def deployment(etcd_server: EtcdServer, s3_server: S3Server) -> Iterator[Deployment]:
    made = Deployment(etcd_server, s3_server)
    yield made
    made.stop()


@pytest.fixture
async def oracle(deployment: Deployment) -> AsyncIterator[OracleClient]:
    client = OracleClient(deployment.oracle.address)
    yield client
    await client.close()


async def test_controller_follows_a_catalog_process_through_a_restart(
    deployment: Deployment, oracle: OracleClient
) -> None:
    process = deployment.start_catalog()
    catalog = CatalogClient(process.address, retry=PATIENT, timeout=30.0)
    host = RecordingHost()
    controller = CatalogController(
        cluster_name="default",
        catalog=catalog,
        host=host,
        start_time=lambda: oracle.read_ts(deployment.timeline),
        retry=ControllerRetry(initial_backoff=0.05, max_backoff=0.5),
    )
    task = asyncio.create_task(controller.run())
    timeline = deployment.timeline
    try:
        first = await latest(catalog, oracle, timeline)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        mv = materialized_view(first, "mv", table_plan(t.id), AB, default_id, [t.id])
        by_a = index(first, "mv_by_a", mv, ["a"], default_id)
        await catalog.compare_and_append(first.upper, first.time + 1, first.updates())
        await controller.wait_applied(first.time, WAIT)
        assert controller.cluster_id == default_id
        assert host.dataflows == {
            mv.id: DataflowSpec(
                mv.id, table_plan(t.id), inputs(t.id), output_collection_id=mv.id, from_catalog=True
            ),
            by_a.id: DataflowSpec(
                by_a.id,
                pb.plan(pb.get(mv.id, AB), AB),
                inputs(mv.id),
                index_key_columns=(0,),
                from_catalog=True,
            ),
        }

        # The catalog process dies and comes back on its port; the controller resubscribes.
        port = process.port
        process.kill()
        process = deployment.start_catalog(port=port)
        second = await latest(catalog, oracle, timeline)
        second.drop(by_a)
        by_b = index(second, "t_by_b", t, ["b"], default_id)
        await catalog.compare_and_append(second.upper, second.time + 1, second.updates())
        assert await controller.wait_applied(second.time, WAIT) > second.time
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await catalog.close()

    assert set(host.dataflows) == {mv.id, by_b.id}
    assert host.dataflows[by_b.id].index_key_columns == (1,)
    assert sorted(host.events[:2]) == sorted([("install", mv.id), ("install", by_a.id)])
    assert host.events[2:] == [("drop", by_a.id), ("install", by_b.id)]
