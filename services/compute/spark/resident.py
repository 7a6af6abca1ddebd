"""Resident tasks on the driver's side: start P of them, talk to them, notice when one dies.

A ``ResidentCluster`` runs P single-task Spark jobs, one per shard, each from a driver
thread and in a job group of its own. A job never finishes on its own: the task of shard
``p`` connects back to a socket the driver listens on, proves it belongs to this cluster with
a random token carried in the job's closure, and then serves requests for shard ``p``
(``shard_host.ShardHost``) until told to stop. Separate jobs keep the tasks apart: Spark
ends only the job of a task that died, never its peers' (a barrier job would fail them all).

Both sides watch the other (``liveness.py``): a task that says nothing for the deadline (not
even the heartbeat it sends while working) is lost, and a task that hears nothing from its
driver for the deadline ends by itself. Starting waits for slots that are still coming up,
relaunching the jobs a bounded number of times.

A lost task either fails the cluster (``Unavailable``, now and on every later call), or,
with ``replace_lost``, is replaced: the driver relaunches that shard's job, the new task
joins the mesh in the lost one's place (``mesh.py``), every dataflow registered with
``register`` rebuilds its shard of state there (its ``ShardRestorer``: the bulk path, as of
before the request in flight), and the request in flight is sent to the new task again, so
the round completes once. The other tasks keep their state and their processes. Only the
dataflow of the request in flight is rebuilt under the request lock (its round waits for
it); the others are rebuilt by threads of their own, several at once, each taking the lock
only to talk to the new task, and a request of a dataflow waits until its shards are all
rebuilt, while the other dataflows' requests go on.

The blocking methods are thread-safe (one request round at a time); the ``a``-prefixed ones
run them in a thread for asyncio callers, except ``acall``, which runs a round of small
answers on the event loop itself when nothing makes it wait.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

from pyspark.sql import SparkSession

from services.compute.dataflow.batch import Row, Update
from services.compute.dataflow.spill import TaskStateBudget
from services.compute.dataflow.work import StateSize, Work
from services.compute.spark import requests as rq
from services.compute.spark.liveness import (
    Channel,
    Liveness,
    PeerLost,
    collect,
    drain,
    keep_alive,
)
from services.compute.spark.mesh import MESH_LOST, PEER_FAILED
from services.compute.spark.secure import accept_secure, own_identity, server_context
from services.compute.spark.session import MESH_PORTS, RESIDENT_PORT, local_slots, port_range
from services.compute.spark.task import resident_task
from services.compute.spark.wire import TOKEN_BYTES, ConnectionLost, authenticate, send_message
from tidemark import errors
from tidemark.errors import FailedPrecondition, Internal, InvalidArgument, Unavailable
from tidemark.logging import get_logger
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import plan_pb2

log = get_logger("compute.spark.resident")

T = TypeVar("T")

_STOP_WAIT_SECONDS = 30.0

REBUILDS_AT_ONCE = 4
"""Dataflows rebuilt at once after a replacement (each runs a Spark job; more would only
queue for the session's few spare slots)."""

ShardRestorer = Callable[[int, Callable[[rq.Request], object]], None]
"""Rebuilds one dataflow's shard on a task that replaces a lost one: called with the shard
and a function that sends that task one request and returns its answer (raising its error).
It may be called from any thread, and must not hold the request lock's round for its own
work: the function it is given takes the lock for each request where needed."""


@dataclass
class _Pending:
    """A dataflow's shards still to rebuild on new tasks: shard -> the replacement (its
    generation) the rebuild is for, and how to rebuild them (kept here, so that a dataflow
    unregistered meanwhile is still rebuilt before its ``Drop`` reaches the new task)."""

    restore: ShardRestorer
    shards: dict[int, int]


@dataclass
class _Restore:
    """One replacement of lost tasks, logged once every dataflow it left to rebuild is."""

    shards: list[int]
    started: float
    waiting: set[str]
    rebuilt: list[str] = field(default_factory=list)


class _RebuildAsk:
    """How a rebuild outside a round talks to the task of ``shard``: one request at a time
    under the request lock, as long as that shard of the dataflow still waits for this
    rebuild (for that ``generation`` of its task). A task lost meanwhile, or replaced again,
    ends this rebuild: the new replacement has queued it again (``superseded``)."""

    def __init__(
        self, cluster: ResidentCluster, dataflow_id: str, shard: int, generation: int
    ) -> None:
        self._cluster = cluster
        self._dataflow_id = dataflow_id
        self._shard = shard
        self._generation = generation
        self.superseded = False

    def __call__(self, request: rq.Request) -> object:
        cluster, shard = self._cluster, self._shard
        with cluster._lock:
            cluster._check_usable()
            with cluster._rebuilds:
                pending = cluster._pending.get(self._dataflow_id)
                waiting = pending is not None and pending.shards.get(shard) == self._generation
            if not waiting:
                # Replaced again, or rebuilt already by the round of a request in flight.
                self.superseded = True
                raise Unavailable(f"the rebuild of shard {shard} was superseded")
            channel = cluster._channels[shard]
            try:
                return cluster._ask(shard, request)
            except (ConnectionLost, PeerLost) as error:
                self.superseded = True
                if cluster._channels[shard] is channel:
                    # Replaced again (and this dataflow queued again) at once.
                    cluster._lost({shard: f"is gone ({error})"}, None, {})
                raise Unavailable(f"the task of shard {shard} was lost while rebuilt") from error


@dataclass
class _Job:
    """One launch of one shard's job (a start or a replacement may launch several)."""

    group: str
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class ResidentCluster:
    def __init__(
        self,
        spark: SparkSession,
        shards: int,
        *,
        connect_timeout: float = 120.0,
        start_attempts: int = 3,
        liveness: Liveness | None = None,
        tls: TlsSettings | None = None,
        state_budget: TaskStateBudget | None = None,
        replace_lost: bool = False,
        replace_s: float = 600.0,
    ) -> None:
        """``connect_timeout``: how long one launch of the jobs may take until every task
        has connected; ``start_attempts``: launches before ``start`` (or a replacement)
        gives up (slots may still be coming up); ``liveness``: heartbeat interval and
        silence deadline. ``tls``: the compute's mTLS files; the tasks' sockets then use TLS
        (``secure.py``), and the executors must read the same files at the same paths.
        ``state_budget``: what each task may hold of operator state in memory and spilled to
        its local disk (None: no bound). ``replace_lost``: replace a lost task rather than
        fail the cluster; its peers wait up to ``replace_s`` for it within a step."""
        if shards < 1:
            raise InvalidArgument(f"a resident cluster needs at least one shard, not {shards}")
        if start_attempts < 1:
            raise InvalidArgument(f"a start needs at least one attempt, not {start_attempts}")
        self.shards = shards
        self._spark = spark
        self._connect_timeout = connect_timeout
        self._start_attempts = start_attempts
        self._liveness = liveness or Liveness()
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._state_budget = state_budget
        self._tls = tls
        # Read now, so that files that do not make a TLS setup fail before any job starts.
        self._tls_context = None if tls is None else server_context(tls)
        self._tls_identity = None if tls is None else own_identity(tls)
        self._replace_lost = replace_lost
        self._replace_s = replace_s
        self._channels: list[Channel] = []
        self._pids: list[int] = []
        self._lock = threading.Lock()  # one request round at a time
        self._jobs: list[_Job] = []
        self._mesh_addresses: list[tuple[str, int]] = []
        self._restorers: dict[str, ShardRestorer] = {}
        self._replacing: list[Channel] = []  # lost between rounds, being replaced
        # Rebuilds left after a replacement: guarded by ``_rebuilds`` (taken after
        # ``_lock`` when both are held, never before it).
        self._rebuilds = threading.Condition()
        self._pending: dict[str, _Pending] = {}
        self._restores: list[_Restore] = []
        self._rebuilders: set[str] = set()  # dataflows a thread is rebuilding
        self._rebuild_slots = threading.Semaphore(REBUILDS_AT_ONCE)
        self._generations = [0] * shards  # replacements of each shard's task so far
        # Dataflows whose rebuild failed outside a round: why. Their requests fail (their
        # owner restarts them) until a Drop, which clears this.
        self._broken: dict[str, str] = {}
        # Step rounds sent so far: every task numbers the same steps alike, and a
        # replacement numbers on from here.
        self._steps_sent = 0
        self.shard_restores = 0
        """Lost tasks replaced with their shards' state rebuilt."""
        self._failure: str | None = None
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Launches the shards' jobs and waits until every task has connected."""
        if self._started:
            raise FailedPrecondition("the resident cluster was already started")
        slots = local_slots(self._spark.sparkContext.master or "")
        if slots is not None and slots < self.shards:
            raise FailedPrecondition(
                f"{self.shards} resident tasks cannot run on a session with {slots} task slots"
            )
        self._started = True
        attempt = 1
        while True:
            try:
                connected = self._launch()
                break
            except Unavailable as error:
                if attempt >= self._start_attempts:
                    self._stopped = True
                    raise
                wait_s = retry_delay(attempt)
                log.warning(
                    "resident_cluster_start_retry",
                    attempt=attempt,
                    attempts=self._start_attempts,
                    wait_s=wait_s,
                    error=error.message,
                )
                time.sleep(wait_s)
                attempt += 1
            except BaseException:
                self._stopped = True
                raise
        for sock, _ in connected:
            keep_alive(sock, self._liveness)
        # Every wait on a task, and every send to it, fails after deadline_s without
        # progress: a silent task, one that stopped reading, a frame that stops half way.
        self._channels = [Channel(sock, self._liveness.deadline_s) for sock, _ in connected]
        self._pids = [pid for _, pid in connected]
        self._keeper = threading.Thread(
            target=self._keep_alive, name="tidemark-resident-keepalive", daemon=True
        )
        self._keeper.start()
        if self.shards > 1:
            self._join_mesh()

    def _join_mesh(self) -> None:
        """Gives every task the others' listeners and waits until they are all connected
        to each other (``mesh.py``); a mesh that cannot form fails the start."""
        try:
            self._mesh_addresses = [_address(a) for a in self.broadcast(rq.MeshAddress())]
            self.broadcast(rq.JoinMesh(tuple(self._mesh_addresses)))
        except BaseException as error:
            self._fail(f"the resident tasks could not connect to each other ({error})")
            self.stop()
            if isinstance(error, Unavailable):
                raise
            raise Unavailable(self._failure or "") from error

    def _launch(self) -> list[tuple[socket.socket, int]]:
        """One launch of every shard's job, until every task has connected. A launch that
        fails is cancelled (its slots, if it got any, come back) before this raises."""
        connected = self._launch_shards(list(range(self.shards)))
        return [connected[shard] for shard in range(self.shards)]

    def _launch_shards(self, shards: list[int]) -> dict[int, tuple[socket.socket, int]]:
        host, bind, port = self._addresses()
        listener = socket.create_server((bind, port), backlog=self.shards)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        launch = secrets.token_hex(8)
        jobs = {shard: _Job(f"tidemark-resident-{launch}-{shard}") for shard in shards}
        if not self._jobs:
            self._jobs = list(jobs.values())
        for shard, job in jobs.items():
            self._jobs[shard] = job
            threading.Thread(
                target=self._run_job, args=(job, host, port, shard), name=job.group, daemon=True
            ).start()
        try:
            return self._accept_all(listener, jobs)
        except BaseException:
            for shard in shards:
                self._cancel_shard(shard)
            raise
        finally:
            # Closed at once so that a retried attempt of a job cannot connect again.
            listener.close()

    def stop(self) -> None:
        """Stops every task and waits for the jobs to end, freeing their slots. Idempotent."""
        self._closing.set()
        if self._keeper is not None:
            self._keeper.join()
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = True
                return
            self._stopped = True
            if self._failure is None:
                try:
                    for channel in self._channels:
                        channel.send(rq.Stop())
                    collect(self._channels)
                except (ConnectionLost, PeerLost):
                    pass  # a task gone already; cancelling the job below ends the rest
            for channel in self._channels:
                channel.sock.close()
        with self._rebuilds:
            self._rebuilds.notify_all()
        for shard, job in enumerate(self._jobs):
            if not job.done.wait(_STOP_WAIT_SECONDS):
                self._cancel_shard(shard)
                job.done.wait(_STOP_WAIT_SECONDS)

    def __enter__(self) -> ResidentCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def task_pids(self) -> tuple[int, ...]:
        """The process id of each shard's Python worker (diagnostics and tests)."""
        return tuple(self._pids)

    @property
    def failure(self) -> str | None:
        """Why the cluster is unusable, once a task has been lost."""
        return self._failure

    @property
    def job_running(self) -> bool:
        """Whether a shard's job still runs (its task holds its slot)."""
        return any(not job.done.is_set() for job in self._jobs)

    def register(self, dataflow_id: str, restore: ShardRestorer) -> None:
        """How to rebuild an installed dataflow's shard on a task replacing a lost one; a
        lost task fails the cluster while an installed dataflow has none."""
        self._restorers[dataflow_id] = restore

    def unregister(self, dataflow_id: str) -> None:
        self._restorers.pop(dataflow_id, None)

    def rebuilding(self, dataflow_id: str) -> bool:
        """Whether a shard of the dataflow waits for its rebuild on a new task (its
        requests wait meanwhile)."""
        with self._rebuilds:
            return dataflow_id in self._pending

    def broken(self, dataflow_id: str) -> str | None:
        """Why the dataflow cannot run here any more (its shard's rebuild on a new task
        failed), or None. Its requests but ``Drop`` raise ``Unavailable`` with this; the
        other dataflows and the cluster go on."""
        with self._rebuilds:
            return self._broken.get(dataflow_id)

    # -- requests ----------------------------------------------------------------------------

    def call(self, requests: Sequence[rq.Request]) -> list[object]:
        """Sends ``requests[p]`` to shard ``p`` (all first, so the shards work in parallel),
        then collects every answer. A task error is raised as the same Tidemark error; a lost
        task raises ``Unavailable`` and leaves the cluster failed."""
        if len(requests) != self.shards:
            raise InvalidArgument(f"{len(requests)} requests for {self.shards} shards")
        # A request of a dataflow whose shard is not rebuilt yet on a new task waits for
        # it (without the lock: other dataflows go on), and checks again under the lock,
        # as a task may have been lost once more in between.
        dataflow_id = _dataflow_of(requests[0])
        while True:
            self._wait_rebuilt(dataflow_id)
            with self._lock:
                self._check_usable()
                if dataflow_id is not None and self.rebuilding(dataflow_id):
                    continue
                broken = None if dataflow_id is None else self.broken(dataflow_id)
                dropping = isinstance(requests[0], rq.Drop)
                if broken is not None and not dropping:
                    raise Unavailable(broken)
                answers = self._round(requests)
                if broken is not None:
                    # Dropped where it was installed; a new task it never reached answers
                    # NotFound, which is no error here.
                    with self._rebuilds:
                        self._broken.pop(dataflow_id or "", None)
                    answers = [
                        rq.Reply() if _reply(answer).error_class == "NotFound" else answer
                        for answer in answers
                    ]
                break
        return self._answers(answers)

    def _answers(self, answers: Sequence[object]) -> list[object]:
        """Every shard's reply value, or the round's error raised (a lost peer fails the
        cluster)."""
        replies = [_reply(answer) for answer in answers]
        failed = [reply for reply in replies if reply.error_class is not None]
        for shard, reply in enumerate(replies):
            if reply.error_class == MESH_LOST:
                # The message names the lost task; the cluster cannot go on without it.
                self._fail(f"{reply.error_message} (seen by shard {shard})")
                raise Unavailable(self._failure or "")
        if failed:
            # A task whose step stopped only because a peer's failed is not the cause.
            causes = [reply for reply in failed if reply.error_class != PEER_FAILED]
            raise _task_error((causes or failed)[0])
        return [reply.value for reply in replies]

    def _round(self, requests: Sequence[rq.Request]) -> list[object]:
        """Sends every shard its request and collects the answers, replacing a task lost on
        the way (the lock is held)."""
        return self._finish_round(requests, self._send_round(requests), {})

    def _send_round(self, requests: Sequence[rq.Request]) -> dict[int, str]:
        """Sends every shard its request; the shards found gone (shard: why)."""
        if isinstance(requests[0], rq.Step):
            self._steps_sent += 1
        lost: dict[int, str] = {}
        for shard in range(self.shards):
            try:
                self._channels[shard].send(requests[shard])
            except ConnectionLost as error:
                lost[shard] = f"is gone ({error})"
        return lost

    def _finish_round(
        self, requests: Sequence[rq.Request], lost: dict[int, str], replied: dict[int, object]
    ) -> list[object]:
        """Collects the answers of a round sent, from ``replied`` (read so far) on,
        replacing the tasks of ``lost`` and any lost meanwhile (the lock is held)."""
        while True:
            if lost:
                self._lost(lost, requests, replied)
            try:
                collect(self._channels, replied)
                break
            except PeerLost as error:
                lost = {error.index: str(error)}
        return [replied[shard] for shard in range(self.shards)]

    def _wait_rebuilt(self, dataflow_id: str | None) -> None:
        if dataflow_id is None:
            return
        with self._rebuilds:
            self._rebuilds.wait_for(
                lambda: (
                    dataflow_id not in self._pending or self._failure is not None or self._stopped
                )
            )

    def broadcast(self, request: rq.Request) -> list[object]:
        return self.call([request] * self.shards)

    def install(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan | plan_pb2.Relation,
        *,
        index_key_columns: Sequence[int] | None = None,
        index_since: int = 0,
    ) -> None:
        self.broadcast(install_request(dataflow_id, plan, index_key_columns, index_since))

    def drop(self, dataflow_id: str) -> None:
        self.broadcast(rq.Drop(dataflow_id))

    def step(
        self,
        dataflow_id: str,
        sources: Sequence[dict[int, list[Update]]],
        constants_at: int | None,
        index_upper: int,
    ) -> list[list[Update]]:
        """Runs one step of a dataflow on every task: ``sources[p]`` is shard ``p``'s share
        of the source updates (any split); the tasks exchange the rest among themselves.
        Returns every shard's share of the output."""
        results = self.call(
            [rq.Step(dataflow_id, part, constants_at, index_upper) for part in sources]
        )
        return [_updates(result) for result in results]

    def apply_index(self, dataflow_id: str, parts: Sequence[list[Update]], upper: int) -> None:
        self.call([rq.ApplyIndex(dataflow_id, part, upper) for part in parts])

    def compact_index(self, dataflow_id: str, since: int) -> None:
        """Moves every shard's index since to ``since``, dropping the history before it."""
        self.broadcast(rq.CompactIndex(dataflow_id, since))

    def peek(self, dataflow_id: str, time: int) -> dict[Row, int]:
        """The indexed output's contents at ``time``, gathered from every shard."""
        contents: dict[Row, int] = {}
        for part in self.broadcast(rq.Peek(dataflow_id, time)):
            assert isinstance(part, dict)
            contents.update(part)  # shards own disjoint keys
        return contents

    def index_changes(self, dataflow_id: str, lower: int, upper: int) -> list[Update]:
        """The indexed output's changes at times in ``[lower, upper)``, from every shard's
        index history (shards own disjoint keys)."""
        changes: list[Update] = []
        for part in self.broadcast(rq.IndexChanges(dataflow_id, lower, upper)):
            assert isinstance(part, list)
            changes.extend(part)
        return changes

    def stats(self, dataflow_id: str) -> tuple[int, Work, StateSize]:
        """Keys held, work done and the state's size, summed over the shards."""
        keys, total, size = 0, Work(), StateSize()
        for result in self.broadcast(rq.Stats(dataflow_id)):
            assert isinstance(result, tuple)
            keys += result[0]
            total.add(result[1])
            size += StateSize(result[0], result[2], result[3], result[4])
        return keys, total, size

    async def acall(self, requests: Sequence[rq.Request]) -> list[object]:
        """``call`` for asyncio callers, run on the event loop itself when it can be: the
        requests are sent at once and each task's answer is read when its socket turns
        readable, so a step pays no hand-off to a thread and back (0.1-0.2 ms of driver
        CPU a step, ``bench/steady_io.py --compare thread``). For rounds whose answers are
        small (a step that writes its output's parts): a large answer would be read and
        decoded on the loop. A round that would wait (for the lock, or a shard's rebuild),
        one over TLS (one OpenSSL state per socket, driven from one thread at a time), and
        a round that loses a task run in a thread as ``call`` does."""
        if not self._claim_for_loop(requests):
            return await asyncio.to_thread(self.call, requests)
        # The lock is held from here on; whoever finishes the round releases it.
        try:
            lost = self._send_round(requests)
        except BaseException:
            self._lock.release()
            raise
        replied: dict[int, object] = {}
        try:
            if not lost:
                lost = await self._collect_on_loop(replied)
        except BaseException:
            # Cancelled (or failed) while answers are on their way: a thread reads them
            # (the next round must not), settles the round as ``call`` would and frees
            # the lock.
            finishing = threading.Thread(
                target=self._finish_abandoned,
                args=(requests, replied),
                name="tidemark-resident-abandoned-round",
                daemon=True,
            )
            self._hand_off(finishing.start)
            raise
        if lost:
            # In the thread, the answers too: a cancelled caller still leaves them judged.
            loop = asyncio.get_running_loop()
            finished = self._hand_off(
                lambda: loop.run_in_executor(None, self._finish_lost, requests, lost, replied)
            )
            return await finished
        self._lock.release()
        return self._answers([replied[shard] for shard in range(self.shards)])

    def _hand_off(self, start: Callable[[], T]) -> T:
        """``start()``, which hands a round in progress (and the lock) to a thread. If it
        cannot, the round's answers stay unread on the sockets: the cluster is failed
        (``Unavailable`` from then on) before the lock is freed, so no later round reads
        them as its own."""
        try:
            return start()
        except BaseException as error:
            self._fail(f"a request round could not be finished ({error})")
            self._lock.release()
            raise

    def _claim_for_loop(self, requests: Sequence[rq.Request]) -> bool:
        """Takes the lock for a round on the event loop, if nothing makes it wait or
        needs the thread path (which also raises the errors of a failed or stopped
        cluster, a broken dataflow or a wrong number of requests)."""
        if self._tls is not None or len(requests) != self.shards:
            return False
        dataflow_id = _dataflow_of(requests[0])
        if not self._lock.acquire(blocking=False):
            return False
        if (
            self._failure is not None
            or not self._started
            or self._stopped
            or (
                dataflow_id is not None
                and (self.rebuilding(dataflow_id) or self.broken(dataflow_id) is not None)
            )
        ):
            self._lock.release()
            return False
        return True

    async def _collect_on_loop(self, replied: dict[int, object]) -> dict[int, str]:
        """Reads every task's answer into ``replied``, each when its socket turns readable
        (a busy task's heartbeats only show it alive); a task that broke its connection, or
        said nothing for the deadline since the round began or it was last heard, is
        returned lost (shard: why), as ``collect`` raises ``PeerLost``. Each socket is
        watched once for the whole round: registering it per answer would cost more than
        the hand-off to a thread this path saves."""
        loop = asyncio.get_running_loop()
        channels = self._channels
        deadline_s = self._liveness.deadline_s
        began = time.monotonic()
        done: asyncio.Future[dict[int, str]] = loop.create_future()
        watched: dict[int, int] = {}  # shard: file descriptor
        timer: asyncio.TimerHandle | None = None

        def settle(lost: dict[int, str]) -> None:
            if not done.done():
                done.set_result(lost)

        def readable(shard: int) -> None:
            if done.done():
                return
            try:
                message = channels[shard].receive()
            except ConnectionLost as error:
                settle({shard: f"is gone ({error})"})
                return
            except Exception as error:  # raised by the round, whose rest a thread reads
                done.set_exception(error)
                return
            if isinstance(message, rq.Heartbeat):
                return
            replied[shard] = message
            loop.remove_reader(watched.pop(shard))
            if not watched:
                settle({})

        def heard(shard: int) -> float:
            return max(began, channels[shard].last_heard)

        def look_for_silence() -> None:
            nonlocal timer
            if done.done() or not watched:  # the last answer came in this same turn
                return
            now = time.monotonic()
            for shard in watched:
                if (silence := now - heard(shard)) >= deadline_s:
                    settle({shard: f"said nothing for {silence:.1f} s"})
                    return
            wake_at = min(heard(shard) for shard in watched) + deadline_s
            timer = loop.call_later(wake_at - now, look_for_silence)

        timer = loop.call_later(deadline_s, look_for_silence)
        try:
            for shard, channel in enumerate(channels):
                try:
                    fd = channel.sock.fileno()
                    loop.add_reader(fd, readable, shard)
                except (ValueError, OSError) as error:  # closed by a stop meanwhile
                    return {shard: f"is gone ({error})"}
                watched[shard] = fd
            return await done
        finally:
            if timer is not None:
                timer.cancel()
            for fd in watched.values():
                loop.remove_reader(fd)

    def _finish_and_release(
        self, requests: Sequence[rq.Request], lost: dict[int, str], replied: dict[int, object]
    ) -> list[object]:
        try:
            return self._finish_round(requests, lost, replied)
        finally:
            self._lock.release()

    def _finish_lost(
        self, requests: Sequence[rq.Request], lost: dict[int, str], replied: dict[int, object]
    ) -> list[object]:
        return self._answers(self._finish_and_release(requests, lost, replied))

    def _finish_abandoned(self, requests: Sequence[rq.Request], replied: dict[int, object]) -> None:
        """Ends a round its caller gave up on: its answers are read and dropped, but a lost
        peer they report still fails the cluster (``_answers``)."""
        try:
            self._answers(self._finish_and_release(requests, {}, replied))
        except Exception as error:
            log.info("resident_round_abandoned", error=str(error))

    async def astart(self) -> None:
        await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    async def ainstall(
        self,
        dataflow_id: str,
        plan: plan_pb2.Plan | plan_pb2.Relation,
        *,
        index_key_columns: Sequence[int] | None = None,
        index_since: int = 0,
    ) -> None:
        await asyncio.to_thread(
            functools.partial(
                self.install,
                dataflow_id,
                plan,
                index_key_columns=index_key_columns,
                index_since=index_since,
            )
        )

    async def adrop(self, dataflow_id: str) -> None:
        await asyncio.to_thread(self.drop, dataflow_id)

    async def apeek(self, dataflow_id: str, time: int) -> dict[Row, int]:
        return await asyncio.to_thread(self.peek, dataflow_id, time)

    # -- internals ---------------------------------------------------------------------------

    def _addresses(self) -> tuple[str, str, int]:
        """Where tasks reach the driver, the address to listen on, and the port (0: any).

        Tasks dial the address Spark's executors reach the driver at (``spark.driver.host``),
        on the session's resident port when one is set (``session.RESIDENT_PORT``) so that a
        NetworkPolicy can allow it. The listener binds ``spark.driver.bindAddress`` when set
        (a pod's address behind a Service name), else every interface. Local tasks run on
        this machine and use loopback."""
        conf = self._spark.sparkContext.getConf()
        port = int(conf.get(RESIDENT_PORT) or 0)
        master = self._spark.sparkContext.master or ""
        if master.startswith("local"):
            return "127.0.0.1", "127.0.0.1", port
        host = conf.get("spark.driver.host") or socket.getfqdn()
        return host, conf.get("spark.driver.bindAddress") or "", port

    def _run_job(self, job: _Job, host: str, port: int, shard: int) -> None:
        context = self._spark.sparkContext
        try:
            context.setJobGroup(
                job.group, f"tidemark resident shard {shard}", interruptOnCancel=True
            )
            mesh_ports = context.getConf().get(MESH_PORTS)
            task = functools.partial(
                resident_task,
                host,
                port,
                self._token,
                self.shards,
                self._liveness,
                tls=self._tls,
                state_budget=self._state_budget,
                mesh_ports=port_range(mesh_ports) if mesh_ports else None,
                replace_s=self._replace_s if self._replace_lost else None,
            )
            context.parallelize([shard], 1).mapPartitions(task).collect()
        except BaseException as error:  # reported by start() or noticed as lost sockets
            job.error = error
        finally:
            job.done.set()

    def _accept_all(
        self, listener: socket.socket, jobs: dict[int, _Job]
    ) -> dict[int, tuple[socket.socket, int]]:
        by_shard: dict[int, tuple[socket.socket, int]] = {}
        deadline = time.monotonic() + self._connect_timeout
        pinged = time.monotonic()
        try:
            while len(by_shard) < len(jobs):
                if time.monotonic() - pinged >= self._liveness.heartbeat_s:
                    # A task that connected early must hear from its driver while the others
                    # come up (an executor still starting): it gives a silent driver up.
                    pinged = time.monotonic()
                    for shard, (early, _) in list(by_shard.items()):
                        try:
                            send_message(early, rq.Ping())
                        except ConnectionLost as error:
                            raise Unavailable(
                                f"the resident task of shard {shard} is gone ({error}) "
                                "while the others connected"
                            ) from error
                for shard, job in jobs.items():
                    if job.done.is_set() and shard not in by_shard:
                        raise Unavailable(
                            f"the resident job of shard {shard} ended before its task "
                            f"connected: {_describe(job.error)}"
                        )
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"only {len(by_shard)} of {len(jobs)} resident tasks connected within "
                        f"{self._connect_timeout} s (are there enough free task slots?)"
                    )
                try:
                    accepted, _ = listener.accept()
                except TimeoutError:
                    continue
                sock = accept_secure(accepted, self._tls_context, self._tls_identity)
                if sock is None:
                    continue
                hello = authenticate(sock, self._token)
                if hello is None or hello.shard in by_shard or hello.shard not in jobs:
                    sock.close()
                    continue
                by_shard[hello.shard] = (sock, hello.pid)
        except BaseException:
            for sock, _ in by_shard.values():
                sock.close()
            raise
        return by_shard

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise Unavailable(self._failure)
        if not self._started or self._stopped:
            raise FailedPrecondition("the resident cluster is not running")

    def _fail(self, reason: str) -> None:
        """Marks the cluster failed (the first reason stays) and ends its tasks. The sockets
        are shut rather than closed: a request round or the keepalive may be using them."""
        if self._failure is None:
            self._failure = reason
            log.warning("resident_cluster_failed", reason=reason)
        for channel in self._channels:
            channel.shut()
        for shard in range(len(self._jobs)):
            self._cancel_shard(shard)
        with self._rebuilds:
            self._rebuilds.notify_all()  # requests waiting for a rebuild fail now

    def _keep_alive(self) -> None:
        """Pings every task each heartbeat and, when no request round is running (a round
        watches the tasks itself), reads their heartbeats and gives up (or replaces) a
        silent one."""
        while not self._closing.wait(self._liveness.heartbeat_s) and self._failure is None:
            self._keep_alive_once()

    def _keep_alive_once(self) -> None:
        channels = list(self._channels)
        lost: PeerLost | None = None
        # Every task is pinged, even past a lost one: the others must keep hearing from
        # their driver while the lost one is replaced.
        for shard, channel in enumerate(channels):
            try:
                channel.send(rq.Ping())
            except ConnectionLost as error:
                lost = lost or PeerLost(shard, f"is gone ({error})")
        if lost is None and self._lock.acquire(blocking=False):
            try:
                if self._failure is None and not self._stopped and channels == self._channels:
                    drain(channels)
            except PeerLost as error:
                lost = error
            finally:
                self._lock.release()
        if lost is not None:
            self._lost_idle(lost.index, str(lost), channels[lost.index])

    def _lost_idle(self, shard: int, reason: str, channel: Channel) -> None:
        """A task lost between rounds: replaced at once (the dataflows are idle), unless a
        round replaced it meanwhile. From a thread of its own: the keepalive goes on pinging
        the other tasks (and the new one), which would otherwise give their driver up while
        a long rebuild runs."""
        if not self._replace_lost:
            self._fail(f"the resident task of shard {shard} {reason}")
            return
        if channel in self._replacing:
            return
        self._replacing.append(channel)
        threading.Thread(
            target=self._replace_idle,
            args=(shard, reason, channel),
            name=f"tidemark-resident-replace-{shard}",
            daemon=True,
        ).start()

    def _replace_idle(self, shard: int, reason: str, channel: Channel) -> None:
        try:
            with self._lock:
                if (
                    self._failure is not None
                    or self._stopped
                    or self._channels[shard] is not channel
                ):
                    return
                self._lost({shard: reason}, None, {})
        except Unavailable:
            pass  # the cluster is failed; the next call reports it
        finally:
            self._replacing.remove(channel)

    def _lost(
        self,
        lost: dict[int, str],
        requests: Sequence[rq.Request] | None,
        replied: dict[int, object],
    ) -> None:
        """The tasks of ``lost`` (shard: why) are gone during a round sending ``requests``
        (None: between rounds): replaces them and sends them their requests again, or fails
        the cluster. Called with the lock held."""
        if self._replace_lost:
            # An executor that died took all its tasks: find them now, so that the new
            # tasks do not try to join a mesh with dead peers.
            self._find_lost(lost, replied)
        cause = "; ".join(
            f"the resident task of shard {shard} {reason}" for shard, reason in sorted(lost.items())
        )
        if not self._replace_lost:
            self._fail(cause)
            raise Unavailable(self._failure or "")
        log.warning("resident_task_lost", shards=sorted(lost), reason=cause)
        try:
            self._replace_while_lost(lost, None if requests is None else requests[0], replied)
            for shard in lost:
                # The new task answers the round instead (a lost task's answer, if it came,
                # is dropped: the new task ran the request again from the same state).
                replied.pop(shard, None)
                if requests is None:
                    continue
                if isinstance(requests[shard], rq.Drop):
                    replied[shard] = rq.Reply()  # never installed there
                else:
                    self._channels[shard].send(requests[shard])
        except Exception as error:
            self._fail(f"{cause}, and replacing it failed ({error})")
            raise Unavailable(self._failure or "") from error

    def _replace_while_lost(
        self, lost: dict[int, str], request: rq.Request | None, replied: dict[int, object]
    ) -> None:
        """Replaces the tasks of ``lost``. A task lost while that runs (another task of a dead
        executor whose end shows only later, a second executor dying, or a new task dying
        while it joins or while the dataflow in flight is rebuilt on it) is added to
        ``lost``, and the replacement starts over for them all, up to ``start_attempts``
        times: the rebuilds are queued per shard and generation, so a newer replacement
        supersedes what the last one left undone."""
        for attempt in range(1, self._start_attempts + 1):
            try:
                self._replace(sorted(lost), request)
                return
            except Exception as error:
                known = set(lost)
                self._find_lost(lost, replied)
                replacement_ended = any(self._ended(shard) for shard in known)
                lost_again = (
                    set(lost) != known
                    or replacement_ended
                    or isinstance(error, ConnectionLost | PeerLost)
                )
                if not lost_again or attempt == self._start_attempts:
                    raise
                log.warning(
                    "resident_task_lost",
                    shards=sorted(lost),
                    reason=f"lost again while being replaced ({_describe(error)})",
                    attempt=attempt,
                )

    def _ended(self, shard: int) -> bool:
        """Whether the connection to the task of ``shard`` has ended (what it sent before
        is dropped: the task is being replaced)."""
        channel = self._channels[shard]
        if channel.sock.fileno() < 0:
            return False  # the lost task's own channel, closed: no new task came up
        try:
            while channel.readable(0):
                channel.receive()
        except ConnectionLost:
            return True
        return False

    def _find_lost(self, lost: dict[int, str], replied: dict[int, object]) -> None:
        """Adds to ``lost`` the other tasks whose connection has ended, keeping any answer
        read on the way (a heartbeat is skipped)."""
        for shard, channel in enumerate(self._channels):
            if shard in lost:
                continue
            try:
                while shard not in replied and channel.readable(0):
                    message = channel.receive()
                    if not isinstance(message, rq.Heartbeat):
                        replied[shard] = message
            except ConnectionLost as error:
                lost[shard] = f"is gone ({error})"

    def _replace(self, shards: list[int], request: rq.Request | None) -> None:
        """Starts new tasks for ``shards``, joins them to the mesh in the lost ones' place
        and has every registered dataflow rebuild its shards there."""
        started = time.monotonic()
        for shard in shards:
            old = self._channels[shard]
            old.shut()
            old.sock.close()
            self._cancel_shard(shard)
        attempt = 1
        while True:
            try:
                connected = self._launch_shards(shards)
                break
            except Unavailable as error:
                if attempt >= self._start_attempts:
                    raise
                wait_s = retry_delay(attempt)
                log.warning(
                    "resident_shard_start_retry",
                    shards=shards,
                    attempt=attempt,
                    error=error.message,
                )
                time.sleep(wait_s)
                attempt += 1
        for shard, (sock, pid) in connected.items():
            keep_alive(sock, self._liveness)
            self._channels[shard] = Channel(sock, self._liveness.deadline_s)
            self._pids[shard] = pid
        if self.shards > 1:
            for shard in shards:
                self._mesh_addresses[shard] = _address(self._ask(shard, rq.MeshAddress()))
            # A step in flight is sent again: the new tasks count it as the same step.
            steps = self._steps_sent - (1 if isinstance(request, rq.Step) else 0)
            join = rq.JoinMesh(tuple(self._mesh_addresses), rejoin=True, steps=steps)
            # All at once: new tasks dial each other too.
            for shard in shards:
                self._channels[shard].send(join)
            for shard in shards:
                self._answer(shard)
        # Every registered dataflow now has shards to rebuild on the new tasks; until they
        # are, its requests wait (``call``), so no step of it reaches a task without its
        # state.
        restore = _Restore(shards, started, set())
        with self._rebuilds:
            for shard in shards:
                self._generations[shard] += 1
            # A dataflow still rebuilding for an earlier replacement is rebuilt on these
            # tasks too, even if it was unregistered since (its Drop waits for it).
            restorers = {d: pending.restore for d, pending in self._pending.items()}
            restorers.update(self._restorers)
            for dataflow_id in self._broken:
                restorers.pop(dataflow_id, None)  # given up: its owner restarts it
            for dataflow_id, restorer in restorers.items():
                pending = self._pending.setdefault(dataflow_id, _Pending(restorer, {}))
                pending.shards.update({shard: self._generations[shard] for shard in shards})
                restore.waiting.add(dataflow_id)
            self._restores.append(restore)
        in_flight = None if request is None else _dataflow_of(request)
        # The others' rebuilds start first: their Spark jobs run beside the one below, and
        # they load their shards as soon as the round in flight lets go of the lock.
        with self._rebuilds:
            for dataflow_id in self._pending.keys() - self._rebuilders - {in_flight}:
                self._rebuilders.add(dataflow_id)
                threading.Thread(
                    target=self._rebuild_in_background,
                    args=(dataflow_id,),
                    name=f"tidemark-resident-rebuild-{dataflow_id}",
                    daemon=True,
                ).start()
        if in_flight is not None:
            # The round in flight is this dataflow's, and the other tasks may be waiting on
            # the mesh for the new one's part of it: rebuilt now, under the lock.
            self._rebuild_now(in_flight)
        self._settle()

    def _rebuild_now(self, dataflow_id: str) -> None:
        """Rebuilds the dataflow's pending shards on this thread (the lock is held)."""
        with self._rebuilds:
            pending = self._pending.get(dataflow_id)
            if pending is None:
                return
            shards = sorted(pending.shards.items())
        for shard, generation in shards:
            pending.restore(shard, functools.partial(self._ask, shard))
            self._rebuilt(dataflow_id, shard, generation)

    def _rebuild_in_background(self, dataflow_id: str) -> None:
        """Rebuilds the dataflow's pending shards one after the other, each request to the
        new task under the lock (``_RebuildAsk``), until none is left; a shard whose task was
        replaced again meanwhile is rebuilt again for the newer one. A rebuild that fails
        fails the cluster, as it would have under the lock."""
        try:
            while True:
                with self._rebuilds:
                    pending = self._pending.get(dataflow_id)
                    if pending is None or self._failure is not None or self._stopped:
                        self._rebuilders.discard(dataflow_id)
                        return
                    shard, generation = min(pending.shards.items())
                ask = _RebuildAsk(self, dataflow_id, shard, generation)
                try:
                    with self._rebuild_slots:
                        pending.restore(shard, ask)
                except Exception:
                    if not ask.superseded:
                        raise
                    continue
                self._rebuilt(dataflow_id, shard, generation)
                self._settle()
        except Exception as error:
            # This dataflow alone is given up (its owner restarts it, on this cluster): the
            # other dataflows and tasks are unharmed.
            reason = f"rebuilding dataflow {dataflow_id!r} on a new resident task failed ({error})"
            with self._rebuilds:
                self._rebuilders.discard(dataflow_id)
                if self._failure is not None or self._stopped:
                    return
                self._pending.pop(dataflow_id, None)
                self._broken[dataflow_id] = reason
                for restore in self._restores:
                    restore.waiting.discard(dataflow_id)
                self._rebuilds.notify_all()
            log.warning("dataflow_rebuild_failed", dataflow=dataflow_id, error=str(error))
            self._settle()

    def _rebuilt(self, dataflow_id: str, shard: int, generation: int) -> None:
        """Marks a shard of a dataflow rebuilt for that replacement; once none is left,
        the dataflow's requests go on."""
        with self._rebuilds:
            pending = self._pending.get(dataflow_id)
            if pending is None or pending.shards.get(shard) != generation:
                return  # replaced again meanwhile: the newer rebuild counts
            del pending.shards[shard]
            if pending.shards:
                return
            del self._pending[dataflow_id]
            started = None
            for restore in self._restores:
                if dataflow_id in restore.waiting:
                    restore.waiting.discard(dataflow_id)
                    restore.rebuilt.append(dataflow_id)
                    started = restore.started if started is None else min(started, restore.started)
            self._rebuilds.notify_all()
        if started is not None:
            # How long the dataflow's requests waited on the loss (the others' rebuilds may
            # still run).
            log.info(
                "dataflow_resumed",
                dataflow=dataflow_id,
                seconds=round(time.monotonic() - started, 3),
            )

    def _settle(self) -> None:
        """Logs the replacements every dataflow of which is rebuilt."""
        with self._rebuilds:
            done = [restore for restore in self._restores if not restore.waiting]
            self._restores = [restore for restore in self._restores if restore.waiting]
            for restore in done:
                self.shard_restores += len(restore.shards)
        for restore in done:
            log.info(
                "shard_restored",
                shards=restore.shards,
                dataflows=restore.rebuilt,
                seconds=round(time.monotonic() - restore.started, 3),
                task_pids=list(self._pids),
            )

    def _ask(self, shard: int, request: rq.Request) -> object:
        """One request to one task, outside a round (the lock is held)."""
        self._channels[shard].send(request)
        return self._answer(shard)

    def _answer(self, shard: int) -> object:
        reply = _reply(collect([self._channels[shard]])[0])
        if reply.error_class is not None:
            raise _task_error(reply)
        return reply.value

    def _cancel_shard(self, shard: int) -> None:
        if shard >= len(self._jobs):
            return
        try:
            self._spark.sparkContext.cancelJobGroup(self._jobs[shard].group)
        except Exception:  # the session may be gone already; nothing is left to cancel then
            pass


