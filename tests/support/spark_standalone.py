"""A Spark standalone cluster for tests: a master and workers, each its own JVM process started
from the classes ``pyspark`` ships (``bin/spark-class``), so nothing is downloaded.

    with standalone_cluster(tmp_path, workers=2) as cluster:
        ... --spark-master cluster.master_url ...
        cluster.executor_pids(0)      # the executor JVMs worker 0 runs now

Everything binds 127.0.0.1 on free ports (``SPARK_LOCAL_IP``). Each process runs in its own
process group and is killed with it on exit, also when the test failed; each one's log is kept
in the directory and quoted when the cluster does not come up (the executors' logs are under
each worker's work directory).

Workers start with ``PYTHONPATH`` set to the repository, so the Python workers of their
executors import Tidemark as a deployment's executor image would provide it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.support.ports import free_port
from tests.support.service_process import REPO_ROOT

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_TIMEOUT = 90.0
LOG_TAIL_LINES = 40
# The daemons' own heaps: they only schedule, and the machine is small.
DAEMON_MEMORY = "256m"


@dataclass
class Daemon:
    """One JVM started by ``spark-class``: its process (the group leader) and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return _tail(self.name, self.log)

    def stop(self) -> None:
        """Kills the process group: the daemon, and for a worker the executors it started
        (also when the daemon itself is gone already)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


@dataclass
class StandaloneCluster:
    directory: Path
    master_url: str
    ui_url: str
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)

    def state(self) -> dict[str, object]:
        """The master's view of the cluster (its UI's ``/json`` page)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            decoded: dict[str, object] = json.loads(response.read())
            return decoded

    def alive_workers(self) -> int:
        alive = self.state().get("aliveworkers", 0)
        assert isinstance(alive, int)
        return alive

    def executor_pids(self, worker: int) -> list[int]:
        """The executor JVMs worker ``worker`` runs now (its children running the executor
        backend)."""
        return [
            pid
            for pid in _children(self.workers[worker].process.pid)
            if EXECUTOR_CLASS in _command_line(pid)
        ]

    def worker_of(self, pid: int) -> tuple[int, int] | None:
        """``(worker index, executor pid)`` of the executor process ``pid`` runs under (a
        Python worker's ancestor), or None when it runs under none."""
        executors = {
            executor: index
            for index in range(len(self.workers))
            for executor in self.executor_pids(index)
        }
        while pid > 1:
            if pid in executors:
                return executors[pid], pid
            pid = _parent(pid)
        return None

    def logs(self) -> str:
        """The tail of each daemon's log and of each executor's (``<work dir>/<app>/<id>``)."""
        tails = [daemon.tail() for daemon in [self.master, *self.workers]]
        for stderr in sorted(self.directory.glob("worker-*/app-*/*/stderr")):
            tails.append(_tail(f"executor {stderr.parent.name} of {stderr.parts[-4]}", stderr))
        return "\n".join(tails)

    def stop(self) -> None:
        for daemon in [*self.workers, self.master]:
            daemon.stop()


@contextmanager
def standalone_cluster(
    directory: Path, *, workers: int = 2, cores: int = 3, memory: str = "1g"
) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers of ``cores`` task slots and ``memory`` for executors
    each, registered and ready when entered; all killed on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    master = _start(
        "master",
        directory,
        [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port)],
        ["--webui-port", str(ui_port)],
        # No REST submission server: it would take a fixed port (6066) nothing here needs.
        options="-Dspark.master.rest.enabled=false",
    )
    cluster = StandaloneCluster(
        directory, f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", master
    )
    try:
        for index in range(workers):
            work = directory / f"worker-{index}"
            work.mkdir(exist_ok=True)
            cluster.workers.append(
                _start(
                    f"worker-{index}",
                    directory,
                    [WORKER_CLASS, "--host", "127.0.0.1", "--port", str(free_port())],
                    [
                        *("--webui-port", str(free_port())),
                        *("--cores", str(cores), "--memory", memory),
                        *("--work-dir", str(work), cluster.master_url),
                    ],
                )
            )
        _wait_registered(cluster, workers)
        yield cluster
    finally:
        cluster.stop()


def _start(
    name: str, directory: Path, head: Sequence[str], tail: Sequence[str], options: str = ""
) -> Daemon:
    log = directory / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOG_DIR=str(directory),
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_DAEMON_JAVA_OPTS=options,
        # Every daemon, UI and executor on loopback: nothing of the test listens outside.
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    with log.open("wb") as output:
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *head, *tail],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed whole by stop()
        )
    return Daemon(name, process, log)


def _wait_registered(cluster: StandaloneCluster, workers: int) -> None:
    end = time.monotonic() + START_TIMEOUT
    alive = 0
    while time.monotonic() < end:
        for daemon in [cluster.master, *cluster.workers]:
            if daemon.process.poll() is not None:
                raise RuntimeError(f"{daemon.name} exited early:\n{cluster.logs()}")
        try:
            alive = cluster.alive_workers()
        except OSError:  # the master's UI is not up yet
            alive = 0
        if alive == workers:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"{alive} of {workers} workers registered within {START_TIMEOUT} s:\n{cluster.logs()}"
    )


def _tail(name: str, log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"== {name}: no log"
    return "\n".join([f"== {name} ({log}):", *lines[-LOG_TAIL_LINES:]])


def remote_ports(pid: int) -> set[int]:
    """The remote ports of process ``pid``'s established TCP connections (IPv4 and IPv6)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # remote address as hex ADDRESS:PORT, state 01 is ESTABLISHED, then the inode
            if fields[3] == "01" and fields[9] in inodes:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def _children(pid: int) -> list[int]:
    # A JVM starts processes from any of its threads, so /proc/<pid>/task/*/children would
    # have to be read for each thread: the parents of all processes tell it at once.
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid:
            found.append(int(entry.name))
    return found


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command name (in parentheses) may hold spaces: the fields after it are fixed.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
