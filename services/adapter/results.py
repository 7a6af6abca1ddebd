"""What a client gets back: rows as ``SqlRow``/``SqlColumn``, command tags, and errors.

Values travel as ``adapter.proto`` says: booleans, integers and floats as themselves; numeric,
date, timestamp and jsonb as their text (numeric with exactly its scale's digits, timestamps as
``YYYY-MM-DD HH:MM:SS[.ffffff]``); bytea as bytes; NULL as an empty ``SqlValue``.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.adapter.sql.errors import INSUFFICIENT_PRIVILEGE, SqlError
from services.adapter.sql.planned import PlannedQuery
from services.adapter.sql.types import type_name
from tidemark.columnar import Column
from tidemark.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TidemarkError,
    Unavailable,
)
from tidemark.v1 import adapter_pb2, common_pb2

# SQLSTATE codes the adapter itself reports (the SQL layer's are in sql/errors.py).
SERIALIZATION_FAILURE = "40001"
IDENTITY_PREFIX = "tidemark://"
"""How a refusal by service identity starts: the caller's identity URI."""
DEPENDENT_OBJECTS_STILL_EXIST = "2BP01"
CONNECTION_FAILURE = "08006"
ADMIN_SHUTDOWN = "57P01"
QUERY_CANCELED = "57014"
OUT_OF_MEMORY = "53200"
INTERNAL_ERROR = "XX000"
IN_FAILED_TRANSACTION = "25P02"
ACTIVE_TRANSACTION = "25001"
NO_ACTIVE_TRANSACTION = "25P01"
READ_ONLY_TRANSACTION = "25006"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
DUPLICATE_OBJECT = "42710"
DUPLICATE_TABLE = "42P07"
UNDEFINED_OBJECT = "42704"
INVALID_PARAMETER = "22023"
FEATURE_NOT_SUPPORTED = "0A000"
PROTOCOL_VIOLATION = "08P01"


def sql_type_name(column: Column | common_pb2.Column) -> str:
    """The SQL name of a column's type."""
    return type_name(column if isinstance(column, Column) else Column.from_proto(column))


def sql_columns(
    schema: common_pb2.RelationSchema | Sequence[Column],
) -> list[adapter_pb2.SqlColumn]:
    columns: Iterable[Column | common_pb2.Column] = (
        schema.columns if isinstance(schema, common_pb2.RelationSchema) else schema
    )
    return [
        adapter_pb2.SqlColumn(name=c.name, type=sql_type_name(c), nullable=c.nullable)
        for c in columns
    ]


def output_columns(planned: PlannedQuery) -> list[adapter_pb2.SqlColumn]:
    """The columns a query's rows come with."""
    return [
        adapter_pb2.SqlColumn(name=c.name, type=c.sql_type, nullable=c.nullable)
        for c in planned.columns
    ]


def sql_value(value: Any) -> adapter_pb2.SqlValue:
    """One Python value (as Arrow hands them out) as a ``SqlValue``."""
    if value is None:
        return adapter_pb2.SqlValue()
    if isinstance(value, bool):
        return adapter_pb2.SqlValue(bool_value=value)
    if isinstance(value, int):
        return adapter_pb2.SqlValue(int_value=value)
    if isinstance(value, float):
        return adapter_pb2.SqlValue(float_value=value)
    if isinstance(value, decimal.Decimal):
        return adapter_pb2.SqlValue(text_value=decimal_text(value))
    if isinstance(value, datetime.datetime):
        return adapter_pb2.SqlValue(text_value=value.isoformat(sep=" "))
    if isinstance(value, datetime.date):
        return adapter_pb2.SqlValue(text_value=value.isoformat())
    if isinstance(value, bytes):
        return adapter_pb2.SqlValue(bytes_value=value)
    return adapter_pb2.SqlValue(text_value=str(value))


def decimal_text(value: decimal.Decimal) -> str:
    """Plain digits (never an exponent), zero unsigned."""
    text = format(value, "f")
    if text.startswith("-") and not value:
        text = text[1:]
    return text


def sql_row(row: Sequence[Any]) -> adapter_pb2.SqlRow:
    return adapter_pb2.SqlRow(values=[sql_value(v) for v in row])


