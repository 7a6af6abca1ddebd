"""Plan types as Spark types, and the column layout every lowered relation shares.

A lowered relation is a DataFrame whose columns are ``c0 .. c{n-1}`` (the plan's columns by
position, so plan names never clash with each other or with ``diff``) followed by ``diff``, a
long multiplicity. Rows need not be consolidated: the same row may appear several times and
its multiplicities add up; a node that needs totals consolidates first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as S

from tidemark.columnar import ColumnType
from tidemark.plan.scalar_types import ScalarType

DIFF = "diff"
# The text of the error a multiplicity past 64 bits raises (see :mod:`.errors`).
MULTIPLICITY_OVERFLOW = "tidemark: a multiplicity does not fit in 64 bits"
INT64_SUM_OVERFLOW = "tidemark: a SUM of BIGINT in one group passes multiplicities of 2^42"
"""Raised where a BIGINT sum's exact total is lost (``aggregates._int64_sum``)."""

_SIMPLE: dict[ColumnType, S.DataType] = {
    ColumnType.BOOL: S.BooleanType(),
    ColumnType.INT64: S.LongType(),
    ColumnType.FLOAT64: S.DoubleType(),
    ColumnType.TEXT: S.StringType(),
    ColumnType.JSON: S.StringType(),
    ColumnType.BYTES: S.BinaryType(),
    ColumnType.DATE: S.DateType(),
    # Naive UTC: the session time zone never shifts these.
    ColumnType.TIMESTAMP: S.TimestampNTZType(),
}


def spark_type(scalar: ScalarType) -> S.DataType:
    """The Spark type holding values of ``scalar`` exactly (a decimal keeps its precision
    and scale)."""
    if scalar.kind is ColumnType.DECIMAL:
        return S.DecimalType(scalar.precision, scalar.scale)
    return _SIMPLE[scalar.kind]


def checked(total: Column, overflowed: Column | None = None) -> Column:
    """``total`` (a ``try_`` sum or product of diffs, NULL on overflow), failing the query on
    overflow whatever the session's ANSI mode: a wrapped multiplicity would be a wrong
    answer. ``overflowed`` tells overflow from another NULL when there can be one."""
    condition = total.isNull() if overflowed is None else overflowed
    return F.when(condition, F.raise_error(F.lit(MULTIPLICITY_OVERFLOW))).otherwise(total)


def diff_sum(diff: Column) -> Column:
    """The sum of diffs as an aggregate, checked for overflow (a global aggregate over no
    rows is NULL too, and stays NULL)."""
    total = F.try_sum(diff)
    return checked(total, total.isNull() & (F.count(F.lit(1)) > 0))


_result_types: dict[tuple[str, str, str], S.DataType] = {}
_result_types_lock = threading.Lock()


def result_type(
    spark: SparkSession,
    operation: str,
    build: Callable[[Column, Column], Column],
    left: S.DataType,
    right: S.DataType,
) -> S.DataType:
    """The type Spark's analyser gives ``build(x, y)`` for ``x`` of type ``left`` and ``y`` of
    ``right`` (decimal arithmetic: its precision and scale rules). Asked of Spark itself, on
    an empty frame of those two types (analysing the query's own plan for every expression
    costs far more), once per operation and types in a process."""
    key = (operation, left.simpleString(), right.simpleString())
    with _result_types_lock:
        known = _result_types.get(key)
    if known is not None:
        return known
    probe = spark.range(0, 0, 1, 1).select(
        F.lit(None).cast(left).alias("x"), F.lit(None).cast(right).alias("y")
    )
    found = probe.select(build(F.col("x"), F.col("y")).alias("r")).schema.fields[0].dataType
    with _result_types_lock:
        _result_types[key] = found
    return found


def name(position: int) -> str:
    return f"c{position}"


def spark_schema(types: Sequence[ScalarType], names: Sequence[str] | None = None) -> S.StructType:
    """The struct of a relation of ``types`` (every field nullable: Spark's nullability is a
    hint the plan's own types already carry), then ``diff``."""
    labels = list(names) if names is not None else [name(i) for i in range(len(types))]
    fields = [S.StructField(n, spark_type(t), True) for n, t in zip(labels, types, strict=True)]
    return S.StructType([*fields, S.StructField(DIFF, S.LongType(), False)])


@dataclass(frozen=True)
class Rel:
    """A lowered relation: ``df`` laid out as above, and the plan type of each column."""

    df: DataFrame
    types: list[ScalarType]
    # Each row at most once, with a non-zero diff (so consolidating again would be a no-op).
    consolidated_already: bool = False
    # Set on a consolidated relation when no two of its rows agree on these columns (a Reduce's
    # group key, say): a projection keeping them keeps the rows distinct. None: the whole row.
    unique: tuple[int, ...] | None = None

    @property
    def width(self) -> int:
        return len(self.types)

    def columns(self) -> list[Column]:
        return [F.col(name(i)) for i in range(self.width)]

    def key(self) -> tuple[int, ...] | None:
        """Columns on which no two rows agree, if the relation is consolidated."""
        if not self.consolidated_already:
            return None
        return tuple(range(self.width)) if self.unique is None else self.unique

    def with_df(self, df: DataFrame, consolidated: bool = False) -> Rel:
        """``df`` with this relation's columns; ``consolidated``: rows as distinct as here."""
        if consolidated and self.consolidated_already:
            return Rel(df, self.types, True, self.unique)
        return Rel(df, self.types, consolidated)

    def consolidated(self) -> Rel:
        """Each distinct row once, with its total multiplicity; zero totals dropped. Grouping
        treats NULLs as equal and normalises NaN and -0.0, as the contract's equality does."""
        if self.consolidated_already:
            return self
        totals = self.df.groupBy(*self.columns()).agg(diff_sum(F.col(DIFF)).alias(DIFF))
        df = totals.where(F.col(DIFF) != 0)
        return self.with_df(df, consolidated=True)
