"""Prometheus metrics: the HTTP endpoint each process serves them on.

Metrics live in the default ``prometheus_client`` registry, declared at module level next to
the code that moves them (``tidemark/rpc/metrics.py`` for every call, ``services/<name>/
metrics.py`` for each service's own). Names start with ``tidemark_``; a service's own ones
with ``tidemark_<service>_``.

The endpoint is off unless ``--metrics-port`` names a port; it listens on the host of the
process's gRPC ``--listen`` address, so a process serving only loopback exposes its metrics
only there too.
"""

from __future__ import annotations

from prometheus_client import start_http_server

from tidemark.logging import get_logger

log = get_logger("tidemark.metrics")


def serve_metrics(listen: str, port: int) -> int:
    """Starts the ``/metrics`` endpoint on ``port`` (on ``listen``'s host, ``listen`` being
    the gRPC ``host:port``) in a daemon thread; returns the bound port."""
    host = listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
    server, _ = start_http_server(port, addr=host)
    bound = int(server.server_address[1])
    log.info("metrics_serving", url=f"http://{host}:{bound}/metrics")
    return bound
