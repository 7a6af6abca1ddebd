"""Messages between the driver and its resident tasks: length-prefixed pickles over TCP.

Pickle is acceptable here only because both ends are our own code and the driver never
unpickles from a connection it has not authenticated: a task's opening message is a fixed
binary hello (not a pickle) carrying the random token the driver put in the job's closure, and
the driver drops any connection that does not present it. Tasks only read from the driver
they dialled.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">Q")
_HELLO = struct.Struct(">32sII")  # token, shard, process id
TOKEN_BYTES = 32


class ConnectionLost(Exception):
    """The peer closed the connection (or it broke) in the middle of an exchange."""


def send_message(sock: socket.socket, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        sock.sendall(_HEADER.pack(len(payload)) + payload)
    except OSError as error:
        raise ConnectionLost(str(error)) from error


def receive_message(sock: socket.socket) -> Any:
    (length,) = _HEADER.unpack(_receive_exactly(sock, _HEADER.size))
    return pickle.loads(_receive_exactly(sock, length))


def send_hello(sock: socket.socket, token: bytes, shard: int, pid: int) -> None:
    try:
        sock.sendall(_HELLO.pack(token, shard, pid))
    except OSError as error:
        raise ConnectionLost(str(error)) from error


def receive_hello(sock: socket.socket) -> tuple[bytes, int, int]:
    """``(token, shard, pid)`` from a task's opening message."""
    token, shard, pid = _HELLO.unpack(_receive_exactly(sock, _HELLO.size))
    return token, shard, pid


def _receive_exactly(sock: socket.socket, length: int) -> bytearray:
    buffer = bytearray(length)
    view = memoryview(buffer)
    received = 0
    while received < length:
        try:
            count = sock.recv_into(view[received:])
        except OSError as error:
            raise ConnectionLost(str(error)) from error
        if count == 0:
            raise ConnectionLost("connection closed by the peer")
        received += count
    return buffer


def tune(sock: socket.socket) -> None:
    """Small request/response messages: send them at once instead of batching."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
