"""Operator state past a memory budget: the coldest keys of arrangements, and the coldest
groups and rows of grouped state, move to local disk.

A resident task holds one shard of every dataflow installed on it, and without a bound a
state that outgrows the executor's memory gets the task killed, and with it every dataflow
on it; the rehydrated state then runs out of memory again. A :class:`StateBudget` is a
task's bound. Every member attached to it counts the state it keeps in memory against the
budget (costed like every other row in the engine, :func:`guard.row_bytes`): join
arrangements (``operators/arrangement.py``) and the ``SpillingMap`` that Reduce, Distinct
and top-k keep their groups or rows in (``spilling_map.py``). When a change takes the total
over the budget, the members holding the most move their oldest state to a
:class:`SpillFile` until the total is back under three quarters of the budget: an
arrangement its keys' rows (the keys stay in memory, to know without a read what is on
disk), a ``SpillingMap`` whole buckets of keys with their state. A read of something
spilled brings it back. A dataflow over the budget keeps working, slower: each spilled key
it touches costs a read from disk.

The spill file is scratch space, not durable state: an append-only file on the task's local
disk, never synced, deleted when the task ends. A task that dies loses it with the rest
of its memory, and hydration rebuilds both. Past ``disk_limit_bytes`` the state cannot fit
at all, and the change that needed more is refused with ``ResourceExhausted``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.compute.dataflow.guard import format_bytes
from services.compute.dataflow.ordering import NAN
from tidemark.errors import ResourceExhausted

COMPACT_MIN_BYTES = 64 << 20
"""A spill file smaller than this is never compacted, however much of it is garbage."""

LOW_WATER = 0.75
"""Relieving stops once the budget is this full, so that a state hovering at the budget
spills in batches rather than one key per change."""

_NAN_PICKLED = b"G" + struct.pack(">d", NAN)
"""How pickle writes the engine's one NaN. State only ever holds that NaN (inputs are
normalised on the way in), so a payload without these bytes holds no NaN at all."""


@dataclass(frozen=True)
class TaskStateBudget:
    """What a resident task may hold: ``memory_bytes`` of operator state in memory (0: no
    bound), and ``disk_bytes`` spilled past it (0: no limit), spilled where ``open`` says.
    Travels in the task's closure."""

    memory_bytes: int
    disk_bytes: int = 0
    directory: str | None = None

    def open(self) -> StateBudget | None:
        """The task's budget. It spills to ``directory``, else under Spark's local directories
        when the executor has them (on Kubernetes, the executor pod's scratch volume), else
        to the temp directory."""
        if self.memory_bytes <= 0:
            return None
        local_dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
        return StateBudget(
            self.memory_bytes,
            disk_limit_bytes=self.disk_bytes,
            directory=self.directory or (local_dirs[0] if local_dirs else None),
        )


class Spillable(Protocol):
    """State as its budget sees it (an arrangement, or the groups of a ``SpillingMap``)."""

    def held_in_memory(self) -> int:
        """Estimated bytes of the rows it keeps in memory."""
        ...

    def spill_oldest(self, bytes_wanted: int) -> int:
        """Moves its oldest keys to disk until about ``bytes_wanted`` are freed; returns the
        bytes freed."""
        ...

    @property
    def spilled(self) -> dict[Any, Location]:
        """What it spilled (keys, or buckets of keys) and where each is in the spill file."""
        ...


Location = tuple[int, int]
"""Where a spilled key's rows are in the spill file: ``(offset, length)``."""


