"""Runs a Tidemark service (``python -m <module>``) as a separate OS process, the way
``tidemark up`` and a deployment do: it learns the port the service bound from its stdout and
collects its JSON log lines from stderr."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0

LogRecord = dict[str, Any]


class ServiceProcess:
    """One service process: its port, its JSON log lines, and signals to stop it."""

    def __init__(
        self,
        module: str,
        args: Sequence[str] = ("--listen", "127.0.0.1:0"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.module = module
        environ = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
        environ.update(env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--log-format", "json", *args],
            cwd=REPO_ROOT,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr_lines: list[str] = []
        self._copy = _log_copy(module, self.process.pid)
        self._changed = threading.Condition()
        self._stdout: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._pump(self.process.stdout, self._stdout.put)
        self._pump(self.process.stderr, self._add_stderr, self._close_copy)
        self.port = self._read_port()
        self.address = f"127.0.0.1:{self.port}"

    def _pump(
        self, stream: IO[str], sink: Callable[[str], None], ended: Callable[[], None] = lambda: None
    ) -> None:
        def run() -> None:
            try:
                for line in stream:
                    sink(line.rstrip("\n"))
            finally:
                ended()  # closed: the process (and any child sharing it) has exited

        threading.Thread(target=run, daemon=True).start()

    def _close_copy(self) -> None:
        if self._copy is not None:
            self._copy.close()

    def _add_stderr(self, line: str) -> None:
        if self._copy is not None:
            self._copy.write(line + "\n")
            self._copy.flush()
        with self._changed:
            self.stderr_lines.append(line)
            self._changed.notify_all()

    def _read_port(self) -> int:
        try:
            line = self._stdout.get(timeout=START_TIMEOUT)
        except queue.Empty:
            self.kill()
            raise RuntimeError(
                f"{self.module} did not report its port:\n" + "\n".join(self.stderr_lines)
            ) from None
        return int(line)

    def records(self) -> list[LogRecord]:
        """The JSON log lines so far (anything else on stderr is skipped)."""
        with self._changed:
            lines = list(self.stderr_lines)
        found = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                found.append(record)
        return found

    def wait_for_record(
        self, matches: Callable[[LogRecord], bool], timeout: float = 10.0
    ) -> LogRecord:
        """The first log record ``matches`` accepts, waiting for it to be written."""
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                for record in self.records():
                    if matches(record):
                        return record
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        "no matching log record; stderr was:\n" + "\n".join(self.stderr_lines)
                    )
                self._changed.wait(left)

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class EchoProcess(ServiceProcess):
    """The echo test service (tests/support/echo_service.py) in its own process."""

    def __init__(
        self,
        args: Sequence[str] = ("--listen", "127.0.0.1:0"),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__("tests.support.echo_service", args, env)


def _log_copy(module: str, pid: int) -> IO[str] | None:
    """A file keeping the process's stderr, when ``TIDEMARK_TEST_LOGS`` names a directory:
    the services' logs (and Spark's, for compute) outlive the test that failed."""
    directory = os.environ.get("TIDEMARK_TEST_LOGS")
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    return open(os.path.join(directory, f"{module}-{pid}.log"), "a", encoding="utf-8")
