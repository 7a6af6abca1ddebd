"""The ``tidemark`` command.

``tidemark up`` runs a whole Tidemark on one machine: every service as its own process on
localhost, embedded backends (SQLite consensus, a blob directory) under one data directory,
one log file per process. Ctrl-C stops them all, last started first; running it again finds
the same data.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    port: int
    args: tuple[str, ...]


def planned_services(data_dir: Path, base_port: int) -> list[ServiceSpec]:
    """The processes of a local Tidemark, in start order (each one's dependencies first)."""
    consensus = "sqlite://" + str(data_dir / "consensus.db")
    blobs = "file://" + str(data_dir / "blobs")
    oracle = f"127.0.0.1:{base_port + 1}"
    storage = f"127.0.0.1:{base_port + 2}"
    catalog = f"127.0.0.1:{base_port + 3}"
    return [
        ServiceSpec("oracle", "services.oracle", base_port + 1, ("--consensus-url", consensus)),
        ServiceSpec(
            "storage",
            "services.storage",
            base_port + 2,
            ("--consensus-url", consensus, "--blob-url", blobs),
        ),
        ServiceSpec(
            "catalog", "services.catalog", base_port + 3, ("--storage", storage, "--oracle", oracle)
        ),
        ServiceSpec(
            "compute",
            "services.compute",
            base_port + 4,
            ("--cluster", "default", "--storage", storage, "--catalog", catalog),
        ),
        ServiceSpec(
            "adapter",
            "services.adapter",
            base_port,
            ("--oracle", oracle, "--storage", storage, "--catalog", catalog),
        ),
    ]


def is_built(spec: ServiceSpec) -> bool:
    """Whether the service has a process entry point yet."""
    return importlib.util.find_spec(f"{spec.module}.__main__") is not None


class RunningService:
    def __init__(self, spec: ServiceSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.log: IO[str] = self.log_path.open("a")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                spec.module,
                "--listen",
                f"127.0.0.1:{spec.port}",
                "--log-format",
                "json",
                *spec.args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        self._port_line: list[str] = []
        self._started = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not self._started.is_set():
                self._port_line.append(line.strip())
                self._started.set()

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._started.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.spec.name} did not start; see {self.log_path}:\n{self.tail()}"
                )

    def tail(self, lines: int = 15) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def up(data_dir: Path, base_port: int) -> int:
    data_dir = data_dir.absolute()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    specs = planned_services(data_dir, base_port)
    built = [s for s in specs if is_built(s)]
    pending = [s.name for s in specs if not is_built(s)]
    print(f"tidemark: data in {data_dir}, logs in {log_dir}")
    running: list[RunningService] = []
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        for spec in built:
            service = RunningService(spec, log_dir)
            running.append(service)
            service.wait_started()
            print(f"  {spec.name:<8} grpc://127.0.0.1:{spec.port}", flush=True)
        if pending:
            print(f"  not built yet: {', '.join(pending)}")
        print("tidemark: running; Ctrl-C stops everything", flush=True)
        while not stop_requested.wait(0.5):
            for service in running:
                if service.process.poll() is not None:
                    print(
                        f"tidemark: {service.spec.name} exited "
                        f"({service.process.returncode}); see {service.log_path}",
                        file=sys.stderr,
                    )
                    return 1
        return 0
    except RuntimeError as exc:
        print(f"tidemark: {exc}", file=sys.stderr)
        return 1
    finally:
        print("tidemark: stopping", flush=True)
        for service in reversed(running):
            service.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tidemark", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="run every service on localhost")
    up_parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("TIDEMARK_DATA_DIR", "data")),
        help="where the embedded backends and the logs live [env TIDEMARK_DATA_DIR; "
        "default: ./data]",
    )
    up_parser.add_argument(
        "--base-port",
        type=int,
        default=int(os.environ.get("TIDEMARK_BASE_PORT", "6875")),
        help="the adapter listens here, the other services on the next ports "
        "[env TIDEMARK_BASE_PORT; default: 6875]",
    )
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(args.data_dir, args.base_port)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
