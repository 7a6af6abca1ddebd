"""The catalog as real processes: oracle and storage on real etcd and an S3 endpoint, catalog
processes on top, driven over gRPC (and, for the anomaly, by clients in their own processes)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

import grpc
import pytest

from tests.support.catalog_items import Draft
from tests.support.etcd import EtcdServer
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server, unique_bucket
from tests.support.service_process import REPO_ROOT, ServiceProcess
from tidemark.clients.catalog import (
    UPPER_METADATA_KEY,
    CatalogClient,
    CatalogProgress,
    CatalogUpperMismatch,
)
from tidemark.clients.oracle import OracleClient
from tidemark.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
)
from tidemark.retry import RetryPolicy
from tidemark.v1 import catalog_pb2

S3_ENV = {"TIDEMARK_S3_ACCESS_KEY": ACCESS_KEY, "TIDEMARK_S3_SECRET_KEY": SECRET_KEY}
PATIENT = RetryPolicy(total_seconds=20.0, initial_backoff=0.05, max_backoff=0.5)


class Deployment:
    """Oracle, storage and catalog processes of one test, on its own key prefix, bucket and
    catalog timeline."""

    def __init__(self, etcd: EtcdServer, s3: S3Server) -> None:
        self.etcd_url = etcd.url
        self.blob_url = s3.url(unique_bucket("catalog"))
        self.prefix = f"test/{uuid.uuid4().hex}/storage/"
        self.timeline = f"catalog-{uuid.uuid4().hex[:12]}"
        self.oracle = ServiceProcess(
            "services.oracle", ["--listen", "127.0.0.1:0", "--consensus-url", self.etcd_url]
        )
        self.storage = self.start_storage()
        self.catalogs: list[ServiceProcess] = []

    def start_storage(self, port: int = 0) -> ServiceProcess:
        return ServiceProcess(
            "services.storage",
            [
                "--listen",
                f"127.0.0.1:{port}",
                "--consensus-url",
                self.etcd_url,
                "--blob-url",
                self.blob_url,
                "--key-prefix",
                self.prefix,
                "--maintenance-interval",
                "0.5",
            ],
            env=S3_ENV,
        )

    def start_catalog(self, *extra: str, port: int = 0) -> ServiceProcess:
        process = ServiceProcess(
            "services.catalog",
            [
                "--listen",
                f"127.0.0.1:{port}",
                "--storage",
                self.storage.address,
                "--oracle",
                self.oracle.address,
                "--timeline",
                self.timeline,
                *extra,
            ],
        )
        self.catalogs.append(process)
        return process

    def stop(self) -> None:
        for process in [*self.catalogs, self.storage, self.oracle]:
            process.kill()


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


async def append(catalog: CatalogClient, draft: Draft) -> int:
    """Append the draft's updates; returns the new upper."""
    return await catalog.compare_and_append(draft.upper, draft.time + 1, draft.updates())


async def latest(catalog: CatalogClient, oracle: OracleClient, timeline: str) -> Draft:
    """A draft at a fresh write timestamp from the snapshot at the current read timestamp."""
    snapshot = await catalog.snapshot_at(await oracle.read_ts(timeline))
    return Draft(snapshot.items, await oracle.write_ts(timeline), snapshot.upper)


def table_names(items: Sequence[catalog_pb2.CatalogItem]) -> set[str]:
    return {item.name.item for item in items if item.WhichOneof("body") == "table"}


