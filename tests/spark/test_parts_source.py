"""Storage as a Spark data source: a collection read by Spark from the parts storage lists,
fetched by the executors from the blob store (a directory, or S3 through the S3 API), equals
storage's own snapshot at the same time, over many appends, retractions and compactions."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.compute.spark.parts_source import collection_frame, missing_part, partitions
from tests.support.service_process import ServiceProcess
from tests.support.storage import Backends, embedded_backends, production_backends, start_storage
from tidemark.blob import open_blob
from tidemark.clients.storage import StorageClient
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.retry import RetryPolicy

SCHEMA = RelationSchema(
    [
        Column("k", ColumnType.INT64, nullable=False),
        Column("flag", ColumnType.BOOL),
        Column("x", ColumnType.FLOAT64),
        Column("amount", ColumnType.DECIMAL, precision=12, scale=2),
        Column("name.with dot", ColumnType.TEXT),
        Column("raw", ColumnType.BYTES),
        Column("day", ColumnType.DATE),
        Column("at", ColumnType.TIMESTAMP),
        Column("doc", ColumnType.JSON),
    ]
)
Row = tuple[Any, ...]
QUICK_RETRY = RetryPolicy(total_seconds=3.0, initial_backoff=0.05, max_backoff=0.3)


@pytest.fixture(scope="module", params=["file", "s3"])
def backends(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backends:
    if request.param == "file":
        return embedded_backends(tmp_path_factory.mktemp("parts"))
    return production_backends(request)


@pytest.fixture(scope="module")
def storage(backends: Backends) -> Iterator[ServiceProcess]:
    process = start_storage(backends)
    yield process
    process.kill()


@pytest.fixture
async def client(storage: ServiceProcess) -> AsyncIterator[StorageClient]:
    made = StorageClient(storage.address, timeout=10.0, retry=QUICK_RETRY)
    yield made
    await made.close()


def random_row(rng: random.Random) -> Row:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.15 else value

    return (
        rng.randrange(6),
        maybe(rng.random() < 0.5),
        maybe(rng.choice([0.5, -2.25, 1e300])),
        maybe(decimal.Decimal(rng.randrange(-(10**6), 10**6)) / 100),
        maybe(rng.choice(["", "a", "é ✓", "tidemark"])),
        maybe(rng.choice([b"", b"\x00\xff", b"bytes"])),
        maybe(datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randrange(400))),
        maybe(datetime.datetime(2024, 2, 29, 12, 0, 0, rng.randrange(10**6))),
        maybe(rng.choice(['{"a": 1}', "[]", "null"])),
    )


def spark_version(spark: SparkSession, client_listing: Any) -> dict[Row, int]:
    frame = collection_frame(spark, client_listing, target_bytes=1)
    found: dict[Row, int] = {}
    for row in frame.collect():
        values = tuple(bytes(v) if isinstance(v, bytearray) else v for v in row[:-1])
        assert values not in found, "a row appears twice: the diffs were not summed"
        found[values] = row[-1]
    return found


async def test_spark_reads_a_collection_at_a_time_as_storage_does(
    spark: SparkSession, client: StorageClient, backends: Backends
) -> None:
    rng = random.Random(7)
    cid = f"u{rng.randrange(10**6)}"
    pair = await client.create(cid, SCHEMA, initial_frontier=1, holder="test")
    live: list[Row] = []
    for time in range(1, 40):
        updates: list[tuple[Row, int, int]] = []
        for _ in range(rng.randrange(1, 8)):
            if live and rng.random() < 0.35:
                updates.append((live.pop(rng.randrange(len(live))), time, -1))
            else:
                row = random_row(rng)
                live.append(row)
                updates.append((row, time, rng.choice([1, 1, 2])))
        await client.append(pair.write, updates, time + 1, expected_upper=time)
    # Maintenance compacts the older parts meanwhile: the listing is of one state either way.
    await asyncio.sleep(0.5)
    for as_of in (5, 23, 39):
        listing = await client.list_parts(pair.read, as_of)
        assert listing.as_of == as_of and listing.parts
        assert listing.blob_url.startswith("s3://" if "s3" in backends.blob_url else "file://")
        expected = (await client.snapshot(pair.read, as_of)).version()
        assert spark_version(spark, listing) == expected


async def test_an_empty_and_a_retracted_collection_read_as_empty(
    spark: SparkSession, client: StorageClient
) -> None:
    pair = await client.create("u990001", SCHEMA, initial_frontier=1, holder="test")
    await client.append(pair.write, [], 3, expected_upper=1)
    listing = await client.list_parts(pair.read, 2)
    assert spark_version(spark, listing) == {}
    row = random_row(random.Random(1))
    await client.append(pair.write, [(row, 3, 2)], 4, expected_upper=3)
    await client.append(pair.write, [(row, 4, -2)], 5, expected_upper=4)
    assert spark_version(spark, await client.list_parts(pair.read, 3)) == {row: 2}
    assert spark_version(spark, await client.list_parts(pair.read, 4)) == {}


async def test_a_part_gone_from_the_blob_store_fails_the_job_as_missing(
    spark: SparkSession, client: StorageClient
) -> None:
    pair = await client.create("u990002", SCHEMA, initial_frontier=1, holder="test")
    row = random_row(random.Random(2))
    await client.append(pair.write, [(row, 1, 1)], 2, expected_upper=1)
    listing = await client.list_parts(pair.read, 1)
    assert len(partitions(listing)) == 1
    async with await open_blob(listing.blob_url) as blob:
        await blob.delete(listing.parts[0].key)
    with pytest.raises(Exception) as failure:
        collection_frame(spark, listing).collect()
    assert missing_part(failure.value)
