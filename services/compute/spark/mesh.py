"""The resident tasks' connections to each other, over which a step's updates go from the task
that made them to the task owning their keys, without passing through the driver.

Each task listens when it starts (``Mesh``); the driver asks every task for its address and
sends them all the list (``join``). Every task then dials every other task, while a thread of
its own accepts the other tasks' connections, presenting and checking the cluster's token in
the same hello a task gives its driver, over TLS when the cluster has TLS (``secure.py``).

So there are two connections between two tasks, one per direction: a task only writes on the
connections it dialled (its parts and its heartbeats) and only reads those it accepted. A TLS
connection is one OpenSSL state machine that two threads must not drive at once, so one
connection written and read at the same time by two threads would take turns, and two tasks
sending each other large parts would each wait for the other to read: one direction per
connection never waits on the other direction.

Frames are typed (``wire.py``): ``Exchange`` messages and heartbeats. One reader thread per
peer moves its frames to an inbox, so a task keeps reading while it sends, and one thread
beats on every outgoing connection. A peer silent for the liveness deadline, or whose
connection breaks, is lost for good: every exchange from then on raises ``MeshLost`` at once,
and the cluster (which only its driver can restart) is given up.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from services.compute.dataflow.batch import Update
from services.compute.spark.liveness import Channel, Liveness, keep_alive
from services.compute.spark.requests import Exchange, Heartbeat
from services.compute.spark.secure import (
    accept_secure,
    connect_secure,
    own_identity,
    server_context,
)
from services.compute.spark.wire import ConnectionLost, authenticate, send_hello, tune
from tidemark.rpc.tls import TlsSettings

MESH_LOST = "MeshLost"
"""The error class a task answers a step with when a peer is lost: the driver then gives the
whole cluster up (``resident.py``)."""
PEER_FAILED = "PeerFailed"
"""The error class of a task whose step stopped because a peer's step failed (the peer
answers the driver with the cause)."""


class MeshLost(Exception):
    """A peer task broke its connection or fell silent for the deadline."""


class PeerFailed(Exception):
    """A peer's step failed, so this task's step cannot complete (the mesh is still whole)."""


@dataclass(frozen=True)
class _Broken:
    reason: str


class Mesh:
    def __init__(
        self,
        shard: int,
        shards: int,
        token: bytes,
        liveness: Liveness,
        *,
        host: str = "127.0.0.1",
        tls: TlsSettings | None = None,
        ports: tuple[int, int] | None = None,
    ) -> None:
        """Opens this task's listener on ``host`` (the address its peers reach it at), on
        the first free port of ``ports`` (first, last; None: an ephemeral port), so that a
        NetworkPolicy can allow the range (several tasks may share an executor)."""
        self.shard = shard
        self.shards = shards
        self._token = token
        self._liveness = liveness
        self._tls = tls
        self._listener = _listen(host, ports, backlog=max(1, shards))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        # Per peer: the connection this task dialled (it only writes there) and the one it
        # accepted (it only reads there).
        self._outgoing: dict[int, Channel] = {}
        self._incoming: dict[int, Channel] = {}
        self._inboxes: dict[int, queue.SimpleQueue[Exchange | _Broken]] = {}
        self._broken: str | None = None
        self._closed = threading.Event()

    def join(self, addresses: Sequence[tuple[str, int]]) -> None:
        """Connects to every other task (``addresses[p]``: shard ``p``'s listener); raises
        ``MeshLost`` when one cannot be reached or does not connect in the deadline."""
        if len(addresses) != self.shards:
            raise MeshLost(f"{len(addresses)} addresses for {self.shards} shards")
        if self._outgoing:
            raise MeshLost("the mesh is joined already")
        deadline_s = self._liveness.deadline_s
        incoming: dict[int, socket.socket] = {}
        outgoing: dict[int, socket.socket] = {}
        accept_error: list[BaseException] = []

        def accept() -> None:
            try:
                self._accept_all(incoming, deadline_s)
            except BaseException as error:  # raised by join below
                accept_error.append(error)

        # Accepting beside dialling: a TLS handshake needs the other end to accept first.
        accepting = threading.Thread(target=accept, name="mesh-accept", daemon=True)
        accepting.start()
        try:
            for peer, (host, port) in enumerate(addresses):
                if peer != self.shard:
                    outgoing[peer] = self._dial(peer, host, port, deadline_s)
            accepting.join()
            if accept_error:
                raise accept_error[0]
        except BaseException:
            for sock in [*outgoing.values(), *incoming.values()]:
                sock.close()
            raise
        finally:
            self._listener.close()
        for peer in outgoing:
            for sock in (outgoing[peer], incoming[peer]):
                keep_alive(sock, self._liveness)
            self._outgoing[peer] = Channel(outgoing[peer], deadline_s)
            self._incoming[peer] = Channel(incoming[peer], deadline_s)
            self._inboxes[peer] = queue.SimpleQueue()
        for peer, channel in self._incoming.items():
            threading.Thread(
                target=self._read, args=(peer, channel), name=f"mesh-{peer}", daemon=True
            ).start()
        threading.Thread(target=self._beat, name="mesh-heartbeat", daemon=True).start()

    def _dial(self, peer: int, host: str, port: int, deadline_s: float) -> socket.socket:
        try:
            sock = connect_secure(
                socket.create_connection((host, port), timeout=deadline_s), self._tls
            )
            sock.settimeout(None)
            tune(sock)
            send_hello(sock, self._token, self.shard, 0)
        except (OSError, ConnectionLost) as error:
            raise MeshLost(f"cannot reach shard {peer} at {host}:{port}: {error}") from error
        return sock

    def _accept_all(self, connected: dict[int, socket.socket], deadline_s: float) -> None:
        context = None if self._tls is None else server_context(self._tls)
        identity = None if self._tls is None else own_identity(self._tls)
        give_up = time.monotonic() + deadline_s
        self._listener.settimeout(0.2)
        while len(connected) < self.shards - 1:
            if time.monotonic() > give_up:
                missing = sorted(set(range(self.shards)) - set(connected) - {self.shard})
                raise MeshLost(f"shards {missing} did not connect within {deadline_s} s")
            try:
                accepted, _ = self._listener.accept()
            except TimeoutError:
                continue
            accepted.settimeout(None)
            sock = accept_secure(accepted, context, identity)
            if sock is None:
                continue
            hello = authenticate(sock, self._token)
            if (
                hello is None
                or not 0 <= hello.shard < self.shards
                or hello.shard == self.shard
                or hello.shard in connected
            ):
                sock.close()
                continue
            connected[hello.shard] = sock

    def exchange(
        self, step: int, node_id: int, parts: Sequence[tuple[list[Update], ...]]
    ) -> list[tuple[list[Update], ...]]:
        """Sends ``parts[q]`` to every peer ``q`` and returns what every shard sent this one
        for (``step``, ``node_id``), by sending shard (this shard's own part included)."""
        if self._broken is not None:
            raise MeshLost(self._broken)
        for peer, channel in self._outgoing.items():
            self._send(peer, channel, Exchange(step, node_id, parts[peer]))
        return [
            parts[peer] if peer == self.shard else self._receive(peer, step, node_id)
            for peer in range(self.shards)
        ]

    def fail_step(self, step: int) -> None:
        """Tells every peer that this task's step ``step`` failed (they stop waiting for it)."""
        if self._broken is not None:
            return
        for peer, channel in self._outgoing.items():
            try:
                self._send(peer, channel, Exchange(step, -1, (), failed=True))
            except MeshLost:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for channel in [*self._outgoing.values(), *self._incoming.values()]:
            channel.shut()
            channel.sock.close()

    def _send(self, peer: int, channel: Channel, message: Exchange) -> None:
        try:
            channel.send(message)
        except ConnectionLost as error:
            self._lose(f"the resident task of shard {peer} is gone ({error})")
            raise MeshLost(self._broken or "") from error

    def _receive(self, peer: int, step: int, node_id: int) -> tuple[list[Update], ...]:
        inbox = self._inboxes[peer]
        while True:
            try:
                # The reader gives a silent peer up after the deadline; this bound is a
                # second line should the reader itself be stuck.
                item = inbox.get(timeout=2 * self._liveness.deadline_s)
            except queue.Empty:
                self._lose(
                    f"the resident task of shard {peer} sent nothing for "
                    f"{2 * self._liveness.deadline_s} s"
                )
                raise MeshLost(self._broken or "") from None
            if isinstance(item, _Broken):
                self._lose(item.reason)
                raise MeshLost(self._broken or "")
            if item.step < step:
                continue  # left over from a step that failed
            if item.failed and item.step == step:
                raise PeerFailed(f"the step failed on shard {peer}")
            if item.step != step or item.node_id != node_id:
                self._lose(
                    f"shard {peer} sent node {item.node_id} of step {item.step} while "
                    f"node {node_id} of step {step} was awaited"
                )
                raise MeshLost(self._broken or "")
            return tuple(list(updates) for updates in item.inputs)

    def _lose(self, reason: str) -> None:
        if self._broken is None:
            self._broken = reason

    def _read(self, peer: int, channel: Channel) -> None:
        inbox = self._inboxes[peer]
        while True:
            try:
                message = channel.receive()
            except ConnectionLost as error:
                if not self._closed.is_set():
                    silent = time.monotonic() - channel.last_heard
                    if silent >= self._liveness.deadline_s:
                        inbox.put(
                            _Broken(
                                f"the resident task of shard {peer} said nothing for {silent:.1f} s"
                            )
                        )
                    else:
                        inbox.put(_Broken(f"the resident task of shard {peer} is gone ({error})"))
                return
            if isinstance(message, Exchange):
                inbox.put(message)
            elif not isinstance(message, Heartbeat):
                inbox.put(_Broken(f"shard {peer} sent a {type(message).__name__}"))
                return

    def _beat(self) -> None:
        while not self._closed.wait(self._liveness.heartbeat_s):
            for channel in self._outgoing.values():
                try:
                    channel.send(Heartbeat())
                except ConnectionLost:
                    pass  # the reader of that peer notices


def _listen(host: str, ports: tuple[int, int] | None, backlog: int) -> socket.socket:
    if ports is None:
        return socket.create_server((host, 0), backlog=backlog)
    first, last = ports
    for port in range(first, last + 1):
        try:
            return socket.create_server((host, port), backlog=backlog)
        except OSError:  # taken (by another task on this executor, or anything else)
            continue
    raise MeshLost(f"no free port for the mesh in {first}-{last} on {host}")
