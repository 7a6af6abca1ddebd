"""Consensus in one SQLite file: the embedded default, safe for several processes on one machine.

Every write is one ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock before
reading the current version, so compare-and-set is atomic across processes. WAL mode lets
readers proceed while a writer holds that lock. A single-row clock table hands out versions,
so they keep rising across deletes and re-creates.

SQLite calls block, so they run on one dedicated worker thread that owns the connection; the
event loop only awaits them.

Watches: SQLite cannot notify other processes, so one poller per store reads the clock every
``poll_interval_s`` while anyone watches; writes made through this store wake watchers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from tidemark.change_signal import ChangeSignal
from tidemark.consensus.base import (
    DEFAULT_MAX_VALUE_BYTES,
    CasResult,
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    check_expected_version,
    check_write,
    encode_key,
    encode_prefix,
)
from tidemark.errors import Indeterminate, Unavailable

T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_S = 5.0
DEFAULT_POLL_INTERVAL_S = 0.05

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS consensus_entries (
        key TEXT PRIMARY KEY,
        version INTEGER NOT NULL,
        data BLOB NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS consensus_clock (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        last_version INTEGER NOT NULL
    )""",
    "INSERT OR IGNORE INTO consensus_clock (id, last_version) VALUES (0, 0)",
)


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (``None``: no bound).

    SQLite compares TEXT as UTF-8 bytes, and UTF-8 preserves code point order, so bumping the
    last code point works; surrogates cannot be stored, so the step over them is skipped.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code <= 0x10FFFF:
            return "".join(chars) + chr(code)
    return None


class _WriteTransaction:
    """State of one ``BEGIN IMMEDIATE`` block: commit only when the write was decided."""

    def __init__(self) -> None:
        self.commit = False


