"""gRPC health checks of the local services (every Tidemark server answers them)."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidemark.rpc.tls import TlsSettings

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"
POLL_INTERVAL_S = 0.2


def _channel(address: str, tls: TlsSettings | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, tls.channel_credentials())


def check_health(
    address: str, timeout: float = 2.0, tls: TlsSettings | None = None, service: str = ""
) -> str:
    """The server's overall status name (``SERVING``, ``NOT_SERVING``, ...), or
    ``UNREACHABLE`` when nothing answers within ``timeout`` seconds; over mTLS with ``tls``.
    ``service``: a health service name instead of the overall status (``liveness``)."""
    with _channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError:
            return UNREACHABLE
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_until_serving(
    address: str,
    timeout: float,
    still_running: Callable[[], bool] = lambda: True,
    tls: TlsSettings | None = None,
) -> bool:
    """Polls until the server reports SERVING (True), or until ``timeout`` seconds pass or
    ``still_running`` turns false (False)."""
    deadline = time.monotonic() + timeout
    while still_running():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if check_health(address, timeout=min(2.0, remaining), tls=tls) == SERVING:
            return True
        time.sleep(POLL_INTERVAL_S)
    return False
