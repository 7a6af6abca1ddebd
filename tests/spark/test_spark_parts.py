"""Storage and Spark exchanging Parquet parts, on a directory and on S3:

- a collection read by Spark from the parts storage lists, fetched by the executors from the
  blob store, equals storage's own snapshot at the same time, over many appends, retractions
  and compactions;
- parts written by the executors become one append when the driver commits them, with
  Append's compare-and-append and idempotency rules, and stray parts are swept."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from services.compute.spark.parts_source import collection_frame, missing_part, partitions
from services.compute.spark.parts_writer import write_parts
from tests.support.service_process import ServiceProcess
from tests.support.storage import (
    FAST_SETTINGS,
    Backends,
    embedded_backends,
    production_backends,
    start_storage,
)
from tidemark.blob import open_blob
from tidemark.clients.storage import StorageClient, WrittenPart
from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.columnar.io import ROW_GROUP_ROWS
from tidemark.errors import FailedPrecondition, InvalidArgument
from tidemark.frontier import u64_frontier
from tidemark.part_keys import new_part_key
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
    # Parts wait for their commit while a Spark job on a busy machine finishes: longer than
    # the seconds the fast settings give a blob before the orphan sweep takes it.
    # Likewise parts compaction replaced stay for the Spark jobs still reading them.
    extra = (*FAST_SETTINGS, "--orphan-grace", "120", "--retired-blob-grace", "60")
    process = start_storage(backends, extra=extra)
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
    for t in range(1, 40):
        updates: list[tuple[Row, int, int]] = []
        for _ in range(rng.randrange(1, 8)):
            if live and rng.random() < 0.35:
                updates.append((live.pop(rng.randrange(len(live))), t, -1))
            else:
                row = random_row(rng)
                live.append(row)
                updates.append((row, t, rng.choice([1, 1, 2])))
        await client.append(pair.write, updates, t + 1, expected_upper=t)
    # Maintenance compacts the older parts meanwhile: the listing is of one state either way.
    await asyncio.sleep(0.5)
    for as_of in (5, 23, 39):
        listing = await client.list_parts(pair.read, as_of)
        assert listing.as_of == as_of and listing.parts
        assert listing.blob_url.startswith("s3://" if "s3" in backends.blob_url else "file://")
        expected = (await client.snapshot(pair.read, as_of)).version()
        assert spark_version(spark, listing) == expected


async def test_a_reader_of_some_columns_reads_those_and_may_skip_consolidation(
    spark: SparkSession, client: StorageClient
) -> None:
    rng = random.Random(5)
    pair = await client.create("u990003", SCHEMA, initial_frontier=1, holder="test")
    rows = [random_row(rng) for _ in range(30)]
    await client.append(pair.write, [(r, 1, 2) for r in rows], 2, expected_upper=1)
    await client.append(pair.write, [(r, 2, -1) for r in rows[:10]], 3, expected_upper=2)
    listing = await client.list_parts(pair.read, 2)
    expected: dict[Row, int] = {}
    for row, diff in (await client.snapshot(pair.read, 2)).version().items():
        narrowed = tuple(v if i in (0, 3) else None for i, v in enumerate(row))
        expected[narrowed] = expected.get(narrowed, 0) + diff
    for consolidate in (True, False):
        frame = collection_frame(spark, listing, columns={3, 0}, consolidate=consolidate)
        assert frame.columns == [c.name for c in SCHEMA.columns] + ["diff"]
        found: dict[Row, int] = {}
        for row in frame.collect():
            key = tuple(row[:-1])
            assert consolidate is False or key not in found
            found[key] = found.get(key, 0) + row[-1]
        assert {k: d for k, d in found.items() if d} == {k: d for k, d in expected.items() if d}


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


# -- parts written by executors, committed by the driver ----------------------------------------


def _frame(spark: SparkSession, version: dict[Row, int]) -> Any:
    from services.compute.spark.parts_source import spark_schema

    rows = [(*row, diff) for row, diff in version.items()]
    return spark.createDataFrame(rows, spark_schema(SCHEMA)).repartition(3)


def _version(rng: random.Random, size: int) -> dict[Row, int]:
    version: dict[Row, int] = {}
    for _ in range(size):
        version[random_row(rng)] = rng.choice([1, 2, -1])
    return version


async def test_parts_written_by_executors_commit_as_one_append(
    spark: SparkSession, client: StorageClient
) -> None:
    rng = random.Random(11)
    pair = await client.create("u990010", SCHEMA, initial_frontier=1, holder="test")
    first = _version(rng, 60)
    parts = write_parts(_frame(spark, first), SCHEMA, "u990010", await _blob_url(client), 5)
    assert len(parts) == 3 and sum(p.rows for p in parts) == len(first)
    appended = await client.append_parts(
        pair.write, parts, 6, times=(5, 5), token="hydrate-1", expected_upper=1
    )
    assert appended.upper == u64_frontier(6) and not appended.already_committed
    # The same commit again (its reply lost): recognised, nothing doubled.
    again = await client.append_parts(
        pair.write, parts, 6, times=(5, 5), token="hydrate-1", expected_upper=1
    )
    assert again.already_committed
    expected = {row: diff for row, diff in first.items() if diff}
    assert (await client.snapshot(pair.read, 5)).version() == expected
    # Readers of the parts see them one by one, and Spark reads the same collection back.
    listing_before = await client.list_parts(pair.read, 5)
    assert sorted(p.key for p in listing_before.parts) == sorted(p.key for p in parts)
    assert spark_version(spark, listing_before) == expected
    # Ordinary appends follow; compaction merges the many-part batch with them.
    row = random_row(rng)
    for t in range(6, 12):
        await client.append(pair.write, [(row, t, 1)], t + 1, expected_upper=t)
    await client.downgrade(pair.read, 11)
    expected[row] = expected.get(row, 0) + 6
    # Compaction runs in the background: the bound only catches one that never comes (a
    # loaded 2-core CI machine once took longer than 20 s against the S3 endpoint).
    deadline = asyncio.get_running_loop().time() + 120
    while (await client.describe("u990010")).batch_count > 2:
        assert asyncio.get_running_loop().time() < deadline, "no compaction happened"
        await asyncio.sleep(0.2)
    assert (await client.snapshot(pair.read, 11)).version() == {
        r: d for r, d in expected.items() if d
    }


async def test_a_refused_or_bad_commit_changes_nothing(
    spark: SparkSession, client: StorageClient
) -> None:
    pair = await client.create("u990011", SCHEMA, initial_frontier=1, holder="test")
    other = await client.create("u990012", SCHEMA, initial_frontier=1, holder="test")
    blob_url = await _blob_url(client)
    parts = write_parts(
        _frame(spark, _version(random.Random(3), 20)), SCHEMA, "u990011", blob_url, 1
    )
    with pytest.raises(FailedPrecondition):
        await client.append_parts(pair.write, parts, 2, times=(1, 1), expected_upper=7)
    with pytest.raises(InvalidArgument, match="not a part key of collection u990012"):
        await client.append_parts(other.write, parts, 2, times=(1, 1), expected_upper=1)
    with pytest.raises(InvalidArgument, match="lies outside"):
        await client.append_parts(pair.write, parts, 2, times=(1, 4), expected_upper=1)
    with pytest.raises(InvalidArgument, match="not in the blob store"):
        gone = WrittenPart(new_part_key("u990011", int(time.time() * 1000)), 1, 10)
        await client.append_parts(pair.write, [*parts, gone], 2, times=(1, 1), expected_upper=1)
    info = await client.describe("u990011")
    assert info.upper == u64_frontier(1) and info.batch_count == 0
    # The parts are still there for a retry, which lands them.
    await client.append_parts(pair.write, parts, 2, times=(1, 1), expected_upper=1)
    assert (await client.describe("u990011")).rows == sum(p.rows for p in parts)


async def test_parts_nobody_commits_are_swept(backends: Backends) -> None:
    storage = start_storage(backends)  # the fast settings: orphans go after 4 s
    try:
        async with StorageClient(storage.address, retry=QUICK_RETRY) as client:
            await client.create("u990013", SCHEMA, initial_frontier=1, holder="test")
            blob_url = await _blob_url(client)
            async with await open_blob(blob_url) as blob:
                stray = new_part_key("u990013", int(time.time() * 1000))
                await blob.put(stray, b"parquet bytes nobody commits")
                deadline = time.monotonic() + 30
                while await blob.get(stray) is not None:
                    assert time.monotonic() < deadline, "the stray part was never swept"
                    await asyncio.sleep(0.5)
    finally:
        storage.kill()


async def _blob_url(client: StorageClient) -> str:
    pair = await client.create(f"u{random.randrange(10**8, 10**9)}", SCHEMA, initial_frontier=1)
    await client.append(pair.write, [], 2, expected_upper=1)
    return (await client.list_parts(pair.read, 1)).blob_url


async def test_a_large_part_is_read_in_slices_of_its_row_groups(
    spark: SparkSession, client: StorageClient
) -> None:
    from services.compute.spark.parts_source import PARTITION_BYTES

    rng = random.Random(9)
    pair = await client.create("u990004", SCHEMA, initial_frontier=1, holder="test")
    rows = {random_row(rng): rng.choice([1, 3]) for _ in range(3000)}
    await client.append(pair.write, [(r, 1, d) for r, d in rows.items()], 2, expected_upper=1)
    listing = await client.list_parts(pair.read, 1)
    (part,) = listing.parts
    assert partitions(listing) == [[(part.key, 0, 1)]] and part.bytes < PARTITION_BYTES
    # One row group (storage writes 2^20 rows to one): never more slices than that.
    assert partitions(listing, target_bytes=1) == [[(part.key, 0, 1)]]
    # A part of 3 row groups, as a bulk load writes them, cut in 3 slices.
    big = replace(part, rows=3 * ROW_GROUP_ROWS, bytes=3 * PARTITION_BYTES)
    assert partitions(replace(listing, parts=[big, part])) == [
        [(part.key, 0, 3)],
        [(part.key, 1, 3)],
        [(part.key, 2, 3)],
        [(part.key, 0, 1)],
    ]
    # A slice that finds no row group of its own reads nothing; together they read it all.
    sliced = replace(listing, parts=[replace(part, rows=3 * ROW_GROUP_ROWS)])
    frame = collection_frame(spark, sliced, target_bytes=max(1, part.bytes // 3))
    found = {
        tuple(bytes(v) if isinstance(v, bytearray) else v for v in r[:-1]): r[-1]
        for r in frame.collect()
    }
    assert found == rows


async def test_parts_of_the_former_layout_read_beside_new_ones(
    spark: SparkSession, client: StorageClient
) -> None:
    """Parts written before decimals were stored as integers (fixed-length bytes) stay
    readable, by storage and by Spark, in the same listing as parts written since."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.columnar import table_from_updates

    rng = random.Random(13)
    cid = "u990020"
    pair = await client.create(cid, SCHEMA, initial_frontier=1, holder="test")
    former_rows = {random_row(rng): rng.choice([1, 2]) for _ in range(200)}
    table = table_from_updates(SCHEMA, [(r, 1, d) for r, d in former_rows.items()])
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=1 << 20)
    data = sink.getvalue().to_pybytes()
    group = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0)
    amount = SCHEMA.columns.index(next(c for c in SCHEMA.columns if c.name == "amount"))
    assert group.column(amount).physical_type == "FIXED_LEN_BYTE_ARRAY"
    key = new_part_key(cid, int(time.time() * 1000))
    async with await open_blob(await _blob_url(client)) as blob:
        await blob.put(key, data)
    written = WrittenPart(key, table.num_rows, len(data))
    await client.append_parts(pair.write, [written], 2, times=(1, 1), expected_upper=1)
    later = {random_row(rng): 1 for _ in range(50)}
    retracted = next(iter(former_rows))
    updates = [(r, 2, d) for r, d in later.items() if r not in former_rows]
    updates.append((retracted, 2, -former_rows[retracted]))
    await client.append(pair.write, updates, 3, expected_upper=2)
    listing = await client.list_parts(pair.read, 2)
    assert key in {p.key for p in listing.parts} and len(listing.parts) >= 2
    expected = (await client.snapshot(pair.read, 2)).version()
    assert retracted not in expected and len(expected) == len(former_rows) - 1 + len(updates) - 1
    assert spark_version(spark, listing) == expected
