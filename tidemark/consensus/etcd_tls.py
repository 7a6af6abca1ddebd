"""TLS to etcd: the settings (from the consensus URL's ``ca``, ``cert`` and ``key`` options)
and an ``aetcd`` client that uses them.

``aetcd`` 1.0 only opens plaintext channels, so :class:`TlsClient` replaces its ``connect`` with
one that opens the channel with TLS credentials and builds the same stubs on it. Everything
else (calls, watches, closing) is aetcd's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import grpc
import grpc.aio
from aetcd import rpc, watcher

from tidemark.errors import InvalidArgument


@dataclass(frozen=True)
class EtcdTls:
    """PEM bytes: ``ca`` verifies the servers (``None``: the system's trusted roots); ``cert``
    and ``key`` are this client's certificate, for an etcd run with ``--client-cert-auth``."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_files(cls, ca: str = "", cert: str = "", key: str = "") -> EtcdTls:
        """Reads the files now, so a wrong path fails at start with its name."""
        if bool(cert) != bool(key):
            raise InvalidArgument("etcd TLS: give both cert= and key=, or neither")
        return cls(_read("ca", ca), _read("cert", cert), _read("key", key))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def _read(option: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"etcd TLS: cannot read {option}={path}: {exc.strerror}") from None


class TlsClient(aetcd.Client):  # type: ignore[misc]
    """An aetcd client whose channel is TLS (username/password auth is not used here)."""

    def __init__(self, tls: EtcdTls, **options: Any) -> None:
        super().__init__(**options)
        self._tls = tls

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        # Channels connect lazily, and nothing here awaits: no second caller can get in.
        self.channel = grpc.aio.secure_channel(
            f"{self._host}:{self._port}", self._tls.credentials(), options=self._options.items()
        )
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


def client(host: str, port: int, tls: EtcdTls | None, **options: Any) -> aetcd.Client:
    """An aetcd client for ``host:port``, over TLS when ``tls`` is given."""
    if tls is None:
        return aetcd.Client(host=host, port=port, **options)
    return TlsClient(tls, host=host, port=port, **options)
