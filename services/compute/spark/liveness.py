"""Heartbeats and deadlines on a driver<->task connection.

Both ends prove they are alive by talking: a task sends a ``Heartbeat`` every
``heartbeat_s`` from a small thread (while idle and while working on a request), and the
driver sends a ``Ping`` every ``heartbeat_s`` to every task. Either end that hears nothing
from the other for ``deadline_s`` gives the connection up. The deadline is on silence, never
on how long a request takes: a task loading millions of rows keeps beating meanwhile.

A ``Channel`` wraps one connected socket: its sends go through one lock (a heartbeat thread
and the request loop share the socket, and a message's bytes must never interleave), and it
remembers when the peer was last heard. Every frame still goes through ``wire``'s
``send_message``/``receive_message``.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from services.compute.spark.requests import Heartbeat, Ping
from services.compute.spark.wire import ConnectionLost, receive_message, send_message
from tidemark.errors import InvalidArgument

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


@dataclass(frozen=True)
class Liveness:
    """``heartbeat_s``: how often each end speaks when it has nothing else to say;
    ``deadline_s``: the silence after which the other end is given up. The deadline spans
    several heartbeats, so one late beat (a busy machine, a pause) is not a failure."""

    heartbeat_s: float = 2.0
    deadline_s: float = 15.0

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0:
            raise InvalidArgument(
                f"the heartbeat interval must be positive, not {self.heartbeat_s}"
            )
        if self.deadline_s < 2 * self.heartbeat_s:
            raise InvalidArgument(
                f"a deadline of {self.deadline_s} s must be at least two heartbeats "
                f"({self.heartbeat_s} s each)"
            )


@dataclass(frozen=True)
class ClusterStart:
    """How a process's resident clusters start and are watched: ``liveness`` for every
    connection, ``connect_timeout_s`` for one launch of the tasks until all have connected,
    ``attempts`` launches before a start gives up."""

    liveness: Liveness = Liveness()
    connect_timeout_s: float = 120.0
    attempts: int = 3

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0:
            raise InvalidArgument(
                f"a cluster start needs a positive timeout, not {self.connect_timeout_s}"
            )
        if self.attempts < 1:
            raise InvalidArgument(f"a start needs at least one attempt, not {self.attempts}")


class PeerLost(Exception):
    """Peer ``index`` broke its connection, or said nothing for longer than the deadline."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


