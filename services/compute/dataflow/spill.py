"""Operator state past a memory budget: the coldest keys of arrangements move to local disk.

A resident task holds one shard of every dataflow installed on it, and without a bound a
state that outgrows the executor's memory gets the task killed, and with it every dataflow
on it; the rehydrated state then runs out of memory again. A :class:`StateBudget` is a
task's bound. Every arrangement attached to it counts the rows it keeps in memory against
the budget (costed like every other row in the engine, :func:`guard.row_bytes`). When a
change takes the total over the budget, the arrangements holding the most move their oldest
keys to a :class:`SpillFile` until the total is back under three quarters of the budget. A
read of a spilled key brings that key back. A dataflow over the budget keeps working,
slower: each spilled key it touches costs a read from disk.

The spill file is scratch space, not durable state: SQLite on the task's local disk with no
journal and no syncing, deleted when the task ends. A task that dies loses it with the rest
of its memory, and hydration rebuilds both. Past ``disk_limit_bytes`` the state cannot fit
at all, and the change that needed more is refused with ``ResourceExhausted``.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import struct
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from services.compute.dataflow.batch import Key, Row
from services.compute.dataflow.guard import format_bytes
from services.compute.dataflow.ordering import NAN
from tidemark.errors import ResourceExhausted

LOW_WATER = 0.75
"""Relieving stops once the budget is this full, so that a state hovering at the budget
spills in batches rather than one key per change."""

_NAN_PICKLED = b"G" + struct.pack(">d", NAN)
"""How pickle writes the engine's one NaN. State only ever holds that NaN (inputs are
normalised on the way in), so a payload without these bytes holds no NaN at all."""


class Spillable(Protocol):
    """An arrangement as its budget sees it."""

    def held_in_memory(self) -> int:
        """Estimated bytes of the rows it keeps in memory."""
        ...

    def spill_oldest(self, bytes_wanted: int) -> int:
        """Moves its oldest keys to disk until about ``bytes_wanted`` are freed; returns the
        bytes freed."""
        ...


class SpillFile:
    """Spilled keys on local disk, each stored under its arrangement and its key's hash
    (keys of equal hash share the hash and are told apart by comparing keys)."""

    def __init__(self, directory: str | None = None) -> None:
        handle, self.path = tempfile.mkstemp(prefix="tidemark-state-", suffix=".db", dir=directory)
        os.close(handle)
        # Scratch space: no journal, no fsync, one connection used by one thread at a time.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.execute(
            "CREATE TABLE spilled (arrangement INTEGER, hash INTEGER, seq INTEGER, "
            "payload BLOB, PRIMARY KEY (arrangement, hash, seq)) WITHOUT ROWID"
        )
        self._seq = 0
        self.bytes_on_disk = 0
        """The payload bytes stored (the file itself grows a little beyond)."""

    def put(self, arrangement: int, entries: Iterable[tuple[Key, dict[Row, int]]]) -> int:
        """Stores each ``(key, rows)``; returns the bytes written."""
        rows = []
        written = 0
        for key, contents in entries:
            payload = pickle.dumps((key, contents), protocol=pickle.HIGHEST_PROTOCOL)
            self._seq += 1
            rows.append((arrangement, hash(key), self._seq, payload))
            written += len(payload)
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO spilled VALUES (?, ?, ?, ?)", rows)
        self._db.execute("COMMIT")
        self.bytes_on_disk += written
        return written

    def take(self, arrangement: int, key: Key) -> dict[Row, int] | None:
        """Removes ``key``'s rows from disk and returns them (None: not spilled)."""
        found = self._db.execute(
            "SELECT seq, payload FROM spilled WHERE arrangement = ? AND hash = ?",
            (arrangement, hash(key)),
        ).fetchall()
        for seq, payload in found:
            stored_key, contents = _restored(payload)
            if stored_key == key:
                self._db.execute(
                    "DELETE FROM spilled WHERE arrangement = ? AND hash = ? AND seq = ?",
                    (arrangement, hash(key), seq),
                )
                self.bytes_on_disk -= len(payload)
                return contents  # type: ignore[no-any-return]
        return None

    def entries(self, arrangement: int) -> Iterator[tuple[Key, dict[Row, int]]]:
        """Every spilled ``(key, rows)`` of ``arrangement``, in no particular order."""
        cursor = self._db.execute(
            "SELECT payload FROM spilled WHERE arrangement = ?", (arrangement,)
        )
        for (payload,) in cursor:
            yield _restored(payload)

    def forget(self, arrangement: int) -> None:
        """Deletes everything ``arrangement`` spilled."""
        (size,) = self._db.execute(
            "SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM spilled WHERE arrangement = ?",
            (arrangement,),
        ).fetchone()
        self._db.execute("DELETE FROM spilled WHERE arrangement = ?", (arrangement,))
        self.bytes_on_disk -= size

    def close(self) -> None:
        self._db.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class StateBudget:
    """One task's memory budget for operator state, with its spill file."""

    def __init__(
        self, budget_bytes: int, *, disk_limit_bytes: int = 0, directory: str | None = None
    ) -> None:
        if budget_bytes <= 0:
            raise ValueError("a state budget needs a positive number of bytes")
        self.budget_bytes = budget_bytes
        self.disk_limit_bytes = disk_limit_bytes
        self._directory = directory
        self._file: SpillFile | None = None
        self._members: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._next_id = 0
        self.held_bytes = 0
        """Estimated bytes the attached arrangements keep in memory."""
        self.spilled_keys = 0
        """Keys moved to disk so far (a measure of how hard the budget is working)."""

    @property
    def bytes_on_disk(self) -> int:
        return 0 if self._file is None else self._file.bytes_on_disk

    @property
    def file(self) -> SpillFile:
        if self._file is None:
            self._file = SpillFile(self._directory)
        return self._file

    def attach(self, member: Spillable) -> int:
        """Counts ``member`` against the budget; returns its id in the spill file."""
        self._next_id += 1
        self._members[self._next_id] = member
        self.held_bytes += member.held_in_memory()
        return self._next_id

    def detach(self, member_id: int, held: int) -> None:
        """Stops counting a member that held ``held`` bytes, and deletes what it spilled."""
        self._members.pop(member_id, None)
        self.held_bytes -= held
        if self._file is not None:
            self._file.forget(member_id)

    def charge(self, delta_bytes: int) -> None:
        self.held_bytes += delta_bytes
        if self.held_bytes > self.budget_bytes:
            self.relieve()

    def relieve(self) -> None:
        """Spills the largest members' oldest keys until the budget is three quarters full."""
        target = int(self.budget_bytes * LOW_WATER)
        members = sorted(self._members.values(), key=lambda m: m.held_in_memory(), reverse=True)
        for member in members:
            excess = self.held_bytes - target
            if excess <= 0:
                break
            self.held_bytes -= member.spill_oldest(excess)
        if self.disk_limit_bytes and self.bytes_on_disk > self.disk_limit_bytes:
            raise ResourceExhausted(
                "the operator state of this task does not fit: it needs more than its memory "
                f"budget of {format_bytes(self.budget_bytes)} plus its disk limit of "
                f"{format_bytes(self.disk_limit_bytes)}"
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _restored(payload: bytes) -> tuple[Key, dict[Row, int]]:
    """A spilled ``(key, rows)`` as the engine holds it: unpickling makes new NaN objects, and
    NaN never equals itself, so they become the engine's one NaN again."""
    key, contents = pickle.loads(payload)
    if _NAN_PICKLED not in payload:
        return key, contents
    return _canonical(key), {_canonical(row): count for row, count in contents.items()}


def _canonical(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        NAN
        if isinstance(value, float) and value != value
        else _canonical(value)
        if isinstance(value, tuple)
        else value
        for value in row
    )
