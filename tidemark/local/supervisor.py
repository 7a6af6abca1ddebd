"""``tidemark up``: start the local services one after the other, keep them running, stop them.

Each service is its own process (its own process group, so the terminal's Ctrl-C reaches only
this supervisor, which then stops the services: SIGTERM to all of them, last started first, a
short grace period, SIGKILL as the last resort). A service counts as started once it reported
its port and answers the gRPC health check with SERVING; only then does the next one, which
may depend on it, start. A service that fails to start stops everything (a wrong flag or a
taken port does not get better by retrying).

Once all are up, a service that exits is restarted after a backoff
(:class:`tidemark.local.supervision.Backoff`) while the others keep serving: they retry their
calls to it until it is back. Each exit and restart is printed, and recorded in the state file
``tidemark status`` reads (:class:`tidemark.local.supervision.SupervisorState`).
Services without a ``__main__`` yet are listed and skipped.

With ``tls``, the CA and a certificate per service are written to ``<data>/tls`` first (the CA
is kept across runs, the certificates are issued afresh) and every service serves mTLS; the
supervisor's own health checks present the tools' certificate.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from tidemark.local.health import check_health, wait_until_serving
from tidemark.local.services import (
    TLS_DIR,
    ServiceSpec,
    cli_tls,
    is_built,
    planned_services,
    session_keys_path,
)
from tidemark.local.supervision import (
    STATE_FILE,
    Backoff,
    ServiceRecord,
    SupervisorState,
    exit_reason,
)
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import default_identities, write_certificates
from tidemark.session_keys import ensure_keys_file

# Compute starts a Spark session before it serves; on a busy 2-core machine that takes a while.
START_TIMEOUT_S = 180.0
# SIGTERM to SIGKILL, for all services together: Ctrl-C must stop everything promptly.
STOP_TIMEOUT_S = 5.0
POLL_S = 0.2


class ServiceFailed(RuntimeError):
    pass


class RunningService:
    """One service's process, started again by :meth:`restart` when it has exited."""

    def __init__(
        self, spec: ServiceSpec, data_dir: Path, log_dir: Path, tls: TlsSettings | None = None
    ) -> None:
        self.spec = spec
        self.tls = tls
        """What health checks present (``tidemark up --tls``)."""
        self.data_dir = data_dir
        self.log_path = log_dir / f"{spec.name}.log"
        self.log: IO[str] = self.log_path.open("a")
        self.record = ServiceRecord()
        self.crashes_in_a_row = 0
        self.restart_due: float | None = None
        """Monotonic time of the pending restart (``None``: running, or not to restart)."""
        self._started_monotonic = 0.0
        self._spawn()

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.spec.module,
                "--listen",
                self.spec.address,
                "--log-format",
                "json",
                *self.spec.args,
            ],
            # Whatever a service leaves in its working directory (Spark's) stays with the data.
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        self._started_monotonic = time.monotonic()
        self.record.pid = self.process.pid
        self.record.started_at = time.time()
        self._announced = threading.Event()
        threading.Thread(target=self._read_stdout, args=(self.process,), daemon=True).start()

    def _read_stdout(self, process: subprocess.Popen[str]) -> None:
        # The first line is the bound port; anything after it is drained so the pipe never
        # fills up and blocks the service.
        assert process.stdout is not None
        for _ in process.stdout:
            self._announced.set()

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> None:
        announced = self._announced
        if (
            not wait_until_serving(
                self.spec.address,
                timeout,
                lambda: self.running() or announced.is_set(),
                tls=self.tls,
            )
            or not self.running()
        ):
            raise ServiceFailed(
                f"{self.spec.name} did not start; see {self.log_path}:\n{self.tail()}"
            )

    def tail(self, lines: int = 15) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def exited(self, backoff: Backoff) -> float:
        """Record that the process has exited and schedule its restart; the delay."""
        self._kill_group()
        uptime = time.monotonic() - self._started_monotonic
        self.crashes_in_a_row = 1 if backoff.was_stable(uptime) else self.crashes_in_a_row + 1
        delay = backoff.delay(self.crashes_in_a_row)
        self.restart_due = time.monotonic() + delay
        self.record.last_exit = exit_reason(self.process.returncode)
        self.record.last_exit_at = time.time()
        self.record.pid = 0
        return delay

    def restart(self) -> None:
        self.restart_due = None
        self.record.restarts += 1
        self._spawn()

    def _kill_group(self) -> None:
        # Helpers the service started in its group (Spark's JVM) must not outlive it.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """Ask the process to stop (SIGTERM); :meth:`stop` finishes the job."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, deadline: float) -> None:
        """Wait for the process until ``deadline`` (monotonic), then kill what is left."""
        if self.process.poll() is None:
            try:
                self.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._kill_group()
        self.log.close()


