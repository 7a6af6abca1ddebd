"""Stopping an evaluation part-way: a cancellation flag and a memory budget, checked as the
work proceeds.

The engine runs in worker threads, which cannot be interrupted from outside. A :class:`Guard`
is how the thread's owner stops it: the owner calls :meth:`Guard.cancel` (the statement's
deadline passed, its client went away, the dataflow was dropped), and the evaluation, which
calls :meth:`Guard.check` between operators and every :data:`CHECK_EVERY` rows inside the
loops that can run long, raises :class:`~tidemark.errors.Cancelled` at its next check.

The same checks enforce a memory budget. The state an evaluation holds is estimated from the
rows it holds, not measured (measuring Python objects is far too slow to do often): the rows in
arrangements, plus the batches held between operators, plus the batch the running operator is
building, each row costed by its width (:func:`row_bytes`). Over the budget, the check raises
:class:`~tidemark.errors.ResourceExhausted`. The estimate errs high for narrow rows of small
values and low for long strings; it exists to stop a cross join before it takes the machine,
not to account for every byte.
"""

from __future__ import annotations

import time

from tidemark.errors import Cancelled, ResourceExhausted

CHECK_EVERY = 4096
"""Rows a long loop produces between two checks: a check is a few attribute reads, so this
keeps its cost out of sight while a cancelled loop stops within milliseconds."""

UPDATE_BYTES = 120
"""An ``(row, time, diff)`` update's own cost: the triple, its time and diff, the list slot
and the row tuple's header."""

VALUE_BYTES = 40
"""One column value in a row: the tuple slot and a small boxed value."""


def row_bytes(width: int) -> int:
    """The estimated cost in bytes of holding one update whose row has ``width`` columns."""
    return UPDATE_BYTES + VALUE_BYTES * width


def rows_bytes(rows: int, values: int) -> int:
    """The estimated cost of holding ``rows`` rows with ``values`` column values among them:
    :func:`row_bytes` summed over rows of mixed widths."""
    return UPDATE_BYTES * rows + VALUE_BYTES * values


def format_bytes(count: int) -> str:
    """``count`` bytes in MiB or GiB, for messages."""
    if count >= 1 << 30:
        return f"{count / (1 << 30):.1f} GiB"
    return f"{count / (1 << 20):.0f} MiB"


class Guard:
    """The cancellation flag and memory budget of one evaluation (a one-shot peek, or one
    dataflow). ``budget_bytes`` 0 means no budget; ``what`` names the evaluation in errors."""

    __slots__ = ("_reason", "budget_bytes", "cancelled_at", "held_bytes", "peak_bytes", "what")

    def __init__(self, budget_bytes: int = 0, what: str = "the evaluation") -> None:
        self.budget_bytes = budget_bytes
        self.what = what
        self.held_bytes = 0
        """Estimated bytes held outside the running operator's own output (set by the
        dataflow between operators)."""
        self.peak_bytes = 0
        """The largest estimate any check saw."""
        self._reason: str | None = None
        self.cancelled_at: float | None = None
        """When :meth:`cancel` was first called (``time.monotonic``)."""

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    def cancel(self, reason: str) -> None:
        """Makes the next check raise ``Cancelled(reason)``; callable from any thread."""
        if self._reason is None:
            self.cancelled_at = time.monotonic()
            self._reason = reason

    def check(self, extra_bytes: int = 0) -> None:
        """Raises if the evaluation was cancelled, or if ``held_bytes`` plus ``extra_bytes``
        (what the caller is building right now) exceed the budget."""
        if self._reason is not None:
            raise Cancelled(self._reason)
        total = self.held_bytes + extra_bytes
        if total > self.peak_bytes:
            self.peak_bytes = total
        if self.budget_bytes and total > self.budget_bytes:
            raise ResourceExhausted(
                f"{self.what} needs more than its memory budget of "
                f"{format_bytes(self.budget_bytes)} (it holds about {format_bytes(total)})"
            )


class _Unguarded(Guard):
    """Shared by every evaluation built without a guard of its own, so it cannot be
    cancelled: a cancel meant for one of them would stop all the others."""

    __slots__ = ()

    def cancel(self, reason: str) -> None:
        pass


UNGUARDED: Guard = _Unguarded()
"""The guard of evaluations nobody stops and that have no budget (tests, tools)."""
