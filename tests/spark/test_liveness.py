"""Heartbeats and deadlines between a driver and its resident tasks, without Spark: a task's
request loop over a socket pair, and fake peers that go silent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from services.compute.spark import requests as rq
from services.compute.spark.liveness import (
    Channel,
    Liveness,
    PeerLost,
    bound_stalls,
    collect,
    drain,
    ping,
)
from services.compute.spark.resident import retry_delay
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.wire import ConnectionLost, receive_message, send_message
from tidemark.errors import InvalidArgument

# Short enough for quick tests, with a deadline of many beats so a loaded machine that
# delays one beat does not fail them.
LIVENESS = Liveness(heartbeat_s=0.1, deadline_s=2.0)


class SlowStats(ShardHost):
    """A host whose Stats take longer than the deadline: a legitimately long request."""

    def __init__(self, seconds: float | None) -> None:
        super().__init__(shard=0, shards=1)
        self.seconds = seconds
        self.release = threading.Event()

    def handle(self, request: rq.Request) -> object:
        if isinstance(request, rq.Stats):
            self.release.wait(self.seconds)
            return "done"
        return super().handle(request)


class Served:
    """A host serving one end of a socket pair in a thread; its outcome once it ends."""

    def __init__(self, host: ShardHost, liveness: Liveness | None) -> None:
        self.driver, task = socket.socketpair()
        self.outcome: BaseException | None = None

        def serve() -> None:
            try:
                host.serve(task, liveness)
            except BaseException as error:
                self.outcome = error
            finally:
                task.close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        self.channel = Channel(self.driver, LIVENESS.deadline_s)


@pytest.fixture
def pair() -> Iterator[tuple[Channel, socket.socket]]:
    left, right = socket.socketpair()
    yield Channel(left), right
    left.close()
    right.close()


def test_a_request_longer_than_the_deadline_is_answered_while_the_task_beats() -> None:
    host = SlowStats(seconds=2.5 * LIVENESS.deadline_s)
    served = Served(host, LIVENESS)
    served.channel.send(rq.Stats("v"))
    # The task beats while it works: the driver keeps waiting, past the deadline.
    assert collect([served.channel]) == [rq.Reply("done")]
    served.channel.send(rq.Stop())
    assert collect([served.channel]) == [rq.Reply()]
    served.thread.join(10)
    assert not served.thread.is_alive() and served.outcome is None
    served.driver.close()


def test_the_driver_gives_up_a_task_that_says_nothing() -> None:
    answering, silent = Served(ShardHost(0, 2), LIVENESS), socket.socketpair()
    channels = [answering.channel, Channel(silent[0], LIVENESS.deadline_s)]
    for channel in channels:
        channel.send(rq.Stats("missing"))
    with pytest.raises(PeerLost, match=r"said nothing for \d") as lost:
        collect(channels)
    assert lost.value.index == 1
    answering.driver.close()
    for end in silent:
        end.close()


def test_a_silent_task_is_noticed_while_another_still_works_on_a_long_request() -> None:
    busy = SlowStats(seconds=None)  # answers only once released
    served = Served(busy, LIVENESS)
    silent_driver, silent_task = socket.socketpair()
    channels = [served.channel, Channel(silent_driver, LIVENESS.deadline_s)]
    for channel in channels:
        channel.send(rq.Stats("v"))
    with pytest.raises(PeerLost, match="said nothing") as lost:
        collect(channels)
    assert lost.value.index == 1  # noticed without waiting for shard 0's answer
    busy.release.set()
    assert collect([served.channel]) == [rq.Reply("done")]
    served.channel.send(rq.Stop())
    assert collect([served.channel]) == [rq.Reply()]
    served.thread.join(10)
    for sock in (served.driver, silent_driver, silent_task):
        sock.close()


def test_a_task_that_closes_its_connection_is_lost_at_once(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, task = pair
    task.shutdown(socket.SHUT_RDWR)
    with pytest.raises(PeerLost, match="is gone") as lost:
        collect([channel])
    assert lost.value.index == 0


def test_an_idle_task_beats_and_a_silent_one_is_noticed() -> None:
    served = Served(ShardHost(0, 1), LIVENESS)
    silent_driver, silent_task = socket.socketpair()
    channels = [served.channel, Channel(silent_driver, LIVENESS.deadline_s)]
    # The beating task's heartbeats are read and keep it heard from; the other one falls
    # silent past the deadline.
    while True:
        try:
            drain(channels)
        except PeerLost as lost:
            assert lost.index == 1
            break
        ping(served.channel)
        threading.Event().wait(LIVENESS.heartbeat_s)
    assert served.thread.is_alive()  # pinged all along: the task keeps serving
    served.channel.send(rq.Stop())
    assert collect([served.channel]) == [rq.Reply()]
    served.thread.join(10)
    assert served.outcome is None
    for sock in (served.driver, silent_driver, silent_task):
        sock.close()


def test_an_unrequested_answer_from_an_idle_task_breaks_the_exchange(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, task = pair
    send_message(task, rq.Heartbeat())
    send_message(task, rq.Reply("stray"))
    with pytest.raises(PeerLost, match="sent an unrequested Reply"):
        drain([channel])


def test_a_task_whose_driver_falls_silent_ends_by_itself() -> None:
    served = Served(ShardHost(0, 1), LIVENESS)
    # The driver never pings and never closes: as if its host vanished.
    served.thread.join(30 * LIVENESS.deadline_s)
    assert not served.thread.is_alive()
    assert isinstance(served.outcome, ConnectionLost)
    assert str(served.outcome) == f"no frame from the driver in {LIVENESS.deadline_s} s"
    served.driver.close()


def test_without_liveness_the_loop_neither_beats_nor_gives_up() -> None:
    served = Served(ShardHost(0, 1), None)
    served.channel.send(rq.Stats("v"))
    (reply,) = collect([served.channel])
    assert isinstance(reply, rq.Reply) and reply.error_class == "NotFound"
    assert not served.channel.readable(3 * LIVENESS.heartbeat_s)  # no heartbeat came
    served.channel.send(rq.Stop())
    assert collect([served.channel]) == [rq.Reply()]
    served.thread.join(10)
    assert served.outcome is None
    served.driver.close()


def test_a_send_the_peer_stops_taking_in_fails_instead_of_blocking(
    pair: tuple[Channel, socket.socket],
) -> None:
    channel, _ = pair  # the peer never reads
    bound_stalls(channel.sock, 0.5)
    with pytest.raises(ConnectionLost):
        channel.send(rq.Reply(b"x" * 50_000_000))


def test_a_large_message_that_keeps_moving_is_not_cut(pair: tuple[Channel, socket.socket]) -> None:
    channel, task = pair
    bound_stalls(channel.sock, 0.5)
    bound_stalls(task, 0.5)
    payload = b"x" * 50_000_000
    received: list[object] = []
    reader = threading.Thread(target=lambda: received.append(receive_message(task)))
    reader.start()
    channel.send(rq.Reply(payload))
    reader.join(60)
    assert received == [rq.Reply(payload)]


def test_a_frame_that_stops_half_way_loses_its_peer(pair: tuple[Channel, socket.socket]) -> None:
    channel, task = pair
    bound_stalls(channel.sock, 0.5)
    encoding, encoded = socket.socketpair()
    send_message(encoding, rq.Reply("x" * 1000))
    frame = encoded.recv(1 << 16)
    encoding.close()
    encoded.close()
    task.sendall(frame[: len(frame) // 2])  # a frame that stops half way
    with pytest.raises(PeerLost, match="is gone") as lost:
        collect([channel])
    assert lost.value.index == 0


@pytest.mark.parametrize(
    ("heartbeat_s", "deadline_s", "message"),
    [
        (0.0, 1.0, "must be positive"),
        (1.0, 1.5, "at least two heartbeats"),
    ],
)
def test_a_deadline_must_span_heartbeats(
    heartbeat_s: float, deadline_s: float, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Liveness(heartbeat_s, deadline_s)


def test_launches_are_retried_after_growing_waits() -> None:
    assert [retry_delay(attempt) for attempt in range(1, 7)] == [2, 4, 8, 16, 30, 30]


class OddAnswer(ShardHost):
    """A host whose Stats answer holds a value the typed wire cannot carry."""

    def handle(self, request: rq.Request) -> object:
        if isinstance(request, rq.Stats):
            return {1, 2}  # a set: no engine value is one
        return super().handle(request)


def test_an_answer_the_wire_cannot_carry_fails_its_request_and_the_task_serves_on() -> None:
    served = Served(OddAnswer(0, 1), LIVENESS)
    served.channel.send(rq.Stats("v"))
    (reply,) = collect([served.channel])
    assert isinstance(reply, rq.Reply) and reply.error_class == "Internal"
    assert "set" in reply.error_message
    served.channel.send(rq.Drop("missing"))
    (reply,) = collect([served.channel])
    assert isinstance(reply, rq.Reply) and reply.error_class == "NotFound"
    served.channel.send(rq.Stop())
    assert collect([served.channel]) == [rq.Reply()]
    served.thread.join(10)
    assert served.outcome is None
    served.driver.close()


def test_a_channel_closed_under_its_reader_ends_as_a_lost_connection() -> None:
    """``Mesh.close`` closes a peer's socket while its reader thread may be about to wait on
    it: the wait reports the end of the connection, and the receive ``ConnectionLost``, rather
    than the reader dying on the closed file descriptor."""
    ours, theirs = socket.socketpair()
    channel = Channel(ours, LIVENESS.deadline_s)
    ours.close()
    assert channel.readable(0)
    with pytest.raises(ConnectionLost):
        channel.receive()
    theirs.close()
