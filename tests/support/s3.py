"""pytest fixtures: a real S3 HTTP endpoint (``moto_server``) for integration tests.

MinIO's server binary cannot be installed here, so tests talk to moto's S3 server: a real
HTTP server speaking the S3 protocol, reached through the same ``minio`` client and URL as
production. Fixtures:

* ``s3_server`` (session): one server shared by every test. Give each test its own bucket
  or prefix — the ``s3_url`` fixture does that — and never stop this one.
* ``fresh_s3_server`` (function): a private server a test may :meth:`~S3Server.stop` and
  :meth:`~S3Server.start` again, or :meth:`~S3Server.freeze` and :meth:`~S3Server.thaw`
  (a hung server), for outage tests.
* ``s3_url`` (function): an ``s3://`` URL for a bucket no other test uses, on ``s3_server``.
* ``tls_s3_server`` (session): a server speaking HTTPS only, with a certificate of a CA made
  for the session (tests/support/tls_certs.py); its URLs say ``secure=true&ca=...``.

Both server fixtures put test credentials in the environment (``TIDEMARK_S3_ACCESS_KEY`` /
``TIDEMARK_S3_SECRET_KEY``; moto accepts any) for as long as they live.

moto keeps everything in memory: a restarted server comes back empty, without buckets or
objects. Outage tests can therefore check "clear errors while down, works again once back"
but not persistence across the restart.
"""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.tls_certs import CertificateSet

ACCESS_KEY = "tidemark-test"
SECRET_KEY = "tidemark-test-secret"
_HOST = "127.0.0.1"
_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0


def _moto_command(host: str, port: int, tls: CertificateSet | None = None) -> list[str]:
    script = Path(sys.executable).parent / "moto_server"
    if script.exists():
        command = [str(script)]
    elif found := shutil.which("moto_server"):
        command = [found]
    else:
        command = [sys.executable, "-m", "moto.server"]
    options = [] if tls is None else ["--ssl-cert", str(tls.server.cert)]
    options += [] if tls is None else ["--ssl-key", str(tls.server.key)]
    return [*command, "-H", host, "-p", str(port), *options]


class S3Server:
    """One ``moto_server`` process on a fixed loopback port.

    ``start()`` launches it and returns once it answers HTTP; ``stop()`` terminates it;
    ``start()`` again brings it back on the same port (empty: moto's state is in memory).
    The server's output goes to :attr:`log_path`, quoted in the error if it fails to start.
    """

    def __init__(
        self, port: int | None = None, host: str = _HOST, tls: CertificateSet | None = None
    ) -> None:
        self.host = host
        self.tls = tls
        self.port = port if port is not None else free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="tidemark-moto-"))
        self.log_path = self._log_dir / "moto_server.log"

    @property
    def endpoint(self) -> str:
        """``host:port``, as the ``endpoint`` URL parameter wants it."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self.running and self._process is not None else None

    def url(self, bucket: str, prefix: str = "") -> str:
        """The ``s3://`` blob URL for ``bucket`` (and a key prefix inside it) on this server."""
        path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
        if self.tls is not None:
            return f"s3://{bucket}{path}?endpoint={self.endpoint}&secure=true&ca={self.tls.ca_file}"
        return f"s3://{bucket}{path}?endpoint={self.endpoint}&secure=false"

    def start(self) -> None:
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                _moto_command(self.host, self.port, self.tls),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_until_answering()

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited with {self._process.returncode}:\n{self._log_tail()}"
                )
            scheme, context = "http", None
            if self.tls is not None:
                scheme, context = "https", ssl.create_default_context(cafile=self.tls.ca_file)
            try:
                with urllib.request.urlopen(
                    f"{scheme}://{self.endpoint}/", timeout=2, context=context
                ):
                    return
            except urllib.error.HTTPError:
                return  # an HTTP error status is still an answer
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"moto_server did not answer on {self.endpoint} within {_START_TIMEOUT_S} s:\n"
            f"{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def freeze(self) -> None:
        """Suspend the server (SIGSTOP): it still accepts connections, answers nothing."""
        assert self._process is not None and self.running, "server is not running"
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Resume a frozen server (SIGCONT)."""
        assert self._process is not None, "server is not running"
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Terminate the server and wait until it has exited (the port is then closed)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)  # in case it is frozen
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the server and remove its log."""
        self.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)


def unique_bucket(label: str = "test") -> str:
    """A bucket name no other test uses (lowercase, S3-valid)."""
    return f"{label}-{uuid.uuid4().hex[:16]}"


@contextmanager
def s3_credentials_in_environment() -> Iterator[None]:
    """Set the credentials the blob store reads, restoring the environment afterwards."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIDEMARK_S3_ACCESS_KEY", ACCESS_KEY)
        patch.setenv("TIDEMARK_S3_SECRET_KEY", SECRET_KEY)
        yield


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server shared by the whole session. Do not stop it; use a unique bucket."""
    server = S3Server()
    with s3_credentials_in_environment():
        try:
            server.start()
            yield server
        finally:
            server.close()


@pytest.fixture(scope="session")
def tls_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server speaking HTTPS only, shared by the session; as ``s3_server``."""
    certificates = CertificateSet.create(tmp_path_factory.mktemp("s3-tls"), "s3")
    server = S3Server(tls=certificates)
    with s3_credentials_in_environment():
        try:
            server.start()
            yield server
        finally:
            server.close()


@pytest.fixture
def fresh_s3_server() -> Iterator[S3Server]:
    """A private moto S3 server for this test alone, free to be stopped and restarted."""
    server = S3Server()
    with s3_credentials_in_environment():
        try:
            server.start()
            yield server
        finally:
            server.close()


@pytest.fixture
def s3_url(s3_server: S3Server) -> str:
    """An ``s3://`` URL for a fresh bucket on the shared server."""
    return s3_server.url(unique_bucket())


__all__ = [
    "ACCESS_KEY",
    "SECRET_KEY",
    "S3Server",
    "free_port",
    "s3_credentials_in_environment",
    "unique_bucket",
]
