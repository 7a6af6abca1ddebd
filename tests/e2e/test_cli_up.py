"""``tidemark up`` (what ``make run`` runs) as a user runs it: separate processes, endpoints
printed, Ctrl-C stops them all, and a second run finds the data again."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.service_process import REPO_ROOT
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient


def free_port_range(width: int) -> int:
    """A base port such that ``base .. base + width - 1`` are all free right now."""
    for _ in range(200):
        base = random.randint(20_000, 60_000)
        try:
            for port in range(base, base + width):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


class Up:
    def __init__(self, data_dir: Path, base_port: int) -> None:
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
            ],
            cwd=REPO_ROOT,
            env={k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        assert self.process.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip())
            if "running" in line:
                return
        self.process.kill()
        raise AssertionError("tidemark up did not start:\n" + "\n".join(self.lines))

    def endpoint(self, name: str) -> str:
        for line in self.lines:
            parts = line.split()
            if parts and parts[0] == name:
                return parts[1].removeprefix("grpc://")
        raise AssertionError(f"no endpoint for {name} in:\n" + "\n".join(self.lines))

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(60)
        assert self.process.stdout is not None
        self.lines.extend(self.process.stdout.read().splitlines())
        return code


async def test_up_serves_and_keeps_its_data_across_restarts(tmp_path: Path) -> None:
    base = free_port_range(5)
    first = Up(tmp_path, base)
    try:
        oracle = OracleClient(first.endpoint("oracle"))
        written = await oracle.write_ts("e2e")
        await oracle.apply_write("e2e", written)
        assert await oracle.read_ts("e2e") == written
        # The catalog came up on storage and published its first state to the oracle.
        catalog = CatalogClient(first.endpoint("catalog"))
        snapshot = await catalog.snapshot_at(await oracle.read_ts("catalog"))
        names = {i.name.database for i in snapshot.items if i.WhichOneof("body") == "database"}
        assert "tidemark" in names
        await catalog.close()
        await oracle.close()
    finally:
        assert first.interrupt() == 0
    assert any("stopping" in line for line in first.lines)
    assert (tmp_path / "logs" / "oracle.log").exists()
    assert (tmp_path / "consensus.db").exists()

    second = Up(tmp_path, base)
    try:
        oracle = OracleClient(second.endpoint("oracle"))
        assert await oracle.read_ts("e2e") == written
        assert await oracle.write_ts("e2e") > written
        await oracle.close()
    finally:
        assert second.interrupt() == 0
