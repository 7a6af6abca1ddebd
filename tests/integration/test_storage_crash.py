"""Crash safety: the storage process is killed with SIGKILL again and again while several
writers append. Every acknowledged append must be there exactly once, nothing else may be,
and the blobs of appends that died half-way must be deleted eventually."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.blob import open_blob
from tidemark.cdc import CdcReader
from tidemark.clients.storage import Capability, StorageClient
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.errors import FailedPrecondition, TidemarkError
from tidemark.lattice import U64
from tidemark.retry import RetryPolicy

SCHEMA = RelationSchema.of(("writer", ColumnType.TEXT), ("seq", ColumnType.INT64))
# Leases outlive a restart; garbage is collected within seconds.
SETTINGS = [*FAST_SETTINGS, "--lease-seconds", "15"]
PATIENT = RetryPolicy(total_seconds=30.0, initial_backoff=0.05, max_backoff=0.5)


@dataclass
class Writer:
    name: str
    collection_id: str
    capability: Capability
    acknowledged: list[tuple[tuple[str, int], int]] = field(default_factory=list)
    refused: int = 0


async def write_until(client: StorageClient, writer: Writer, stop: asyncio.Event) -> None:
    """Append one row at a time at the current upper. A refusal (another writer won that
    upper) is definite: move the capability up and try again with a new token. An unknown
    outcome is retried with the same token until it is known."""
    seq = 0
    upper = 0
    while not stop.is_set():
        row = (writer.name, seq)
        token = uuid.uuid4().hex
        while True:
            try:
                result = await client.append(
                    writer.capability, [(row, upper, 1)], upper + 1, token=token
                )
            except FailedPrecondition:
                writer.refused += 1
                current = (await client.describe(writer.collection_id)).upper.elements[0]
                writer.capability = await client.downgrade(writer.capability, current)
                upper = current
                break
            except TidemarkError:
                await asyncio.sleep(0.1)  # the service is down; same token once it is back
                continue
            writer.acknowledged.append((row, upper))
            upper = result.upper.elements[0]
            seq += 1
            break


@pytest.mark.slow
async def test_kill_9_during_appends_keeps_exactly_the_acknowledged_ones(tmp_path: Path) -> None:
    backends = embedded_backends(tmp_path)
    port = free_port()
    process: ServiceProcess = start_storage(backends, port, SETTINGS)
    client = StorageClient(process.address, timeout=30.0, retry=PATIENT)
    blob = await open_blob(backends.blob_url)
    try:
        writers: list[Writer] = []
        readers: list[Capability] = []
        for cid in ("u1", "u2"):
            pair = await client.create(cid, SCHEMA)
            readers.append(pair.read)
            second = await client.clone(pair.write)
            writers.append(Writer(f"{cid}-a", cid, pair.write))
            writers.append(Writer(f"{cid}-b", cid, second))
        stop = asyncio.Event()
        async with client.keep_alive(readers, every=1.0):
            tasks = [asyncio.create_task(write_until(client, w, stop)) for w in writers]
            rng = random.Random(1)
            for _ in range(6):
                await asyncio.sleep(rng.uniform(0.4, 1.2))
                process.kill()  # SIGKILL, mid-stream
                process = start_storage(backends, port, SETTINGS)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

            for cid, read in zip(("u1", "u2"), readers, strict=True):
                mine = [w for w in writers if w.collection_id == cid]
                acknowledged = [a for w in mine for a in w.acknowledged]
                assert len(acknowledged) > 10, "the writers made too little progress"
                upper = (await client.describe(cid)).upper.elements[0]
                reader: CdcReader[tuple[object, ...], int] = CdcReader(U64)
                history = []
                async for message in client.subscribe(read, stop_at=upper):
                    history.extend(u for updates, _ in reader.push(message) for u in updates)
                # Exactly the acknowledged rows, each once, at the time it was acknowledged.
                assert sorted(history) == sorted((row, t, 1) for row, t in acknowledged)

            # A blob some crashed append left behind long ago, besides any the kills left.
            stale = f"shards/u1/{int(time.time() * 1000) - 60_000:013d}-{'0' * 32}.parquet"
            await blob.put(stale, b"stale")
            deadline = time.monotonic() + 20
            while True:
                referenced = set()
                for cid in ("u1", "u2"):
                    info = await client.describe(cid)
                    referenced.update(b.key for b in info.batches)
                listed = set(await blob.list("shards/"))
                if listed == referenced:
                    break
                assert time.monotonic() < deadline, f"garbage left: {sorted(listed - referenced)}"
                await asyncio.sleep(0.25)
    finally:
        await blob.close()
        await client.close()
        process.kill()
