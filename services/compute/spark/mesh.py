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
connection breaks, is down. Without ``replace_s`` it is lost for good: every exchange from
then on raises ``MeshLost`` at once, and the cluster (which only its driver can restart) is
given up. With ``replace_s``, the driver may start a new task for that shard within that
time: the new task dials every peer (``join(..., rejoin=True)``) and, after its hello, says
where it listens (``MeshPeer``); each peer dials it back, drops the old connections and goes
on waiting, so a step in flight completes. Every task keeps the ``Exchange`` messages it
sent in its current step and re-sends them to a replaced peer, which runs the step from its
start (its state was rebuilt as of before the step); a receiver ignores a second message for
a (step, node) it already has from that peer, so what the lost task had sent counts once.
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
from services.compute.spark.requests import Exchange, Heartbeat, MeshPeer
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
    generation: int = 0


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
        replace_s: float | None = None,
    ) -> None:
        """Opens this task's listener on ``host`` (the address its peers reach it at), on
        the first free port of ``ports`` (first, last; None: an ephemeral port), so that a
        NetworkPolicy can allow the range (several tasks may share an executor).
        ``replace_s``: how long a step waits for a lost peer's replacement (None: a lost
        peer fails every step from then on); the listener then stays open for it."""
        self.shard = shard
        self.replace_s = replace_s
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
        # A peer's outgoing connection, its kept messages and its generation change
        # together (a replacement) under its lock; a reader of an older generation is stale.
        self._locks: dict[int, threading.Lock] = {}
        self._generation: dict[int, int] = {}
        self._down: set[int] = set()
        # The Exchange messages sent to each peer in step ``_kept_step``, re-sent to a
        # replacement; and per peer the (step, node) already received, to skip a resend.
        self._kept_step = 0
        self._kept: dict[int, list[Exchange]] = {}
        self._received: dict[int, set[tuple[int, int]]] = {}

    def join(self, addresses: Sequence[tuple[str, int]], *, rejoin: bool = False) -> None:
        """Connects to every other task (``addresses[p]``: shard ``p``'s listener); raises
        ``MeshLost`` when one cannot be reached or does not connect in the deadline. With
        ``rejoin``, this task replaces a lost one in a running mesh: it tells each peer its
        own listener's address, and they dial it back."""
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
                    if rejoin:
                        self._announce(peer, outgoing[peer])
            accepting.join()
            if accept_error:
                raise accept_error[0]
        except BaseException:
            for sock in [*outgoing.values(), *incoming.values()]:
                sock.close()
            self._listener.close()
            raise
        if self.replace_s is None:
            self._listener.close()
        for peer in outgoing:
            for sock in (outgoing[peer], incoming[peer]):
                keep_alive(sock, self._liveness)
            self._outgoing[peer] = Channel(outgoing[peer], deadline_s)
            self._incoming[peer] = Channel(incoming[peer], deadline_s)
            self._inboxes[peer] = queue.SimpleQueue()
            self._locks[peer] = threading.Lock()
            self._generation[peer] = 0
            self._kept[peer] = []
            self._received[peer] = set()
        for peer, channel in self._incoming.items():
            self._start_reader(peer, channel, 0)
        threading.Thread(target=self._beat, name="mesh-heartbeat", daemon=True).start()
        if self.replace_s is not None:
            threading.Thread(
                target=self._accept_replacements, name="mesh-replacements", daemon=True
            ).start()

    def _announce(self, peer: int, sock: socket.socket) -> None:
        try:
            Channel(sock).send(MeshPeer(*self.address))
        except ConnectionLost as error:
            raise MeshLost(f"cannot reach shard {peer}: {error}") from error

    def _start_reader(self, peer: int, channel: Channel, generation: int) -> None:
        threading.Thread(
            target=self._read,
            args=(peer, channel, generation),
            name=f"mesh-{peer}-{generation}",
            daemon=True,
        ).start()

    def _accept_replacements(self) -> None:
        """Takes in the tasks that replace lost peers, for the task's whole life."""
        context = None if self._tls is None else server_context(self._tls)
        identity = None if self._tls is None else own_identity(self._tls)
        self._listener.settimeout(0.5)
        while not self._closed.is_set():
            try:
                accepted, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed: the task ends
            try:
                accepted.settimeout(None)
                sock = accept_secure(accepted, context, identity)
                if sock is None:
                    continue
                hello = authenticate(sock, self._token)
                if hello is None or hello.shard not in self._outgoing:
                    sock.close()
                    continue
                self._replace(hello.shard, sock)
            except (OSError, ConnectionLost, MeshLost):
                # The newcomer went away half way; the step keeps waiting for another.
                continue

    def _replace(self, peer: int, incoming: socket.socket) -> None:
        """Swaps in the task that took over shard ``peer``: reads where it listens, dials
        it back, and re-sends it this step's kept messages."""
        deadline_s = self._liveness.deadline_s
        reading = Channel(incoming, deadline_s)
        message = reading.receive()
        if not isinstance(message, MeshPeer):
            incoming.close()
            return
        outgoing = self._dial(peer, message.host, message.port, deadline_s)
        for sock in (outgoing, incoming):
            keep_alive(sock, self._liveness)
        writing = Channel(outgoing, deadline_s)
        with self._locks[peer]:
            for old in (self._outgoing[peer], self._incoming[peer]):
                old.shut()
                old.sock.close()
            generation = self._generation[peer] + 1
            self._generation[peer] = generation
            self._outgoing[peer] = writing
            self._incoming[peer] = reading
            self._down.discard(peer)
            self._start_reader(peer, reading, generation)
            for kept in self._kept[peer]:
                writing.send(kept)

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
        if step != self._kept_step:
            # A new step: what the last one sent is no longer needed by anyone.
            self._kept_step = step
            for peer in self._kept:
                self._kept[peer] = []
                self._received[peer] = {seen for seen in self._received[peer] if seen[0] >= step}
        for peer in list(self._outgoing):
            message = Exchange(step, node_id, parts[peer])
            if self.replace_s is None:
                self._send(peer, self._outgoing[peer], message)
                continue
            with self._locks[peer]:
                self._kept[peer].append(message)
                if peer not in self._down:
                    try:
                        self._outgoing[peer].send(message)
                    except ConnectionLost:
                        # Its replacement gets the message with the others kept.
                        self._down.add(peer)
        return [
            parts[peer] if peer == self.shard else self._receive(peer, step, node_id)
            for peer in range(self.shards)
        ]

    def fail_step(self, step: int) -> None:
        """Tells every peer that this task's step ``step`` failed (they stop waiting for it)."""
        if self._broken is not None:
            return
        for peer in list(self._outgoing):
            try:
                self._send(peer, self._outgoing[peer], Exchange(step, -1, (), failed=True))
            except MeshLost:
                if self.replace_s is None:
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
            reason = f"the resident task of shard {peer} is gone ({error})"
            if self.replace_s is not None:
                raise MeshLost(reason) from error
            self._lose(reason)
            raise MeshLost(self._broken or "") from error

    def _receive(self, peer: int, step: int, node_id: int) -> tuple[list[Update], ...]:
        inbox = self._inboxes[peer]
        while True:
            # The reader gives a silent peer up after the deadline; this bound is a second
            # line should the reader itself be stuck. A peer that is down may be replaced.
            wait_s = 2 * self._liveness.deadline_s
            if peer in self._down and self.replace_s is not None:
                wait_s = self.replace_s
            try:
                item = inbox.get(timeout=wait_s)
            except queue.Empty:
                self._lose(f"the resident task of shard {peer} sent nothing for {wait_s} s")
                raise MeshLost(self._broken or "") from None
            if isinstance(item, _Broken):
                if self.replace_s is None:
                    self._lose(item.reason)
                    raise MeshLost(self._broken or "")
                with self._locks[peer]:
                    if item.generation == self._generation[peer]:
                        self._down.add(peer)  # wait for its replacement
                continue
            if item.step < step:
                continue  # left over from a step that failed
            if (item.step, item.node_id) in self._received[peer]:
                continue  # sent again by a replacement that ran the step from its start
            if item.failed and item.step == step:
                raise PeerFailed(f"the step failed on shard {peer}")
            if item.step != step or item.node_id != node_id:
                self._lose(
                    f"shard {peer} sent node {item.node_id} of step {item.step} while "
                    f"node {node_id} of step {step} was awaited"
                )
                raise MeshLost(self._broken or "")
            self._received[peer].add((step, node_id))
            return tuple(list(updates) for updates in item.inputs)

    def _lose(self, reason: str) -> None:
        if self._broken is None:
            self._broken = reason

    def _read(self, peer: int, channel: Channel, generation: int) -> None:
        inbox = self._inboxes[peer]
        while True:
            try:
                message = channel.receive()
            except ConnectionLost as error:
                if not self._closed.is_set():
                    silent = time.monotonic() - channel.last_heard
                    if silent >= self._liveness.deadline_s:
                        reason = (
                            f"the resident task of shard {peer} said nothing for {silent:.1f} s"
                        )
                    else:
                        reason = f"the resident task of shard {peer} is gone ({error})"
                    inbox.put(_Broken(reason, generation))
                return
            if isinstance(message, Exchange):
                inbox.put(message)
            elif isinstance(message, MeshPeer):
                continue  # a new task's word to its peers: this task joins with it
            elif not isinstance(message, Heartbeat):
                inbox.put(_Broken(f"shard {peer} sent a {type(message).__name__}", generation))
                return

    def _beat(self) -> None:
        while not self._closed.wait(self._liveness.heartbeat_s):
            for channel in list(self._outgoing.values()):
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
