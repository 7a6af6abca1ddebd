"""Free loopback ports for the servers the tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections and to binds of port 0."""
    try:
        low, high = (int(part) for part in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    Chosen below the kernel's ephemeral range: a port from that range, free when picked, can
    be taken by any process's outgoing connection before the server that was handed it
    binds it (a service starting after several others lost its metrics port that way)."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(10_000, low) if low > 10_000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            chosen: int = sock.getsockname()[1]
            return chosen
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        fallback: int = sock.getsockname()[1]
        return fallback
