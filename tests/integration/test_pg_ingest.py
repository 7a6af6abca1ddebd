"""A PostgreSQL source through the binding protocol (tidemark/sources/ingest.py) with a real
storage service, oracle and PostgreSQL: when the process dies after a batch's binding is
committed but before its data reached every subsource, a new process's PostgresReader
derives exactly that batch again (the initial snapshot, or a stretch of the stream) and the
subsources end equal to the upstream tables, nothing lost or doubled."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from tests.integration.test_source_ingest import (
    Crash,
    CrashingStorage,
    history,
    new_id,
    until,
)
from tests.integration.test_source_ingest import clients as clients
from tests.integration.test_source_ingest import services as services
from tests.support.postgres import DATABASE, PASSWORD, SUPERUSER, PostgresCluster
from tidemark.clients import storage as storage_client
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.columnar import Row, frontier_bound
from tidemark.sources.ingest import Ingestion, IngestTargets
from tidemark.sources.postgres import offsets
from tidemark.sources.postgres.reader import PostgresReader
from tidemark.sources.postgres.upstream import ConnectionParams, UpstreamTable, publication_tables
from tidemark.sources.progress import PROGRESS_SCHEMA

# ``services`` and ``clients`` (imported above) are the fixtures of the binding protocol's own
# tests: a storage service, an oracle, and a storage client that can fail chosen appends.
pytestmark = pytest.mark.postgres

TIMELINE = "data"


def params(pg: PostgresCluster) -> ConnectionParams:
    return ConnectionParams(pg.host, pg.port, SUPERUSER, PASSWORD, DATABASE)


async def make_targets(storage: StorageClient, tables: list[UpstreamTable]) -> IngestTargets:
    progress = new_id()
    pair = await storage.create(progress, PROGRESS_SCHEMA, holder="test")
    await storage.drop(pair.write)
    outputs = {}
    for table in tables:
        collection = new_id()
        pair = await storage.create(collection, table.schema, holder="test")
        await storage.drop(pair.write)
        outputs[table.key] = collection
    return IngestTargets(progress, outputs)


def ingestion(
    storage: StorageClient,
    oracle: OracleClient,
    targets: IngestTargets,
    pg: PostgresCluster,
    slot: str,
    tables: list[UpstreamTable],
) -> Ingestion:
    return Ingestion(
        name="pg-test",
        reader=PostgresReader(params(pg), "ing_pub", slot, tables),
        targets=targets,
        storage=storage,
        oracle=oracle,
        timeline=TIMELINE,
        holder="test-sources",
        advance_interval=0.05,
    )


async def contents(storage: StorageClient, collection: str) -> Counter[Row]:
    info = await storage.describe(collection)
    if frontier_bound(info.upper) == 0:
        return Counter()
    updates, _ = await history(storage, collection)
    counts: Counter[Row] = Counter()
    for row, _, diff in updates:
        counts[row] += diff
    return +counts


def upstream(pg: PostgresCluster, table: str) -> Counter[Row]:
    return Counter(tuple(r) for r in pg.query(f"SELECT id, v FROM {table}"))


async def wait_equal(
    storage: StorageClient, targets: IngestTargets, pg: PostgresCluster, tables: list[str]
) -> None:
    for _ in range(200):
        same = [
            await contents(storage, targets.outputs[f"public.{t}"]) == upstream(pg, t)
            for t in tables
        ]
        if all(same):
            return
        await asyncio.sleep(0.1)
    for t in tables:
        assert await contents(storage, targets.outputs[f"public.{t}"]) == upstream(pg, t)


@pytest.fixture
def tables(postgres: PostgresCluster) -> list[UpstreamTable]:
    postgres.execute(
        "DROP PUBLICATION IF EXISTS ing_pub",
        "DROP TABLE IF EXISTS ing_a, ing_b",
        "CREATE TABLE ing_a (id bigint, v text)",
        "CREATE TABLE ing_b (id bigint, v text)",
        "ALTER TABLE ing_a REPLICA IDENTITY FULL",
        "ALTER TABLE ing_b REPLICA IDENTITY FULL",
        "INSERT INTO ing_a SELECT g, 'a' || g FROM generate_series(1, 50) g",
        "INSERT INTO ing_b SELECT g, 'b' || g FROM generate_series(1, 30) g",
        "CREATE PUBLICATION ing_pub FOR TABLE ing_a, ing_b",
    )
    return publication_tables(params(postgres), "ing_pub", None)


async def test_a_crash_after_the_snapshot_binding_is_repaired_by_replay(
    clients: tuple[CrashingStorage, OracleClient],
    postgres: PostgresCluster,
    tables: list[UpstreamTable],
) -> None:
    storage, oracle = clients
    targets = await make_targets(storage, tables)
    # The snapshot's binding commits; its data does not reach ing_b.
    storage.victims.add(targets.outputs["public.ing_b"])
    first = ingestion(storage, oracle, targets, postgres, "ing_snap", tables)
    with pytest.raises(Crash):
        await asyncio.wait_for(first.run(), 30)
    await first.reader.close()  # as the sources runtime does after a failure
    # (ing_a's append ran concurrently: it may or may not have landed.)
    assert await contents(storage, targets.outputs["public.ing_b"]) == Counter()
    # Upstream moves on before the new process starts: the snapshot it rebuilds must still
    # be the one at the slot's consistent point, not today's tables.
    postgres.execute(
        "DELETE FROM ing_b WHERE id <= 10",
        "UPDATE ing_b SET v = v || '!' WHERE id > 25",
        "INSERT INTO ing_b VALUES (100, 'new'), (100, 'new')",
        "INSERT INTO ing_a VALUES (200, 'later')",
    )
    second = ingestion(storage, oracle, targets, postgres, "ing_snap", tables)
    task = asyncio.create_task(second.run())
    try:
        await until(lambda: second.stats.replayed >= 1)
        await wait_equal(storage, targets, postgres, ["ing_a", "ing_b"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await second.reader.close()
    assert second.stats.batches >= 1


async def test_a_crash_after_a_stream_binding_is_repaired_by_replay(
    clients: tuple[CrashingStorage, OracleClient],
    postgres: PostgresCluster,
    tables: list[UpstreamTable],
) -> None:
    storage, oracle = clients
    targets = await make_targets(storage, tables)
    first = ingestion(storage, oracle, targets, postgres, "ing_stream", tables)
    task = asyncio.create_task(first.run())
    await until(lambda: first.stats.batches == 1)  # the snapshot
    storage.victims.add(targets.outputs["public.ing_a"])
    postgres.execute(
        "BEGIN; UPDATE ing_a SET v = 'moved' WHERE id = 1; DELETE FROM ing_b WHERE id = 1; COMMIT",
        "INSERT INTO ing_a VALUES (51, 'x')",
    )
    with pytest.raises(Crash):
        await asyncio.wait_for(task, 30)
    await first.reader.close()
    postgres.execute("INSERT INTO ing_b VALUES (31, 'after')")
    second = ingestion(storage, oracle, targets, postgres, "ing_stream", tables)
    task = asyncio.create_task(second.run())
    try:
        await until(lambda: second.stats.replayed >= 1)
        await wait_equal(storage, targets, postgres, ["ing_a", "ing_b"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await second.reader.close()


class CrashOnAppend(CrashingStorage):
    """Fails the ``n``-th append with data to ``collection`` (once)."""

    def __init__(self, address: str, collection: str, n: int) -> None:
        super().__init__(address)
        self.collection = collection
        self.left = n

    async def append_ipc(self, capability: Any, data: Any, new_upper: Any, **kw: Any) -> Any:
        if capability.collection_id == self.collection and len(data) > 0:
            self.left -= 1
            if self.left == 0:
                raise Crash(self.collection)
        return await super().append_ipc(capability, data, new_upper, **kw)


async def test_a_crash_in_the_middle_of_a_snapshot_in_parts(
    clients: tuple[CrashingStorage, OracleClient],
    services: tuple[str, str],
    postgres: PostgresCluster,
    tables: list[UpstreamTable],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot too large for one append goes in parts; a process that dies after some of
    them resumes with the rest (cut from a rebuilt snapshot, the same way)."""
    monkeypatch.setattr(offsets, "SNAPSHOT_PART_BYTES", 400)
    storage, oracle = clients
    targets = await make_targets(storage, tables)
    crashing = CrashOnAppend(services[0], targets.outputs["public.ing_a"], 3)
    first = ingestion(crashing, oracle, targets, postgres, "ing_parts", tables)
    with pytest.raises(Crash):
        await asyncio.wait_for(first.run(), 30)
    await first.reader.close()
    await crashing.close()
    assert 0 < sum((await contents(storage, targets.outputs["public.ing_a"])).values()) < 50
    postgres.execute("DELETE FROM ing_a WHERE id > 40", "INSERT INTO ing_b VALUES (99, 'late')")
    second = ingestion(storage, oracle, targets, postgres, "ing_parts", tables)
    task = asyncio.create_task(second.run())
    try:
        await wait_equal(storage, targets, postgres, ["ing_a", "ing_b"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await second.reader.close()
    progress = await contents(storage, targets.progress)
    ((position, *_),) = progress
    assert position > 0


async def test_a_snapshot_larger_than_a_message_lands_whole_at_one_time(
    clients: tuple[CrashingStorage, OracleClient],
    postgres: PostgresCluster,
    tables: list[UpstreamTable],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch more than one append message carries goes as one chunked append: the whole
    snapshot of each table at the snapshot's one time."""
    monkeypatch.setattr(storage_client, "CHUNKED_FROM_BYTES", 600)
    monkeypatch.setattr(storage_client, "CHUNK_BYTES", 300)
    storage, oracle = clients
    targets = await make_targets(storage, tables)
    run = ingestion(storage, oracle, targets, postgres, "ing_chunked", tables)
    task = asyncio.create_task(run.run())
    try:
        await wait_equal(storage, targets, postgres, ["ing_a", "ing_b"])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await run.reader.close()
    for table, rows in (("ing_a", 50), ("ing_b", 30)):
        updates, _ = await history(storage, targets.outputs[f"public.{table}"])
        assert len(updates) == rows and len({time for _, time, _ in updates}) == 1
