"""pytest fixtures: a real etcd server (the Debian ``etcd-server`` binary) for integration tests.

:class:`EtcdServer` runs one single-member etcd on free loopback ports with its own data
directory, and can be stopped, killed, frozen and restarted on the same ports and data, so
fault tests can take the server away under a running client and bring it back.

Fixtures:

- ``etcd_server`` (session scope): one server shared by every test in the session. Tests must
  keep to their own key prefix (for example ``f"test/{uuid.uuid4().hex}/"``) and must not
  stop it.
- ``fresh_etcd_server`` (function scope): a private server for tests that stop, freeze or
  restart it; it is torn down after the test.
- ``tls_etcd_server`` (session scope): like ``etcd_server``, but serving clients over TLS only
  and requiring a client certificate (``--client-cert-auth``), with certificates of a CA made
  for the session (tests/support/tls_certs.py); its ``url`` carries ``ca``, ``cert``, ``key``.

A missing binary fails the test with a clear message rather than skipping it: the
integration suite is meant to run against the real server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.tls_certs import CertificateSet

ETCD_BINARY = os.environ.get("TIDEMARK_ETCD_BINARY", "/usr/bin/etcd")

_HOST = "127.0.0.1"
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


class _PortTaken(Exception):
    pass


class EtcdServer:
    """One etcd member on loopback. Ports and data directory are fixed at construction,
    so :meth:`start` after :meth:`stop` brings back the same server with the same data."""

    def __init__(
        self, base_dir: Path, name: str = "tidemark-test", tls: CertificateSet | None = None
    ) -> None:
        self.name = name
        self.tls = tls
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "etcd.log"
        self.client_port, self.peer_port = self._pick_ports()
        self._process: subprocess.Popen[bytes] | None = None
        self._started_once = False

    @staticmethod
    def _pick_ports() -> tuple[int, int]:
        client = free_port()
        peer = free_port()
        while peer == client:
            peer = free_port()
        return client, peer

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener."""
        return f"{_HOST}:{self.client_port}"

    @property
    def url(self) -> str:
        """The consensus URL for this server (see ``tidemark.consensus.open_consensus``),
        with the TLS options a client needs when it serves TLS."""
        if self.tls is None:
            return f"etcd://{self.endpoint}"
        return f"{self.plaintext_url}?{self.tls_options}"

    @property
    def plaintext_url(self) -> str:
        """The URL without TLS options (refused by a TLS server)."""
        return f"etcd://{self.endpoint}"

    @property
    def tls_options(self) -> str:
        assert self.tls is not None
        client = self.tls.client
        return f"ca={self.tls.ca_file}&cert={client.cert}&key={client.key}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start (or restart) the server and wait until it reports healthy."""
        if self.running:
            return
        attempts = 1 if self._started_once else 3
        for attempt in range(attempts):
            try:
                self._launch()
                self._wait_healthy()
                break
            except _PortTaken as exc:
                # Another process grabbed a port between picking and binding it. Only a
                # first start may move: a restart must come back where clients expect it.
                if attempt + 1 == attempts:
                    message = f"etcd could not bind its ports:\n{self.log_tail()}"
                    raise RuntimeError(message) from exc
                shutil.rmtree(self.data_dir, ignore_errors=True)  # nothing was stored yet
                self.client_port, self.peer_port = self._pick_ports()
        self._started_once = True

    def _launch(self) -> None:
        if not os.access(ETCD_BINARY, os.X_OK):
            pytest.fail(
                f"etcd binary {ETCD_BINARY} is missing; install the Debian etcd-server "
                "package (make system-deps) or set TIDEMARK_ETCD_BINARY"
            )
        self.base_dir.mkdir(parents=True, exist_ok=True)
        client_url = f"{self._client_scheme}://{self.endpoint}"
        peer_url = f"http://{_HOST}:{self.peer_port}"
        args = [
            ETCD_BINARY,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"{self.name}={peer_url}",
            "--initial-cluster-state",
            "new",
            "--log-level",
            "warn",
        ]
        if self.tls is not None:
            args += [
                *("--cert-file", str(self.tls.server.cert)),
                *("--key-file", str(self.tls.server.key)),
                *("--trusted-ca-file", str(self.tls.ca_file)),
                "--client-cert-auth",
            ]
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                self._process = None
                if "address already in use" in self.log_tail(10):
                    raise _PortTaken
                raise RuntimeError(f"etcd exited during start-up:\n{self.log_tail()}")
            if self._is_healthy():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd not healthy after {_START_TIMEOUT_S} s:\n{self.log_tail()}")

    @property
    def _client_scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def _is_healthy(self) -> bool:
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca_file))
            context.load_cert_chain(str(self.tls.client.cert), str(self.tls.client.key))
        url = f"{self._client_scheme}://{self.endpoint}/health"
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                body = json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return bool(body.get("health") == "true")

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM, then SIGKILL if it lingers)."""
        process = self._process
        if process is None:
            return
        self.resume()  # a frozen process cannot handle SIGTERM
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None

    def kill(self) -> None:
        """Crash the server (SIGKILL): no clean shutdown, data as of the last fsync."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        self._process = None

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections stay open but nothing is answered,
        which is how requests end in timeouts rather than connection errors."""
        if self.running and self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        if self.running and self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def destroy(self) -> None:
        """Stop the server and delete its data directory."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)


@contextlib.contextmanager
def running_etcd(base_dir: Path | None = None, *, tls: bool = False) -> Iterator[EtcdServer]:
    """A started :class:`EtcdServer` for the duration of the block, destroyed afterwards.
    Without ``base_dir`` a fresh temporary directory is used. ``tls``: clients only over TLS
    with a client certificate, from certificates made in the directory."""
    owned = base_dir is None
    root = Path(tempfile.mkdtemp(prefix="tidemark-etcd-")) if base_dir is None else base_dir
    certificates = CertificateSet.create(root / "certs", "etcd") if tls else None
    server = EtcdServer(root, tls=certificates)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if owned:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd shared by the whole session; use a unique key prefix and never stop it."""
    with running_etcd(tmp_path_factory.mktemp("etcd-shared")) as server:
        yield server


@pytest.fixture(scope="session")
def tls_etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd over TLS with client certificates, shared by the session; as ``etcd_server``."""
    with running_etcd(tmp_path_factory.mktemp("etcd-tls"), tls=True) as server:
        yield server


@pytest.fixture
def fresh_etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A private etcd for one test, free to be stopped, killed, paused and restarted."""
    with running_etcd(tmp_path_factory.mktemp("etcd-fresh")) as server:
        yield server
