"""Recording oracle calls and checking them against the oracle's laws.

A history is the list of calls that completed successfully, each with the monotonic clock
reading at invocation and at completion (``time.monotonic`` is one clock for every process on
the machine). For every pair where one call completed before the other began, the laws fix
their order:

- a later ``WriteTs`` is greater than every earlier ``ReadTs``/``WriteTs`` result and every
  earlier ``ApplyWrite`` timestamp;
- a later ``ReadTs`` is at least every earlier ``ReadTs`` result and ``ApplyWrite`` timestamp
  (and, by the first rule read backwards, below every later ``WriteTs``);
- no two ``WriteTs`` calls return the same timestamp.

Failed calls are left out: a failed ``ApplyWrite`` may or may not have taken effect, and
either way it can only raise later results, which the laws allow.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["read", "write", "apply"]


@dataclass(frozen=True)
class Call:
    kind: Kind
    timeline: str
    invoked: float
    completed: float
    value: int  # the timestamp returned (read, write) or applied (apply)


class _PrefixMax:
    """For a set of calls: the largest value among calls completed before a given instant."""

    def __init__(self, calls: Iterable[Call]) -> None:
        ordered = sorted(calls, key=lambda c: c.completed)
        self.completions = [c.completed for c in ordered]
        self.best: list[Call] = []
        for c in ordered:
            if not self.best or c.value > self.best[-1].value:
                self.best.append(c)
            else:
                self.best.append(self.best[-1])

    def before(self, instant: float) -> Call | None:
        i = bisect.bisect_left(self.completions, instant)
        return self.best[i - 1] if i else None


def check_history(history: Sequence[Call]) -> list[str]:
    """Every violation of the laws, described; an empty list means the history is valid."""
    violations: list[str] = []
    by_timeline: dict[str, list[Call]] = defaultdict(list)
    for call in history:
        by_timeline[call.timeline].append(call)
    for timeline, calls in by_timeline.items():
        writes = [c for c in calls if c.kind == "write"]
        reads = [c for c in calls if c.kind == "read"]
        applies = [c for c in calls if c.kind == "apply"]
        any_result = _PrefixMax(calls)  # reads, writes and applies all bound a later WriteTs
        read_floor = _PrefixMax(reads + applies)
        for w in writes:
            earlier = any_result.before(w.invoked)
            if earlier is not None and w.value <= earlier.value:
                violations.append(
                    f"{timeline}: WriteTs -> {w.value} began after {earlier.kind} "
                    f"{earlier.value} completed, but is not greater"
                )
        for r in reads:
            earlier = read_floor.before(r.invoked)
            if earlier is not None and r.value < earlier.value:
                violations.append(
                    f"{timeline}: ReadTs -> {r.value} began after {earlier.kind} "
                    f"{earlier.value} completed, but is smaller"
                )
        seen: dict[int, Call] = {}
        for w in writes:
            if w.value in seen:
                violations.append(f"{timeline}: WriteTs returned {w.value} twice")
            seen[w.value] = w
    return violations
