"""Steps run by three resident task hosts that exchange updates among themselves over the mesh,
without Spark: each host serves its driver end of a socket pair in a thread, and the hosts'
meshes connect over loopback. The output equals the single-shard in-process engine's."""

from __future__ import annotations

import secrets
import socket
import threading
import time as clock
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from services.compute.dataflow import Dataflow, Update
from services.compute.dataflow.batch import Row, consolidate
from services.compute.dataflow.operators.reduce import ReduceOperator
from services.compute.dataflow.worker import ShardWorker
from services.compute.spark import requests as rq
from services.compute.spark.liveness import Channel, Liveness, collect
from services.compute.spark.mesh import MESH_LOST, PEER_FAILED, Mesh, MeshLost
from services.compute.spark.shard_host import HOLD_ENV, ShardHost
from services.compute.spark.wire import TOKEN_BYTES, ConnectionLost
from tests.spark.test_spark_dataflow import CUSTOMERS, ORDERS, history, orders_by_region
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.rpc.identity import compute_identity
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import file_stem, write_certificates

LIVENESS = Liveness(heartbeat_s=0.1, deadline_s=2.0)
SHARDS = 3


class Tasks:
    """Three hosts serving in threads, joined into one mesh, and the driver's channels. Like
    the real driver, it pings every host each heartbeat: a host gives up a driver silent for
    the deadline, and the test may build its inputs for longer than that between requests."""

    def __init__(self, tls: TlsSettings | None = None, replace_s: float | None = None) -> None:
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.replace_s = replace_s
        self.hosts = [self.host(shard, tls) for shard in range(SHARDS)]
        self.channels: list[Channel] = []
        self.threads: list[threading.Thread] = []
        for host in self.hosts:
            self.channels.append(self.serve(host))
        self._stopping = threading.Event()
        threading.Thread(target=self._ping, daemon=True).start()
        addresses = self.ask_all(rq.MeshAddress())
        self.addresses = [reply.value for reply in addresses]
        assert self.ask_all(rq.JoinMesh(tuple(self.addresses))) == [rq.Reply()] * 3

    def host(self, shard: int, tls: TlsSettings | None = None) -> ShardHost:
        mesh = Mesh(shard, SHARDS, self.token, LIVENESS, tls=tls, replace_s=self.replace_s)
        return ShardHost(shard, SHARDS, mesh=mesh)

    def serve(self, host: ShardHost) -> Channel:
        driver, task = socket.socketpair()
        thread = threading.Thread(target=_serve, args=(host, task), daemon=True)
        thread.start()
        self.threads.append(thread)
        return Channel(driver, LIVENESS.deadline_s)

    def _ping(self) -> None:
        while not self._stopping.wait(LIVENESS.heartbeat_s):
            for channel in list(self.channels):
                try:
                    channel.send(rq.Ping())
                except ConnectionLost:  # a test that ends a host on purpose
                    pass

    def replace(self, shard: int, steps: int) -> None:
        """A new host for ``shard`` joins the mesh in the old one's place."""
        self.hosts[shard] = self.host(shard)
        self.channels[shard] = channel = self.serve(self.hosts[shard])
        channel.send(rq.MeshAddress())
        [address] = collect([channel])
        self.addresses[shard] = address.value  # type: ignore[attr-defined]
        channel.send(rq.JoinMesh(tuple(self.addresses), rejoin=True, steps=steps))
        assert collect([channel]) == [rq.Reply()]

    def ask(self, requests: Sequence[rq.Request]) -> list[rq.Reply]:
        for channel, request in zip(self.channels, requests, strict=True):
            channel.send(request)
        replies = collect(self.channels)
        assert all(isinstance(reply, rq.Reply) for reply in replies)
        return replies  # type: ignore[return-value]

    def ask_all(self, request: rq.Request) -> list[rq.Reply]:
        return self.ask([request] * SHARDS)

    def step(
        self,
        dataflow_id: str,
        sources: dict[int, list[Update]],
        constants_at: int | None,
        upper: int,
    ) -> list[Update]:
        """One step, the sources dealt out round-robin; the tasks' outputs, consolidated."""
        shares = [
            {node: updates[shard::SHARDS] for node, updates in sources.items()}
            for shard in range(SHARDS)
        ]
        replies = self.ask([rq.Step(dataflow_id, s, constants_at, upper) for s in shares])
        assert [reply.error_class for reply in replies] == [None] * SHARDS, replies
        return consolidate(update for reply in replies for update in reply.value)

    def stop(self) -> None:
        self._stopping.set()
        for channel in self.channels:
            channel.send(rq.Stop())
        for thread in self.threads:
            thread.join(10)
        for channel in self.channels:
            channel.sock.close()


