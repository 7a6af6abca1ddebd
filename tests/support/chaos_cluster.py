"""A whole Tidemark on production-like backends whose processes the chaos suite can kill -9 and
restart one at a time: a 3-member etcd cluster, the S3 endpoint (behind a TCP forwarder, see
tests/support/tcp_proxy.py), oracle, storage, catalog, one compute process and two adapters.

Every process listens on a port chosen once, so a restarted one comes back where its clients
look for it. The cluster restarts only what the caller killed: it does not supervise.

::

    with chaos_cluster(tmp_path) as cluster:
        cluster.kill("storage")
        cluster.restart("storage")
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.etcd import ETCD_BINARY
from tests.support.ports import free_port
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, S3Server
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS
from tidemark.session_keys import ensure_keys_file

S3_ENV = {"TIDEMARK_S3_ACCESS_KEY": ACCESS_KEY, "TIDEMARK_S3_SECRET_KEY": SECRET_KEY}
ETCD_MEMBERS = 3
START_TIMEOUT_S = 60.0


class EtcdMember:
    """One member of a loopback etcd cluster; a restart reuses its data directory."""

    def __init__(self, name: str, directory: Path, client_port: int, peer_port: int) -> None:
        self.name = name
        self.directory = directory
        self.client_port = client_port
        self.peer_port = peer_port
        self.process: subprocess.Popen[bytes] | None = None
        self.initial_cluster = ""

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        client_url = f"http://{self.endpoint}"
        args = [
            ETCD_BINARY,
            *("--name", self.name, "--data-dir", str(self.directory / "data")),
            *("--listen-client-urls", client_url, "--advertise-client-urls", client_url),
            *("--listen-peer-urls", self.peer_url),
            *("--initial-advertise-peer-urls", self.peer_url),
            *("--initial-cluster", self.initial_cluster, "--initial-cluster-state", "new"),
            *("--initial-cluster-token", "tidemark-chaos", "--log-level", "warn"),
        ]
        with open(self.directory / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class ChaosCluster:
    directory: Path
    engine: str = "local"
    backends: str = "production"  # or "embedded": SQLite files and a local blob directory
    spark_master: str = "local[2]"
    etcd: list[EtcdMember] = field(default_factory=list)
    s3: S3Server | None = None
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    bucket: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:12]}")

    # -- addresses ---------------------------------------------------------------------------

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def adapters(self) -> list[str]:
        return [self.address("adapter0"), self.address("adapter1")]

    def consensus_url(self, user: str) -> str:
        if self.backends == "embedded":
            return f"sqlite://{self.directory / (user + '.db')}"
        return "etcd://" + ",".join(m.endpoint for m in self.etcd)

    def blob_url(self) -> str:
        if self.backends == "embedded":
            return f"file://{self.directory / 'blobs'}"
        return f"s3://{self.bucket}?endpoint={self.address('s3')}&secure=false"

    @property
    def fault_kinds(self) -> set[str]:
        """The kinds of process this cluster runs (see ``Config.faults``)."""
        kinds = {"oracle", "catalog", "storage", "compute", "adapter", "adapter1"}
        return kinds | ({"etcd", "s3"} if self.backends == "production" else set())

    @property
    def killable(self) -> list[str]:
        """Every process name :meth:`kill` accepts."""
        return [*self.processes, *(m.name for m in self.etcd)]

    # -- starting ----------------------------------------------------------------------------

    def start(self) -> None:
        services = ["oracle", "storage", "catalog", "compute", "adapter0", "adapter1"]
        if self.backends == "production":
            self._start_backends()
            services.insert(0, "s3")
        for name in services:
            self.ports[name] = free_port()
        for name in services:
            self.restart(name)

    def _start_backends(self) -> None:
        for index in range(ETCD_MEMBERS):
            self.etcd.append(
                EtcdMember(
                    f"etcd{index}", self.directory / f"etcd{index}", free_port(), free_port()
                )
            )
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.etcd)
        for member in self.etcd:
            member.initial_cluster = initial
            member.start()
        self.s3 = S3Server()
        self.s3.start()
        _wait_for(self._etcd_healthy, "the etcd cluster to elect a leader")

    def _etcd_healthy(self) -> bool:
        """Every member answers /health with a leader elected."""
        for member in self.etcd:
            try:
                url = f"http://{member.endpoint}/health"
                with urllib.request.urlopen(url, timeout=1) as response:
                    if json.loads(response.read()).get("health") != "true":
                        return False
            except (OSError, ValueError):
                return False
        return True

    def _args(self, name: str) -> tuple[str, list[str], dict[str, str]]:
        listen = ["--listen", self.address(name)]
        if name == "s3":
            assert self.s3 is not None
            return "tests.support.tcp_proxy", [str(self.ports["s3"]), self.s3.endpoint], {}
        if name == "oracle":
            return "services.oracle", [*listen, "--consensus-url", self.consensus_url("oracle")], {}
        if name == "storage":
            return (
                "services.storage",
                [
                    *listen,
                    *("--consensus-url", self.consensus_url("storage")),
                    *("--blob-url", self.blob_url()),
                    *("--key-prefix", "chaos/"),
                    *FAST_SETTINGS,
                ],
                S3_ENV,
            )
        if name == "catalog":
            return (
                "services.catalog",
                [*listen, "--storage", self.address("storage"), "--oracle", self.address("oracle")],
                {},
            )
        if name == "compute":
            return (
                "services.compute",
                [
                    *listen,
                    *("--cluster", "default", "--storage", self.address("storage")),
                    *("--catalog", self.address("catalog"), "--oracle", self.address("oracle")),
                    *("--engine", self.engine, "--spark-master", self.spark_master),
                    *("--spark-driver-memory", "512m", "--hold-interval", "0.2"),
                ],
                {},
            )
        if name.startswith("adapter"):
            keys = ensure_keys_file(self.directory / "session-keys")
            return (
                "services.adapter",
                [
                    *listen,
                    *("--oracle", self.address("oracle"), "--storage", self.address("storage")),
                    *("--catalog", self.address("catalog")),
                    *("--compute", f"default={self.address('compute')}"),
                    *("--peek-wait-seconds", "60"),
                    # One key for both adapters (and their restarts): sessions move freely.
                    *("--session-keys-file", str(keys)),
                ],
                {},
            )
        raise KeyError(name)

    # -- faults ------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """kill -9 one process (a service name or an etcd member's)."""
        for member in self.etcd:
            if member.name == name:
                member.kill()
                return
        self.processes[name].kill()

    def restart(self, name: str) -> None:
        """Start ``name`` again on its port (after :meth:`kill`, or for the first time)."""
        for member in self.etcd:
            if member.name == name:
                member.start()
                return
        module, args, env = self._args(name)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.processes[name] = ServiceProcess(module, args, env)
                return
            except RuntimeError:
                # A dependency that is itself down can stop a service from starting; the
                # harness brings everything back, so try again until the deadline.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
        for member in self.etcd:
            member.kill()
        if self.s3 is not None:
            self.s3.close()

    def logs(self, name: str, lines: int = 60) -> str:
        process = self.processes.get(name)
        return "\n".join(process.stderr_lines[-lines:]) if process else ""


def _wait_for(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


@contextmanager
def chaos_cluster(
    directory: Path, *, engine: str = "local", backends: str = "production"
) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(directory, engine=engine, backends=backends)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory / "etcd0", ignore_errors=True)
