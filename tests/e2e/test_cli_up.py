"""``tidemark up`` (what ``make run`` runs) and ``tidemark sql`` as a user runs them: separate
processes, endpoints printed, the README's example session, Ctrl-C stops everything, and a
second run finds the data again.

Everything happens in one test: each start of ``tidemark up`` starts a Spark session, the
slow part, so the test starts it twice in all."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from tests.support.service_process import REPO_ROOT
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.errors import PermissionDenied
from tidemark.local.services import cli_tls

SERVICES = ("oracle", "storage", "catalog", "sources", "compute", "adapter")
START_TIMEOUT_S = 300
SQL_TIMEOUT_S = 180

# The README's example session, statement by statement.
README_SETUP = [
    "CREATE TABLE orders (id bigint, customer text, amount numeric(10,2));",
    "INSERT INTO orders VALUES (1, 'ada', 12.50), (2, 'bob', 3.00), (3, 'ada', 7.25);",
    "CREATE MATERIALIZED VIEW spend AS SELECT customer, sum(amount) AS total, count(*) AS n "
    "FROM orders GROUP BY customer;",
]
README_SELECT = "SELECT * FROM spend ORDER BY customer;"
README_SUBSCRIBE = "SUBSCRIBE spend;"


def _first_ephemeral_port() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default otherwise)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port_range(width: int) -> int:
    """A base port such that ``base - 1 .. base + width - 1`` are all free right now (base - 1
    is the adapter's PostgreSQL wire protocol port), and the metrics ports 100 above them too.
    Chosen below the ephemeral range: a restarted ``up`` binds the same ports again, and a
    port there could meanwhile be the local end of any process's outgoing connection."""
    highest = max(10_200, _first_ephemeral_port() - 200)
    for _ in range(200):
        base = random.randint(10_000, highest)
        try:
            for port in [*range(base - 1, base + width), *range(base + 100, base + 100 + width)]:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}