async def test_racing_writers_one_wins_the_loser_retries_and_rejections_change_nothing(
    deployment: Deployment, oracle: OracleClient
) -> None:
    # No history kept beyond the current contents: since follows the upper closely.
    process = deployment.start_catalog("--history-seconds", "0", "--maintenance-interval", "0.1")
    catalog = CatalogClient(process.address)
    timeline = deployment.timeline
    try:
        snapshot = await catalog.snapshot_at(await oracle.read_ts(timeline))
        assert {i.WhichOneof("body") for i in snapshot.items} == {
            "database",
            "schema",
            "cluster",
            "id_allocator",
        }
        drafts = []
        for name in ("left", "right"):
            draft = Draft(snapshot.items, await oracle.write_ts(timeline))
            draft.table(name)
            drafts.append(draft)
        outcomes = await asyncio.gather(
            *(catalog.compare_and_append(snapshot.upper, d.time + 1, d.updates()) for d in drafts),
            return_exceptions=True,
        )
        won = [o for o in outcomes if isinstance(o, int)]
        lost = [o for o in outcomes if isinstance(o, CatalogUpperMismatch)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert lost[0].current_upper == won[0]
        # The current upper also travels as trailing metadata, for clients in any language.
        cause = lost[0].__cause__
        while cause is not None and not isinstance(cause, grpc.aio.AioRpcError):
            cause = cause.__cause__
        assert isinstance(cause, grpc.aio.AioRpcError)
        # grpc.aio hands back (key, value) pairs; grpc-stubs describes the sync API's type.
        trailing = [tuple(pair) for pair in cast(Any, cause.trailing_metadata() or ())]
        assert (UPPER_METADATA_KEY, str(won[0])) in trailing

        # The loser re-reads at the upper it was told and retries at a new timestamp.
        loser_name = "right" if won[0] == drafts[0].time + 1 else "left"
        retry_base = await catalog.snapshot_at(lost[0].current_upper - 1)
        retry = Draft(retry_base.items, await oracle.write_ts(timeline))
        retry.table(loser_name)
        upper = await catalog.compare_and_append(retry_base.upper, retry.time + 1, retry.updates())
        final = await catalog.snapshot_at(await oracle.read_ts(timeline))
        assert table_names(final.items) == {"left", "right"}
        assert final.upper == upper

        # Rejected appends leave no trace, and say why.
        again = Draft(final.items, await oracle.write_ts(timeline))
        again.table("left")
        with pytest.raises(AlreadyExists, match="already exists"):
            await catalog.compare_and_append(final.upper, again.time + 1, again.updates())
        with pytest.raises(InvalidArgument, match="must be greater"):
            await catalog.compare_and_append(final.upper, final.upper, [])
        cluster = next(i for i in final.items if i.WhichOneof("body") == "cluster")
        early_drop = [catalog_pb2.CatalogUpdate(item=cluster, time=final.upper - 1, diff=-1)]
        with pytest.raises(InvalidArgument, match="lies outside"):
            await catalog.compare_and_append(final.upper, final.upper + 1, early_drop)
        unchanged = await catalog.snapshot_at(await oracle.read_ts(timeline))
        assert unchanged.upper == final.upper
        assert sorted(i.SerializeToString(deterministic=True) for i in unchanged.items) == sorted(
            i.SerializeToString(deterministic=True) for i in final.items
        )
        for _ in range(100):
            try:
                await catalog.snapshot_at(final.upper - 2)
            except FailedPrecondition as exc:
                assert "before the catalog's since" in exc.message
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the catalog's since never advanced")
        assert (await catalog.snapshot_at(final.upper - 1)).since == final.upper - 1
        with pytest.raises(DeadlineExceeded):
            await catalog.snapshot_at(final.upper + 60_000, timeout=0.3)
    finally:
        await catalog.close()


def run_client(action: str, catalog: str, oracle: str, timeline: str, name: str) -> dict[str, Any]:
    """One ``tests.support.catalog_ddl`` run in its own OS process."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.catalog_ddl",
            action,
            "--catalog",
            catalog,
            "--oracle",
            oracle,
            "--timeline",
            timeline,
            "--name",
            name,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


async def test_acknowledged_ddl_is_seen_by_the_next_reader_in_another_process(
    deployment: Deployment,
) -> None:
    """Seed 004's first anomaly: client 1 creates a table and is acknowledged; client 2, in
    another process, then takes ReadTs("catalog") and must find the table in SnapshotAt.
    With two catalog processes the reader's catalog may only learn of the table by following
    storage, so each round writes through one and reads through the other."""
    first = deployment.start_catalog().address
    second = deployment.start_catalog().address
    oracle, timeline = deployment.oracle.address, deployment.timeline
    for round_ in range(4):
        writer, reader = (first, second) if round_ % 2 == 0 else (second, first)
        name = f"t{round_}"
        created = await asyncio.to_thread(run_client, "create", writer, oracle, timeline, name)
        seen = await asyncio.to_thread(run_client, "find", reader, oracle, timeline, name)
        assert seen["found"], (round_, created, seen)
        assert seen["read_ts"] >= created["time"]


async def test_subscription_contents_equal_snapshots_at_every_reported_time(
    deployment: Deployment, oracle: OracleClient
) -> None:
    catalog = CatalogClient(deployment.start_catalog().address)
    timeline = deployment.timeline
    try:
        start = await oracle.read_ts(timeline)
        reports: list[tuple[dict[bytes, int], int]] = []

        async def follow() -> None:
            contents: dict[bytes, int] = {}
            progress: CatalogProgress
            async for progress in catalog.subscribe_at(start):
                for change in progress.changes:
                    data = change.item.SerializeToString(deterministic=True)
                    contents[data] = contents.get(data, 0) + change.diff
                    if contents[data] == 0:
                        del contents[data]
                reports.append((dict(contents), progress.frontier))

        follower = asyncio.create_task(follow())
        draft = await latest(catalog, oracle, timeline)
        a = draft.table("a")
        draft.view("va", [a.id])
        await append(catalog, draft)
        draft = await latest(catalog, oracle, timeline)
        draft.table("b")
        await append(catalog, draft)
        draft = await latest(catalog, oracle, timeline)
        draft.drop(draft.by_name("va", "view"))
        renamed = catalog_pb2.CatalogItem()
        renamed.CopyFrom(draft.by_name("a", "table"))
        renamed.name.item = "a2"
        draft.replace(draft.by_name("a", "table"), renamed)
        last = await append(catalog, draft)
        for _ in range(200):
            if reports and reports[-1][1] >= last:
                break
            await asyncio.sleep(0.05)
        follower.cancel()
        assert len(reports) >= 2
        assert reports[-1][1] == last
        for contents, frontier in reports:
            snapshot = await catalog.snapshot_at(frontier - 1)
            expected = {i.SerializeToString(deterministic=True): 1 for i in snapshot.items}
            assert contents == expected, frontier
        final_names = {catalog_pb2.CatalogItem.FromString(d).name.item for d in reports[-1][0]}
        assert {"a2", "b"} <= final_names and not {"a", "va"} & final_names
    finally:
        await catalog.close()


@pytest.mark.slow
async def test_restarts_of_catalog_and_storage_lose_nothing_acknowledged(
    deployment: Deployment, oracle: OracleClient
) -> None:
    timeline = deployment.timeline
    catalog_process = deployment.start_catalog()
    port = catalog_process.port
    catalog = CatalogClient(catalog_process.address, retry=PATIENT, timeout=30.0)
    acknowledged: set[str] = set()

    async def create(name: str) -> None:
        while True:
            draft = await latest(catalog, oracle, timeline)
            draft.table(name)
            try:
                await append(catalog, draft)
            except CatalogUpperMismatch:
                continue
            acknowledged.add(name)
            return

    async def check() -> None:
        snapshot = await catalog.snapshot_at(await oracle.read_ts(timeline))
        assert acknowledged <= table_names(snapshot.items)

    try:
        for n in range(3):
            await create(f"before{n}")
        # The catalog crashes and comes back on the same port.
        catalog_process.kill()
        catalog_process = deployment.start_catalog(port=port)
        await check()
        await create("after_catalog_crash")
        # Storage crashes and comes back: the catalog keeps serving, its follower and its
        # appends reconnect.
        storage_port = deployment.storage.port
        deployment.storage.kill()
        deployment.storage = deployment.start_storage(port=storage_port)
        await create("after_storage_crash")
        await check()
        # Both go down; the catalog comes back first and waits for storage.
        catalog_process.kill()
        deployment.storage.kill()
        deployment.storage = deployment.start_storage(port=storage_port)
        catalog_process = deployment.start_catalog(port=port)
        await check()
        await create("after_both")
        await check()
        assert len(acknowledged) == 6
    finally:
        await catalog.close()
