"""Writing a DataFrame of updates into a collection: the executors write the Parquet parts,
the driver only commits them.

:func:`write_parts` has every Spark partition of a DataFrame (the collection's columns and
``diff``, all at one ``time``) encoded by the executor that computed it, as one Parquet part
stored in the collection's blob store under a fresh part key. What comes back to the driver
is only each part's key, rows and bytes; ``StorageClient.append_parts`` then makes them one
batch of the collection. Parts that are never committed (the job failed half way, the commit
was refused) are deleted by storage's orphan sweep.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StringType, StructField, StructType

from services.compute.spark.parts_source import DIFF, column, s3_credentials
from tidemark.clients.storage import WrittenPart
from tidemark.columnar import RelationSchema
from tidemark.columnar.schema import TIME_COLUMN, TIME_TYPE

if TYPE_CHECKING:
    from tidemark.blob import Blob

_WRITTEN = StructType(
    [
        StructField("key", StringType(), False),
        StructField("rows", LongType(), False),
        StructField("bytes", LongType(), False),
        StructField("diffs", LongType(), False),
    ]
)


def write_parts(
    frame: DataFrame,
    schema: RelationSchema,
    collection_id: str,
    blob_url: str,
    time: int,
    *,
    environment: Mapping[str, str] | None = None,
) -> list[WrittenPart]:
    """Store ``frame`` (``schema``'s columns, then ``diff``) as Parquet parts of
    ``collection_id`` with every update at ``time``, one part per non-empty Spark partition,
    written by the executors; returns the parts, for ``append_parts``."""
    return write_parts_counted(
        frame, schema, collection_id, blob_url, time, environment=environment
    )[0]


def write_parts_counted(
    frame: DataFrame,
    schema: RelationSchema,
    collection_id: str,
    blob_url: str,
    time: int,
    *,
    environment: Mapping[str, str] | None = None,
) -> tuple[list[WrittenPart], int]:
    """:func:`write_parts`, and the sum of the diffs written (the rows of the collection the
    parts add up to, counted with multiplicity), counted by the same job."""
    update_schema = schema.update_schema()
    credentials = s3_credentials(environment)
    columns = [c.name for c in schema.columns]

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        os.environ.update(credentials)
        received = list(batches)
        if not received or sum(b.num_rows for b in received) == 0:
            return
        table = pa.Table.from_batches(received)
        times = pa.repeat(pa.scalar(time, TIME_TYPE), table.num_rows)
        data = [table.column(i) for i in range(len(columns))]
        updates = pa.table(
            [*data, times, table.column(len(columns))], names=[*columns, TIME_COLUMN, DIFF]
        ).cast(update_schema)
        written = asyncio.run(store_part(blob_url, collection_id, updates))
        diffs = pc.sum(table.column(len(columns))).as_py() or 0
        yield pa.record_batch(
            [
                pa.array([written.key]),
                pa.array([written.rows]),
                pa.array([written.bytes]),
                pa.array([diffs], pa.int64()),
            ],
            names=["key", "rows", "bytes", "diffs"],
        )

    # Plain positional names: mapInArrow does not quote the names it passes on, so a column
    # called "a.b" would not resolve.
    ordered = frame.select(
        *[column(name).alias(f"c{i}") for i, name in enumerate([*columns, DIFF])]
    )
    rows = ordered.mapInArrow(write, _WRITTEN).collect()
    parts = [WrittenPart(row["key"], row["rows"], row["bytes"]) for row in rows]
    return parts, sum(row["diffs"] for row in rows)


async def store_part(blob_url: str, collection_id: str, updates: pa.Table) -> WrittenPart:
    """Stores ``updates`` (a table of the update schema) as a Parquet part of ``collection_id``
    under a fresh part key; the part is not committed."""
    # Imported here: only executors write parts.
    from tidemark.blob import open_blob

    async with await open_blob(blob_url) as blob:
        return await put_part(blob, collection_id, updates)


async def put_part(blob: Blob, collection_id: str, updates: pa.Table) -> WrittenPart:
    """``store_part`` into a blob store already open (a ``tidemark.blob`` store)."""
    written, data = encode_part(collection_id, updates)
    await blob.put(written.key, data)
    return written


def encode_part(collection_id: str, updates: pa.Table) -> tuple[WrittenPart, bytes]:
    """``updates`` as a part's Parquet bytes under a fresh key of ``collection_id``, and the
    part they make once stored under that key."""
    import time as clock

    from tidemark.columnar import to_parquet
    from tidemark.part_keys import new_part_key

    data = to_parquet(updates)
    key = new_part_key(collection_id, int(clock.time() * 1000))
    return WrittenPart(key, updates.num_rows, len(data)), data
