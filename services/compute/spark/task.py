"""The function each resident Spark task runs: connect back to the driver, then serve.

It must be importable by name in the executor's Python worker (the job's closure refers to it
by module), so it stays free of driver-only state.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator

from services.compute.dataflow.spill import TaskStateBudget
from services.compute.spark.liveness import Liveness, keep_alive
from services.compute.spark.mesh import Mesh
from services.compute.spark.secure import connect_secure
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.wire import send_hello, tune
from tidemark.rpc.tls import TlsSettings


def resident_task(
    host: str,
    port: int,
    token: bytes,
    shards: int,
    liveness: Liveness,
    partition: Iterable[int],
    *,
    tls: TlsSettings | None = None,
    state_budget: TaskStateBudget | None = None,
    mesh_ports: tuple[int, int] | None = None,
    replace_s: float | None = None,
) -> Iterator[int]:
    """Hosts the shard its one-element partition names until the driver says stop, or
    until the driver falls silent for ``liveness.deadline_s`` (the task then fails, which
    ends the job and frees its slot). With ``tls`` (paths this executor can read), the
    connection to the driver and those to the other tasks (``mesh.py``) are mTLS; its
    operator state is held to ``state_budget`` (None: no bound). It listens for the other
    tasks on the first free port of ``mesh_ports`` (None: any free port); ``replace_s``: how
    long a step waits for a lost peer's replacement (None: not at all)."""
    from pyspark import TaskContext

    (shard,) = partition
    context = TaskContext.get()
    if context is not None and context.attemptNumber() > 0:
        # Spark retrying a lost task on its own: the driver relaunches a lost shard itself
        # (it has to rebuild its state first), so this attempt ends at once.
        yield shard
        return
    with connect_secure(socket.create_connection((host, port), timeout=60), tls) as sock:
        # Blocking: the request loop bounds its waits itself, and a large reply may take
        # its time to send to a live driver.
        sock.settimeout(None)
        tune(sock)
        keep_alive(sock, liveness)
        # The mesh listens on the address this executor reaches the driver from, which its
        # peers reach it at too; the driver collects the addresses once all tasks are up.
        mesh = None
        if shards > 1:
            mesh = Mesh(
                shard,
                shards,
                token,
                liveness,
                host=sock.getsockname()[0],
                tls=tls,
                ports=mesh_ports,
                replace_s=replace_s,
            )
        send_hello(sock, token, shard, os.getpid())
        shard_host = ShardHost(
            shard, shards, None if state_budget is None else state_budget.open(), mesh
        )
        try:
            shard_host.serve(sock, liveness)
        finally:
            shard_host.close()
    yield shard
