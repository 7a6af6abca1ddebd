"""``python -m services.adapter``: the SQL adapter process."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from services.adapter.authentication import AUTH_MODES, DEFAULT_SUPERUSER, TRUST
from services.adapter.backends import Backends, parse_compute_endpoints
from services.adapter.pgwire.server import PgServer
from services.adapter.service import Adapter, AdapterSettings, adapter_service
from services.adapter.session_signing import SessionSigner
from tidemark.config import ServiceConfig, listen_setting, setting
from tidemark.rpc import announce_port, serve
from tidemark.runner import run_service
from tidemark.session_keys import KeyFileError


@dataclass(frozen=True)
class AdapterConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:6875")
    oracle: str = setting("127.0.0.1:6876", help="timestamp oracle address", metavar="HOST:PORT")
    storage: str = setting("127.0.0.1:6877", help="storage service address", metavar="HOST:PORT")
    catalog: str = setting("127.0.0.1:6878", help="catalog service address", metavar="HOST:PORT")
    compute: str = setting(
        "default=127.0.0.1:6879",
        help="the compute process of each cluster this adapter sends queries to",
        metavar="NAME=HOST:PORT[,NAME=HOST:PORT...]",
    )
    catalog_timeline: str = setting(
        "catalog", help="the oracle timeline of catalog times (the catalog's --timeline)"
    )
    data_timeline: str = setting("data", help="the oracle timeline of data times")
    history_seconds: float = setting(
        900.0,
        help="how far back in data time AS OF can read: the adapter's read holds on "
        "collections trail the read timestamp by this much",
        metavar="SECONDS",
    )
    peek_wait_seconds: float = setting(
        30.0,
        help="how long a read waits for compute (its catalog, a dataflow's or source's "
        "frontier) before it fails",
        metavar="SECONDS",
    )
    subscribe_tick_seconds: float = setting(
        1.0,
        help="how often a subscription advances the tables it reads, so its progress moves "
        "while nobody writes",
        metavar="SECONDS",
    )

    table_tick_seconds: float = setting(
        1.0,
        help="how often this adapter advances every table's upper to the current read time, so "
        "views over idle tables keep advancing (0: never)",
        metavar="SECONDS",
    )

    auth: str = setting(
        TRUST,
        help="who SQL callers are: trust (a call's tidemark-user metadata, or pgwire's user on "
        "localhost, is taken at its word; no user means the bootstrap superuser) or password "
        "(the user must be a role with LOGIN and send its password: gRPC metadata "
        "tidemark-password, SCRAM over pgwire)",
        choices=AUTH_MODES,
    )
    bootstrap_superuser: str = setting(
        DEFAULT_SUPERUSER,
        help="the superuser role created at start if it does not exist (empty: none)",
        metavar="NAME",
    )
    bootstrap_superuser_password_file: str = setting(
        "",
        help="a file holding the bootstrap superuser's password, set when the role is created",
        metavar="PATH",
    )
    pgwire_listen: str = setting(
        "",
        help="address to serve the PostgreSQL wire protocol on, host:port (empty: not served; "
        "tidemark up uses 127.0.0.1:6874)",
        metavar="HOST:PORT",
    )
    pgwire_password_file: str = setting(
        "",
        help="user:password lines; when given, pgwire clients authenticate with SCRAM-SHA-256 "
        "(without it only localhost clients may connect, trusted)",
        metavar="PATH",
    )
    pgwire_tls_cert: str = setting(
        "",
        help="PEM certificate for pgwire TLS (SSLRequest answered 'N' without it)",
        metavar="PATH",
    )
    pgwire_tls_key: str = setting("", help="PEM private key for pgwire TLS", metavar="PATH")
    session_keys_file: str = setting(
        "",
        help="id:base64key lines shared by the adapters: the first key signs the sessions "
        "handed to gRPC clients, all verify them (rotate by adding a key, then moving it "
        "first, then removing the old one); empty: a random key, so sessions are valid only "
        "on this adapter until it restarts",
        metavar="PATH",
    )
    tls_client_auth: bool = setting(
        False,
        help="with --tls-cert/--tls-key/--tls-ca, also require SQL clients on the gRPC port to "
        "present a certificate signed by the CA (off: the port serves TLS and SQL users "
        "authenticate by password; the adapter's own calls to the other services are mTLS "
        "either way)",
    )

    def settings(self) -> AdapterSettings:
        return AdapterSettings(
            history_ms=round(self.history_seconds * 1000),
            peek_wait_ms=round(self.peek_wait_seconds * 1000),
            subscribe_tick_seconds=self.subscribe_tick_seconds,
            table_tick_seconds=self.table_tick_seconds,
            catalog_timeline=self.catalog_timeline,
            data_timeline=self.data_timeline,
            auth=self.auth,
            bootstrap_superuser=self.bootstrap_superuser,
            bootstrap_superuser_password=_password(self.bootstrap_superuser_password_file),
            holder=f"adapter/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}",
        )


def _password(path: str) -> str:
    """The first line of ``path`` (a mounted Secret's key, say), or "" without a path."""
    if not path:
        return ""
    lines = Path(path).read_text().splitlines()
    return lines[0].strip() if lines else ""


async def main(config: AdapterConfig) -> None:
    try:
        endpoints = parse_compute_endpoints(config.compute)
    except ValueError as exc:
        raise SystemExit(f"--compute: {exc}") from None
    try:
        signer = SessionSigner.from_file(config.session_keys_file)
    except KeyFileError as exc:
        raise SystemExit(f"--session-keys-file: {exc}") from None
    tls = config.tls()
    backends = Backends.connect(config.oracle, config.catalog, config.storage, endpoints, tls)
    adapter = Adapter(backends, config.settings())
    pgwire: PgServer | None = None
    try:
        await adapter.start()
        if config.pgwire_listen:
            pgwire = PgServer.from_flags(
                adapter,
                config.pgwire_password_file,
                config.pgwire_tls_cert,
                config.pgwire_tls_key,
                require_passwords=config.auth != TRUST,
            )
            await pgwire.start(config.pgwire_listen)
        await serve(
            [adapter_service(adapter, signer)],
            config.listen,
            grace=config.shutdown_grace,
            on_started=announce_port,
            readiness=adapter.readiness,
            tls=replace(tls, require_client_auth=config.tls_client_auth) if tls else None,
            reflection=config.reflection,
        )
    finally:
        if pgwire is not None:
            await pgwire.close()
        await adapter.close()
        await backends.close()


if __name__ == "__main__":
    run_service(
        main,
        AdapterConfig,
        prog="python -m services.adapter",
        description="Tidemark adapter: SQL sessions over the oracle, catalog, storage and "
        "compute services; stateless, so any number may run side by side.",
    )
