"""Storage as a Spark data source: a collection at a time, read by the executors themselves.

Storage lists the Parquet parts that hold a collection's updates at times ``<= as_of``
(``Storage.ListParts``, under the caller's read capability). :func:`collection_frame` turns
such a listing into a DataFrame: one Spark partition per group of parts, each fetched by the
executor running it straight from the blob store (a ``file://`` directory, or S3 through the
S3 API), never through the driver. Inside a partition the updates at times ``<= as_of`` are
kept and summed per row; the DataFrame then sums them across partitions, so every row appears
once with its multiplicity in ``diff`` (zero sums dropped): the collection at ``as_of``.

The source is a Python data source (``pyspark.sql.datasource``), so it needs no jar: the
executors import this module from the project, as the resident tasks do.

A part that compaction replaced stays in the blob store for storage's retired-blob grace
period. A job that runs longer may find one gone; it then fails with :class:`MissingPart`
in its message (:func:`missing_part`), and the caller lists again and reruns it, as storage's
own reads do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import DataType, DecimalType, LongType, StructField, StructType
from structlog.typing import FilteringBoundLogger

from services.compute.spark.lowering.types import spark_type as scalar_spark_type
from tidemark.clients.storage import PartsListing
from tidemark.columnar import Column as RelationColumn
from tidemark.columnar import ColumnType, RelationSchema
from tidemark.columnar.io import ROW_GROUP_ROWS
from tidemark.columnar.schema import DIFF_COLUMN, TIME_COLUMN
from tidemark.columnar.updates import frontier_bound
from tidemark.plan.scalar_types import ScalarType
from tidemark.v1 import common_pb2

SOURCE_NAME = "tidemark_parts"
DIFF = DIFF_COLUMN

# Parts are grouped into partitions of about this many bytes (Parquet, compressed): small
# parts (a table's recent appends) would otherwise each cost a task.
PARTITION_BYTES = 64 << 20

_CREDENTIAL_VARIABLES = (
    "TIDEMARK_S3_ACCESS_KEY",
    "TIDEMARK_S3_SECRET_KEY",
    "TIDEMARK_S3_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
# The option carrying them; Spark's default redaction pattern hides option names with
# "secret" from plans and logs.
_CREDENTIALS_OPTION = "s3_secret_environment"
MISSING_PART = "tidemark: part missing from the blob store"
LISTING_ATTEMPTS = 5
"""Listings a Spark job over parts tries before giving up on parts compacted away under it."""


def listing_backoff(attempt: int) -> float:
    """Seconds to wait before listing again after run ``attempt`` found a part gone.

    Compaction retires parts in bursts of rounds after writes; listing again at once can land
    inside the same burst and lose the same race. The wait doubles from 0.1 s (1.5 s in all
    over :data:`LISTING_ATTEMPTS`)."""
    return 0.1 * (1 << (attempt - 1))


class MissingPart(Exception):
    """A listed part is gone: compaction replaced it and its grace period ran out."""


def missing_part(error: BaseException) -> bool:
    """Whether a failed Spark job failed because a listed part was gone (list again).

    Besides :data:`MISSING_PART` (this source's own reads), Spark's Parquet reader says so
    in three ways: the path is gone when the job is planned, or when a task opens it, or
    (FAILED_READ_FILE.NO_HINT, caused by the file system's own error) while it reads it.
    Spark's errors carry their condition in their text, so the text alone tells."""
    text = str(error)
    return any(marker in text for marker in _FILE_GONE)


_FILE_GONE = (
    MISSING_PART,
    "PATH_NOT_FOUND",
    "FAILED_READ_FILE.FILE_NOT_EXIST",
    "java.nio.file.NoSuchFileException",
    "java.io.FileNotFoundException",
)


class Relisting:
    """The runs of one piece of work over listed parts (a one-shot query, a hydration, a
    shard's rebuild): after a run failed, whether to list the parts again and run once more,
    and how long to wait first. A part compacted away under a run is a lost race, not a
    fault: the parts listed again hold the same updates. Every other failure stands, and so
    does the last of :data:`LISTING_ATTEMPTS` runs. The caller lists and runs; this counts,
    logs ``event`` (with ``fields``) to the caller's ``log`` and picks the wait."""

    def __init__(self, log: FilteringBoundLogger, event: str, **fields: object) -> None:
        self.log = log
        self.event = event
        self.fields = fields
        self.attempt = 1

    def wait_before_next(self, error: BaseException, **run: object) -> float | None:
        """After the current run failed with ``error``: the seconds to wait before listing
        again and running once more, or ``None`` when the failure stands (see
        :attr:`used_up` for why). ``run``: what the log says of this run alone."""
        if not missing_part(error) or self.used_up:
            return None
        self.log.info(self.event, **{**self.fields, **run, "attempt": self.attempt})
        wait = listing_backoff(self.attempt)
        self.attempt += 1
        return wait

    @property
    def used_up(self) -> bool:
        """Whether the current run is the last one allowed."""
        return self.attempt >= LISTING_ATTEMPTS


def spark_type(column: RelationColumn) -> DataType:
    """The Spark type holding a column's values exactly as its Arrow type does."""
    if column.type is ColumnType.DECIMAL:
        arrow = column.arrow_type  # precision 0 reads as 38 there
        return DecimalType(arrow.precision, arrow.scale)
    return scalar_spark_type(ScalarType.of_column(column))


def spark_schema(schema: RelationSchema) -> StructType:
    """The relation's columns, then ``diff``."""
    fields = [StructField(c.name, spark_type(c), c.nullable) for c in schema.columns]
    return StructType([*fields, StructField(DIFF, LongType(), False)])


@dataclass(frozen=True)
class _Parts(InputPartition):  # type: ignore[misc]
    slices: tuple[tuple[str, int, int], ...]
    """``(key, index, count)``: the row groups ``g`` of part ``key`` with ``g % count ==
    index`` (``count`` 1: the whole part)."""


def partitions(
    listing: PartsListing, target_bytes: int = PARTITION_BYTES
) -> list[list[tuple[str, int, int]]]:
    """The listing's parts as Spark partitions of about ``target_bytes`` each: small parts
    grouped together, a large one cut into slices of its row groups."""
    groups: list[list[tuple[str, int, int]]] = []
    size = 0
    for part in listing.parts:
        # No more slices than row groups: a slice without one would read nothing.
        groups_in_part = max(1, -(-part.rows // ROW_GROUP_ROWS))
        count = min(groups_in_part, max(1, -(-part.bytes // target_bytes)))
        if count > 1:
            groups.extend([(part.key, index, count)] for index in range(count))
            continue
        if not groups or size + part.bytes > target_bytes or groups[-1][-1][2] != 1:
            groups.append([])
            size = 0
        groups[-1].append((part.key, 0, 1))
        size += part.bytes
    return groups


class StoragePartsSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("tidemark_parts")``; see :func:`collection_frame` for its options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["spark_schema"]))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _PartsReader(self.options)


class _PartsReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str]) -> None:
        self.blob_url = options["blob_url"]
        self.as_of = int(options["as_of"])
        self.groups: list[list[tuple[str, int, int]]] = [
            [(key, index, count) for key, index, count in group]
            for group in json.loads(options["parts"])
        ]
        self.relation = _relation(options["relation_schema"])
        self.environment: dict[str, str] = json.loads(options.get(_CREDENTIALS_OPTION, "{}"))
        chosen = options.get("columns", "")
        self.columns = {int(c) for c in chosen.split(",") if c} if chosen else None

    def partitions(self) -> Sequence[InputPartition]:
        # At least one: Spark reads a source that offers none as one partition of its own.
        return [_Parts(tuple(group)) for group in self.groups] or [_Parts(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        os.environ.update(self.environment)
        assert isinstance(partition, _Parts)
        update_schema = self.relation.update_schema()
        wanted = [
            f.name for i, f in enumerate(update_schema) if self.columns is None or i in self.columns
        ]
        names = [*wanted, TIME_COLUMN, DIFF] if self.columns is not None else None
        output = pa.schema([update_schema.field(n) for n in wanted if n != TIME_COLUMN])
        if self.columns is not None:
            output = output.append(update_schema.field(DIFF))
        for table in _read_slices(self.blob_url, partition.slices, names):
            yield from at_time(table, self.as_of).cast(output).to_batches()


def read_parts(
    blob_url: str, keys: Sequence[str], environment: Mapping[str, str]
) -> dict[str, pa.Table]:
    """Whole parts by key (every column), read as the source's executors read them: in
    place from a ``file://`` directory, else through the blob store's API with the S3
    credentials in ``environment``. A part that is gone raises :class:`MissingPart`."""
    os.environ.update(environment)
    chosen = list(dict.fromkeys(keys))
    tables = _read_slices(blob_url, [(key, 0, 1) for key in chosen], None)
    return dict(zip(chosen, tables, strict=True))


def iter_parts(
    blob_url: str, keys: Sequence[str], columns: Sequence[str], environment: Mapping[str, str]
) -> Iterator[pa.Table]:
    """Each part's ``columns``, one table per part, read as :func:`read_parts` reads them."""
    os.environ.update(environment)
    return _read_slices(blob_url, [(key, 0, 1) for key in keys], columns)


def _read_slices(
    blob_url: str, slices: Sequence[tuple[str, int, int]], columns: Sequence[str] | None
) -> Iterator[pa.Table]:
    """Each slice's rows (its ``columns`` only), read from a local directory in place or
    fetched from the blob store."""
    from urllib.parse import unquote, urlsplit

    import pyarrow.parquet as pq

    url = urlsplit(blob_url)
    if url.scheme == "file":
        root = Path(unquote(url.path))
        for key, index, count in slices:
            try:
                source = pq.ParquetFile(root / key, memory_map=True, pre_buffer=False)
            except FileNotFoundError:
                raise MissingPart(f"{MISSING_PART}: {key} (compacted away; list again)") from None
            with source:
                yield _row_groups(source, index, count, columns)
        return
    keys = list(dict.fromkeys(key for key, _, _ in slices))
    fetched = dict(zip(keys, asyncio.run(_fetch(blob_url, keys)), strict=True))
    for key, index, count in slices:
        with pq.ParquetFile(pa.BufferReader(fetched[key]), pre_buffer=False) as source:
            yield _row_groups(source, index, count, columns)


def read_part_bytes(data: bytes) -> pa.Table:
    """A whole part from its Parquet bytes, read as :func:`read_parts` reads a file."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(pa.BufferReader(data), pre_buffer=False) as source:
        return _row_groups(source, 0, 1, None)


def _row_groups(source: Any, index: int, count: int, columns: Sequence[str] | None) -> pa.Table:
    # In this thread, with the file's bytes read as the columns need them: a reader runs in
    # a task or an executor's worker beside others on the same cores, and for the parts a
    # step reads (thousands of rows) Arrow's thread pool and read-ahead cost more than they
    # save (a 1,000-row part 0.51 -> 0.29 ms, 20,000 rows 1.66 -> 0.86 ms; 300,000 rows
    # about even).
    chosen = [g for g in range(source.num_row_groups) if g % count == index]
    return source.read_row_groups(chosen, columns=columns, use_threads=False)


def _relation(encoded: str) -> RelationSchema:
    proto = common_pb2.RelationSchema()
    proto.ParseFromString(base64.b64decode(encoded))
    return RelationSchema.from_proto(proto)


async def _fetch(blob_url: str, keys: Sequence[str]) -> list[bytes]:
    # Imported here: executors open the store themselves, and only when they read.
    from tidemark.blob import open_blob

    async with await open_blob(blob_url) as blob:
        fetched = await asyncio.gather(*(blob.get(key) for key in keys))
    missing = [key for key, data in zip(keys, fetched, strict=True) if data is None]
    if missing:
        raise MissingPart(f"{MISSING_PART}: {missing[0]} (compacted away; list again)")
    return [data for data in fetched if data is not None]


def at_time(updates: pa.Table, as_of: int) -> pa.Table:
    """The updates at times ``<= as_of`` without ``time``: one part's share of the collection
    at ``as_of``. Readers sum the diffs of equal rows anyway; a part of several times (one
    that compaction made, with retractions) is summed here already, which can shrink it."""
    import pyarrow.compute as pc

    times = updates.column(TIME_COLUMN)
    kept = updates.filter(pc.less_equal(times, pa.scalar(as_of, pa.uint64())))
    data = [name for name in kept.column_names if name not in (TIME_COLUMN, DIFF)]
    if kept.num_rows == 0:
        return kept.drop_columns([TIME_COLUMN])
    bounds = pc.min_max(kept.column(TIME_COLUMN))
    if bounds["min"] == bounds["max"]:
        # Storage consolidates a part per row and time: with one time, nothing cancels.
        return kept.drop_columns([TIME_COLUMN])
    summed = kept.group_by(data, use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.rename_columns([*data, DIFF])
    summed = summed.filter(pc.not_equal(summed.column(DIFF), 0))
    return summed.select([*data, DIFF])


def column(name: str) -> Column:
    """The column called ``name``, quoted: "a.b" is a column, not a field of a struct."""
    return F.col("`" + name.replace("`", "``") + "`")


def s3_credentials(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The S3 credentials set in ``environment`` (default: this process's), for executors
    to open the blob store with."""
    env = os.environ if environment is None else environment
    return {name: env[name] for name in _CREDENTIAL_VARIABLES if env.get(name)}


_registered: set[int] = set()


def register(spark: SparkSession) -> None:
    """Make the source known to ``spark`` (once per session)."""
    if id(spark) not in _registered:
        spark.dataSource.register(StoragePartsSource)
        _registered.add(id(spark))


def collection_frame(
    spark: SparkSession,
    listing: PartsListing,
    *,
    columns: Collection[int] | None = None,
    consolidate: bool = True,
    target_bytes: int = PARTITION_BYTES,
    environment: Mapping[str, str] | None = None,
) -> DataFrame:
    """The collection at ``listing.as_of``: its columns and ``diff``. With ``columns`` (the
    positions a reader needs), the parts' other columns are not read and come out NULL.
    ``consolidate``: one row per distinct row with its multiplicity (never 0), at the cost of
    a shuffle; otherwise a row may come several times and its diffs add up. The S3
    credentials in ``environment`` (default: this process's) go to the executors with the
    job."""
    schema = spark_schema(listing.schema)
    every = range(len(listing.schema.columns))
    chosen = None if columns is None else sorted(set(columns) & set(every))
    read_schema = schema
    if chosen is not None:
        read_schema = StructType([*(schema.fields[i] for i in chosen), schema.fields[-1]])
    url = urlsplit(listing.blob_url)
    if url.scheme == "file" and listing.parts:
        frame = _local_parts(spark, Path(unquote(url.path)), listing, read_schema)
    else:
        frame = _source_frame(spark, listing, read_schema, chosen, target_bytes, environment)
    if chosen is not None:
        present = set(chosen)
        frame = frame.select(
            *(
                column(f.name) if i in present else F.lit(None).cast(f.dataType).alias(f.name)
                for i, f in enumerate(schema.fields[:-1])
            ),
            column(DIFF),
        )
    if not consolidate:
        return frame
    names = [column(c.name) for c in listing.schema.columns]
    grouped = frame.groupBy(*names) if names else frame.groupBy()
    summed = grouped.agg(F.sum(DIFF).alias(DIFF))
    return summed.where(F.col(DIFF).isNotNull() & (F.col(DIFF) != 0))


def _local_parts(
    spark: SparkSession, root: Path, listing: PartsListing, read_schema: StructType
) -> DataFrame:
    """The parts of a local blob directory through Spark's own Parquet reader, which the
    executors run on the files in place (vectorized, only the columns asked for, row groups
    split across tasks): the same rows as the Python source, sooner."""
    paths = [str(root / part.key) for part in listing.parts]
    # The schema is given, so Spark reads no footer to infer it on the driver; storage wrote
    # each column with exactly these types (``time``, a uint64, is Spark's DECIMAL(20, 0)).
    # All of them: Spark sizes a scan (to choose broadcast joins) as the files' bytes times
    # the share of the schema's width it reads.
    every = spark_schema(listing.schema)
    stored = StructType(
        [*every.fields[:-1], StructField(TIME_COLUMN, DecimalType(20, 0)), every.fields[-1]]
    )
    read = spark.read.option("mergeSchema", "false").schema(stored).parquet(*paths)
    if not all_at_or_before(listing):
        read = read.where(F.col(TIME_COLUMN) <= F.lit(listing.as_of))
    return read.select(*(column(f.name) for f in read_schema))


def all_at_or_before(listing: PartsListing) -> bool:
    """Whether every listed part's updates are at times ``<= as_of`` (each part's upper is
    at most ``as_of + 1``): then no update needs dropping and ``time`` need not be read."""
    for part in listing.parts:
        bound = frontier_bound(part.upper)
        if bound is None or bound > listing.as_of + 1:
            return False
    return True


def _source_frame(
    spark: SparkSession,
    listing: PartsListing,
    read_schema: StructType,
    chosen: list[int] | None,
    target_bytes: int,
    environment: Mapping[str, str] | None,
) -> DataFrame:
    """The parts through the Python data source: executors fetch them through the blob
    store's API (S3), or read a local directory's when Spark's reader cannot run."""
    register(spark)
    credentials = s3_credentials(environment)
    proto = listing.schema.to_proto().SerializeToString()
    return (
        spark.read.format(SOURCE_NAME)
        .option("blob_url", listing.blob_url)
        .option("as_of", str(listing.as_of))
        .option("parts", json.dumps(partitions(listing, target_bytes)))
        .option("relation_schema", base64.b64encode(proto).decode())
        .option("spark_schema", read_schema.json())
        .option("columns", "" if chosen is None else ",".join(map(str, chosen)))
        .option(_CREDENTIALS_OPTION, json.dumps(credentials))
        .load()
    )