class Channel:
    """``deadline_s``: bound every blocking receive on ``sock`` (and every send, with
    ``bound_sends``) to that long without progress (``bound_stalls``), and give the peer up
    after that long without a frame."""

    def __init__(
        self, sock: socket.socket, deadline_s: float | None = None, *, bound_sends: bool = True
    ) -> None:
        self.sock = sock
        self.deadline_s = deadline_s
        self.last_heard = time.monotonic()
        self._send_lock = threading.Lock()
        # A TLS connection is one OpenSSL state machine, which two threads must not drive at
        # once (a read may write, a write may read): its receives wait for bytes outside the
        # lock, then read under the lock the sends take.
        self._one_at_a_time = isinstance(sock, ssl.SSLSocket)
        if deadline_s is not None:
            bound_stalls(sock, deadline_s, sends=bound_sends)

    def send(self, message: object) -> None:
        with self._send_lock:
            send_message(self.sock, message)

    def receive(self) -> object:
        if self._one_at_a_time:
            if not self.readable(self.deadline_s):
                raise ConnectionLost(f"nothing received in {self.deadline_s} s")
            with self._send_lock:
                message = receive_message(self.sock)
        else:
            message = receive_message(self.sock)
        self.last_heard = time.monotonic()
        return message

    def buffered(self) -> bool:
        """Whether bytes already wait in the socket object itself (a TLS socket decrypts
        ahead, where a poll of its file descriptor cannot see them)."""
        pending = getattr(self.sock, "pending", None)
        return pending is not None and pending() > 0

    def readable(self, timeout: float | None) -> bool:
        """Whether a frame (or the end of the connection) arrives within ``timeout`` s
        (None: waits for one)."""
        if self.buffered():
            return True
        poller = select.poll()
        try:
            poller.register(self.sock, _READABLE)
        except ValueError:
            # Closed here meanwhile (``Mesh.close`` while its reader waits): the end of the
            # connection, which the receive that follows reports as ``ConnectionLost``.
            return True
        return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))

    def shut(self) -> None:
        """Ends the connection both ways, waking any thread blocked on it (closing the file
        descriptor alone would not, and could let it be reused under that thread)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already ended by the peer
            pass


def bound_stalls(sock: socket.socket, seconds: float, *, sends: bool = True) -> None:
    """Makes a blocking receive or send on ``sock`` fail once it has made no progress for
    ``seconds`` (kernel timeouts, ``SO_RCVTIMEO``/``SO_SNDTIMEO``): an idle wait that no
    frame ends, a frame that stops half way, a send to a peer that stopped reading. Unlike
    ``settimeout``, the socket stays blocking, so the hot path pays no poll per call, and a
    large transfer that keeps moving is never cut."""
    whole = int(seconds)
    value = struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    if sends:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def keep_alive(sock: socket.socket, liveness: Liveness) -> None:
    """TCP keepalive as well, so a connection whose peer host vanished errors at the socket
    level even when nothing is being sent (the heartbeats are what bound the time)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(liveness.deadline_s))
    for option, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", max(1, int(liveness.heartbeat_s))),
        ("TCP_KEEPCNT", 3),
    ):
        if hasattr(socket, option):  # Linux names; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def collect(channels: Sequence[Channel], replies: dict[int, object] | None = None) -> list[object]:
    """The next message other than heartbeats from every channel, read in order: the peers
    work in parallel meanwhile, and a round of quick answers costs no more than plain
    receives (no poll). Each wait is bounded by the channel's deadline (its receive timeout).
    While a peer's heartbeats show it is still working on a long request, the peers not read
    yet are looked at too, so one that fell silent meanwhile is noticed at once rather than
    after the busy one answers. Raises ``PeerLost``. ``replies``: the answers read so far,
    kept there as they come (a caller that replaces a lost peer collects on from them)."""
    if replies is None:
        replies = {}
    for index, channel in enumerate(channels):
        while index not in replies:
            message = _receive(channel, index)
            if isinstance(message, Heartbeat):
                _look_at_others(channels, replies, index)
            else:
                replies[index] = message
    return [replies[index] for index in range(len(channels))]


def drain(channels: Sequence[Channel]) -> None:
    """Reads the heartbeats idle peers sent (anything else is a broken exchange), then
    raises ``PeerLost`` for a peer not heard from in its deadline."""
    for index, channel in enumerate(channels):
        while channel.readable(0):
            message = _receive(channel, index)
            if not isinstance(message, Heartbeat):
                raise PeerLost(index, f"sent an unrequested {type(message).__name__}")
        _check_silence(channel, index)


def _look_at_others(channels: Sequence[Channel], replies: dict[int, object], busy: int) -> None:
    for index, channel in enumerate(channels):
        if index == busy or index in replies:
            continue
        while index not in replies and channel.readable(0):
            message = _receive(channel, index)
            if not isinstance(message, Heartbeat):
                replies[index] = message
        if index not in replies:
            _check_silence(channel, index)


def _receive(channel: Channel, index: int) -> object:
    waiting = time.monotonic()
    try:
        return channel.receive()
    except ConnectionLost as error:
        silence = time.monotonic() - waiting
        if channel.deadline_s is not None and silence >= channel.deadline_s:
            raise PeerLost(index, f"said nothing for {silence:.1f} s") from error
        raise PeerLost(index, f"is gone ({error})") from error


def _check_silence(channel: Channel, index: int) -> None:
    """Only called for a channel a poll just found with nothing to read: a driver that was
    itself paused finds the beats its peers sent meanwhile waiting, not silence."""
    silence = time.monotonic() - channel.last_heard
    if channel.deadline_s is not None and silence >= channel.deadline_s:
        raise PeerLost(index, f"said nothing for {silence:.1f} s")


@contextmanager
def heartbeats(channel: Channel, interval_s: float) -> Iterator[None]:
    """Sends a ``Heartbeat`` on ``channel`` every ``interval_s`` until the block ends."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval_s):
            try:
                channel.send(Heartbeat())
            except ConnectionLost:
                return  # the request loop notices the broken connection itself

    beating = threading.Thread(target=beat, name="tidemark-heartbeat", daemon=True)
    beating.start()
    try:
        yield
    finally:
        done.set()
        # A beat blocked on a dead peer is left to its daemon thread: the loop's exit must
        # not wait on it.
        beating.join(interval_s)


def ping(channel: Channel) -> None:
    channel.send(Ping())
