"""CPU use of process trees over a window: a Spark driver's JVM and Python workers, or a
service and everything it started, counted with the process that started them."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from bench.common import cpu_seconds, machine_busy_seconds


def process_tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and every process descended from them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    pending = list(roots)
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _cpu_by_pid(pids: Sequence[int]) -> dict[int, float]:
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = cpu_seconds(pid)
        except OSError:
            continue  # exited
    return seconds


class TreeCpuMeter:
    """CPU use over a window in percent of one core: per named group of process trees, and
    ``other`` for everything else on the machine. Groups are resolved in order and a process
    counts for the first group whose tree holds it (so ``{"compute": [pid], "bench":
    [os.getpid()]}`` leaves the compute process out of the benchmark's own tree). A process
    that starts or ends inside the window is left out of its group, and shows in ``other``."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups = dict(groups)
        self._started_at = 0.0
        self._machine = 0.0
        self._start: dict[str, dict[int, float]] = {}

    def _sample(self) -> dict[str, dict[int, float]]:
        claimed: set[int] = set()
        sample = {}
        for name, roots in self.groups.items():
            pids = [pid for pid in process_tree(roots) if pid not in claimed]
            claimed.update(pids)
            sample[name] = _cpu_by_pid(pids)
        return sample

    def start(self) -> None:
        self._start = self._sample()
        self._machine = machine_busy_seconds()
        self._started_at = time.monotonic()

    def stop(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._started_at, 1e-9)
        machine = machine_busy_seconds() - self._machine
        end = self._sample()
        result: dict[str, float] = {}
        for name, seconds in end.items():
            before = self._start.get(name, {})
            used = sum(seconds[pid] - before[pid] for pid in seconds.keys() & before.keys())
            result[name] = used
        ours = sum(result.values())
        percent: dict[str, float] = {
            name: max(0, round(100 * used / elapsed)) for name, used in result.items()
        }
        percent["other"] = max(0, round(100 * (machine - ours) / elapsed))
        return percent
