"""TLS on the resident sockets, when the compute serves mTLS (``--tls-cert/key/ca``).

The driver's listener and every task's connection then speak TLS with certificates on both
sides, before the token hello: the task verifies the driver's certificate against the CA and
the driver verifies the task's. Both present the compute's own certificate (the executors
mount the same files, at the same paths: the job's closure carries the paths, not the keys),
so besides the CA each end requires the peer's ``tidemark://`` identity to equal its own:
another service's certificate from the same CA is refused. Host names are not checked: the
driver is reached at its pod's address, which no certificate names.

Without TLS settings, sockets stay plaintext and only the token authenticates a task.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from services.compute.spark.wire import ConnectionLost
from tidemark.rpc.identity import Identity, identity_of_certificate
from tidemark.rpc.tls import TlsSettings

HANDSHAKE_TIMEOUT_SECONDS = 10.0


class PeerRefused(ConnectionLost):
    """The TLS handshake failed, or the peer's certificate names another identity."""


def server_context(tls: TlsSettings) -> ssl.SSLContext:
    """The driver's side: requires a certificate from every task."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context, tls)
    return context


def client_context(tls: TlsSettings) -> ssl.SSLContext:
    """A task's side: verifies the driver's certificate and presents its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the identity is checked instead (module docstring)
    _configure(context, tls)
    return context


def _configure(context: ssl.SSLContext, tls: TlsSettings) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(tls.cert, tls.key)
    context.load_verify_locations(tls.ca)


def accept_secure(
    sock: socket.socket, context: ssl.SSLContext | None, identity: Identity | None
) -> socket.socket | None:
    """A newly accepted connection, over TLS when ``context`` is given, or None when its
    handshake or its identity fails (the connection is closed then)."""
    if context is None:
        return sock
    sock.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
    try:
        secured = context.wrap_socket(sock, server_side=True)
        _check_peer(secured, identity)
    except (OSError, PeerRefused):  # ssl.SSLError is an OSError
        sock.close()
        return None
    return secured


def connect_secure(sock: socket.socket, tls: TlsSettings | None) -> socket.socket:
    """A task's connection to the driver, over TLS when ``tls`` is given. Raises
    ``PeerRefused`` when the driver is not who it should be."""
    if tls is None:
        return sock
    try:
        secured = client_context(tls).wrap_socket(sock)
        _check_peer(secured, own_identity(tls))
    except OSError as error:
        sock.close()
        raise PeerRefused(f"TLS with the driver failed: {error}") from error
    except PeerRefused:
        sock.close()
        raise
    return secured


def own_identity(tls: TlsSettings) -> Identity | None:
    """The ``tidemark://`` identity of the certificate in ``tls`` (None if it names none)."""
    return identity_of_certificate(Path(tls.cert).read_bytes())


def _check_peer(sock: ssl.SSLSocket, identity: Identity | None) -> None:
    der = sock.getpeercert(binary_form=True)
    if der is None:
        raise PeerRefused("the peer presented no certificate")
    peer = identity_of_certificate(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))
    if peer != identity:
        sock.close()
        raise PeerRefused(f"the peer is {peer}, not {identity}")