def _serve(host: ShardHost, sock: socket.socket) -> None:
    try:
        host.serve(sock, LIVENESS)
    except Exception:  # a test that breaks the mesh ends hosts this way
        pass
    finally:
        host.close()
        sock.close()


@pytest.fixture
def tasks() -> Iterator[Tasks]:
    running = Tasks()
    yield running
    running.stop()


def _by_node(dataflow: Dataflow, batches: dict[str, list[Update]]) -> dict[int, list[Update]]:
    return {dataflow.graph.inputs[name]: list(updates) for name, updates in batches.items()}


def _contents(updates: Sequence[Update], time: int) -> dict[Row, int]:
    contents: dict[Row, int] = {}
    for row, at, diff in updates:
        if at <= time:
            contents[row] = contents.get(row, 0) + diff
    return {row: count for row, count in contents.items() if count}


def test_three_shards_exchanging_over_the_mesh_give_the_single_shard_output(
    tasks: Tasks,
) -> None:
    plan = orders_by_region()
    updates = history(seed=11, times=12)
    as_of, uppers = 3, [5, 6, 9, 12]
    reference = Dataflow(plan, as_of=as_of)
    assert (
        tasks.ask_all(rq.Install("v", plan.SerializeToString(), True, (0,), as_of))
        == [rq.Reply()] * SHARDS
    )

    snapshot = {name: [u for u in batch if u[1] <= as_of] for name, batch in updates.items()}
    expected, _ = reference.hydrate(snapshot)
    advanced = {name: [(r, as_of, d) for r, _, d in batch] for name, batch in snapshot.items()}
    got = tasks.step("v", _by_node(reference, advanced), as_of, as_of + 1)
    assert got == expected and got
    everything = list(got)
    for upper in uppers:
        lower = reference.upper
        assert lower is not None
        batches = {
            name: [u for u in batch if lower <= u[1] < upper] for name, batch in updates.items()
        }
        expected, _ = reference.step(batches, upper)
        got = tasks.step("v", _by_node(reference, batches), None, upper)
        assert got == expected
        everything.extend(got)
    # The output went to the shards owning its index keys: together they hold the output.
    for time in (as_of, 8, 11):
        peeked: dict[Row, int] = {}
        for reply in tasks.ask_all(rq.Peek("v", time)):
            peeked.update(reply.value)
        assert peeked == _contents(everything, time) and peeked


def test_a_step_failing_on_one_shard_fails_there_and_leaves_the_mesh_to_other_steps(
    tasks: Tasks,
) -> None:
    plan = orders_by_region()
    updates = history(seed=3, times=6)
    for dataflow_id in ("broken", "fine"):
        tasks.ask_all(rq.Install(dataflow_id, plan.SerializeToString(), True))
    reference = Dataflow(plan, as_of=0)
    expected, _ = reference.hydrate({})
    assert tasks.step("fine", {}, 0, 1) == expected
    tasks.hosts[1]._fault = ("broken", 1)
    replies = tasks.ask_all(rq.Step("broken", {}, 0, 1))
    assert [reply.error_class for reply in replies] == [PEER_FAILED, "Internal", PEER_FAILED]
    assert "injected fault" in replies[1].error_message
    # Step numbers stay aligned, and nothing of the failed step is taken for this one.
    batches = {name: [u for u in batch if 1 <= u[1] < 6] for name, batch in updates.items()}
    expected, _ = reference.step(batches, 6)
    assert tasks.step("fine", _by_node(reference, batches), None, 6) == expected and expected


