"""``python -m tidemark.probe PORT [--service NAME]``: one gRPC health check of the process in
this container, for Kubernetes exec probes.

kubelet's own gRPC probe speaks plaintext and presents no certificate, so it cannot check a
service that requires mTLS. This check runs inside the container and dials the process on
``localhost`` the way its peers do: with the process's own certificate, key and CA from
``TIDEMARK_TLS_CERT``, ``TIDEMARK_TLS_KEY`` and ``TIDEMARK_TLS_CA`` (plaintext when none is
set, as for the process itself). It exits 0 when the health service answers SERVING for
``--service`` (the overall status by default, ``liveness`` for the liveness service), and 1
otherwise, saying why on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidemark.config import env_var

TLS_SETTINGS = ("tls_cert", "tls_key", "tls_ca")


def channel_credentials(environ: Mapping[str, str]) -> grpc.ChannelCredentials | None:
    """The process's own mTLS credentials from its environment; ``None`` for plaintext.
    ValueError when only some of the files are named, as the process itself refuses that."""
    paths = [environ.get(env_var(name), "") for name in TLS_SETTINGS]
    if not any(paths):
        return None
    if not all(paths):
        raise ValueError("TLS needs TIDEMARK_TLS_CERT, TIDEMARK_TLS_KEY and TIDEMARK_TLS_CA")
    cert, key, ca = (Path(path).read_bytes() for path in paths)
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def check(port: int, service: str, timeout: float, environ: Mapping[str, str]) -> str | None:
    """``None`` when ``service`` is SERVING on ``localhost:port``, else why not."""
    target = f"localhost:{port}"
    try:
        credentials = channel_credentials(environ)
    except (OSError, ValueError) as exc:
        return f"cannot read the TLS files: {exc}"
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        status: str = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        return status
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tidemark.probe", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("port", type=int, help="the process's gRPC port")
    parser.add_argument(
        "--service", default="", help="health service to ask for (default: the overall status)"
    )
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds to wait")
    options = parser.parse_args(argv)
    problem = check(options.port, options.service, options.timeout, os.environ)
    if problem is not None:
        print(f"not serving: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
