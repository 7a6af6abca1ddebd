"""Running COPY: FROM STDIN or a location into a table as one write, and a query TO STDOUT.

A COPY FROM is one write at one timestamp, like an INSERT: the whole input is decoded and
checked before anything is appended, so bad input (the error names its line and column)
leaves the table as it was, and a COPY that succeeded is durable when it answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState
from services.adapter.copying.decoding import CopyInput, decode_arrow, decode_delimited
from services.adapter.copying.files import read_location
from services.adapter.copying.options import FEATURE_NOT_SUPPORTED, CopyFormat, copy_format
from services.adapter.planning import Planner
from services.adapter.privileges import Privileges
from services.adapter.results import Outcome
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.dml import target_columns, target_table
from services.adapter.sql.errors import SqlError
from services.adapter.transactions import Transaction
from services.adapter.writes import TableWriter

ACTIVE_SQL_TRANSACTION = "25001"
BAD_COPY_FILE_FORMAT = "22P04"

StateSource = Callable[[], Awaitable[CatalogState]]


@dataclass(frozen=True)
class CopyOutput:
    """What COPY TO sends: the column names, the rows and how to write them."""

    names: list[str]
    rows: list[tuple[Any, ...]]
    format: CopyFormat
    timestamp: int


class CopyRunner:
    def __init__(self, catalog_state: StateSource, planner: Planner, writer: TableWriter) -> None:
        self.catalog_state = catalog_state
        self.planner = planner
        self.writer = writer

    async def copy_from(
        self,
        statement: ast.CopyFrom,
        settings: Settings,
        transaction: Transaction | None,
        data: bytes | None,
        principal: Principal,
    ) -> Outcome:
        if transaction is not None:
            raise SqlError(
                ACTIVE_SQL_TRANSACTION,
                "COPY FROM cannot run inside a transaction block",
                statement.position,
                hint="a COPY is a write of its own, at one timestamp",
            )
        fmt = copy_format(statement.options, location=statement.location)
        state = await self.catalog_state()
        catalog = self.planner.view(state)
        where = statement.position
        table = target_table(statement.table, catalog, settings.values, where, "copy to")
        privileges = Privileges.of(state, principal)
        privileges.require_usage_of_container(table.item, where)
        privileges.require(table.item, "INSERT", where)
        if statement.location is not None:
            # As PostgreSQL's server-side COPY FROM a file: the adapter's own access.
            privileges.require_superuser("COPY from a file or s3:// location", where)
        into = CopyInput(
            table.name[-1], table.schema, target_columns(table, statement.columns, where)
        )
        if statement.location is None:
            if data is None:
                raise SqlError(
                    FEATURE_NOT_SUPPORTED,
                    "COPY FROM STDIN needs the data from the client",
                    where,
                    hint="send it with the Adapter.CopyIn call (tidemark sql: \\copy ... FROM "
                    "'file')",
                )
            updates = await asyncio.to_thread(_decode, [("STDIN", data)], fmt, into)
        else:
            files = await read_location(statement.location)
            updates = await asyncio.to_thread(_decode, files, fmt, into)
        if updates.num_rows == 0:
            return Outcome("COPY 0")
        w = await self.writer.write_updates(table.collection_id or table.id, updates)
        return Outcome(f"COPY {updates.num_rows}", timestamp=w)


def _decode(files: Sequence[tuple[str, bytes]], fmt: CopyFormat, into: CopyInput) -> pa.Table:
    """Every file decoded (on this worker thread; Arrow's readers use their own threads too)
    into one update batch."""
    tables = []
    for name, data in files:
        if fmt.kind == "parquet":
            try:
                table = pq.read_table(pa.py_buffer(data))
            except (pa.ArrowInvalid, OSError) as exc:
                raise SqlError(
                    BAD_COPY_FILE_FORMAT, f"{name} is not a Parquet file: {exc}"
                ) from None
            tables.append(decode_arrow(table, into, name))
        else:
            tables.append(decode_delimited(data, fmt, into))
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
