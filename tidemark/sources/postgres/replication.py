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
EMPTY_BATCH_INTERVAL_S = 5.0
SILENCE_LIMIT_S = 6 * FEEDBACK_INTERVAL_S


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

    def merge(self, other: Batch) -> None:
        """Appends ``other``, a later stretch of the stream: the offset moves to its end."""
        for key, pairs in other.changes.items():
            self.changes.setdefault(key, []).extend(pairs)
        self.commit_times_us.extend(other.commit_times_us)
        self.offset = other.offset


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
        return self._snapshot_through(self.slot, temporary=False)

    def _snapshot_through(self, slot: str, temporary: bool) -> Batch:
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        with contextlib.closing(self._replication_connection()) as repl:
            cur = repl.cursor()
            cur.execute(f'CREATE_REPLICATION_SLOT "{slot}" {kind} pgoutput EXPORT_SNAPSHOT')
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

    def _transactions(
        self,
        start: int,
        confirmed: Callable[[], int],
        stopped: Callable[[], bool],
        messages: bool = False,
    ) -> Iterator[_Transaction | _Idle]:
        """Each whole upstream transaction committed after ``start``, in commit order;
        ``_Idle`` whenever nothing has arrived for a while between transactions (so callers
        can flush or stop), with the LSN the server has decoded up to."""
        decoder = _Decoder(self.tables)
        options = {"proto_version": "1", "publication_names": self.publication}
        if messages:
            options["messages"] = "true"
        with contextlib.closing(self._replication_connection()) as repl:
            cur = repl.cursor()
            cur.start_replication(
                slot_name=self.slot, decode=False, start_lsn=start, options=options
            )
            current: _Transaction | None = None
            last_feedback = 0.0
            sent = -1
            while not stopped():
                now = time.monotonic()
                flush = confirmed()
                if flush != sent or now - last_feedback >= FEEDBACK_INTERVAL_S:
                    cur.send_feedback(flush_lsn=flush, reply=True)
                    last_feedback, sent = now, flush
                message = cur.read_message()
                if message is None:
                    # We ask for a keepalive with every feedback: a silent server is gone
                    # (a network partition does not close the socket).
                    silent = time.time() - cur.io_timestamp.timestamp()
                    if silent > SILENCE_LIMIT_S:
                        raise psycopg2.OperationalError(
                            f"no message from PostgreSQL for {silent:.0f} s"
                        )
                    if current is None:
                        # The server's keepalives carry how far it has decoded: every
                        # transaction committed before that has been sent already.
                        yield _Idle(int(cur.wal_end))
                    select.select([cur], [], [], BATCH_WINDOW_S)
                    continue
                decoded = pgoutput.decode(message.payload)
                if isinstance(decoded, pgoutput.Begin):
                    current = _Transaction(Batch(0))
                elif isinstance(decoded, pgoutput.Commit):
                    assert current is not None, "Commit without Begin"
                    current.commit = decoded
                    current.changes.offset = decoded.end_lsn
                    current.changes.commit_times_us.append(decoded.commit_time_us)
                    yield current
                    current = None
                elif isinstance(decoded, pgoutput.LogicalMessage):
                    if current is not None:
                        current.messages.append(decoded)
                else:
                    decoder.apply(decoded, current.changes if current else Batch(0))

    def stream(
        self, start: int, confirmed: Callable[[], int], stopped: Callable[[], bool]
    ) -> Iterator[Batch]:
        """Batches of whole transactions after ``start``, until ``stopped()``: a batch is
        cut once no more transactions arrive within BATCH_WINDOW_S, or at BATCH_MAX_CHANGES.
        While the publication's tables are quiet, an empty batch moves the offset to where
        the server has decoded (at most every EMPTY_BATCH_INTERVAL_S), so confirming it lets
        PostgreSQL recycle the WAL of everything else written meanwhile. ``confirmed()`` is
        the LSN the slot may forget up to, sent upstream as feedback."""
        pending = Batch(start)
        opened = 0.0
        last_cut = time.monotonic()
        for transaction in self._transactions(start, confirmed, stopped):
            if isinstance(transaction, _Transaction):
                if not pending.commit_times_us:
                    opened = time.monotonic()
                pending.merge(transaction.changes)
                if pending.size < BATCH_MAX_CHANGES and (
                    time.monotonic() - opened < BATCH_WINDOW_S
                ):
                    continue
            elif not pending.commit_times_us:
                now = time.monotonic()
                if (
                    transaction.decoded > pending.offset
                    and now - last_cut >= EMPTY_BATCH_INTERVAL_S
                ):
                    last_cut = now
                    yield Batch(transaction.decoded)
                    pending = Batch(transaction.decoded)
                continue
            last_cut = time.monotonic()
            yield pending
            pending = Batch(pending.offset)

    def replay(self, prev: int, offset: int) -> Batch:
        """Exactly the batch (prev, offset] once more: the transactions committed in it
        (none, for an empty batch cut at a keepalive's LSN)."""
        batch = Batch(prev)
        for transaction in self._transactions(prev, lambda: prev, lambda: False):
            if isinstance(transaction, _Idle):
                if transaction.decoded >= offset:
                    batch.offset = offset
                    return batch
                continue
            assert transaction.commit is not None
            if transaction.commit.end_lsn > offset:
                # The first transaction after the batch: it ended at a keepalive's LSN.
                batch.offset = offset
                return batch
            batch.merge(transaction.changes)
            if batch.offset == offset:
                return batch
        raise AssertionError("unreachable: replay never stops")

    def replay_snapshot(self, snapshot_lsn: int) -> Batch:
        """The snapshot batch at ``snapshot_lsn`` once more, after its exported snapshot is
        gone: the tables now (through a temporary slot's snapshot at L2) less every change
        of (snapshot_lsn, L2], which the source's slot still holds because nothing past
        ``snapshot_lsn`` was confirmed."""
        now = self._snapshot_through(f"{self.slot[:55]}_replay", temporary=True)
        fence = f"fence-{time.time_ns()}".encode()
        with contextlib.closing(connect(self.params)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                # A transaction after L2: once it streams by, every commit before L2 has.
                cur.execute("SELECT pg_logical_emit_message(true, 'tidemark', %s)", (fence,))
        counts: dict[str, dict[Row, int]] = {}
        for key, pairs in now.changes.items():
            table = counts.setdefault(key, {})
            for row, diff in pairs:
                table[row] = table.get(row, 0) + diff
        stream = self._transactions(snapshot_lsn, lambda: snapshot_lsn, lambda: False, True)
        for transaction in stream:
            if isinstance(transaction, _Idle):
                continue
            if any(m.content == fence for m in transaction.messages):
                break
            assert transaction.commit is not None
            if transaction.commit.commit_lsn >= now.offset:
                continue
            for key, pairs in transaction.changes.changes.items():
                table = counts.setdefault(key, {})
                for row, diff in pairs:
                    table[row] = table.get(row, 0) - diff
        batch = Batch(snapshot_lsn)
        for key in (f"{t.namespace}.{t.name}" for t in self.tables):
            rows = batch.changes.setdefault(key, [])
            for row, count in counts.get(key, {}).items():
                if count < 0:
                    raise UpstreamError(
                        NOT_IN_PREREQUISITE_STATE,
                        f"rebuilding the snapshot of {key} found a row retracted more often "
                        f"than it was there",
                    )
                rows.extend([(row, 1)] * count)
        return batch


@dataclass(frozen=True)
class _Idle:
    # The LSN the server had decoded up to at its last message.
    decoded: int


@dataclass
class _Transaction:
    changes: Batch
    commit: pgoutput.Commit | None = None
    messages: list[pgoutput.LogicalMessage] = field(default_factory=list)


def slot_exists(params: ConnectionParams, slot: str) -> bool:
    with contextlib.closing(connect(params)) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return cur.fetchone() is not None


def is_disconnect(error: BaseException) -> bool:
    """Whether ``error`` is the upstream going away (retry after a pause) rather than a
    problem that retrying cannot fix."""
    if isinstance(error, UpstreamError):
        return error.sqlstate == "08001"
    if isinstance(error, psycopg2.OperationalError | psycopg2.InterfaceError):
        return True
    # A dropped replication stream surfaces as an error without a SQLSTATE ("no COPY in
    # progress"); errors the server sends carry one and are not retried here.
    return isinstance(error, psycopg2.DatabaseError) and error.pgcode is None
