"""The process's one SparkSession, tuned for many small jobs and a few resident tasks.

Starting a session costs seconds (a JVM, then Python workers), so a process makes one and
keeps it. Compute runs two kinds of Spark work side by side: P resident tasks per cluster of
shards, which hold a task slot for their whole life while mostly waiting on a socket, and
short bulk jobs (hydration, checks). The session therefore needs at least P + 2 slots; in
local mode ``local[*]`` is widened to that many when the machine has fewer cores, because
resident tasks are idle most of the time. A ``local[N]`` with fewer slots is widened too.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
from pathlib import Path

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

RESIDENT_PORT = "spark.tidemark.resident.port"
"""The driver's port for its resident tasks to connect to (0 or unset: any free port). Kept in
the session's conf beside the driver's other ports, so every resident cluster finds it."""

MESH_PORTS = "spark.tidemark.mesh.ports"
"""``first-last``: the ports the resident tasks listen on for each other (``mesh.py``), each
task taking the first free one on its executor (unset: any free port)."""

_PROJECT_ROOT = str(Path(__file__).resolve().parents[3])

# Latency over throughput: no UI, no progress bars, tiny shuffles, no speculative or
# dynamically allocated executors (resident tasks must stay where they started).
_SETTINGS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.speculation": "false",
    "spark.dynamicAllocation.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.log.level": "ERROR",
    # Inputs are parts in a blob store, local to no executor; on a cluster a file split's
    # preferred host ("localhost") matches no executor, and waiting for one cost each stage
    # seconds of a one-shot query's latency.
    "spark.locality.wait": "0",
    # PySpark otherwise records the Python call site of every DataFrame and Column call in
    # the JVM (about five py4j round trips each, hundreds per lowered plan: a fifth of a
    # one-shot query's time on the driver), only to quote it in an error's query context,
    # which no error here reports.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

_lock = threading.Lock()
_session: SparkSession | None = None


def local_master(slots: int) -> str:
    """``local[N]`` with at least ``slots`` task slots (and at least the core count)."""
    return f"local[{max(slots, os.cpu_count() or 1)}]"


def local_slots(master: str) -> int | None:
    """How many tasks a ``local`` master runs at once (None for a cluster master)."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master)
    if match is None:
        return None
    count = match.group(1)
    if count is None:
        return 1
    return (os.cpu_count() or 1) if count == "*" else int(count)


def network_settings(
    *,
    driver_host: str = "",
    bind_address: str = "",
    driver_port: int = 0,
    block_manager_port: int = 0,
    resident_port: int = 0,
    mesh_ports: str = "",
) -> dict[str, str]:
    """The Spark settings that fix where the driver listens, so that a firewall or a
    NetworkPolicy between the driver and its executors can allow exactly these ports. Empty
    and 0 leave Spark's defaults (the machine's host name, ephemeral ports).

    ``driver_host`` is the address executors dial the driver at (Spark's RPC and the resident
    tasks alike); ``bind_address`` the local address the driver listens on, when that differs
    (a pod's own IP behind a Service name). ``block_manager_port`` is used by the executors'
    block managers as well as the driver's. ``mesh_ports`` (``first-last``) is where the
    executors' resident tasks listen for each other."""
    settings: dict[str, str] = {}
    if driver_host:
        settings["spark.driver.host"] = driver_host
    if bind_address:
        settings["spark.driver.bindAddress"] = bind_address
    if driver_port:
        settings["spark.driver.port"] = str(driver_port)
    if block_manager_port:
        settings["spark.blockManager.port"] = str(block_manager_port)
    if resident_port:
        settings[RESIDENT_PORT] = str(resident_port)
    if mesh_ports:
        first, last = port_range(mesh_ports)
        settings[MESH_PORTS] = f"{first}-{last}"
    return settings


def port_range(text: str) -> tuple[int, int]:
    """``first-last`` (or one port) as ``(first, last)``; ValueError when it is not a range
    of TCP ports."""
    first_text, _, last_text = text.partition("-")
    first = int(first_text)
    last = int(last_text) if last_text else first
    if not 0 < first <= last < 65536:
        raise ValueError(f"{text!r} is not a range of TCP ports (first-last)")
    return first, last


def spark_session(
    master: str = DEFAULT_MASTER,
    *,
    min_slots: int = 6,
    app_name: str = "tidemark-compute",
    settings: dict[str, str] | None = None,
) -> SparkSession:
    """The process's SparkSession, created on first call and reused after (later calls'
    arguments are ignored). Stopped when the process exits."""
    global _session
    with _lock:
        if _session is not None:
            return _session
        _prepare_worker_environment()
        slots = local_slots(master)
        if slots is not None and slots < min_slots:
            # Resident tasks hold their slots for good: a local master too narrow for them
            # plus bulk jobs (one-shot queries, hydration) is widened, never left to hang.
            master = local_master(min_slots)
        builder = SparkSession.builder.master(master).appName(app_name)
        for key, value in {**_SETTINGS, **(settings or {})}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        _session = session
        atexit.register(stop_spark_session)
        return session


def stop_spark_session() -> None:
    """Stops the process's session if one is running (a later call makes a new one)."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        session.stop()


def _prepare_worker_environment() -> None:
    """Python workers must run this interpreter and import this project. Locally they inherit
    the environment; on a real cluster the executor image provides both."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _PROJECT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PROJECT_ROOT, *filter(None, paths)])
