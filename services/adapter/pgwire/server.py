"""The PostgreSQL wire protocol listener of the adapter process: accepts connections on the
adapter's own event loop, hands each to a ``Connection`` over the shared ``Adapter``, and routes
CancelRequests (process id + secret key, from BackendKeyData) to the connection they name.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
from pathlib import Path

from services.adapter.pgwire.auth import (
    Authenticator,
    CatalogRoles,
    FirstOf,
    PasswordFile,
    RoleStore,
)
from services.adapter.pgwire.connection import Connection
from services.adapter.service import Adapter
from tidemark.logging import get_logger

log = get_logger("services.adapter.pgwire")

SERVER_VERSION = "15.0"
"""What clients are told (psql and drivers choose their catalog queries by it)."""


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


class PgServer:
    def __init__(
        self,
        adapter: Adapter,
        authenticator: Authenticator,
        tls: ssl.SSLContext | None = None,
        *,
        server_version: str = SERVER_VERSION,
    ) -> None:
        self.adapter = adapter
        self.authenticator = authenticator
        self.tls = tls
        self.server_version = server_version
        self.connections: dict[int, Connection] = {}
        self._next_process_id = secrets.randbelow(1 << 20) + 1
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_flags(
        cls,
        adapter: Adapter,
        password_file: str,
        tls_cert: str,
        tls_key: str,
        *,
        require_passwords: bool = False,
    ) -> PgServer:
        """``require_passwords``: SCRAM for every client (the adapter's ``auth = password``);
        else loopback clients are trusted unless a password file is given."""
        stores: list[RoleStore] = []
        administrators: frozenset[str] = frozenset()
        if password_file:
            path = Path(password_file)
            if path.exists():
                passwords = PasswordFile.read(path)
                stores.append(passwords)
                administrators = passwords.users
            else:
                # A Secret not created yet (Kubernetes mounts it optionally): only the
                # catalog's roles then, rather than refuse to start.
                log.warning("pgwire_password_file_missing", path=password_file)
        stores.append(CatalogRoles(lambda: adapter.cache.latest()))
        if bool(tls_cert) != bool(tls_key):
            raise SystemExit("--pgwire-tls-cert and --pgwire-tls-key go together")
        tls = tls_context(tls_cert, tls_key) if tls_cert else None
        authenticator = Authenticator(
            FirstOf(*stores),
            require_passwords=require_passwords or bool(password_file),
            administrators=administrators,
        )
        return cls(adapter, authenticator, tls)

    async def start(self, listen: str) -> int:
        host, _, port = listen.rpartition(":")
        host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"  # [::]:6874
        self._server = await asyncio.start_server(self._accept, host, int(port))
        bound = self._server.sockets[0].getsockname()[1]
        log.info("pgwire_listening", address=f"{host}:{bound}", tls=self.tls is not None)
        return int(bound)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def cancel(self, process_id: int, secret_key: int) -> None:
        connection = self.connections.get(process_id)
        if connection is not None and secrets.compare_digest(
            connection.secret_key.to_bytes(4, "big", signed=True),
            secret_key.to_bytes(4, "big", signed=True),
        ):
            log.info("pgwire_cancel", process_id=process_id)
            connection.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        process_id = self._next_process_id
        self._next_process_id += 1
        secret_key = secrets.randbelow(1 << 31)
        connection = Connection(self, reader, writer, process_id, secret_key)
        self.connections[process_id] = connection
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await connection.run()
        except Exception as exc:
            log.exception("pgwire_connection_failed", error=str(exc))
        finally:
            self.connections.pop(process_id, None)
            if task is not None:
                self._tasks.discard(task)  # type: ignore[arg-type]