def expand(rows: Iterable[tuple[tuple[Any, ...], int]]) -> list[tuple[Any, ...]]:
    """``(row, multiplicity)`` pairs as a list with each row repeated that many times.
    A negative multiplicity means the plan produced a retraction without its row: a bug."""
    out: list[tuple[Any, ...]] = []
    for row, count in rows:
        if count < 0:
            raise InvalidArgument(f"the query produced a negative multiplicity ({count}) for {row}")
        out.extend([row] * count)
    return out


def sql_error(error: SqlError) -> adapter_pb2.SqlError:
    return adapter_pb2.SqlError(
        code=error.code, message=error.message, position=error.position, hint=error.hint
    )


def error_from_backend(exc: TidemarkError, what: str = "") -> SqlError:
    """The SQL error a client sees for a failure of a backend service."""
    prefix = f"{what}: " if what else ""
    if isinstance(exc, Indeterminate):
        return SqlError(
            CONNECTION_FAILURE,
            f"{prefix}the outcome is unknown, a backend stopped answering: {exc.message}",
            hint="check whether the statement took effect before repeating it",
        )
    if isinstance(exc, Unavailable):
        return SqlError(
            CONNECTION_FAILURE,
            f"{prefix}a backend service is unavailable: {exc.message}",
            hint="the statement had no effect; retry once the service is back",
        )
    if isinstance(exc, DeadlineExceeded):
        return SqlError(QUERY_CANCELED, f"{prefix}timed out: {exc.message}")
    if isinstance(exc, Cancelled):
        return SqlError(QUERY_CANCELED, f"{prefix}cancelled: {exc.message}")
    if isinstance(exc, ResourceExhausted):
        return SqlError(
            OUT_OF_MEMORY,
            f"{prefix}out of memory: {exc.message}",
            hint="narrow the query (filters, join keys), or raise the compute cluster's "
            "--statement-memory-mb",
        )
    if isinstance(exc, Aborted):
        return SqlError(SERIALIZATION_FAILURE, f"{prefix}{exc.message}")
    if isinstance(exc, NotFound):
        return SqlError(UNDEFINED_OBJECT, f"{prefix}{exc.message}")
    if isinstance(exc, AlreadyExists):
        return SqlError(DUPLICATE_OBJECT, f"{prefix}{exc.message}")
    if isinstance(exc, FailedPrecondition):
        return SqlError(OBJECT_NOT_IN_PREREQUISITE_STATE, f"{prefix}{exc.message}")
    if isinstance(exc, InvalidArgument):
        return SqlError(INVALID_PARAMETER, f"{prefix}{exc.message}")
    if isinstance(exc, PermissionDenied) and exc.message.startswith(IDENTITY_PREFIX):
        # A service refused another by its mTLS identity: a compute cluster serves the one
        # database (tenant) its certificate names.
        return SqlError(
            INSUFFICIENT_PRIVILEGE,
            f"{prefix}{exc.message}",
            hint="with mTLS, each compute cluster serves one database: run this on a cluster "
            "whose certificate names this database (SET cluster = ...)",
        )
    if isinstance(exc, PermissionDenied):
        return SqlError(OBJECT_NOT_IN_PREREQUISITE_STATE, f"{prefix}{exc.message}")
    return SqlError(INTERNAL_ERROR, f"{prefix}{exc.message}")


# -- command tags -------------------------------------------------------------------------


def select_tag(rows: int) -> str:
    return f"SELECT {rows}"


def insert_tag(rows: int) -> str:
    return f"INSERT 0 {rows}"


def update_tag(rows: int) -> str:
    return f"UPDATE {rows}"


def delete_tag(rows: int) -> str:
    return f"DELETE {rows}"


@dataclass
class Outcome:
    """A statement that succeeded: what its ``StatementResult`` carries."""

    tag: str
    columns: list[adapter_pb2.SqlColumn] = field(default_factory=list)
    rows: list[adapter_pb2.SqlRow] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    timestamp: int = 0

    def to_proto(self) -> adapter_pb2.StatementResult:
        return adapter_pb2.StatementResult(
            tag=self.tag,
            columns=self.columns,
            rows=self.rows,
            notices=self.notices,
            timestamp=self.timestamp,
        )


def text_outcome(tag: str, names: Sequence[str], rows: Iterable[Sequence[Any]]) -> Outcome:
    """A result of text columns (SHOW, EXPLAIN)."""
    held = [tuple(row) for row in rows]
    columns = [adapter_pb2.SqlColumn(name=n, type="text", nullable=False) for n in names]
    return Outcome(tag.format(rows=len(held)), columns, [sql_row(r) for r in held])
