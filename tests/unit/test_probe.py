"""``python -m tidemark.probe``, the exec probe of the Kubernetes manifests, against a real
server: its answer for liveness and readiness, and why it fails."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tidemark.probe import channel_credentials, check, main
from tidemark.rpc.server import LIVENESS_SERVICE, Server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def probe(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_probe_passes_while_serving_and_fails_once_not_ready() -> None:
    reason: list[str | None] = [None]
    server = Server(
        [], "127.0.0.1:0", grace=0, readiness=lambda: reason[0], readiness_interval=0.05
    )
    port = await server.start()
    try:
        assert await probe(str(port)) == 0
        assert await probe(str(port), "--service", LIVENESS_SERVICE) == 0
        reason[0] = "the catalog is behind"
        await asyncio.sleep(0.3)
        # Not ready, yet alive: readiness fails, liveness still passes.
        assert await asyncio.to_thread(check, port, "", 2.0, {}) == "NOT_SERVING"
        assert await probe(str(port)) == 1
        assert await probe(str(port), "--service", LIVENESS_SERVICE) == 0
    finally:
        await server.stop(0)


async def test_probe_fails_when_nothing_answers(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert await probe(str(port), "--timeout", "0.5") == 1
    assert "not serving: UNAVAILABLE" in capsys.readouterr().err


def test_probe_reads_the_processes_tls_files_or_none(tmp_path: Path) -> None:
    assert channel_credentials({}) is None
    with pytest.raises(ValueError, match="TIDEMARK_TLS_CERT, TIDEMARK_TLS_KEY and TIDEMARK_TLS_CA"):
        channel_credentials({"TIDEMARK_TLS_CERT": str(tmp_path / "tls.crt")})
    missing = {
        "TIDEMARK_TLS_CERT": str(tmp_path / "tls.crt"),
        "TIDEMARK_TLS_KEY": str(tmp_path / "tls.key"),
        "TIDEMARK_TLS_CA": str(tmp_path / "ca.crt"),
    }
    problem = check(free_port(), "", 0.5, missing)
    assert problem is not None and problem.startswith("cannot read the TLS files")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    assert channel_credentials(missing) is not None