class LineReader:
    """A child's output, line by line, readable with a timeout."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        stdout = process.stdout

        def pump() -> None:
            for line in stdout:
                self._queue.put(line.rstrip("\n"))
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def until(self, predicate: re.Pattern[str], timeout: float) -> str:
        """Reads until a line matches; that line."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {predicate.pattern!r} in:\n" + "\n".join(self.lines)
                ) from None
            if line is None:
                raise AssertionError(
                    f"output ended before {predicate.pattern!r}:\n" + "\n".join(self.lines)
                )
            self.lines.append(line)
            if predicate.search(line):
                return line

    def rest(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if line is None:
                return
            self.lines.append(line)


class Up:
    def __init__(self, data_dir: Path, base_port: int, *extra: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidemark.cli",
                "up",
                "--data-dir",
                str(data_dir),
                "--base-port",
                str(base_port),
                "--spark-master",
                "local[2]",
                *extra,
            ],
            cwd=REPO_ROOT,
            # The services read TIDEMARK_* variables too. The first read of a new materialized
            # view waits for Spark to build it, which on a loaded 2-core machine can take longer
            # than the adapter's default wait; this test is about the CLI, not that latency.
            env={**clean_env(), "TIDEMARK_PEEK_WAIT_SECONDS": str(SQL_TIMEOUT_S - 30)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output = LineReader(self.process)
        try:
            self.output.until(re.compile(r"tidemark: ready"), START_TIMEOUT_S)
        except AssertionError:
            self.process.kill()
            raise

    @property
    def lines(self) -> list[str]:
        return self.output.lines

    def endpoint(self, name: str) -> str:
        for line in self.lines:
            parts = line.split()
            if parts and parts[0] == name:
                return parts[1].removeprefix("grpc://")
        raise AssertionError(f"no endpoint for {name} in:\n" + "\n".join(self.lines))

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(60)
        self.output.rest(5)
        return code


def tidemark(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``tidemark ARGS...`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "tidemark.cli", *args],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=SQL_TIMEOUT_S,
    )


def sql(address: str, *statements: str) -> subprocess.CompletedProcess[str]:
    """``tidemark sql --address ADDRESS -c S1 -c S2 ...``."""
    return tidemark("sql", "--address", address, *(a for s in statements for a in ("-c", s)))


def table_rows(output: str) -> list[list[str]]:
    """The cells of an aligned table's rows (the lines between the ``---+---`` rule and the
    ``(N rows)`` footer)."""
    lines = output.splitlines()
    rule = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+(\+-+)*", line))
    footer = next(i for i, line in enumerate(lines) if re.fullmatch(r"\(\d+ rows?\)", line))
    return [[cell.strip() for cell in line.split("|")] for line in lines[rule + 1 : footer]]


def assert_spend(output: str, expected: dict[str, tuple[str, int]]) -> None:
    header = output.splitlines()[0]
    assert [c.strip() for c in header.split("|")] == ["customer", "total", "n"], output
    rows = {row[0]: (Decimal(row[1]), int(row[2])) for row in table_rows(output)}
    assert rows == {k: (Decimal(t), n) for k, (t, n) in expected.items()}, output
    assert f"({len(expected)} rows)" in output


def change_lines(reader: LineReader, count: int) -> list[tuple[int, int, str, Decimal, int]]:
    """The next ``count`` changes printed by ``tidemark sql -c SUBSCRIBE``:
    ``(timestamp, diff, customer, total, n)``."""
    changes = []
    for _ in range(count):
        line = reader.until(re.compile(r"^\d+ \| [+-]\d+ \|"), SQL_TIMEOUT_S)
        timestamp, diff, customer, total, n = (cell.strip() for cell in line.split("|"))
        changes.append((int(timestamp), int(diff), customer, Decimal(total), int(n)))
    return changes


async def check_backends(up: Up) -> int:
    """The oracle and the catalog answer; returns a timestamp written to the oracle."""
    oracle = OracleClient(up.endpoint("oracle"))
    written = await oracle.write_ts("e2e")
    await oracle.apply_write("e2e", written)
    assert await oracle.read_ts("e2e") == written
    # The catalog came up on storage and published its first state to the oracle.
    catalog = CatalogClient(up.endpoint("catalog"))
    snapshot = await catalog.snapshot_at(await oracle.read_ts("catalog"))
    names = {i.name.database for i in snapshot.items if i.WhichOneof("body") == "database"}
    assert "tidemark" in names
    await catalog.close()
    await oracle.close()
    return written


def run_readme_session(adapter: str) -> None:
    setup = sql(adapter, *README_SETUP)
    assert setup.returncode == 0, setup.stderr
    assert setup.stdout.splitlines() == ["CREATE TABLE", "INSERT 0 3", "CREATE MATERIALIZED VIEW"]

    selected = sql(adapter, README_SELECT)
    assert selected.returncode == 0, selected.stderr
    assert_spend(selected.stdout, {"ada": ("19.75", 2), "bob": ("3.00", 1)})

    # A subscription prints the current contents, then each change as it happens.
    subscriber = subprocess.Popen(
        [sys.executable, "-m", "tidemark.cli", "sql", "--address", adapter],
        cwd=REPO_ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.PIPE,
    )
    try:
        # Through the interactive shell's input (not a tty): the statement, then stay open.
        assert subscriber.stdin is not None
        subscriber.stdin.write(README_SUBSCRIBE + "\n")
        subscriber.stdin.flush()
        reader = LineReader(subscriber)
        header = reader.until(re.compile(r"^timestamp \| diff"), SQL_TIMEOUT_S)
        assert header == "timestamp | diff | customer | total | n"
        initial = change_lines(reader, 2)
        assert sorted(c[1:] for c in initial) == [
            (1, "ada", Decimal("19.75"), 2),
            (1, "bob", Decimal("3.00"), 1),
        ]
        assert len({c[0] for c in initial}) == 1

        inserted = sql(adapter, "INSERT INTO orders VALUES (4, 'bob', 1.00);")
        assert inserted.returncode == 0, inserted.stderr
        update = change_lines(reader, 2)
        assert sorted(c[1:] for c in update) == [
            (-1, "bob", Decimal("3.00"), 1),
            (1, "bob", Decimal("4.00"), 2),
        ]
        assert update[0][0] == update[1][0] > initial[0][0]
        # Ctrl-C ends the subscription and, the input being over, the shell.
        subscriber.stdin.close()
        subscriber.send_signal(signal.SIGINT)
        assert subscriber.wait(30) == 0
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()

    failed = sql(adapter, "SELECT * FROM nope;")
    assert failed.returncode == 1
    assert "SQLSTATE 42P01" in failed.stderr
    assert re.search(r"LINE 1: SELECT \* FROM nope\n +\^", failed.stderr), failed.stderr


async def test_up_serves_sql_and_keeps_its_data_across_restarts(tmp_path: Path) -> None:
    base = free_port_range(6)
    first = Up(tmp_path, base)
    try:
        assert [line.split()[0] for line in first.lines if "grpc://" in line] == list(SERVICES)
        written = await check_backends(first)
        status = tidemark("status", "--base-port", str(base), "--data-dir", str(tmp_path))
        assert status.returncode == 0, status.stdout
        assert [line.split()[0] for line in status.stdout.splitlines()] == list(SERVICES)
        assert all(line.endswith("SERVING  restarts=0") for line in status.stdout.splitlines()), (
            status.stdout
        )
        run_readme_session(first.endpoint("adapter"))
        # -c also runs a backslash command.
        listed = sql(first.endpoint("adapter"), "\\d")
        assert listed.returncode == 0, listed.stderr
        assert ["orders", "table"] in table_rows(listed.stdout)
        assert ["spend", "materialized view"] in table_rows(listed.stdout)
        # The README's load generator: the supervised sources process ingests it.
        counted = sql(
            first.endpoint("adapter"),
            "CREATE SOURCE counter FROM LOAD GENERATOR COUNTER (TICK INTERVAL '100ms');",
            "SELECT min(counter) FROM counter;",
        )
        assert counted.returncode == 0, counted.stderr
        assert table_rows(counted.stdout) == [["1"]], counted.stdout
        assert ["counter_progress", "progress"] in table_rows(
            sql(first.endpoint("adapter"), "\\d").stdout
        )
        # The same data through the PostgreSQL wire protocol, at the URL up printed.
        url = f"postgres://tidemark@127.0.0.1:{base - 1}/tidemark"
        assert any(line.strip().startswith(url) for line in first.lines), first.lines
        through_psql = await asyncio.to_thread(
            subprocess.run,
            ["psql", url, "-X", "-A", "-t", "-c", "SELECT customer FROM spend ORDER BY customer"],
            capture_output=True,
            text=True,
            timeout=SQL_TIMEOUT_S,
        )
        assert through_psql.stdout.split() == ["ada", "bob"], through_psql.stderr
    finally:
        assert first.interrupt() == 0
    assert any("stopping" in line for line in first.lines)
    for name in SERVICES:
        assert (tmp_path / "logs" / f"{name}.log").exists()
    assert (tmp_path / "consensus.db").exists()

    second = Up(tmp_path, base)
    try:
        oracle = OracleClient(second.endpoint("oracle"))
        assert await oracle.read_ts("e2e") == written
        assert await oracle.write_ts("e2e") > written
        await oracle.close()
        # The table, its rows and the view over them are all still there.
        selected = sql(second.endpoint("adapter"), README_SELECT)
        assert selected.returncode == 0, selected.stderr
        assert_spend(selected.stdout, {"ada": ("19.75", 2), "bob": ("4.00", 2)})
        counted = sql(second.endpoint("adapter"), "SELECT count(*) AS c FROM orders;")
        assert counted.returncode == 0, counted.stderr
        assert table_rows(counted.stdout) == [["4"]]
    finally:
        assert second.interrupt() == 0


def status_lines(base: int, data_dir: Path) -> dict[str, str]:
    status = tidemark("status", "--base-port", str(base), "--data-dir", str(data_dir))
    return {line.split()[0]: line for line in status.stdout.splitlines()}


def wait_restarted(up: Up, base: int, data_dir: Path, name: str) -> str:
    """Waits until ``tidemark status`` shows ``name`` serving again after a restart; its
    status line."""
    deadline = time.monotonic() + START_TIMEOUT_S
    line = ""
    while time.monotonic() < deadline:
        line = status_lines(base, data_dir).get(name, "")
        restarts = re.search(r"restarts=(\d+)", line)
        if "SERVING" in line and restarts and int(restarts.group(1)) >= 1:
            return line
        assert up.process.poll() is None, "tidemark up exited:\n" + "\n".join(up.lines)
        time.sleep(1)
    raise AssertionError(f"{name} did not come back: {line}")


def insert_and_count(adapter: str, row_id: int) -> int:
    """Inserts one row into ``orders`` and reads the count back, retrying while the services
    are still reconnecting to the restarted one (an insert that failed changed nothing)."""
    deadline = time.monotonic() + SQL_TIMEOUT_S
    while True:
        done = sql(adapter, f"INSERT INTO orders VALUES ({row_id}, 'cy', 1.00);")
        if done.returncode == 0:
            break
        assert time.monotonic() < deadline, done.stderr
        time.sleep(1)
    while True:
        counted = sql(adapter, "SELECT count(*) AS c FROM orders;")
        if counted.returncode == 0:
            return int(table_rows(counted.stdout)[0][0])
        assert time.monotonic() < deadline, counted.stderr
        time.sleep(1)


@pytest.mark.timeout(900)
async def test_up_restarts_a_killed_service_while_the_others_keep_serving(tmp_path: Path) -> None:
    base = free_port_range(6)
    up = Up(tmp_path, base)
    try:
        adapter = up.endpoint("adapter")
        setup = sql(adapter, *README_SETUP)
        assert setup.returncode == 0, setup.stderr
        expected = 3
        for restarts, name in enumerate(("storage", "compute"), start=1):
            pid = int(
                json.loads((tmp_path / "supervisor.json").read_text())["services"][name]["pid"]
            )
            os.kill(pid, signal.SIGKILL)
            up.output.until(
                re.compile(rf"tidemark: {name} exited \(signal SIGKILL\); restart 1"), 30
            )
            up.output.until(re.compile(rf"tidemark: {name} restarted \(restart 1"), 30)
            line = wait_restarted(up, base, tmp_path, name)
            assert "last exit: signal SIGKILL" in line, line
            expected += 1
            assert insert_and_count(adapter, 10 + restarts) == expected
            # The view over the table follows the insert (compute and storage both work).
            selected = sql(adapter, README_SELECT)
            assert selected.returncode == 0, selected.stderr
            assert "cy" in selected.stdout, selected.stdout
        # Nothing else was restarted.
        lines = status_lines(base, tmp_path)
        for name in ("oracle", "catalog", "adapter"):
            assert "restarts=0" in lines[name] and "last exit" not in lines[name], lines[name]
    finally:
        started = time.monotonic()
        assert up.interrupt() == 0
        assert time.monotonic() - started < 30


def test_up_with_tls_serves_sql_over_mtls_only(tmp_path: Path) -> None:
    base = free_port_range(6)
    data_dir = tmp_path / "data"
    up = Up(data_dir, base, "--tls")
    try:
        tls_dir = data_dir / "tls"
        adapter = up.endpoint("adapter")
        assert f"--tls-dir {tls_dir}" in next(line for line in up.lines if "adapter" in line)
        assert sql(adapter, "SELECT 1;").returncode == 1  # plaintext: no handshake
        done = tidemark(
            "sql",
            *("--address", adapter, "--tls-dir", str(tls_dir)),
            *(a for s in [*README_SETUP, README_SELECT] for a in ("-c", s)),
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert_spend(
            done.stdout[done.stdout.index(" customer") :], {"ada": ("19.75", 2), "bob": ("3.00", 1)}
        )
        # PostgreSQL clients get TLS with the adapter's certificate, verified against the CA.
        url = (
            f"postgresql://tidemark@127.0.0.1:{base - 1}/tidemark"
            f"?sslmode=verify-full&sslrootcert={tls_dir / 'ca.crt'}"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            rows = conn.execute("SELECT customer, n FROM spend ORDER BY customer").fetchall()
            assert rows == [("ada", 2), ("bob", 1)]
        status = tidemark("status", "--base-port", str(base), "--data-dir", str(data_dir))
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("SERVING") == len(SERVICES)

        # Storage refuses a client certificate it has no table entry for.
        async def list_as_cli() -> None:
            async with StorageClient(up.endpoint("storage"), tls=cli_tls(tls_dir)) as storage:
                with pytest.raises(PermissionDenied):
                    await storage.list()

        asyncio.run(list_as_cli())
    finally:
        assert up.interrupt() == 0