class SpillFile:
    """Spilled state on local disk: an append-only file of pickled payloads, each an
    arrangement's key's ``{row: multiplicity}`` dict or a bucket of a ``SpillingMap``'s
    entries. Where each payload is stays in memory, in its owner's map of spilled keys (or
    buckets) to locations, so that finding out whether something was spilled costs no
    read. Reading a key back leaves its bytes behind as garbage; once the garbage outweighs
    the live bytes, ``compact`` rewrites the file."""

    def __init__(self, directory: str | None = None) -> None:
        self._fd, self.path = tempfile.mkstemp(
            prefix="tidemark-state-", suffix=".spill", dir=directory
        )
        self.end = 0
        self.live_bytes = 0
        """The bytes of rows still spilled (the file also holds garbage)."""

    def put(self, contents: Sequence[Any]) -> list[Location]:
        """Appends each payload (a key's rows, a bucket's entries); returns where each went."""
        payloads = [pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL) for rows in contents]
        locations = []
        offset = self.end
        for payload in payloads:
            locations.append((offset, len(payload)))
            offset += len(payload)
        os.pwrite(self._fd, b"".join(payloads), self.end)
        self.live_bytes += offset - self.end
        self.end = offset
        return locations

    def read(self, location: Location) -> Any:
        offset, length = location
        return _restored(os.pread(self._fd, length, offset))

    def take(self, location: Location) -> Any:
        """Reads a payload back; its bytes on disk become garbage."""
        self.live_bytes -= location[1]
        return self.read(location)

    def forget(self, locations: Iterable[Location]) -> None:
        self.live_bytes -= sum(length for _, length in locations)

    def needs_compaction(self) -> bool:
        return self.end > COMPACT_MIN_BYTES and self.end > 2 * self.live_bytes

    def compact(self, spilled: Sequence[dict[Any, Location]]) -> None:
        """Rewrites the live rows of every map in ``spilled`` to a new file, updating their
        locations in place, and deletes the old file."""
        fresh = SpillFile(os.path.dirname(self.path))
        try:
            for locations in spilled:
                keys = list(locations)
                for start in range(0, len(keys), 1024):
                    chunk = keys[start : start + 1024]
                    payloads = [
                        os.pread(self._fd, locations[key][1], locations[key][0]) for key in chunk
                    ]
                    offset = fresh.end
                    for key, payload in zip(chunk, payloads, strict=True):
                        locations[key] = (offset, len(payload))
                        offset += len(payload)
                    os.pwrite(fresh._fd, b"".join(payloads), fresh.end)
                    fresh.live_bytes += offset - fresh.end
                    fresh.end = offset
        except BaseException:
            fresh.close()
            raise
        self.close()
        self._fd, self.path = fresh._fd, fresh.path
        self.end, self.live_bytes = fresh.end, fresh.live_bytes

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


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
        self.columnar_disk_bytes = 0
        """The bytes of columnar batches moved to disk (Arrow IPC files, memory-mapped)."""

    @property
    def directory(self) -> str | None:
        return self._directory

    @property
    def bytes_on_disk(self) -> int:
        spilled = 0 if self._file is None else self._file.live_bytes
        return spilled + self.columnar_disk_bytes

    @property
    def file(self) -> SpillFile:
        if self._file is None:
            self._file = SpillFile(self._directory)
        return self._file

    def attach(self, member: Spillable) -> int:
        """Counts ``member`` against the budget; returns its id (for ``detach``)."""
        self._next_id += 1
        self._members[self._next_id] = member
        self.held_bytes += member.held_in_memory()
        return self._next_id

    def detach(self, member: Spillable, member_id: int) -> None:
        """Stops counting ``member``, whose spilled rows become garbage."""
        self._members.pop(member_id, None)
        self.held_bytes -= member.held_in_memory()
        if self._file is not None:
            self._file.forget(member.spilled.values())

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
        spill_file = self._file
        if spill_file is not None and spill_file.needs_compaction():
            spill_file.compact([member.spilled for member in self._members.values()])
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


def _restored(payload: bytes) -> Any:
    """Spilled state as the engine holds it: unpickling makes new NaN objects, and NaN never
    equals itself, so they become the engine's one NaN again."""
    contents = pickle.loads(payload)
    if _NAN_PICKLED not in payload:
        return contents
    return _canonical(contents)


_ATOMS = (type(None), bool, int, str, bytes)


def _canonical(value: Any) -> Any:
    """``value`` with every NaN in it the engine's one NaN: tuples and dicts are rebuilt,
    lists and the slotted objects operator state is made of are updated in place. Only
    payloads holding a NaN come here, so the walk's cost is rare."""
    kind = value.__class__
    if kind is float:
        return NAN if value != value else value
    if kind in _ATOMS:
        return value
    if kind is tuple:
        return tuple(_canonical(item) for item in value)
    if kind is list:
        value[:] = [_canonical(item) for item in value]
        return value
    if kind is dict:
        items = [(_canonical(k), _canonical(v)) for k, v in value.items()]
        value.clear()
        value.update(items)
        return value
    for owner in kind.__mro__:
        slots = owner.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if not name.startswith("__") and hasattr(value, name):
                setattr(value, name, _canonical(getattr(value, name)))
    return value
