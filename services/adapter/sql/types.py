"""SQL type names and Tidemark column types, both ways.

Tidemark has one type per family (plan.proto's ColumnType), so several SQL names share one:
every integer type is ``bigint`` (INT64), ``real`` and ``double precision`` are FLOAT64, and
``char``/``varchar`` are ``text``. Result columns are always named by the canonical PostgreSQL
name of their family (``adapter.proto`` SqlColumn.type).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from services.adapter.sql.errors import INVALID_PARAMETER, SYNTAX_ERROR, SqlError, not_supported
from tidemark.columnar import Column, ColumnType
from tidemark.plan.scalar_types import MAX_PRECISION, ScalarType

# A ``numeric`` with no precision is unbounded in PostgreSQL; a column declared that way
# holds 38 digits, 10 of them after the point.
UNCONSTRAINED_NUMERIC = ScalarType.decimal(MAX_PRECISION, 10)

_DT = exp.DataType.Type
_FAMILIES: dict[exp.DType, ColumnType] = {
    _DT.BIGINT: ColumnType.INT64,
    _DT.INT: ColumnType.INT64,
    _DT.SMALLINT: ColumnType.INT64,
    _DT.TINYINT: ColumnType.INT64,
    _DT.DOUBLE: ColumnType.FLOAT64,
    _DT.FLOAT: ColumnType.FLOAT64,
    _DT.TEXT: ColumnType.TEXT,
    _DT.VARCHAR: ColumnType.TEXT,
    _DT.CHAR: ColumnType.TEXT,
    _DT.NCHAR: ColumnType.TEXT,
    _DT.NVARCHAR: ColumnType.TEXT,
    _DT.BOOLEAN: ColumnType.BOOL,
    _DT.VARBINARY: ColumnType.BYTES,
    _DT.DATE: ColumnType.DATE,
    _DT.TIMESTAMP: ColumnType.TIMESTAMP,
    _DT.JSON: ColumnType.JSON,
    _DT.JSONB: ColumnType.JSON,
}

_NAMES: dict[ColumnType, str] = {
    ColumnType.BOOL: "boolean",
    ColumnType.INT64: "bigint",
    ColumnType.FLOAT64: "double precision",
    ColumnType.TEXT: "text",
    ColumnType.BYTES: "bytea",
    ColumnType.DATE: "date",
    ColumnType.TIMESTAMP: "timestamp",
    ColumnType.JSON: "jsonb",
}


@dataclass(frozen=True)
class SqlType:
    """A type written in SQL. ``unconstrained`` marks a bare ``numeric``/``decimal``, which a
    cast may narrow to what its input needs (PostgreSQL's numeric keeps every digit)."""

    type: ScalarType
    unconstrained: bool = False


def _int_param(param: exp.Expr, position: int) -> int:
    value = param.this if isinstance(param, exp.DataTypeParam) else param
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    raise SqlError(SYNTAX_ERROR, f"type modifier {param.sql()} is not an integer", position)


def sql_type(data_type: exp.DataType, position: int = 0) -> SqlType:
    """The Tidemark type of a SQL type expression; 0A000 for types Tidemark does not have."""
    kind = data_type.this
    if kind is not _DT.DECIMAL and kind not in _FAMILIES:
        raise not_supported(f"type {data_type.sql(dialect='postgres').lower()}", position)
    params = [_int_param(p, position) for p in data_type.expressions]
    if kind is _DT.DECIMAL:
        if not params:
            return SqlType(UNCONSTRAINED_NUMERIC, unconstrained=True)
        precision = params[0]
        scale = params[1] if len(params) > 1 else 0
        if len(params) > 2 or not 1 <= precision <= MAX_PRECISION or not 0 <= scale <= precision:
            raise SqlError(
                INVALID_PARAMETER,
                f"NUMERIC precision {precision} must be between 1 and {MAX_PRECISION}, and the "
                f"scale {scale} between 0 and the precision",
                position,
            )
        return SqlType(ScalarType.decimal(precision, scale))
    family = _FAMILIES.get(kind)
    if family is None:
        raise not_supported(f"type {data_type.sql(dialect='postgres').lower()}", position)
    if family is ColumnType.TIMESTAMP and params and params[0] != 6:
        raise not_supported("timestamp with a precision other than 6", position)
    return SqlType(ScalarType(family))


def parse_type_name(text: str, position: int = 0) -> SqlType:
    """The Tidemark type of a SQL type name such as ``numeric(10,2)``."""
    try:
        data_type = exp.DataType.build(text, dialect="postgres")
    except Exception:  # sqlglot raises several kinds for junk
        raise SqlError(SYNTAX_ERROR, f"type {text!r} does not exist", position) from None
    return sql_type(data_type, position)


def type_name(column: ScalarType | Column) -> str:
    """The SQL name of a column's type: boolean, bigint, double precision, numeric(p,s), text,
    bytea, date, timestamp or jsonb."""
    kind = column.kind if isinstance(column, ScalarType) else column.type
    if kind is ColumnType.DECIMAL:
        return f"numeric({column.precision or MAX_PRECISION},{column.scale})"
    return _NAMES[kind]
