"""Server bootstrap shared by every Tidemark process.

A :class:`Server` serves the given services plus gRPC health checking and server reflection
(unless switched off), with the access-log and error-mapping interceptors in front of every
call; plaintext by default, or TLS, where with client certificates required (mTLS) each call's
caller is also checked against its service's table (:mod:`tidemark.rpc.authorization`).
Stopping is graceful: health turns NOT_SERVING, the listener closes, and calls in flight get a
grace period to finish before they are cancelled.

Health has two sides. *Liveness* (the health service ``liveness``) is SERVING from start to
stop: the process answers. *Readiness* (the overall status ``""`` and each service's name) is
SERVING only while the process's ``readiness`` check says it can do its job, that is, while
its dependencies let it (the catalog caught up, compute caught up with the catalog and its
dataflows hydrated, ...); the check is polled every ``readiness_interval`` seconds and each
change is logged with its reason. Load balancers and ``tidemark up`` wait for readiness.

Processes run :func:`serve` from their async main under :func:`tidemark.runner.run_service`,
which turns SIGTERM/SIGINT into a cancellation of that main; ``serve`` answers it with the
graceful stop above.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import _async as health_aio  # the asyncio servicer; untyped in grpc-stubs
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import SERVICE_NAME as HEALTH_SERVICE_NAME
from grpc_reflection.v1alpha import reflection as grpc_reflection

from tidemark.logging import get_logger
from tidemark.rpc.access_log import AccessLogInterceptor
from tidemark.rpc.authorization import AuthorizationInterceptor, CallerPolicy
from tidemark.rpc.errors import ErrorMappingInterceptor
from tidemark.rpc.interceptor import CallInterceptor, InterceptorChain
from tidemark.rpc.metrics import RpcMetricsInterceptor
from tidemark.rpc.tls import TlsSettings

S = TypeVar("S")

log = get_logger("tidemark.rpc")

# Shared Arrow batches and snapshots can be large; gRPC's default cap is 4 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Refuse to share a port with another process (gRPC allows it by default): two servers on
    # one port would split traffic silently.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Detect dead clients holding streams open, and accept the clients' own keepalive pings
    # (see tidemark.rpc.client) instead of closing the connection as abusive.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
)

DEFAULT_GRACE_SECONDS = 10.0

LIVENESS_SERVICE = "liveness"
"""The health service name of liveness: SERVING whenever the process answers."""

Readiness = Callable[[], str | None]
"""A readiness check: ``None`` when ready, otherwise why not (logged, and shown as the
reason of NOT_SERVING)."""

READINESS_INTERVAL_SECONDS = 0.5


@dataclass(frozen=True)
class Service(Generic[S]):
    """A servicer and how to register it, e.g.
    ``Service(oracle_pb2.DESCRIPTOR.services_by_name["TimestampOracle"], servicer,
    oracle_pb2_grpc.add_TimestampOracleServicer_to_server)``."""

    descriptor: ServiceDescriptor
    servicer: S
    add_to_server: Callable[[S, grpc.aio.Server], None]
    # Called at high rates (the oracle): successful calls are logged at debug, not info.
    hot: bool = False
    # Called when the server starts stopping, before calls in flight get their grace period:
    # long-lived streams that can end early without loss (an idle append stream) end then,
    # instead of holding the shutdown for the whole grace period.
    on_stopping: Callable[[], None] | None = None
    # Who may call it when mTLS is on (see tidemark.rpc.authorization); None: any verified
    # peer.
    callers: CallerPolicy | None = None

    @property
    def name(self) -> str:
        return self.descriptor.full_name

    @property
    def method_names(self) -> list[str]:
        """Full method names, as gRPC reports them: ``/package.Service/Method``."""
        return [f"/{self.name}/{method.name}" for method in self.descriptor.methods]


def split_listen_address(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as host and port; raises ValueError if malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen address {listen!r} is not host:port")
    return host, int(port)


class Server:
    """A started-once gRPC server; use ``async with`` or :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        services: Sequence[Service[Any]],
        listen: str,
        *,
        grace: float = DEFAULT_GRACE_SECONDS,
        drain: float = 0.0,
        interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (),
        options: Sequence[tuple[str, Any]] = (),
        readiness: Readiness | None = None,
        readiness_interval: float = READINESS_INTERVAL_SECONDS,
        tls: TlsSettings | None = None,
        reflection: bool = True,
    ) -> None:
        """``grace``: seconds calls in flight get to finish when stopping. ``drain``: seconds
        between reporting NOT_SERVING and closing the listener, so load balancers that poll
        health stop routing here first. ``interceptors`` run inside the built-in ones.
        ``readiness``: the readiness check (see the module docs; none: always ready).
        ``tls``: serve TLS (see :mod:`tidemark.rpc.tls`); when it requires client
        certificates, each call is checked against its service's ``callers``.
        ``reflection``: serve gRPC server reflection (the list of services and their
        messages)."""
        split_listen_address(listen)
        self.services = list(services)
        self.listen = listen
        self.grace = grace
        self.drain = drain
        self._port: int | None = None
        self._health = health_aio.HealthServicer()
        hot_methods = [name for service in services if service.hot for name in service.method_names]
        self.readiness = readiness
        self.readiness_interval = readiness_interval
        self._ready: bool | None = None
        self._watching: asyncio.Task[None] | None = None
        self.tls = tls
        self.reflection = reflection
        chain: list[CallInterceptor] = [
            AccessLogInterceptor(hot_methods),
            RpcMetricsInterceptor(),
            ErrorMappingInterceptor(),
        ]
        if tls is not None and tls.require_client_auth:
            # Inside the error mapping, so a refusal is answered PERMISSION_DENIED.
            policies = {s.name: s.callers for s in services if s.callers is not None}
            chain.append(AuthorizationInterceptor(policies))
        built_in = InterceptorChain(chain, innermost=not interceptors)
        self._server = grpc.aio.server(
            interceptors=[built_in, *interceptors], options=[*SERVER_OPTIONS, *options]
        )
        self._stopping: asyncio.Future[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def port(self) -> int:
        """The bound port (the one chosen by the OS if ``listen`` asked for port 0)."""
        if self._port is None:
            raise RuntimeError("the server has not been started")
        return self._port

    @property
    def service_names(self) -> list[str]:
        return [service.name for service in self.services]

    async def start(self) -> int:
        """Register everything, bind, start serving; returns the bound port."""
        for service in self.services:
            service.add_to_server(service.servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        if self.reflection:
            grpc_reflection.enable_server_reflection(
                [*self.service_names, HEALTH_SERVICE_NAME, grpc_reflection.SERVICE_NAME],
                self._server,
            )
        try:
            if self.tls is not None:
                port = self._server.add_secure_port(self.listen, self.tls.server_credentials())
            else:
                port = self._server.add_insecure_port(self.listen)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {self.listen}: {exc}") from exc
        if port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        self._port = port
        await self._server.start()
        await self._health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self._check_readiness()
        if self.readiness is not None:
            self._watching = asyncio.create_task(self._watch_readiness(), name="readiness")
        log.info(
            "server_started",
            listen=self.listen,
            port=port,
            services=self.service_names,
            tls=self.tls.mode if self.tls is not None else "off",
        )
        return port

    @property
    def ready(self) -> bool:
        """Whether health reports SERVING (readiness) right now."""
        return bool(self._ready)

    async def _check_readiness(self) -> None:
        reason = None
        if self.readiness is not None:
            try:
                reason = self.readiness()
            except Exception as exc:  # a broken check must not stop the server; it says why
                log.exception("readiness_check_failed")
                reason = f"the readiness check failed: {exc!r}"
        ready = reason is None
        if ready == self._ready:
            return
        self._ready = ready
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            await self._health.set(name, status)
        log.info("readiness_changed", ready=ready, reason=reason or "", port=self._port)

    async def _watch_readiness(self) -> None:
        while True:
            await asyncio.sleep(self.readiness_interval)
            await self._check_readiness()

    async def stop(self, grace: float | None = None) -> None:
        """Stop gracefully (see the class docs). Concurrent and repeated calls share one stop."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(
                self._stop(self.grace if grace is None else grace)
            )
        # Shielded: every caller waits on the same stop, and one caller being cancelled must
        # not cancel it for the others.
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> None:
        log.info("server_stopping", port=self._port, grace_seconds=grace)
        if self._watching is not None:
            self._watching.cancel()
        await self._health.enter_graceful_shutdown()
        if self.drain > 0:
            await asyncio.sleep(self.drain)
        for service in self.services:
            if service.on_stopping is not None:
                service.on_stopping()
        await self._server.stop(grace)
        self._stopped.set()
        log.info("server_stopped", port=self._port)

    async def wait_for_termination(self) -> None:
        """Wait until the server has stopped. Cancelling the wait does not stop it."""
        # Not grpc's own wait_for_termination: cancelling that one cancels the future its
        # stop() waits on, and the stop then gives up half-way.
        await self._stopped.wait()

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def announce_port(server: Server) -> None:
    """Print the bound port on stdout, one line: how a parent process (the tests,
    ``tidemark up``) learns a port the OS chose for ``--listen host:0``."""
    print(server.port, flush=True)


async def serve(
    services: Sequence[Service[Any]],
    listen: str,
    *,
    grace: float = DEFAULT_GRACE_SECONDS,
    drain: float = 0.0,
    on_started: Callable[[Server], None] | None = None,
    readiness: Readiness | None = None,
    tls: TlsSettings | None = None,
    reflection: bool = True,
) -> None:
    """Serve until cancelled (the runner cancels on SIGTERM/SIGINT), then stop gracefully.
    ``readiness``: when health reports SERVING (see the module docs; none: always).
    ``tls``, ``reflection``: as for :class:`Server`."""
    async with Server(
        services,
        listen,
        grace=grace,
        drain=drain,
        readiness=readiness,
        tls=tls,
        reflection=reflection,
    ) as server:
        if on_started is not None:
            on_started(server)
        await server.wait_for_termination()
