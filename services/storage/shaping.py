"""What a reader asked to see: a row filter and a column projection, applied to update
batches before they are sent.

Filtering keeps whole updates, so it commutes with consolidation. Projection can make updates
that differed only in a dropped column equal, so a projected batch is consolidated again;
that keeps each ``(row, time)`` at most once per batch, as CDCv2 requires.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tidemark.columnar import Column, ColumnType, RelationSchema, project
from tidemark.errors import InvalidArgument
from tidemark.v1 import storage_pb2

Mask = Callable[[pa.Table], pa.ChunkedArray | pa.Array]

_COMPARISONS: dict[int, Callable[..., pa.ChunkedArray]] = {
    storage_pb2.FILTER_OP_EQ: pc.equal,
    storage_pb2.FILTER_OP_NE: pc.not_equal,
    storage_pb2.FILTER_OP_LT: pc.less,
    storage_pb2.FILTER_OP_LE: pc.less_equal,
    storage_pb2.FILTER_OP_GT: pc.greater,
    storage_pb2.FILTER_OP_GE: pc.greater_equal,
}

# Which FilterValue kinds may be compared with which column types.
_KINDS: dict[ColumnType, tuple[str, ...]] = {
    ColumnType.BOOL: ("bool_value",),
    ColumnType.INT64: ("int_value",),
    ColumnType.FLOAT64: ("float_value", "int_value"),
    ColumnType.DECIMAL: ("decimal_value", "int_value"),
    ColumnType.TEXT: ("text_value",),
    ColumnType.JSON: ("text_value",),
    ColumnType.BYTES: ("bytes_value",),
    ColumnType.DATE: ("date_value",),
    ColumnType.TIMESTAMP: ("timestamp_value",),
}

_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)


@dataclass(frozen=True)
class Shape:
    """A compiled projection and filter for one schema."""

    schema: RelationSchema
    """The schema of what is sent."""
    columns: tuple[str, ...] | None
    masks: tuple[Mask, ...]

    def apply(self, table: pa.Table) -> pa.Table:
        for mask in self.masks:
            table = table.filter(mask(table))
        if self.columns is not None:
            table = project(table, self.columns)
        return table

    @property
    def is_identity(self) -> bool:
        return self.columns is None and not self.masks


def compile_shape(
    schema: RelationSchema,
    columns: Sequence[str] = (),
    row_filter: storage_pb2.RowFilter | None = None,
) -> Shape:
    """The shape for ``columns`` (none: all) and ``row_filter``; ``InvalidArgument`` for an
    unknown column, an operator without its operand or a constant of the wrong type."""
    projected = schema.project(list(columns)) if columns else schema
    keep = tuple(columns) if columns and list(columns) != schema.names else None
    masks = tuple(
        _predicate(schema, p) for p in (row_filter.predicates if row_filter is not None else ())
    )
    return Shape(projected, keep, masks)


def _predicate(schema: RelationSchema, predicate: storage_pb2.ColumnPredicate) -> Mask:
    column = schema.column(predicate.column)
    name = column.name
    op = predicate.op
    if op == storage_pb2.FILTER_OP_IS_NULL:
        return lambda table: pc.is_null(table.column(name))
    if op == storage_pb2.FILTER_OP_IS_NOT_NULL:
        return lambda table: pc.is_valid(table.column(name))
    if op == storage_pb2.FILTER_OP_IN:
        if not predicate.values:
            raise InvalidArgument(f"IN on column {name!r} needs at least one value")
        constants = [_constant(column, v).as_py() for v in predicate.values]
        values = pa.array(constants, column.arrow_type)
        return lambda table: pc.is_in(table.column(name), value_set=values)
    compare = _COMPARISONS.get(op)
    if compare is None:
        raise InvalidArgument(f"predicate on column {name!r} has no operator")
    if not predicate.HasField("value"):
        raise InvalidArgument(f"predicate on column {name!r} has no value to compare with")
    constant = _constant(column, predicate.value)
    return lambda table: compare(table.column(name), constant)


def _constant(column: Column, value: storage_pb2.FilterValue) -> pa.Scalar:
    kind = value.WhichOneof("kind")
    if kind not in _KINDS[column.type]:
        raise InvalidArgument(
            f"column {column.name!r} ({column.type.name.lower()}) cannot be compared with a "
            f"{kind or 'missing'} constant"
        )
    raw: object = getattr(value, kind)
    if kind == "decimal_value":
        try:
            raw = decimal.Decimal(value.decimal_value)
        except decimal.InvalidOperation:
            raise InvalidArgument(f"{value.decimal_value!r} is not a decimal number") from None
    elif kind == "date_value":
        raw = _EPOCH_DATE + datetime.timedelta(days=value.date_value)
    elif kind == "timestamp_value":
        raw = _EPOCH + datetime.timedelta(microseconds=value.timestamp_value)
    try:
        return pa.scalar(raw, column.arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        raise InvalidArgument(f"constant for column {column.name!r}: {exc}") from None
