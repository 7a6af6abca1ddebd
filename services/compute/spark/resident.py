"""Resident tasks on the driver's side: start P of them, talk to them, notice when one dies.

A ``ResidentCluster`` runs one barrier job of P tasks from a driver thread. The job never
finishes on its own: task ``p`` connects back to a socket the driver listens on, proves it
belongs to this cluster with a random token carried in the job's closure, and then serves
requests for shard ``p`` (``shard_host.ShardHost``) until told to stop. A barrier job gets
all its slots at once or not at all, so the P shards always live together.

The blocking methods are thread-safe (one request round at a time); the ``a``-prefixed ones
run them in a thread for asyncio callers.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from pyspark.sql import SparkSession

from services.compute.dataflow.batch import Row, Update
from services.compute.dataflow.spill import TaskStateBudget
from services.compute.dataflow.work import StateSize, Work
from services.compute.spark import requests as rq
from services.compute.spark.secure import accept_secure, own_identity, server_context
from services.compute.spark.session import RESIDENT_PORT, local_slots
from services.compute.spark.task import resident_task
from services.compute.spark.wire import (
    TOKEN_BYTES,
    ConnectionLost,
    receive_hello,
    receive_message,
    send_message,
    tune,
)
from tidemark import errors
from tidemark.errors import FailedPrecondition, Internal, InvalidArgument, Unavailable
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import plan_pb2

_STOP_WAIT_SECONDS = 30.0


class ResidentCluster:
    def __init__(
        self,
        spark: SparkSession,
        shards: int,
        *,
        connect_timeout: float = 120.0,
        tls: TlsSettings | None = None,
        state_budget: TaskStateBudget | None = None,
    ) -> None:
        """``tls``: the compute's mTLS files; the tasks' sockets then use TLS (``secure.py``),
        and the executors must read the same files at the same paths. ``state_budget``: what
        each task may hold of operator state in memory and spilled to its local disk (None:
        no bound)."""
        if shards < 1:
            raise InvalidArgument(f"a resident cluster needs at least one shard, not {shards}")
        self.shards = shards
        self._spark = spark
        self._connect_timeout = connect_timeout
        self._state_budget = state_budget
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._tls = tls
        # Read now, so that files that do not make a TLS setup fail before any job starts.
        self._tls_context = None if tls is None else server_context(tls)
        self._tls_identity = None if tls is None else own_identity(tls)
        self._group = f"tidemark-resident-{secrets.token_hex(8)}"
        self._sockets: list[socket.socket] = []
        self._pids: list[int] = []
        self._lock = threading.Lock()
        self._job_done = threading.Event()
        self._job_error: BaseException | None = None
        self._failure: str | None = None
        self._job: threading.Thread | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Launches the barrier job and waits until every task has connected."""
        if self._started:
            raise FailedPrecondition("the resident cluster was already started")
        slots = local_slots(self._spark.sparkContext.master or "")
        if slots is not None and slots < self.shards:
            raise FailedPrecondition(
                f"{self.shards} resident tasks cannot run on a session with {slots} task slots"
            )
        host, bind, port = self._addresses()
        listener = socket.create_server((bind, port), backlog=self.shards)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        self._started = True
        self._job = threading.Thread(
            target=self._run_job, args=(host, port), name=self._group, daemon=True
        )
        self._job.start()
        try:
            connected = self._accept_all(listener)
        except BaseException:
            self._abandon()
            raise
        finally:
            # Closed at once so that a retried attempt of the job cannot connect again.
            listener.close()
        self._sockets = [sock for sock, _ in connected]
        self._pids = [pid for _, pid in connected]

    def stop(self) -> None:
        """Stops every task and waits for the job to end, freeing its slots. Idempotent."""
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = True
                return
            self._stopped = True
            if self._failure is None:
                for sock in self._sockets:
                    try:
                        send_message(sock, rq.Stop())
                    except ConnectionLost:
                        pass
                for sock in self._sockets:
                    try:
                        receive_message(sock)
                    except ConnectionLost:
                        pass
            for sock in self._sockets:
                sock.close()
        if not self._job_done.wait(_STOP_WAIT_SECONDS):
            self._cancel_job()
            self._job_done.wait(_STOP_WAIT_SECONDS)

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

    # -- requests ----------------------------------------------------------------------------

    def call(self, requests: Sequence[rq.Request]) -> list[object]:
        """Sends ``requests[p]`` to shard ``p`` (all first, so the shards work in parallel),
        then collects every answer. A task error is raised as the same Tidemark error; a lost
        task raises ``Unavailable`` and leaves the cluster failed."""
        if len(requests) != self.shards:
            raise InvalidArgument(f"{len(requests)} requests for {self.shards} shards")
        with self._lock:
            self._check_usable()
            replies: list[rq.Reply] = []
            shard = 0
            try:
                while shard < self.shards:
                    send_message(self._sockets[shard], requests[shard])
                    shard += 1
                shard = 0
                while shard < self.shards:
                    replies.append(receive_message(self._sockets[shard]))
                    shard += 1
            except ConnectionLost as error:
                self._fail(f"the resident task of shard {shard} is gone ({error})")
                raise Unavailable(self._failure or "") from error
        for reply in replies:
            if reply.error_class is not None:
                raise _task_error(reply)
        return [reply.value for reply in replies]

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
        self.broadcast(
            rq.Install(
                dataflow_id,
                plan.SerializeToString(),
                isinstance(plan, plan_pb2.Relation),
                None if index_key_columns is None else tuple(index_key_columns),
                index_since,
            )
        )

    def drop(self, dataflow_id: str) -> None:
        self.broadcast(rq.Drop(dataflow_id))

    def process(
        self, dataflow_id: str, node_id: int, inputs: Sequence[tuple[list[Update], ...]]
    ) -> list[list[Update]]:
        """Runs a stateful node on every shard: ``inputs[p]`` is shard ``p``'s share."""
        results = self.call([rq.Process(dataflow_id, node_id, part) for part in inputs])
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

    def stats(self, dataflow_id: str) -> tuple[int, Work, StateSize]:
        """Keys held, work done and the state's size, summed over the shards."""
        keys, total, size = 0, Work(), StateSize()
        for result in self.broadcast(rq.Stats(dataflow_id)):
            assert isinstance(result, tuple)
            keys += result[0]
            total.add(result[1])
            size += StateSize(result[0], result[2], result[3], result[4])
        return keys, total, size

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

    def _run_job(self, host: str, port: int) -> None:
        context = self._spark.sparkContext
        try:
            context.setJobGroup(self._group, "tidemark resident shards", interruptOnCancel=True)
            task = functools.partial(
                resident_task,
                host,
                port,
                self._token,
                self.shards,
                tls=self._tls,
                state_budget=self._state_budget,
            )
            context.parallelize(range(self.shards), self.shards).barrier().mapPartitions(
                task
            ).collect()
        except BaseException as error:  # reported by start() or noticed as lost sockets
            self._job_error = error
        finally:
            self._job_done.set()

    def _accept_all(self, listener: socket.socket) -> list[tuple[socket.socket, int]]:
        by_shard: dict[int, tuple[socket.socket, int]] = {}
        deadline = time.monotonic() + self._connect_timeout
        try:
            while len(by_shard) < self.shards:
                if self._job_done.is_set():
                    raise Unavailable(
                        f"the resident job ended before all {self.shards} tasks connected: "
                        f"{_describe(self._job_error)}"
                    )
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"only {len(by_shard)} of {self.shards} resident tasks connected within "
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
                if hello is None or hello.shard in by_shard or not 0 <= hello.shard < self.shards:
                    sock.close()
                    continue
                by_shard[hello.shard] = (sock, hello.pid)
        except BaseException:
            for sock, _ in by_shard.values():
                sock.close()
            raise
        return [by_shard[shard] for shard in range(self.shards)]

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise Unavailable(self._failure)
        if not self._started or self._stopped:
            raise FailedPrecondition("the resident cluster is not running")

    def _fail(self, reason: str) -> None:
        self._failure = reason
        for sock in self._sockets:
            sock.close()
        self._cancel_job()

    def _abandon(self) -> None:
        self._stopped = True
        self._cancel_job()

    def _cancel_job(self) -> None:
        try:
            self._spark.sparkContext.cancelJobGroup(self._group)
        except Exception:  # the session may be gone already; nothing is left to cancel then
            pass


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


def _updates(value: object) -> list[Update]:
    assert isinstance(value, list)
    return value
