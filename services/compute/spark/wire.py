"""Messages between the driver and its resident tasks: length-prefixed typed frames over TCP
(TLS when the compute is configured for it, ``secure.py``).

A frame is an 8-byte big-endian length and one message of a kind registered below, encoded by
``codec.py``: the request dataclasses of ``requests.py`` and ``Reply``, whose values are
engine rows, updates and counters. Decoding constructs nothing but those, so a frame from a
confused or hostile peer is at worst a ``ProtocolError``; still, the driver reads frames only
from connections that presented the cluster's token in a fixed binary hello (not a frame),
and tasks read only from the driver they dialled and from peer tasks of the mesh that
presented the same token (``mesh.py``).

To add a message kind, define its dataclass (in ``requests.py``) and register it here with a
tag no other kind uses: ``CODEC.register(<tag>, rq.NewKind)``.
"""

from __future__ import annotations

import hmac
import socket
import struct
from dataclasses import dataclass
from typing import Any

from services.compute.dataflow.work import Work
from services.compute.spark import requests as rq
from services.compute.spark.codec import Codec, MalformedMessage

_HEADER = struct.Struct(">Q")
_HELLO = struct.Struct(">32sII")  # token, shard, process id
TOKEN_BYTES = 32

MAX_FRAME_BYTES = 1 << 36
"""A frame claiming more is refused outright (a Peek of a very large view stays far below)."""
_FIRST_CHUNK_BYTES = 1 << 20
"""Frames are read into chunks that grow as bytes actually arrive, so a length prefix alone
never makes the reader allocate what it claims."""

CODEC = Codec()
CODEC.register(1, rq.Install)
CODEC.register(2, rq.Drop)
CODEC.register(4, rq.ApplyIndex)
CODEC.register(5, rq.CompactIndex)
CODEC.register(6, rq.Peek)
CODEC.register(7, rq.Stats)
CODEC.register(8, rq.Hydrate)
CODEC.register(9, rq.Stop)
CODEC.register(10, rq.Reply)
CODEC.register(11, Work)
CODEC.register(12, rq.Ping)
CODEC.register(13, rq.Heartbeat)
CODEC.register(14, rq.Step)
CODEC.register(15, rq.MeshAddress)
CODEC.register(16, rq.JoinMesh)
CODEC.register(17, rq.Exchange)
CODEC.register(18, rq.MeshPeer)
CODEC.register(19, rq.LoadRows)
CODEC.register(20, rq.IndexChanges)
CODEC.register(40, rq.StepIO)
CODEC.register(41, rq.StepWritten)
CODEC.register(42, rq.PartsShare)


class ConnectionLost(Exception):
    """The peer closed the connection (or it broke) in the middle of an exchange."""


class ProtocolError(ConnectionLost):
    """The peer sent something that is not a frame of a registered message kind; the
    connection cannot be trusted further."""


def send_message(sock: socket.socket, message: object) -> None:
    payload = CODEC.encode(message)
    try:
        sock.sendall(_HEADER.pack(len(payload)) + payload)
    except OSError as error:
        raise ConnectionLost(str(error)) from error


def receive_message(sock: socket.socket) -> Any:
    """The next message: an instance of a registered kind (``ProtocolError`` otherwise)."""
    (length,) = _HEADER.unpack(_receive_exactly(sock, _HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame of {length} bytes is over the {MAX_FRAME_BYTES} limit")
    try:
        return CODEC.decode(_receive_exactly(sock, length))
    except MalformedMessage as error:
        raise ProtocolError(str(error)) from None


def send_hello(sock: socket.socket, token: bytes, shard: int, pid: int) -> None:
    try:
        sock.sendall(_HELLO.pack(token, shard, pid))
    except OSError as error:
        raise ConnectionLost(str(error)) from error


def receive_hello(sock: socket.socket) -> tuple[bytes, int, int]:
    """``(token, shard, pid)`` from a task's opening message."""
    token, shard, pid = _HELLO.unpack(_receive_exactly(sock, _HELLO.size))
    return token, shard, pid


@dataclass(frozen=True)
class Hello:
    """A connected task: its shard and the process id of its Python worker."""

    shard: int
    pid: int


def authenticate(sock: socket.socket, token: bytes) -> Hello | None:
    """A newly connected task's hello if it carries ``token``, else None (the caller closes
    the connection). Leaves the socket blocking and tuned for requests."""
    sock.settimeout(10)
    try:
        presented, shard, pid = receive_hello(sock)
    except (ConnectionLost, OSError):
        return None
    if not hmac.compare_digest(presented, token):
        return None
    sock.settimeout(None)
    tune(sock)
    return Hello(shard, pid)


def _receive_exactly(sock: socket.socket, length: int) -> bytes | bytearray:
    chunks: list[bytearray] = []
    remaining = length
    size = min(length, _FIRST_CHUNK_BYTES)
    while remaining:
        chunk = bytearray(min(size, remaining))
        _fill(sock, chunk)
        chunks.append(chunk)
        remaining -= len(chunk)
        size *= 2
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def _fill(sock: socket.socket, buffer: bytearray) -> None:
    view = memoryview(buffer)
    received = 0
    while received < len(buffer):
        try:
            count = sock.recv_into(view[received:])
        except OSError as error:
            raise ConnectionLost(str(error)) from error
        if count == 0:
            raise ConnectionLost("connection closed by the peer")
        received += count


def tune(sock: socket.socket) -> None:
    """Small request/response messages: send them at once instead of batching."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
