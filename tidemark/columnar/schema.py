"""Relation schemas: named, typed, nullable columns, and the Arrow schema of their updates.

A collection's data is a relation; its updates travel and rest as Arrow columns: one per
relation column, in order, then ``time`` (uint64) and ``diff`` (int64). Those two names are
therefore reserved.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

from tidemark.errors import InvalidArgument
from tidemark.v1 import common_pb2

TIME_COLUMN = "time"
DIFF_COLUMN = "diff"
RESERVED_COLUMNS = frozenset({TIME_COLUMN, DIFF_COLUMN})

TIME_TYPE = pa.uint64()
DIFF_TYPE = pa.int64()

MAX_DECIMAL_PRECISION = 38
MAX_COLUMNS = 1000
# Any text a SQL identifier could reasonably be, without control characters.
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,255}")


class ColumnType(enum.Enum):
    BOOL = common_pb2.COLUMN_TYPE_BOOL
    INT64 = common_pb2.COLUMN_TYPE_INT64
    FLOAT64 = common_pb2.COLUMN_TYPE_FLOAT64
    DECIMAL = common_pb2.COLUMN_TYPE_DECIMAL
    TEXT = common_pb2.COLUMN_TYPE_TEXT
    BYTES = common_pb2.COLUMN_TYPE_BYTES
    DATE = common_pb2.COLUMN_TYPE_DATE
    TIMESTAMP = common_pb2.COLUMN_TYPE_TIMESTAMP
    JSON = common_pb2.COLUMN_TYPE_JSON


_FIXED_ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.BOOL: pa.bool_(),
    ColumnType.INT64: pa.int64(),
    ColumnType.FLOAT64: pa.float64(),
    ColumnType.TEXT: pa.string(),
    ColumnType.BYTES: pa.binary(),
    ColumnType.DATE: pa.date32(),
    ColumnType.TIMESTAMP: pa.timestamp("us"),
    ColumnType.JSON: pa.string(),
}


@dataclass(frozen=True)
class Column:
    """One column. ``precision``/``scale`` matter for ``DECIMAL`` only (``precision`` 0 is
    read as 38)."""

    name: str
    type: ColumnType
    nullable: bool = True
    precision: int = 0
    scale: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidArgument(
                f"column name {self.name!r} must be 1 to 255 characters without control codes"
            )
        if self.name in RESERVED_COLUMNS:
            raise InvalidArgument(
                f"column name {self.name!r} is reserved for the update "
                f"{'time' if self.name == TIME_COLUMN else 'diff'} in update batches"
            )
        if not isinstance(self.type, ColumnType):
            raise InvalidArgument(f"column {self.name!r}: unknown type {self.type!r}")
        if self.type is ColumnType.DECIMAL:
            precision = self.precision or MAX_DECIMAL_PRECISION
            if not 1 <= precision <= MAX_DECIMAL_PRECISION:
                raise InvalidArgument(
                    f"column {self.name!r}: decimal precision {self.precision} is not in "
                    f"1..{MAX_DECIMAL_PRECISION}"
                )
            if not 0 <= self.scale <= precision:
                raise InvalidArgument(
                    f"column {self.name!r}: decimal scale {self.scale} is not in 0..{precision}"
                )
            object.__setattr__(self, "precision", precision)
        elif self.precision or self.scale:
            raise InvalidArgument(
                f"column {self.name!r}: precision and scale apply to decimal columns only"
            )

    @property
    def arrow_type(self) -> pa.DataType:
        if self.type is ColumnType.DECIMAL:
            return pa.decimal128(self.precision, self.scale)
        return _FIXED_ARROW_TYPES[self.type]

    def arrow_field(self) -> pa.Field:
        return pa.field(self.name, self.arrow_type, nullable=self.nullable)

    def to_proto(self) -> common_pb2.Column:
        return common_pb2.Column(
            name=self.name,
            type=self.type.value,  # type: ignore[arg-type]
            nullable=self.nullable,
            precision=self.precision,
            scale=self.scale,
        )

    @classmethod
    def from_proto(cls, proto: common_pb2.Column) -> Column:
        try:
            kind = ColumnType(proto.type)
        except ValueError:
            raise InvalidArgument(f"column {proto.name!r} has no type (got {proto.type})") from None
        return cls(proto.name, kind, proto.nullable, proto.precision, proto.scale)


@dataclass(frozen=True)
class RelationSchema:
    """The columns of a relation, in order; names are unique."""

    columns: tuple[Column, ...]

    def __init__(self, columns: Iterable[Column]) -> None:
        held = tuple(columns)
        if not held:
            raise InvalidArgument("a relation schema needs at least one column")
        if len(held) > MAX_COLUMNS:
            raise InvalidArgument(f"a relation schema has at most {MAX_COLUMNS} columns")
        seen: set[str] = set()
        for column in held:
            if not isinstance(column, Column):
                raise InvalidArgument(f"not a column: {column!r}")
            if column.name in seen:
                raise InvalidArgument(f"column name {column.name!r} appears twice")
            seen.add(column.name)
        object.__setattr__(self, "columns", held)

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise InvalidArgument(f"no column named {name!r}; the columns are {self.names}")

    def project(self, names: Sequence[str]) -> RelationSchema:
        """The schema of just ``names``, in that order."""
        if len(set(names)) != len(names):
            raise InvalidArgument(f"projection names a column twice: {list(names)}")
        return RelationSchema(self.column(name) for name in names)

    def data_schema(self) -> pa.Schema:
        """The Arrow schema of rows: the columns alone."""
        return pa.schema([column.arrow_field() for column in self.columns])

    def update_schema(self) -> pa.Schema:
        """The Arrow schema of update batches: the columns, ``time`` and ``diff``."""
        return self._update_schema

    @cached_property
    def _update_schema(self) -> pa.Schema:
        fields = [column.arrow_field() for column in self.columns]
        fields.append(pa.field(TIME_COLUMN, TIME_TYPE, nullable=False))
        fields.append(pa.field(DIFF_COLUMN, DIFF_TYPE, nullable=False))
        return pa.schema(fields)

    def to_proto(self) -> common_pb2.RelationSchema:
        return common_pb2.RelationSchema(columns=[c.to_proto() for c in self.columns])

    @classmethod
    def from_proto(cls, proto: common_pb2.RelationSchema) -> RelationSchema:
        return cls(Column.from_proto(c) for c in proto.columns)

    @classmethod
    def of(cls, *columns: tuple[str, ColumnType] | Column) -> RelationSchema:
        """Shorthand: ``RelationSchema.of(("id", ColumnType.INT64), ("name", ColumnType.TEXT))``
        (columns given as pairs are nullable)."""
        return cls(c if isinstance(c, Column) else Column(c[0], c[1]) for c in columns)