def install_request(
    dataflow_id: str,
    plan: plan_pb2.Plan | plan_pb2.Relation,
    index_key_columns: Sequence[int] | None,
    index_since: int,
) -> rq.Install:
    return rq.Install(
        dataflow_id,
        plan.SerializeToString(),
        isinstance(plan, plan_pb2.Relation),
        None if index_key_columns is None else tuple(index_key_columns),
        index_since,
    )


def _describe(error: BaseException | None) -> str:
    """The gist of a failed Spark job: the Java exception's message rather than py4j's."""
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            return str(java.getMessage()).strip().splitlines()[0]
        except Exception:  # the gateway may be gone; fall back to the Python side
            pass
    return repr(error)


def _task_error(reply: rq.Reply) -> Exception:
    cls = getattr(errors, reply.error_class or "", None)
    if isinstance(cls, type) and issubclass(cls, errors.TidemarkError):
        return cls(reply.error_message)
    return Internal(f"resident task failed: {reply.error_class}: {reply.error_message}")


def retry_delay(attempt: int) -> float:
    """Seconds to wait after failed launch ``attempt`` (from 1): doubling from 2 s, at most
    30 s, as executors take seconds to tens of seconds to register."""
    return float(min(2**attempt, 30))


def _reply(answer: object) -> rq.Reply:
    if not isinstance(answer, rq.Reply):
        raise Internal(f"a resident task answered with a {type(answer).__name__}")
    return answer


def _dataflow_of(request: rq.Request) -> str | None:
    """The dataflow a request is about (None: the cluster's own, such as the mesh's)."""
    dataflow_id = getattr(request, "dataflow_id", None)
    return dataflow_id if isinstance(dataflow_id, str) else None


def _updates(value: object) -> list[Update]:
    assert isinstance(value, list)
    return value


def _address(value: object) -> tuple[str, int]:
    if not isinstance(value, tuple) or len(value) != 2:
        raise Internal(f"a resident task gave {value!r} as its mesh address")
    host, port = value
    return str(host), int(port)