def test_a_lost_peer_fails_the_step_with_mesh_lost_at_once(tasks: Tasks) -> None:
    plan = orders_by_region()
    tasks.ask_all(rq.Install("v", plan.SerializeToString(), True))
    mesh = tasks.hosts[2].mesh
    assert mesh is not None
    mesh.close()  # as a killed task's connections end
    for channel in tasks.channels[:2]:
        channel.send(rq.Step("v", {}, 0, 1))
    replies = collect(tasks.channels[:2])
    assert [reply.error_class for reply in replies] == [MESH_LOST, MESH_LOST]  # type: ignore[attr-defined]
    assert all("shard 2 is gone" in reply.error_message for reply in replies)  # type: ignore[attr-defined]


def test_a_task_replaced_mid_step_completes_the_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every task holds after the step's first exchange; shard 2 is then killed (its
    connections end) and the others go on to the next exchange, waiting for it. A new host
    for shard 2, in the state before the step, joins the mesh and runs the step from its
    start: the others re-send what they sent shard 2 and skip what the new host sends again
    of the first exchange, and the step's output is the single-shard engine's, once."""
    monkeypatch.setenv(HOLD_ENV, f"v@1@{tmp_path}")
    tasks = Tasks(replace_s=60.0)
    plan = orders_by_region()
    updates = history(seed=5, times=8)
    reference = Dataflow(plan, as_of=0)
    install = rq.Install("v", plan.SerializeToString(), True, (0,), 0)
    assert tasks.ask_all(install) == [rq.Reply()] * SHARDS
    snapshot = {name: [(r, 0, d) for r, t, d in batch if t <= 0] for name, batch in updates.items()}
    expected, _ = reference.hydrate(snapshot)
    sources = _by_node(reference, snapshot)
    shares = [
        {node: batch[shard::SHARDS] for node, batch in sources.items()} for shard in range(SHARDS)
    ]
    for shard in range(SHARDS):
        tasks.channels[shard].send(rq.Step("v", shares[shard], 0, 1))
    for shard in range(SHARDS):
        _wait_for(tmp_path / f"held-{shard}")
    lost = tasks.hosts[2]
    assert lost.mesh is not None
    lost.mesh.close()  # as a killed task's connections end
    tasks.channels[2].sock.close()
    (tmp_path / "release").touch()

    tasks.replace(2, steps=0)
    tasks.channels[2].send(install)
    assert collect([tasks.channels[2]]) == [rq.Reply()]
    tasks.channels[2].send(rq.Step("v", shares[2], 0, 1))
    replies = collect(tasks.channels)
    assert [reply.error_class for reply in replies] == [None] * SHARDS, replies  # type: ignore[attr-defined]
    got = consolidate(u for reply in replies for u in reply.value)  # type: ignore[attr-defined]
    assert got == expected and got
    # Later steps run as ever, numbered alike on the new host.
    batches = {name: [u for u in batch if 1 <= u[1] < 8] for name, batch in updates.items()}
    expected, _ = reference.step(batches, 8)
    assert tasks.step("v", _by_node(reference, batches), None, 8) == expected and expected
    peeked: dict[Row, int] = {}
    for reply in tasks.ask_all(rq.Peek("v", 7)):
        peeked.update(reply.value)
    assert peeked == _contents([*got, *expected], 7)
    tasks.stop()


def _wait_for(path: Path) -> None:
    deadline = clock.monotonic() + 30
    while not path.exists():
        assert clock.monotonic() < deadline, f"{path} never appeared"
        clock.sleep(0.01)


def test_large_parts_cross_both_ways_over_tls_at_once(tmp_path: Path) -> None:
    """Every task sends every other megabytes of updates at the same time, over mTLS: each
    direction has its own connection, so no send waits for a read of the other direction."""
    identity = compute_identity("db", "default")
    write_certificates(tmp_path, [identity])
    stem = tmp_path / file_stem(identity)
    tls = TlsSettings(f"{stem}.crt", f"{stem}.key", str(tmp_path / "ca.crt"))
    tasks = Tasks(tls)
    try:
        numbers = RelationSchema.of(("n", T.INT64), ("label", T.TEXT))
        plan = pb.reduce(pb.get("numbers", numbers), [0], [pb.aggregate("count")])
        tasks.ask_all(rq.Install("v", plan.SerializeToString(), True))
        reference = Dataflow(plan, as_of=0)
        updates = [((n % 40_000, "x" * 40), 0, 1) for n in range(120_000)]
        expected, _ = reference.hydrate({"numbers": updates})
        got = tasks.step("v", _by_node(reference, {"numbers": updates}), 0, 1)
        assert got == expected and len(got) == 40_000
    finally:
        tasks.stop()


def test_a_task_listens_on_the_first_free_port_of_its_range() -> None:
    token = secrets.token_bytes(TOKEN_BYTES)
    taken = socket.create_server(("127.0.0.1", 0))
    first = taken.getsockname()[1]
    meshes: list[Mesh] = []
    try:
        # The range's first port is taken: the first mesh gets the next free one.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            spare = probe.getsockname()[1]
        ports = (min(first, spare), max(first, spare))
        mesh = Mesh(0, 2, token, LIVENESS, ports=ports)
        meshes.append(mesh)
        assert ports[0] <= mesh.address[1] <= ports[1] and mesh.address[1] != first
        with pytest.raises(MeshLost, match=f"no free port for the mesh in {first}-{first}"):
            Mesh(1, 2, token, LIVENESS, ports=(first, first))
    finally:
        for mesh in meshes:
            mesh.close()
        taken.close()


def _comparable(updates: Sequence[Update]) -> list[tuple[Row, int, int]]:
    # A NaN read off the wire is not the reference's NaN object, which tuples compare by;
    # NULL keys do not sort against text.
    return sorted(
        (
            (tuple("NaN" if value != value else value for value in row), time, diff)
            for row, time, diff in updates
        ),
        key=repr,
    )


@pytest.mark.parametrize("seed", [1, 2, 23])
def test_a_reduce_of_sums_combines_on_every_task_and_answers_as_one_shard(
    tasks: Tasks, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """COUNT, SUM and AVG over the join of a float column (NaN, -0.0 and 1e300 among its
    values) on three hosts: each host combines its share before the exchange and folds
    the partial rows it receives (``ShardWorker.process_combined``, never ``process`` for
    the reduce), and every step's output equals the single-shard engine's (seed 1 has a
    group whose orders cancel out at a time while its sum changes)."""
    joined = pb.join(pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0])
    plan = pb.reduce(
        joined,
        [4],
        [
            pb.aggregate("count"),
            pb.aggregate("count", 2),
            pb.aggregate("sum", 2),
            pb.aggregate("avg", 2),
        ],
    )
    updates = history(seed=seed, times=12)
    as_of, uppers = 2, [4, 5, 8, 12]
    # The single-shard reference first: the spies below are to see the hosts' workers only.
    reference = Dataflow(plan, as_of=as_of)
    snapshot = {name: [u for u in batch if u[1] <= as_of] for name, batch in updates.items()}
    hydrated, _ = reference.hydrate(snapshot)
    advanced = {name: [(r, as_of, d) for r, _, d in batch] for name, batch in snapshot.items()}
    steps = [(_by_node(reference, advanced), as_of, as_of + 1, hydrated)]
    for upper in uppers:
        lower = reference.upper
        assert lower is not None
        batches = {
            name: [u for u in batch if lower <= u[1] < upper] for name, batch in updates.items()
        }
        expected, _ = reference.step(batches, upper)
        steps.append((_by_node(reference, batches), None, upper, expected))
    calls: dict[str, set[int]] = {"process_combined": set(), "process": set()}

    def spy(name: str) -> None:
        original = getattr(ShardWorker, name)

        def counted(self: ShardWorker, node_id: int, *args: object) -> object:
            calls[name].add(node_id)
            return original(self, node_id, *args)

        monkeypatch.setattr(ShardWorker, name, counted)

    spy("process_combined")
    spy("process")
    tasks.ask_all(rq.Install("v", plan.SerializeToString(), True))
    changed = 0
    for sources, constants_at, upper, expected in steps:
        got = tasks.step("v", sources, constants_at, upper)
        assert _comparable(got) == _comparable(expected)
        changed += len(got)
    assert changed > 10
    (reduce_id,) = [
        node.id for node in reference.graph.nodes if isinstance(node.operator, ReduceOperator)
    ]
    assert reduce_id in calls["process_combined"]
    assert reduce_id not in calls["process"]
