"""The adapter process and its ``--session-keys-file``: a file it cannot use stops it at start
with the reason; without one it says that its sessions are valid on it alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.service_process import REPO_ROOT


def start_failure(*args: str) -> str:
    finished = subprocess.run(
        [sys.executable, "-m", "services.adapter", "--listen", "127.0.0.1:0", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode != 0
    return finished.stderr


def test_a_keys_file_it_cannot_use_stops_the_adapter(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert f"--session-keys-file: cannot read session keys file {missing}" in start_failure(
        "--session-keys-file", str(missing)
    )
    short = tmp_path / "short"
    short.write_text("k1:c2hvcnQ=\n")
    assert "key 'k1' has 5 bytes, at least 16 needed" in start_failure(
        "--session-keys-file", str(short)
    )


def test_without_a_keys_file_the_adapter_says_its_sessions_are_its_own() -> None:
    # No backends are running: the adapter decides on its key before it connects to them.
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "services.adapter", "--log-format", "json"),
            *("--listen", "127.0.0.1:0", "--storage", "127.0.0.1:1", "--catalog", "127.0.0.1:1"),
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if '"session_keys_generated"' in line:
                record = json.loads(line)
                break
        else:
            raise AssertionError("the adapter never said how it signs sessions")
        assert record["level"] == "warning"
        assert "valid only on this adapter until it restarts" in record["detail"]
    finally:
        process.kill()
        process.wait()
