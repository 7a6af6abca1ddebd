"""A throwaway PostgreSQL cluster for the PostgreSQL source tests.

``PostgresCluster`` runs Debian's server binaries (``/usr/lib/postgresql/<version>/bin``) on a
fresh ``initdb`` in a temporary directory, with ``wal_level=logical``, a free TCP port on
127.0.0.1 and its unix socket in that directory. PostgreSQL refuses to run as root, so as root
the cluster belongs to a non-root OS user (Debian's ``postgres``, or one created here).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.support.ports import free_port

SUPERUSER = "tidemark"
PASSWORD = "tidemark-pw"
DATABASE = "upstream"
_OS_USER = "postgres"


def server_bin() -> Path:
    """The newest installed server's binary directory."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError(
            "no PostgreSQL server: run scripts/install-system-deps.sh (Debian's postgresql)"
        )
    return Path(found[-1]).parent


def _os_user() -> str | None:
    """The user to run the server as: None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_OS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _OS_USER],
            check=True,
        )
    return _OS_USER


class PostgresCluster:
    """One cluster: ``start()``, ``stop()``, ``restart()``, ``connect()``, ``execute()``."""

    def __init__(self) -> None:
        self.bin = server_bin()
        self.user = _os_user()
        self.dir = Path(tempfile.mkdtemp(prefix="tidemark-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.host = "127.0.0.1"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._initdb()

    def _run(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), user=self.user, check=True, capture_output=True, text=True, **kwargs
        )

    def _initdb(self) -> None:
        password_file = self.dir / "pw"
        password_file.write_text(PASSWORD)
        if self.user is not None:
            shutil.chown(password_file, self.user)
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                f"--pwfile={password_file}",
                "--auth=md5",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\nwal_level = logical\n"
                "max_wal_senders = 10\n"
                "max_replication_slots = 10\n"
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "fsync = off\n"
                "synchronous_commit = on\n"
                "shared_buffers = 32MB\n"
            )
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 md5\n")

    def start(self) -> None:
        self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        self._wait_ready()

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with contextlib.closing(self.connect("postgres")):
                    break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with contextlib.closing(self.connect("postgres")) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cur.fetchone() is None:
                    cur.execute(f"CREATE DATABASE {DATABASE}")

    def dsn(self, database: str = DATABASE) -> str:
        return (
            f"host={self.host} port={self.port} user={SUPERUSER} password={PASSWORD} "
            f"dbname={database}"
        )

    def connect(self, database: str = DATABASE) -> Any:
        return psycopg2.connect(self.dsn(database), connect_timeout=5)

    def execute(self, *statements: str) -> None:
        """Runs each statement in autocommit mode."""
        with contextlib.closing(self.connect()) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """One PostgreSQL cluster for the whole test session."""
    with postgres_cluster() as cluster:
        yield cluster
