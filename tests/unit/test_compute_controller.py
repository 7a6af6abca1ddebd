"""The compute controller against a real catalog served over gRPC in this process (in-memory
log, fake oracle), with a host that records what it is asked to run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from structlog.testing import capture_logs

from services.catalog.catalog import Catalog, CatalogSettings
from services.catalog.log import MemoryCatalogLog
from services.catalog.service import catalog_service
from services.compute.controller import CatalogController, ControllerRetry
from services.compute.spec import DataflowSpec
from tests.support.catalog_items import Draft, int_columns
from tests.support.compute_catalog import (
    AB,
    RecordingHost,
    cluster,
    copy_of,
    index,
    inputs,
    materialized_view,
    table_plan,
    view,
)
from tidemark.clients.catalog import CatalogClient
from tidemark.errors import DeadlineExceeded
from tidemark.plan import builders as pb
from tidemark.rpc import Server
from tidemark.v1 import plan_pb2

TIMELINE = "catalog"
FAST = ControllerRetry(initial_backoff=0.01, max_backoff=0.05)
WAIT = 10.0
ABCD = int_columns("a", "b", "c", "d")


class FakeOracle:
    """Read and write timestamps of one timeline, in memory."""

    def __init__(self) -> None:
        self.read = 0
        self.write = 1000

    async def read_ts(self, timeline: str) -> int:
        return self.read

    async def write_ts(self, timeline: str) -> int:
        self.write += 1
        return self.write

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        self.read = max(self.read, timestamp)
        self.write = max(self.write, timestamp)


class LocalCatalog:
    """A catalog served on a local port that can be stopped and started again on the same
    port and log, like a restarted catalog process."""

    def __init__(self) -> None:
        self.log = MemoryCatalogLog()
        self.oracle = FakeOracle()
        self.port = 0
        self.catalog: Catalog | None = None
        self.server: Server | None = None

    async def open(self, history_ms: int = 3_600_000) -> Catalog:
        settings = CatalogSettings(
            timeline=TIMELINE, history_ms=history_ms, maintenance_seconds=3600
        )
        self.catalog = Catalog(self.log, self.oracle, settings)
        await self.catalog.start()
        return self.catalog

    async def serve(self) -> None:
        assert self.catalog is not None
        self.server = Server([catalog_service(self.catalog)], f"127.0.0.1:{self.port}", grace=0)
        self.port = await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
        if self.catalog is not None:
            await self.catalog.close()
        self.server = self.catalog = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
async def local_catalog() -> AsyncIterator[LocalCatalog]:
    made = LocalCatalog()
    await made.open()
    await made.serve()
    yield made
    await made.stop()


@pytest.fixture
async def client(local_catalog: LocalCatalog) -> AsyncIterator[CatalogClient]:
    made = CatalogClient(local_catalog.address)
    yield made
    await made.close()


async def draft(client: CatalogClient, oracle: FakeOracle) -> Draft:
    snapshot = await client.snapshot_at(oracle.read)
    return Draft(snapshot.items, await oracle.write_ts(TIMELINE), snapshot.upper)


async def commit(client: CatalogClient, change: Draft) -> int:
    """Append the draft; returns its catalog time."""
    await client.compare_and_append(change.upper, change.time + 1, change.updates())
    return change.time


@contextlib.asynccontextmanager
async def running(controller: CatalogController) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(controller.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def join_plan(left: str, right: str) -> plan_pb2.Plan:
    """``left(a, b) JOIN right(a, b) ON left.a = right.a``: columns a, b, c, d."""
    return pb.plan(pb.join(pb.get(left, AB), pb.get(right, AB), [0], [0]), ABCD)


def controller_for(
    oracle: FakeOracle, client: CatalogClient, host: RecordingHost, cluster_name: str = "default"
) -> CatalogController:
    return CatalogController(
        cluster_name=cluster_name,
        catalog=client,
        host=host,
        start_time=lambda: oracle.read_ts(TIMELINE),
        retry=FAST,
    )


async def test_materialized_views_and_indexes_of_this_cluster_run_with_their_specs(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    # Some items exist before the controller starts (they arrive in its snapshot) ...
    before = await draft(client, oracle)
    default_id = before.by_name("default", "cluster").id
    t1, t2 = before.table("t1"), before.table("t2")
    mv = materialized_view(before, "mv", join_plan(t1.id, t2.id), ABCD, default_id, [t1.id, t2.id])
    on_table = index(before, "t1_by_b", t1, ["b"], default_id)
    other = cluster(before, "other")
    elsewhere = materialized_view(before, "mv_other", table_plan(t2.id), AB, other.id, [t2.id])
    index(before, "t2_elsewhere", t2, ["a"], other.id)
    await commit(client, before)
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        await controller.wait_applied(before.time, WAIT)
        assert controller.cluster_id == default_id
        # ... and some are created while it runs (they arrive as changes).
        after = await draft(client, oracle)
        v = view(after, "v", join_plan(t1.id, t2.id), ABCD, [t1.id, t2.id])
        on_view = index(after, "v_by_d_a", v, ["d", "a"], default_id)
        on_mv = index(after, "mv_by_c", mv, ["c"], default_id)
        index(after, "mv_elsewhere", elsewhere, ["b"], other.id)
        applied = await controller.wait_applied(await commit(client, after), WAIT)
        assert applied > after.time

    expected = {
        mv.id: DataflowSpec(
            mv.id,
            join_plan(t1.id, t2.id),
            inputs(t1.id, t2.id),
            output_collection_id=mv.id,
            from_catalog=True,
        ),
        on_table.id: DataflowSpec(
            on_table.id, table_plan(t1.id), inputs(t1.id), index_key_columns=(1,), from_catalog=True
        ),
        on_view.id: DataflowSpec(
            on_view.id,
            join_plan(t1.id, t2.id),
            inputs(t1.id, t2.id),
            index_key_columns=(3, 0),
            from_catalog=True,
        ),
        on_mv.id: DataflowSpec(
            on_mv.id,
            pb.plan(pb.get(mv.id, ABCD), ABCD),
            inputs(mv.id),
            index_key_columns=(2,),
            from_catalog=True,
        ),
    }
    assert host.dataflows == expected
    assert controller.installed() == expected
    assert sorted(host.events) == sorted(("install", i) for i in expected)
    assert controller.failures() == {}


async def test_dropped_items_are_dropped_and_changed_ones_reinstalled(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        first = await draft(client, oracle)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        by_a = index(first, "t_by_a", t, ["a"], default_id)
        doomed = index(first, "t_by_b", t, ["b"], default_id)
        mv = materialized_view(first, "mv", table_plan(t.id), AB, default_id, [t.id])
        await controller.wait_applied(await commit(client, first), WAIT)
        assert set(host.dataflows) == {by_a.id, doomed.id, mv.id}
        host.events.clear()

        second = await draft(client, oracle)
        second.drop(doomed)
        rekeyed = copy_of(by_a)
        rekeyed.index.key_columns[:] = ["b", "a"]
        second.replace(by_a, rekeyed)
        # A rename changes the item but not the dataflow: it keeps running.
        renamed = copy_of(mv)
        renamed.name.item = "mv_renamed"
        second.replace(mv, renamed)
        await controller.wait_applied(await commit(client, second), WAIT)

    assert host.events == [("drop", by_a.id), ("drop", doomed.id), ("install", by_a.id)]
    assert host.dataflows[by_a.id].index_key_columns == (1, 0)
    assert set(controller.installed()) == {by_a.id, mv.id}


async def test_a_cluster_runs_nothing_until_it_exists_and_everything_stops_when_dropped(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host, cluster_name="analytics")
    async with running(controller):
        first = await draft(client, oracle)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        index(first, "t_on_default", t, ["a"], default_id)
        await controller.wait_applied(await commit(client, first), WAIT)
        assert controller.cluster_id is None
        assert host.events == [] and controller.installed() == {}

        second = await draft(client, oracle)
        analytics = cluster(second, "analytics")
        mv = materialized_view(second, "mv", table_plan(t.id), AB, analytics.id, [t.id])
        by_b = index(second, "mv_by_b", mv, ["b"], analytics.id)
        await controller.wait_applied(await commit(client, second), WAIT)
        assert controller.cluster_id == analytics.id
        assert set(host.dataflows) == {mv.id, by_b.id}

        third = await draft(client, oracle)
        for item in (by_b, mv, analytics):
            third.drop(item)
        await controller.wait_applied(await commit(client, third), WAIT)
        assert controller.cluster_id is None

    assert sorted(host.events) == sorted(
        [("install", by_b.id), ("install", mv.id), ("drop", by_b.id), ("drop", mv.id)]
    )
    assert host.dataflows == {} and controller.installed() == {}


async def test_wait_applied_waits_for_the_catalog_and_times_out_naming_the_times(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    controller = controller_for(local_catalog.oracle, client, RecordingHost())
    with pytest.raises(DeadlineExceeded, match=r"below time 0, not yet catalog time 5 "):
        await controller.wait_applied(5, 0.05)
    async with running(controller):
        current = await controller.wait_applied(oracle.read, WAIT)
        assert current == oracle.read + 1
        change = await draft(client, oracle)
        change.table("t")
        waiter = asyncio.create_task(controller.wait_applied(change.time, WAIT))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await commit(client, change)
        assert await waiter == change.time + 1
        assert controller.applied_upper == change.time + 1
        with pytest.raises(DeadlineExceeded) as raised:
            await controller.wait_applied(change.time + 50, 0.1)
        assert f"below time {change.time + 1}" in raised.value.message
        assert f"catalog time {change.time + 50}" in raised.value.message


async def test_items_that_cannot_run_are_reported_and_the_rest_keep_running(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    with capture_logs() as logs:
        async with running(controller):
            first = await draft(client, oracle)
            default_id = first.by_name("default", "cluster").id
            t = first.table("t")
            bad_key = index(first, "t_by_z", t, ["a", "z"], default_id)
            bad_plan = materialized_view(first, "broken", b"plan", AB, default_id, [t.id])
            good = index(first, "t_by_a", t, ["a"], default_id)
            await controller.wait_applied(await commit(client, first), WAIT)
            second = await draft(client, oracle)
            later = index(second, "t_by_b", t, ["b"], default_id)
            await controller.wait_applied(await commit(client, second), WAIT)

    assert set(host.dataflows) == {good.id, later.id}
    failures = controller.failures()
    assert set(failures) == {bad_key.id, bad_plan.id}
    assert "has no column 'z'" in failures[bad_key.id] and "t_by_z" in failures[bad_key.id]
    assert "stored plan does not parse" in failures[bad_plan.id]
    reported = [log for log in logs if log["event"] == "compute_catalog_item_invalid"]
    # Reported once each, not at every catalog change.
    assert sorted(log["item_id"] for log in reported) == sorted([bad_key.id, bad_plan.id])
    assert all(log["log_level"] == "error" for log in reported)


async def test_failed_installs_are_retried_without_holding_back_the_applied_frontier(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        change = await draft(client, oracle)
        default_id = change.by_name("default", "cluster").id
        t = change.table("t")
        flaky = index(change, "t_by_a", t, ["a"], default_id)
        steady = index(change, "t_by_b", t, ["b"], default_id)
        host.failing.add(flaky.id)
        await controller.wait_applied(await commit(client, change), WAIT)
        assert set(host.dataflows) == {steady.id}
        assert "storage is down" in controller.failures()[flaky.id]
        await eventually(lambda: host.attempts[flaky.id] >= 3, "install retried")
        host.failing.clear()
        await eventually(lambda: flaky.id in host.dataflows, "install succeeded")
        assert controller.failures() == {}
        assert set(controller.installed()) == {flaky.id, steady.id}
    assert host.events.count(("install", flaky.id)) == 1


async def test_failed_drops_are_retried_and_forgotten_when_the_item_comes_back(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        first = await draft(client, oracle)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        by_a = index(first, "t_by_a", t, ["a"], default_id)
        by_b = index(first, "t_by_b", t, ["b"], default_id)
        await controller.wait_applied(await commit(client, first), WAIT)
        host.failing_drops.update({by_a.id, by_b.id})

        second = await draft(client, oracle)
        second.drop(by_a)
        rekeyed = copy_of(by_b)
        rekeyed.index.key_columns[:] = ["a"]
        second.replace(by_b, rekeyed)
        await controller.wait_applied(await commit(client, second), WAIT)
        assert set(controller.installed()) == {by_a.id, by_b.id}
        assert "drop failed: cannot release" in controller.failures()[by_a.id]
        # The index comes back as it was: its failed drop is moot.
        third = await draft(client, oracle)
        third.replace(rekeyed, by_b)
        await controller.wait_applied(await commit(client, third), WAIT)
        assert set(controller.failures()) == {by_a.id}
        await eventually(lambda: host.attempts_to_drop[by_a.id] >= 3, "drop retried")
        host.failing_drops.clear()
        await eventually(lambda: by_a.id not in controller.installed(), "drop succeeded")
        assert controller.failures() == {}

    assert host.dataflows[by_b.id].index_key_columns == (1,)
    assert host.events.count(("install", by_b.id)) == 1
    assert host.events[-1] == ("drop", by_a.id)


async def test_a_catalog_restart_is_ridden_out_without_installing_anything_twice(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        first = await draft(client, oracle)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        mv = materialized_view(first, "mv", table_plan(t.id), AB, default_id, [t.id])
        by_a = index(first, "t_by_a", t, ["a"], default_id)
        await controller.wait_applied(await commit(client, first), WAIT)
        applied = controller.applied_upper

        await local_catalog.stop()
        await asyncio.sleep(0.1)  # the subscription fails and is retried meanwhile
        assert controller.applied_upper == applied
        await local_catalog.open()
        await local_catalog.serve()

        second = await draft(client, oracle)
        by_b = index(second, "t_by_b", t, ["b"], default_id)
        second.drop(by_a)
        await controller.wait_applied(await commit(client, second), WAIT)

    assert sorted(host.events[:2]) == sorted([("install", by_a.id), ("install", mv.id)])
    assert host.events[2:] == [("drop", by_a.id), ("install", by_b.id)]
    assert set(controller.installed()) == {mv.id, by_b.id}


async def test_a_resume_point_compacted_away_starts_over_at_the_current_time(
    local_catalog: LocalCatalog, client: CatalogClient
) -> None:
    oracle = local_catalog.oracle
    host = RecordingHost()
    controller = controller_for(local_catalog.oracle, client, host)
    async with running(controller):
        first = await draft(client, oracle)
        default_id = first.by_name("default", "cluster").id
        t = first.table("t")
        kept = index(first, "t_by_a", t, ["a"], default_id)
        gone = index(first, "t_by_b", t, ["b"], default_id)
        await controller.wait_applied(await commit(client, first), WAIT)

        # While the catalog is away it changes, and forgets the history the controller
        # would resume from.
        await local_catalog.stop()
        catalog = await local_catalog.open(history_ms=0)
        snapshot = await catalog.snapshot_at(oracle.read)
        second = Draft([row.item for row in snapshot.rows], await oracle.write_ts(TIMELINE))
        second.drop(gone)
        new = index(second, "t_by_ab", t, ["a", "b"], default_id)
        await catalog.compare_and_append(snapshot.upper, second.time + 1, second.updates())
        await catalog.maintain()
        assert catalog.history.since == second.time > first.time
        with capture_logs() as logs:
            await local_catalog.serve()
            await controller.wait_applied(second.time, WAIT)

    assert any(log["event"] == "compute_catalog_resume_failed" for log in logs)
    assert set(host.dataflows) == {kept.id, new.id}
    assert sorted(host.events[:2]) == sorted([("install", kept.id), ("install", gone.id)])
    assert host.events[2:] == [("drop", gone.id), ("install", new.id)]
