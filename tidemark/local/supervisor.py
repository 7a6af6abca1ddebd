"""``tidemark up``: start the local services one after the other, watch them, stop them.

Each service is its own process (its own process group, so the terminal's Ctrl-C reaches only
this supervisor, which then stops the services in reverse start order: SIGTERM, a grace period,
SIGKILL as the last resort). A service counts as started once it reported its port and answers
the gRPC health check with SERVING; only then does the next one, which may depend on it, start.
Services without a ``__main__`` yet are listed and skipped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from tidemark.local.health import check_health, wait_until_serving
from tidemark.local.services import ServiceSpec, is_built, planned_services

# Compute starts a Spark session before it serves; on a busy 2-core machine that takes a while.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


class ServiceFailed(RuntimeError):
    pass


class RunningService:
    def __init__(self, spec: ServiceSpec, data_dir: Path, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = log_dir / f"{spec.name}.log"
        self.log: IO[str] = self.log_path.open("a")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                spec.module,
                "--listen",
                spec.address,
                "--log-format",
                "json",
                *spec.args,
            ],
            # Whatever a service leaves in its working directory (Spark's) stays with the data.
            cwd=data_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        self._announced = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self) -> None:
        # The first line is the bound port; anything after it is drained so the pipe never
        # fills up and blocks the service.
        assert self.process.stdout is not None
        for _ in self.process.stdout:
            self._announced.set()

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> None:
        announced = self._announced
        if (
            not wait_until_serving(
                self.spec.address, timeout, lambda: self.running() or announced.is_set()
            )
            or not self.running()
        ):
            raise ServiceFailed(
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
        # Helpers the service started in its group (Spark's JVM) must not outlive it.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.log.close()


def up(
    data_dir: Path, base_port: int, spark_master: str, start_timeout: float = START_TIMEOUT_S
) -> int:
    data_dir = data_dir.absolute()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    specs = planned_services(data_dir, base_port, spark_master)
    built = [s for s in specs if is_built(s)]
    pending = [s.name for s in specs if not is_built(s)]
    print(f"tidemark: data in {data_dir}, logs in {log_dir}", flush=True)
    running: list[RunningService] = []
    stop_requested = threading.Event()
    # Only the waits for a service to come up are interrupted by a signal; anywhere else (say,
    # between starting a process and recording it) the signal just sets the flag.
    interruptible = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()
        if interruptible.is_set():
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        for spec in built:
            if stop_requested.is_set():
                return 0
            service = RunningService(spec, data_dir, log_dir)
            running.append(service)
            interruptible.set()
            try:
                service.wait_serving(start_timeout)
            finally:
                interruptible.clear()
            print(spec.banner(), flush=True)
        if pending:
            print(f"  not built yet: {', '.join(pending)}", flush=True)
        print("tidemark: ready; Ctrl-C stops everything", flush=True)
        while not stop_requested.wait(0.5):
            for service in running:
                if not service.running():
                    print(
                        f"tidemark: {service.spec.name} exited "
                        f"({service.process.returncode}); see {service.log_path}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
        return 0
    except ServiceFailed as exc:
        print(f"tidemark: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # Stopping must not be cut short by another Ctrl-C.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("tidemark: stopping", flush=True)
        for service in reversed(running):
            service.stop()
        print("tidemark: stopped", flush=True)


def status(base_port: int) -> int:
    """Prints each local endpoint's health; 0 when every built service is serving."""
    healthy = True
    for spec in planned_services(Path("data"), base_port):
        state = check_health(spec.address) if is_built(spec) else "not built"
        healthy &= state in ("SERVING", "not built")
        print(f"  {spec.name:<8} grpc://{spec.address}  {state}")
    return 0 if healthy else 1
