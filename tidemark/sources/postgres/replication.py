"""Logical replication from one PostgreSQL publication: the initial snapshot, then the
change stream, as batches of row changes per upstream table, each ending at an LSN.

Offsets are LSNs. The snapshot is the batch at the replication slot's consistent point; each
later batch holds one or more whole upstream transactions and ends at the last one's commit
end LSN. A batch (prev, offset] can be derived again (``replay``) as long as the slot has not
been confirmed past ``prev``, because PostgreSQL decodes from the slot's confirmed flush LSN on
and skips every transaction whose commit lies before the requested start.

Everything here blocks (psycopg2); the source runs it on a thread of its own.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import psycopg2.extras

from tidemark.columnar import Row
from tidemark.sources.postgres import pgoutput
from tidemark.sources.postgres.types import text_parser
from tidemark.sources.postgres.upstream import (
    NOT_IN_PREREQUISITE_STATE,
    ConnectionParams,
    UpstreamError,
    UpstreamTable,
    connect,
)

# How long a batch may wait for more transactions to join it, and how many changes it holds
# at most: a commit is readable in Tidemark after at most this much batching delay.
BATCH_WINDOW_S = 0.05
BATCH_MAX_CHANGES = 50_000
FEEDBACK_INTERVAL_S = 5.0


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass
class Batch:
    """Row changes (row, +1 or -1) per upstream table (``namespace.name``), up to ``offset``."""

    offset: int
    changes: dict[str, list[tuple[Row, int]]] = field(default_factory=dict)
    # Upstream commit times (Unix microseconds) of the transactions in the batch.
    commit_times_us: list[int] = field(default_factory=list)

    def add(self, table: str, row: Row, diff: int) -> None:
        self.changes.setdefault(table, []).append((row, diff))

    @property
    def size(self) -> int:
        return sum(len(c) for c in self.changes.values())


class _Decoder:
    """Turns pgoutput messages into row changes for the chosen tables."""

    def __init__(self, tables: list[UpstreamTable]) -> None:
        self.by_name = {f"{t.namespace}.{t.name}": t for t in tables}
        self.parsers = {
            key: [text_parser(c.column) for c in t.columns] for key, t in self.by_name.items()
        }
        # Relation oid -> "namespace.name" of the tables we replicate.
        self.relations: dict[int, str] = {}

    def relation(self, message: pgoutput.Relation) -> None:
        key = f"{message.namespace}.{message.name}"
        table = self.by_name.get(key)
        if table is None:
            return
        names = [c.name for c in message.columns]
        expected = [c.column.name for c in table.columns]
        if names != expected:
            raise UpstreamError(
                NOT_IN_PREREQUISITE_STATE,
                f'upstream table "{key}" changed its columns from {expected} to {names}; '
                f"drop and recreate the source",
            )
        self.relations[message.oid] = key

    def row(self, key: str, values: pgoutput.TupleData, old: Row | None = None) -> Row:
        parsers = self.parsers[key]
        out = []
        for index, value in enumerate(values):
            if value is pgoutput.UNCHANGED:
                # A TOASTed value the UPDATE kept: REPLICA IDENTITY FULL sent it in the old row.
                if old is None:
                    raise UpstreamError(
                        NOT_IN_PREREQUISITE_STATE, f"unchanged TOAST value without old row in {key}"
                    )
                out.append(old[index])
            elif value is None:
                out.append(None)
            else:
                assert isinstance(value, bytes)
                out.append(parsers[index](value.decode("utf-8")))
        return tuple(out)

    def apply(self, message: pgoutput.Message, batch: Batch) -> None:
        if isinstance(message, pgoutput.Relation):
            self.relation(message)
        elif isinstance(message, pgoutput.Insert):
            key = self.relations.get(message.relation_oid)
            if key is not None:
                batch.add(key, self.row(key, message.new), 1)
        elif isinstance(message, pgoutput.Update):
            key = self.relations.get(message.relation_oid)
            if key is not None:
                if message.old is None or message.old_is_key:
                    raise UpstreamError(
                        NOT_IN_PREREQUISITE_STATE,
                        f'an UPDATE of "{key}" came without its old row: the table needs '
                        f"REPLICA IDENTITY FULL",
                    )
                old = self.row(key, message.old)
                batch.add(key, old, -1)
                batch.add(key, self.row(key, message.new, old), 1)
        elif isinstance(message, pgoutput.Delete):
            key = self.relations.get(message.relation_oid)
            if key is not None:
                if message.old_is_key:
                    raise UpstreamError(
                        NOT_IN_PREREQUISITE_STATE,
                        f'a DELETE from "{key}" came with its key only: the table needs '
                        f"REPLICA IDENTITY FULL",
                    )
                batch.add(key, self.row(key, message.old), -1)
        elif isinstance(message, pgoutput.Truncate):
            hit = [self.relations[o] for o in message.relation_oids if o in self.relations]
            if hit:
                raise UpstreamError(
                    "0A000",
                    f"upstream TRUNCATE of {', '.join(hit)}: a PostgreSQL source cannot "
                    f"follow TRUNCATE; drop and recreate the source",
                )


class Replication:
    """One publication through one replication slot (``slot``)."""

    def __init__(
        self,
        params: ConnectionParams,
        publication: str,
        slot: str,
        tables: list[UpstreamTable],
    ) -> None:
        self.params = params
        self.publication = publication
        self.slot = slot
        self.tables = tables

    # -- the slot and the snapshot ----------------------------------------------------------

    def _replication_connection(self) -> Any:
        return connect(self.params, connection_factory=psycopg2.extras.LogicalReplicationConnection)

    def drop_slot(self) -> None:
        """Drops the slot if it exists (its WAL is then free upstream)."""
        with contextlib.closing(connect(self.params)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (self.slot,),
                )

    def snapshot(self) -> Batch:
        """A new slot (replacing an old one of the same name) and every table's contents at
        its consistent point: the batch at that LSN."""
        self.drop_slot()
        with contextlib.closing(self._replication_connection()) as repl:
            cur = repl.cursor()
            cur.execute(f'CREATE_REPLICATION_SLOT "{self.slot}" LOGICAL pgoutput EXPORT_SNAPSHOT')
            _, consistent_point, snapshot_name, _ = cur.fetchone()
            batch = Batch(parse_lsn(consistent_point))
            # The exported snapshot lives while the replication connection stays idle.
            with contextlib.closing(connect(self.params)) as conn:
                conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
                with conn.cursor() as snap:
                    snap.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                decoder = _Decoder(self.tables)
                for table in self.tables:
                    self._read_table(conn, decoder, table, batch)
                conn.rollback()
        return batch

    def _read_table(self, conn: Any, decoder: _Decoder, table: UpstreamTable, batch: Batch) -> None:
        key = f"{table.namespace}.{table.name}"
        columns = ", ".join(f'"{c.column.name}"::text' for c in table.columns)
        rows = batch.changes.setdefault(key, [])
        with conn.cursor(name=f"snapshot_{table.oid}") as cur:
            cur.itersize = 20_000
            cur.execute(f"SELECT {columns} FROM ONLY {table.qualified}")
            for values in cur:
                encoded = tuple(None if v is None else v.encode() for v in values)
                rows.append((decoder.row(key, encoded), 1))

    # -- the stream -------------------------------------------------------------------------

    def stream(
        self,
        start: int,
        confirmed: Callable[[], int],
        stopped: Callable[[], bool],
        end: int | None = None,
    ) -> Iterator[Batch]:
        """Batches after ``start``, each of whole transactions, until ``stopped()``; with
        ``end``, exactly the transactions up to that offset, as one batch. ``confirmed()``
        is the LSN the slot may forget up to, sent upstream as feedback."""
        decoder = _Decoder(self.tables)
        with contextlib.closing(self._replication_connection()) as repl:
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.slot,
                decode=False,
                start_lsn=start,
                options={"proto_version": "1", "publication_names": self.publication},
            )
            pending = Batch(start)
            open_since: float | None = None
            in_transaction = False
            last_feedback = 0.0
            while not stopped():
                now = time.monotonic()
                if now - last_feedback >= FEEDBACK_INTERVAL_S:
                    cur.send_feedback(flush_lsn=confirmed(), reply=True)
                    last_feedback = now
                message = cur.read_message()
                if message is None:
                    if end is None and pending.commit_times_us and not in_transaction:
                        if now - (open_since or now) >= BATCH_WINDOW_S:
                            yield pending
                            pending = Batch(pending.offset)
                            open_since = None
                            continue
                    wait = BATCH_WINDOW_S if pending.commit_times_us else 1.0
                    select.select([cur], [], [], wait)
                    continue
                decoded = pgoutput.decode(message.payload)
                if isinstance(decoded, pgoutput.Begin):
                    in_transaction = True
                    continue
                if isinstance(decoded, pgoutput.Commit):
                    in_transaction = False
                    pending.offset = decoded.end_lsn
                    pending.commit_times_us.append(decoded.commit_time_us)
                    if open_since is None:
                        open_since = time.monotonic()
                    if end is not None:
                        if decoded.end_lsn == end:
                            yield pending
                            return
                        if decoded.end_lsn > end:
                            raise UpstreamError(
                                NOT_IN_PREREQUISITE_STATE,
                                f"replaying up to {format_lsn(end)} met a commit at "
                                f"{format_lsn(decoded.end_lsn)} instead",
                            )
                    elif pending.size >= BATCH_MAX_CHANGES:
                        yield pending
                        pending = Batch(pending.offset)
                        open_since = None
                    continue
                decoder.apply(decoded, pending)

    def replay(self, prev: int, offset: int) -> Batch:
        """Exactly the batch (prev, offset] once more."""
        for batch in self.stream(prev, lambda: prev, lambda: False, end=offset):
            return batch
        raise AssertionError("unreachable")

    def confirm(self, lsn: int) -> None:
        """Lets the slot forget everything up to ``lsn`` now (a short replication session
        sending one feedback message), for use outside a running ``stream``."""
        with contextlib.closing(self._replication_connection()) as repl:
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.slot,
                decode=False,
                start_lsn=lsn,
                options={"proto_version": "1", "publication_names": self.publication},
            )
            cur.send_feedback(flush_lsn=lsn, reply=True, force=True)


def slot_exists(params: ConnectionParams, slot: str) -> bool:
    with contextlib.closing(connect(params)) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return cur.fetchone() is not None


def is_disconnect(error: BaseException) -> bool:
    """Whether ``error`` is the upstream going away (retry after a pause) rather than a
    problem that retrying cannot fix."""
    if isinstance(error, UpstreamError):
        return error.sqlstate == "08001"
    return isinstance(error, psycopg2.OperationalError | psycopg2.InterfaceError)
