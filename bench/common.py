"""What every benchmark needs: latency percentiles, CPU meters, and services run as their own
processes with their logs going to a file.

Benchmarks import this as ``bench.common`` (each script puts the repository root on
``sys.path`` first, so it runs as ``.venv/bin/python bench/<name>.py``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 60.0


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when it is empty)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, round(fraction * len(sorted_values)) - 1))
    return sorted_values[rank]


@dataclass(frozen=True)
class Latency:
    """How many samples, and their median and 99th percentile in milliseconds."""

    count: int
    p50_ms: float
    p99_ms: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Latency:
        ordered = sorted(seconds)
        return Latency(
            len(ordered),
            round(percentile(ordered, 0.50) * 1000, 3),
            round(percentile(ordered, 0.99) * 1000, 3),
        )


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name may contain spaces; the fields after it are fixed.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU time every core of the machine has spent busy so far (all processes)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks[:8]) - idle - iowait) / CLOCK_TICKS


def load_average() -> float:
    return os.getloadavg()[0]


class CpuMeter:
    """CPU use over a window, in percent of one core: of named groups of processes, and as
    ``other``, of everything else on the machine (other work disturbs the figures)."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self._start: dict[str, float] = {}
        self._started_at = 0.0

    def _sample(self) -> dict[str, float]:
        sample = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in self.groups.items()}
        sample["other"] = machine_busy_seconds() - sum(sample.values())
        return sample

    def start(self) -> None:
        self._start = self._sample()
        self._started_at = time.monotonic()

    def stop(self) -> dict[str, float]:
        elapsed = time.monotonic() - self._started_at
        end = self._sample()
        # Clamped: the counters advance in clock ticks, so a near-idle group can come out a
        # tick below zero.
        return {
            name: max(0, round(100 * (end[name] - self._start[name]) / elapsed)) for name in end
        }


class LoggedService:
    """``python -m <module> --listen 127.0.0.1:<port>`` with its JSON log going to a file: a
    benchmark must not spend its own CPU reading thousands of access-log lines a second."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        log_path: Path,
        *,
        port: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
        environ.update(env or {})
        self.module = module
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # closed in stop()
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", module, "--listen", f"127.0.0.1:{port}"),
                *("--log-format", "json", *args),
            ],
            cwd=REPO_ROOT,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        self.port = self._read_port()
        self.address = f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_port(self) -> int:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.stop()
            log = self.log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"{self.module} did not report its port; its log:\n{log}")
        return int(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


@contextmanager
def running_service(
    module: str,
    args: Sequence[str],
    log_path: Path,
    *,
    port: int = 0,
    env: Mapping[str, str] | None = None,
) -> Iterator[LoggedService]:
    service = LoggedService(module, args, log_path, port=port, env=env)
    try:
        yield service
    finally:
        service.stop()


class ProcessPool:
    """Client processes, spawned (not forked: the parent has gRPC threads) and reused across
    cells. Each runs ``target(conn)``: it receives jobs on ``conn`` until it receives ``None``,
    answering each with its result (or the exception it raised)."""

    def __init__(
        self, target: Callable[[multiprocessing.connection.Connection], None], size: int
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._conns: list[multiprocessing.connection.Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        for _ in range(size):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=target, args=(child_end,), daemon=True)
            process.start()
            child_end.close()
            self._conns.append(parent_end)
            self._processes.append(process)

    @property
    def size(self) -> int:
        return len(self._processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def run(self, jobs: Sequence[object | None], during: Callable[[], None]) -> list[Any]:
        """Hand job ``i`` to process ``i`` (``None``: nothing for it), call ``during`` while
        they run, and return their results in order."""
        busy = []
        for conn, job in zip(self._conns, jobs, strict=False):
            if job is not None:
                conn.send(job)
                busy.append(conn)
        during()
        results = [conn.recv() for conn in busy]
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def close(self) -> None:
        for conn in self._conns:
            with suppress(OSError):  # a client process that died has nothing to be told
                conn.send(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
