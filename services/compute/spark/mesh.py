"""The resident tasks' connections to each other, over which a step's updates go from the task
that made them to the task owning their keys, without passing through the driver.

Each task listens when it starts (``listen``); the driver asks every task for its address and
sends them all the list (``join``). Task ``p`` dials every task numbered above it and accepts
from every task below it, presenting and checking the cluster's token in the same hello a task
gives its driver, over TLS when the cluster has TLS (``secure.py``). Dialing upward before
accepting cannot deadlock: the highest task dials nobody, so every chain of waits ends there.

A peer connection carries typed frames (``wire.py``): ``Exchange`` messages and heartbeats.
One reader thread per peer moves its frames to an inbox, so a task never stops reading while
it sends (two tasks sending each other large parts would otherwise both block), and one thread
beats on every peer connection. A peer silent for the liveness deadline, or whose connection
breaks, is lost for good: every exchange from then on raises ``MeshLost`` at once, and the
cluster (which only its driver can restart) is given up.
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
    ) -> None:
        """Opens this task's listener on ``host`` (the address its peers reach it at), on
        an ephemeral port."""
        self.shard = shard
        self.shards = shards
        self._token = token
        self._liveness = liveness
        self._tls = tls
        self._listener = socket.create_server((host, 0), backlog=max(1, shards))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._channels: dict[int, Channel] = {}
        self._inboxes: dict[int, queue.SimpleQueue[Exchange | _Broken]] = {}
        self._broken: str | None = None
        self._closed = threading.Event()

    def join(self, addresses: Sequence[tuple[str, int]]) -> None:
        """Connects to every other task (``addresses[p]``: shard ``p``'s listener); raises
        ``MeshLost`` when one cannot be reached or does not authenticate in the deadline."""
        if len(addresses) != self.shards:
            raise MeshLost(f"{len(addresses)} addresses for {self.shards} shards")
        if self._channels:
            raise MeshLost("the mesh is joined already")
        deadline_s = self._liveness.deadline_s
        connected: dict[int, socket.socket] = {}
        try:
            for peer in range(self.shard + 1, self.shards):
                host, port = addresses[peer]
                try:
                    raw = socket.create_connection((host, port), timeout=deadline_s)
                    sock = connect_secure(raw, self._tls)
                except (OSError, ConnectionLost) as error:
                    reason = f"cannot reach shard {peer} at {host}:{port}: {error}"
                    raise MeshLost(reason) from error
                connected[peer] = sock
                sock.settimeout(None)
                tune(sock)
                send_hello(sock, self._token, self.shard, 0)
            self._accept_lower(connected, deadline_s)
        except BaseException:
            for sock in connected.values():
                sock.close()
            raise
        finally:
            self._listener.close()
        for peer, sock in connected.items():
            keep_alive(sock, self._liveness)
            self._channels[peer] = Channel(sock, deadline_s)
            self._inboxes[peer] = queue.SimpleQueue()
        for peer, channel in self._channels.items():
            threading.Thread(
                target=self._read, args=(peer, channel), name=f"mesh-{peer}", daemon=True
            ).start()
        threading.Thread(target=self._beat, name="mesh-heartbeat", daemon=True).start()

    def _accept_lower(self, connected: dict[int, socket.socket], deadline_s: float) -> None:
        context = None if self._tls is None else server_context(self._tls)
        identity = None if self._tls is None else own_identity(self._tls)
        give_up = time.monotonic() + deadline_s
        self._listener.settimeout(0.2)
        while len(connected) < self.shards - 1:
            if time.monotonic() > give_up:
                missing = sorted(set(range(self.shard)) - set(connected))
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
            if hello is None or not 0 <= hello.shard < self.shard or hello.shard in connected:
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
        for peer, channel in self._channels.items():
            self._send(peer, channel, Exchange(step, node_id, parts[peer]))
        return [
            parts[peer] if peer == self.shard else self._receive(peer, step, node_id)
            for peer in range(self.shards)
        ]

    def fail_step(self, step: int) -> None:
        """Tells every peer that this task's step ``step`` failed (they stop waiting for it)."""
        if self._broken is not None:
            return
        for peer, channel in self._channels.items():
            try:
                self._send(peer, channel, Exchange(step, -1, (), failed=True))
            except MeshLost:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for channel in self._channels.values():
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
            for channel in self._channels.values():
                try:
                    channel.send(Heartbeat())
                except ConnectionLost:
                    pass  # the reader of that peer notices