def up(
    data_dir: Path,
    base_port: int,
    spark_master: str,
    start_timeout: float = START_TIMEOUT_S,
    backoff: Backoff | None = None,
    tls: bool = False,
) -> int:
    backoff = backoff or Backoff()
    data_dir = data_dir.absolute()
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    ensure_keys_file(session_keys_path(data_dir))
    tls_dir = data_dir / TLS_DIR if tls else None
    if tls_dir is not None:
        write_certificates(tls_dir, default_identities())
        print(f"tidemark: mTLS on, certificates in {tls_dir}", flush=True)
    health_tls = cli_tls(tls_dir) if tls_dir is not None else None
    specs = planned_services(data_dir, base_port, spark_master, tls_dir)
    built = [s for s in specs if is_built(s)]
    pending = [s.name for s in specs if not is_built(s)]
    print(f"tidemark: data in {data_dir}, logs in {log_dir}", flush=True)
    running: list[RunningService] = []
    state = SupervisorState(os.getpid(), base_port, tls=tls)
    stop_requested = threading.Event()
    # Only the waits for a service to come up are interrupted by a signal; anywhere else (say,
    # between starting a process and recording it) the signal just sets the flag.
    interruptible = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()
        if interruptible.is_set():
            raise KeyboardInterrupt

    def save_state() -> None:
        state.services = {service.spec.name: service.record for service in running}
        try:
            state.save(data_dir)
        except OSError as exc:
            print(f"tidemark: cannot write the state file: {exc}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        for spec in built:
            if stop_requested.is_set():
                return 0
            service = RunningService(spec, data_dir, log_dir, health_tls)
            running.append(service)
            save_state()
            interruptible.set()
            try:
                service.wait_serving(start_timeout)
            finally:
                interruptible.clear()
            print(spec.banner(), flush=True)
        if pending:
            print(f"  not built yet: {', '.join(pending)}", flush=True)
        print("tidemark: ready; Ctrl-C stops everything", flush=True)
        while not stop_requested.wait(POLL_S):
            if supervise(running, backoff):
                save_state()
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
            service.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for service in reversed(running):
            service.stop(deadline)
        with contextlib.suppress(OSError):
            (data_dir / STATE_FILE).unlink()
        print("tidemark: stopped", flush=True)


def supervise(running: list[RunningService], backoff: Backoff) -> bool:
    """One look at every service: record those that exited, restart those whose backoff is
    over. Whether anything changed."""
    changed = False
    for service in running:
        name = service.spec.name
        if service.restart_due is None and not service.running():
            delay = service.exited(backoff)
            print(
                f"tidemark: {name} exited ({service.record.last_exit}); restart "
                f"{service.record.restarts + 1} in {delay:g} s; see {service.log_path}",
                file=sys.stderr,
                flush=True,
            )
            changed = True
        elif service.restart_due is not None and time.monotonic() >= service.restart_due:
            service.restart()
            print(
                f"tidemark: {name} restarted (restart {service.record.restarts}, "
                f"pid {service.record.pid})",
                file=sys.stderr,
                flush=True,
            )
            changed = True
    return changed


def status(base_port: int, data_dir: Path) -> int:
    """Prints each local endpoint's health and, when a supervisor runs on ``data_dir`` with
    these ports, each service's restarts and last exit; 0 when every built service is
    serving."""
    supervised = SupervisorState.load(data_dir)
    if supervised is not None and (
        supervised.base_port != base_port or not supervised.supervisor_alive()
    ):
        supervised = None  # another run's, or a stale one
    healthy = True
    # A supervisor running with --tls serves mTLS; without one, plaintext is the guess.
    tls = cli_tls(data_dir.absolute() / TLS_DIR) if supervised and supervised.tls else None
    for spec in planned_services(data_dir, base_port):
        state = check_health(spec.address, tls=tls) if is_built(spec) else "not built"
        healthy &= state in ("SERVING", "not built")
        line = f"  {spec.name:<8} grpc://{spec.address}  {state}"
        record = supervised.services.get(spec.name) if supervised is not None else None
        if record is not None:
            line += f"  restarts={record.restarts}"
            if record.last_exit:
                when = time.strftime("%H:%M:%S", time.localtime(record.last_exit_at))
                line += f"  last exit: {record.last_exit} at {when}"
        print(line)
    return 0 if healthy else 1