class SqliteConsensus(Consensus):
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.path = os.fspath(path)
        self.busy_timeout_s = busy_timeout_s
        self.poll_interval_s = poll_interval_s
        self.max_value_bytes = max_value_bytes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidemark-sqlite")
        self._conn: sqlite3.Connection | None = None  # used only on the worker thread
        self._changes = ChangeSignal()
        self._watchers = 0
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, job: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise Unavailable(f"SQLite consensus store {self.path} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._on_worker, job)

    def _on_worker(self, job: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return job(self._connection())
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: sqlite3.Error) -> Unavailable:
        reason = str(exc)
        if "locked" in reason or "busy" in reason:
            reason += (
                f" (another connection held the write lock longer than the busy timeout of "
                f"{self.busy_timeout_s} s)"
            )
        return Unavailable(f"SQLite consensus store {self.path}: {reason}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(f"cannot create the directory for {self.path}: {exc}") from exc
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        try:
            mode = self._enable_wal(conn)
            if str(mode).lower() != "wal":
                raise Unavailable(f"SQLite file {self.path} cannot use WAL mode (got {mode})")
            # Durable on power loss, not just on process crash: these are commit decisions.
            conn.execute("PRAGMA synchronous=FULL")
            with self._write_transaction(conn) as txn:
                for statement in _SCHEMA:
                    conn.execute(statement)
                txn.commit = True
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> object:
        """Switch the file to WAL. Several processes opening a new file at once race for the
        switch, and SQLite answers the losers "locked" at once instead of waiting out the busy
        timeout (waiting could deadlock), so retry within that timeout."""
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                return mode
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    @contextlib.contextmanager
    def _write_transaction(self, conn: sqlite3.Connection) -> Iterator[_WriteTransaction]:
        """Hold the write lock for the block. Failing to take it, or failing before the
        commit, is determinate (nothing written); a failing commit is indeterminate."""
        conn.execute("BEGIN IMMEDIATE")
        txn = _WriteTransaction()
        try:
            yield txn
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        if not txn.commit:
            conn.execute("ROLLBACK")
            return
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise Indeterminate(
                f"SQLite consensus store {self.path}: commit failed, outcome unknown: {exc}"
            ) from exc

    # -- jobs (worker thread) ---------------------------------------------------------------

    @staticmethod
    def _read(conn: sqlite3.Connection, key: str) -> VersionedData | None:
        row = conn.execute(
            "SELECT version, data FROM consensus_entries WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else VersionedData(int(row[0]), bytes(row[1]))

    @staticmethod
    def _next_version(conn: sqlite3.Connection) -> int:
        (version,) = conn.execute(
            "UPDATE consensus_clock SET last_version = last_version + 1 WHERE id = 0 "
            "RETURNING last_version"
        ).fetchone()
        return int(version)

    def _compare_and_set_job(
        self, conn: sqlite3.Connection, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        with self._write_transaction(conn) as txn:
            current = self._read(conn, key)
            if (current.version if current else None) != expected_version:
                return Mismatch(current)
            version = self._next_version(conn)
            conn.execute(
                "INSERT INTO consensus_entries (key, version, data) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET version = excluded.version, data = excluded.data",
                (key, version, data),
            )
            txn.commit = True
            return Committed(version)

    def _delete_job(self, conn: sqlite3.Connection, key: str, expected_version: int) -> CasResult:
        with self._write_transaction(conn) as txn:
            current = self._read(conn, key)
            if current is None or current.version != expected_version:
                return Mismatch(current)
            # The delete spends a version so that pollers watching the clock notice it.
            self._next_version(conn)
            conn.execute("DELETE FROM consensus_entries WHERE key = ?", (key,))
            txn.commit = True
            return Committed(current.version)

    @staticmethod
    def _scan_job(conn: sqlite3.Connection, prefix: str) -> list[tuple[str, VersionedData]]:
        upper = prefix_upper_bound(prefix)
        args: tuple[str, ...]
        if upper is None:
            query, args = "WHERE key >= ?", (prefix,)
        else:
            query, args = "WHERE key >= ? AND key < ?", (prefix, upper)
        rows = conn.execute(
            f"SELECT key, version, data FROM consensus_entries {query} ORDER BY key", args
        ).fetchall()
        return [(str(key), VersionedData(int(version), bytes(data))) for key, version, data in rows]

    @staticmethod
    def _clock_job(conn: sqlite3.Connection) -> int:
        (version,) = conn.execute(
            "SELECT last_version FROM consensus_clock WHERE id = 0"
        ).fetchone()
        return int(version)

    # -- the contract -----------------------------------------------------------------------

    async def head(self, key: str) -> VersionedData | None:
        encode_key(key)
        return await self._run(lambda conn: self._read(conn, key))

    async def compare_and_set(
        self, key: str, expected_version: int | None, data: bytes
    ) -> CasResult:
        check_write(key, expected_version, data, self.max_value_bytes)
        result = await self._run(
            lambda conn: self._compare_and_set_job(conn, key, expected_version, data)
        )
        if isinstance(result, Committed):
            self._changes.notify()
        return result

    async def scan(self, prefix: str) -> list[tuple[str, VersionedData]]:
        encode_prefix(prefix)
        return await self._run(lambda conn: self._scan_job(conn, prefix))

    async def delete(self, key: str, expected_version: int) -> CasResult:
        encode_key(key)
        check_expected_version(expected_version)
        result = await self._run(lambda conn: self._delete_job(conn, key, expected_version))
        if isinstance(result, Committed):
            self._changes.notify()
        return result

    async def watch(self, key: str) -> AsyncIterator[VersionedData | None]:
        encode_key(key)
        self._watchers += 1
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_clock())
        try:
            last_seen: int | None = -1  # no version is -1: the first state is always yielded
            first = True
            while not self._closed:
                token = self._changes.token
                try:
                    state = await self.head(key)
                except Unavailable:
                    if self._closed:
                        return
                    if first:
                        raise
                    # Ride out the outage; the poller keeps trying and wakes us.
                    await self._changes.wait_past(token)
                    continue
                first = False
                version = state.version if state else None
                if version != last_seen:
                    last_seen = version
                    yield state
                await self._changes.wait_past(token)
        finally:
            self._watchers -= 1
            if self._watchers == 0 and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def _poll_clock(self) -> None:
        """Wake watchers whenever the clock moves, including writes by other processes.
        The first successful poll always wakes them, covering writes that landed between
        a watcher's read and this poller's start."""
        last: int | None = None
        while not self._closed:
            try:
                clock = await self._run(self._clock_job)
            except Unavailable:
                # Wake watchers so they re-read (and retry) as soon as the file is back.
                clock = None
                self._changes.notify()
            if clock is not None and clock != last:
                last = clock
                self._changes.notify()
            await asyncio.sleep(self.poll_interval_s)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self._changes.notify()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=False)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
