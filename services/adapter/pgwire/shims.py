"""What the wire front end answers itself rather than the adapter's SQL: catalog queries
(``pg_catalog``, ``information_schema``, ``version()``, ``current_schema()`` ...) through
``catalog_sql`` over the adapter's catalog, ``SHOW`` of the server's fixed parameters, and the
savepoint statements drivers wrap work in (accepted; Tidemark transactions have no savepoints,
a failed statement still fails the whole transaction).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import sqlglot.errors

from services.adapter.catalog_cache import CatalogState
from services.adapter.executor import SessionState
from services.adapter.pgwire.catalog_sql import Interpreter, Unsupported
from services.adapter.pgwire.catalog_tables import CatalogTables
from services.adapter.pgwire.outcome import Result
from services.adapter.privileges import Privileges, visible_view
from services.adapter.results import output_columns, sql_value
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.errors import SqlError
from tidemark.logging import get_logger
from tidemark.v1 import adapter_pb2

if TYPE_CHECKING:
    from services.adapter.pgwire.connection import Connection
    from services.adapter.service import Adapter

log = get_logger("services.adapter.pgwire")

CATALOG_QUERY = re.compile(
    r"\b(pg_catalog\s*\.|information_schema\s*\.|pg_(class|type|namespace|attribute|database|"
    r"index|am|roles|user|settings|description|proc|tablespace|extension|constraint)\b)"
    r"|\b(version|current_schema|current_schemas|current_database|pg_backend_pid|to_regtype|"
    r"to_regclass|has_\w+_privilege|current_setting)\s*\(|^\s*select\s+current_(user|schema)\b",
    re.IGNORECASE,
)
SHOW = re.compile(r"\s*SHOW\s+(\w+)\s*;?\s*\Z", re.IGNORECASE)
SAVEPOINT = re.compile(
    r"\s*(SAVEPOINT|RELEASE(?:\s+SAVEPOINT)?|ROLLBACK\s+TO(?:\s+SAVEPOINT)?)\s+(\"[^\"]+\"|\w+)\s*;?\s*\Z",
    re.IGNORECASE,
)
DISCARD = re.compile(r"\s*DISCARD\s+ALL\s*;?\s*\Z", re.IGNORECASE)
# Settings drivers set at connect time that change nothing Tidemark sends (JDBC's
# extra_float_digits: floats are always sent exactly; bytea is always hex).
CLIENT_ONLY_SET = re.compile(
    r"\s*SET\s+(?:SESSION\s+)?(extra_float_digits|bytea_output|intervalstyle|lc_messages)"
    r"\s*(?:=|TO)\s*'?([\w-]+)'?\s*;?\s*\Z",
    re.IGNORECASE,
)
FIXED_PARAMETERS = {
    "server_encoding": "UTF8",
    "standard_conforming_strings": "on",
    "integer_datetimes": "on",
    "is_superuser": "off",
    "max_identifier_length": "63",
    "lc_collate": "C",
    "lc_ctype": "C",
    "intervalstyle": "postgres",
}
FEATURE_NOT_SUPPORTED = "0A000"


class CatalogShims:
    def __init__(self, adapter: Adapter, connection: Connection) -> None:
        self.adapter = adapter
        self.connection = connection

    async def _state(self) -> CatalogState:
        return await self.adapter.executor.catalog_state()

    async def catalog_view(self) -> CatalogView:
        """The catalog as this connection's role may see it."""
        return visible_view(await self._state(), self.connection.session.principal)

    async def query_columns(
        self, select: ast.Select, settings: Settings
    ) -> list[adapter_pb2.SqlColumn]:
        state = await self._state()
        planned = self.adapter.planner.query(select.query, state, settings)
        # Describing a statement tells its columns: only to whoever may run it.
        Privileges.of(state, self.connection.session.principal).require_read(
            planned.depends_on, select.position
        )
        return output_columns(planned)

    def _fixed(self, name: str) -> str | None:
        lowered = name.lower()
        if lowered == "is_superuser":
            return "on" if self.connection.superuser else "off"
        if lowered == "server_version":
            return self.connection.server.server_version
        if lowered == "server_version_num":
            major, _, minor = self.connection.server.server_version.partition(".")
            return f"{int(major) * 10000 + int(minor or 0)}"
        return FIXED_PARAMETERS.get(lowered)

    def recognises(self, text: str) -> bool:
        show = SHOW.match(text)
        if show and self._fixed(show[1]) is not None:
            return True
        return bool(CATALOG_QUERY.search(text)) and text.lstrip().lower().startswith(
            ("select", "with", "(")
        )

    async def answer(self, text: str, session: SessionState) -> Result | None:
        if match := SAVEPOINT.match(text):
            word = match[1].split()[0].upper()
            if session.transaction is None:
                raise SqlError("25P01", f"{word} can only be used in transaction blocks")
            if word == "ROLLBACK":
                session.transaction.failed = False
                return Result("ROLLBACK")
            return Result(word)
        if DISCARD.match(text):
            return Result("DISCARD ALL")
        if CLIENT_ONLY_SET.match(text):
            return Result("SET")
        show = SHOW.match(text)
        if show:
            value = self._fixed(show[1])
            if value is None:
                return None
            column = adapter_pb2.SqlColumn(name=show[1].lower(), type="text")
            row = adapter_pb2.SqlRow(values=[adapter_pb2.SqlValue(text_value=value)])
            return Result("SHOW", [column], [row])
        if not self.recognises(text):
            return None
        transaction = session.transaction
        if transaction is not None and transaction.failed:
            raise SqlError(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )
        settings = session.settings
        # Each role lists only what it has some privilege on.
        view = await self.catalog_view()
        tables = CatalogTables(view, settings.database)
        search_path = [s for s in settings.search_path if view.schema(settings.database, s)]
        context = {
            "current_schema": search_path[0] if search_path else None,
            "search_path": search_path,
            "version": f"PostgreSQL {self.connection.server.server_version} (Tidemark)",
            "pid": self.connection.process_id,
            "user": session.principal.name,
        }
        try:
            names, rows = Interpreter(tables, context).run(text)
        except (Unsupported, sqlglot.errors.SqlglotError) as exc:
            log.info("pgwire_catalog_query_unsupported", sql=text[:500], error=str(exc))
            raise SqlError(
                FEATURE_NOT_SUPPORTED, f"this catalog query is not supported by Tidemark: {exc}"
            ) from None
        columns = [
            adapter_pb2.SqlColumn(name=name, type=_type_of([row[i] for row in rows]))
            for i, name in enumerate(names)
        ]
        return Result(
            f"SELECT {len(rows)}",
            columns,
            [adapter_pb2.SqlRow(values=[_value(v) for v in row]) for row in rows],
        )


def _type_of(values: list[Any]) -> str:
    for value in values:
        if value is None:
            continue
        if isinstance(value, bool):
            return "boolean"
        if isinstance(value, int):
            return "bigint"
        if isinstance(value, float):
            return "double precision"
        return "text"
    return "text"


def _value(value: Any) -> adapter_pb2.SqlValue:
    if isinstance(value, list):
        return adapter_pb2.SqlValue(text_value="{" + ",".join(str(v) for v in value) + "}")
    return sql_value(value)
