"""What a PostgreSQL source reads upstream: the connection, the publication's tables and
their columns, checked for what logical replication into Tidemark needs.

The driver is psycopg2. psycopg 3 has no replication protocol support; psycopg2 (maintained,
with releases for every current Python and PostgreSQL) has ``LogicalReplicationConnection``
and ships as a self-contained wheel (``psycopg2-binary``), so nothing needs compiling.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions

from tidemark.columnar import Column, ColumnType, RelationSchema
from tidemark.sources.postgres.types import UnsupportedType, tidemark_column

# SQLSTATEs for what CREATE SOURCE reports.
UNDEFINED_OBJECT = "42704"
NOT_IN_PREREQUISITE_STATE = "55000"
FEATURE_NOT_SUPPORTED = "0A000"
CONNECTION_FAILURE = "08001"


class UpstreamError(Exception):
    """A reason the upstream cannot be replicated, with the SQLSTATE to report it under."""

    def __init__(self, sqlstate: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class ConnectionParams:
    host: str
    port: int
    user: str
    password: str
    database: str

    def dsn_args(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": self.database,
            "connect_timeout": 10,
            "application_name": "tidemark",
        }

    def __repr__(self) -> str:
        # The password never appears in a log line or an error.
        return (
            f"ConnectionParams(host={self.host!r}, port={self.port}, user={self.user!r}, "
            f"database={self.database!r})"
        )


@dataclass(frozen=True)
class UpstreamColumn:
    column: Column
    type_oid: int


@dataclass(frozen=True)
class UpstreamTable:
    oid: int
    namespace: str
    name: str
    columns: tuple[UpstreamColumn, ...]

    @property
    def schema(self) -> RelationSchema:
        return RelationSchema(c.column for c in self.columns)

    @property
    def key(self) -> str:
        """The subsource (upstream) name its changes go under: ``namespace.name``."""
        return f"{self.namespace}.{self.name}"

    @property
    def qualified(self) -> str:
        return f"{_quote(self.namespace)}.{_quote(self.name)}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def connect(params: ConnectionParams, **kwargs: Any) -> Any:
    """A connection; UpstreamError 08001 when PostgreSQL cannot be reached."""
    try:
        return psycopg2.connect(**params.dsn_args(), **kwargs)
    except psycopg2.OperationalError as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else "no answer"
        if params.password:
            text = text.replace(params.password, "****")
        raise UpstreamError(
            CONNECTION_FAILURE,
            f"cannot connect to PostgreSQL at {params.host}:{params.port}: {text}",
        ) from None


def check_reachable(params: ConnectionParams) -> None:
    """Opens and closes a session: UpstreamError 08001 when PostgreSQL cannot be reached or
    refuses the credentials."""
    connect(params).close()


def publication_tables(
    params: ConnectionParams,
    publication: str,
    wanted: Sequence[str] | None,
    schemas: Sequence[str] | None = None,
    text_columns: Sequence[str] = (),
) -> list[UpstreamTable]:
    """The publication's tables (only ``wanted``, each ``name`` or ``schema.name``, when
    given; only those in ``schemas``, when given), checked: the publication exists and
    publishes inserts, updates and deletes; each table has REPLICA IDENTITY FULL; each
    column type has a Tidemark counterpart, or the column is one of ``text_columns``
    (``table.column`` or ``schema.table.column``), replicated as text. UpstreamError
    otherwise."""
    with contextlib.closing(connect(params)) as conn, conn.cursor() as cur:
        cur.execute("SHOW wal_level")
        (wal_level,) = cur.fetchone()
        if wal_level != "logical":
            raise UpstreamError(
                NOT_IN_PREREQUISITE_STATE,
                f"PostgreSQL's wal_level is {wal_level}; logical replication needs logical",
                "set wal_level = logical in postgresql.conf and restart PostgreSQL",
            )
        cur.execute(
            "SELECT pubinsert AND pubupdate AND pubdelete FROM pg_publication WHERE pubname = %s",
            (publication,),
        )
        row = cur.fetchone()
        if row is None:
            raise UpstreamError(
                UNDEFINED_OBJECT,
                f'publication "{publication}" does not exist in the upstream database '
                f'"{params.database}"',
                f"create it upstream: CREATE PUBLICATION {publication} FOR ALL TABLES",
            )
        if not row[0]:
            raise UpstreamError(
                NOT_IN_PREREQUISITE_STATE,
                f'publication "{publication}" does not publish every insert, update and delete',
            )
        cur.execute(
            "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_publication_tables p "
            "JOIN pg_namespace n ON n.nspname = p.schemaname "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename "
            "WHERE p.pubname = %s ORDER BY n.nspname, c.relname",
            (publication,),
        )
        found = cur.fetchall()
        chosen = _choose(found, wanted, publication)
        if schemas is not None:
            chosen = [row for row in chosen if row[1] in set(schemas)]
        as_text = {tuple(reference.split(".")) for reference in text_columns}
        tables = []
        for oid, namespace, name, identity in chosen:
            if identity != "f":
                raise UpstreamError(
                    NOT_IN_PREREQUISITE_STATE,
                    f'table "{namespace}.{name}" does not have REPLICA IDENTITY FULL, so its '
                    f"updates and deletes do not carry the old row",
                    f"run upstream: ALTER TABLE {_quote(namespace)}.{_quote(name)} "
                    f"REPLICA IDENTITY FULL",
                )
            tables.append(_table(cur, oid, namespace, name, as_text))
        if not tables:
            raise UpstreamError(
                NOT_IN_PREREQUISITE_STATE,
                f'publication "{publication}" publishes no tables'
                + (f" in schemas {', '.join(schemas)}" if schemas is not None else ""),
            )
        _check_text_columns(tables, as_text)
        return tables


def _text_column(namespace: str, name: str, column: str, as_text: set[tuple[str, ...]]) -> bool:
    return (name, column) in as_text or (namespace, name, column) in as_text


def _check_text_columns(tables: list[UpstreamTable], as_text: set[tuple[str, ...]]) -> None:
    known: set[tuple[str, ...]] = {(t.name, c.column.name) for t in tables for c in t.columns}
    known |= {(t.namespace, t.name, c.column.name) for t in tables for c in t.columns}
    for reference in sorted(as_text - known):
        raise UpstreamError(
            "42703",
            f"TEXT COLUMNS names {'.'.join(reference)}, which is not a column of the "
            f"source's tables",
        )


def _choose(
    found: list[tuple[int, str, str, str]], wanted: Sequence[str] | None, publication: str
) -> list[tuple[int, str, str, str]]:
    if wanted is None:
        return found
    chosen = []
    for reference in wanted:
        schema, _, name = reference.rpartition(".")
        matches = [r for r in found if r[2] == name and (not schema or r[1] == schema)]
        if not matches:
            raise UpstreamError(
                UNDEFINED_OBJECT,
                f'table "{reference}" is not in publication "{publication}"',
            )
        if len(matches) > 1:
            raise UpstreamError(
                "42P09",
                f'table "{reference}" is ambiguous in publication "{publication}": name its schema',
            )
        chosen.append(matches[0])
    return chosen


def _table(
    cur: Any, oid: int, namespace: str, name: str, as_text: set[tuple[str, ...]]
) -> UpstreamTable:
    cur.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod) "
        "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (oid,),
    )
    columns = []
    for column_name, type_oid, modifier, type_name in cur.fetchall():
        if _text_column(namespace, name, column_name, as_text):
            columns.append(UpstreamColumn(Column(column_name, ColumnType.TEXT), type_oid))
            continue
        try:
            column = tidemark_column(column_name, type_oid, modifier, type_name)
        except UnsupportedType as error:
            raise UpstreamError(
                FEATURE_NOT_SUPPORTED,
                f'table "{namespace}.{name}": {error}',
                f"replicate the column as text: (PUBLICATION '...', TEXT COLUMNS "
                f"({name}.{column_name})), or leave the table out",
            ) from None
        columns.append(UpstreamColumn(column, type_oid))
    return UpstreamTable(oid, namespace, name, tuple(columns))


def drop_slot(params: ConnectionParams, slot: str, within: float = 15.0) -> None:
    """Drops replication slot ``slot`` if it exists, ending the session that streams from
    it (a sources process about to notice its source is gone). UpstreamError when that
    cannot be done within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            with contextlib.closing(connect(params)) as conn:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND active_pid IS NOT NULL",
                        (slot,),
                    )
                    cur.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s",
                        (slot,),
                    )
                    return
        except psycopg2.Error as error:
            # The slot was still active (a reader reconnected in between): try again.
            if time.monotonic() > deadline:
                raise UpstreamError(
                    NOT_IN_PREREQUISITE_STATE, str(error).strip().splitlines()[0]
                ) from None
            time.sleep(0.3)
