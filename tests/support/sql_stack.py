"""A whole Tidemark as separate processes, for SQL tests: oracle, storage, catalog, one compute
process per cluster, several adapters and (on request) the sources process, all on free ports
under one directory.

::

    with sql_stack(tmp_path, adapters=2) as stack:
        async with AdapterClient(stack.adapter(0)) as a, AdapterClient(stack.adapter(1)) as b:
            ...

Spark takes seconds to start, so share one stack per test module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.compute import Stack
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.clients.adapter import AdapterClient
from tidemark.session_keys import ensure_keys_file

SPARK_MASTER = "local[2]"
# A loaded 2-core machine can take longer than the 30 s default to start Spark and hydrate.
ADAPTER_EXTRA = ("--peek-wait-seconds", "180")


@dataclass
class SqlStack:
    compute: Stack
    adapters: list[ServiceProcess] = field(default_factory=list)
    adapter_extra: tuple[str, ...] = ()
    sources: ServiceProcess | None = None
    sources_extra: tuple[str, ...] = ()
    session_keys_file: Path | None = None
    """The keys every adapter signs and verifies sessions with, so a session moves freely
    between them (an adapter's ``extra`` flags may name another file)."""

    @property
    def oracle(self) -> ServiceProcess:
        assert self.compute.oracle is not None
        return self.compute.oracle

    @property
    def catalog(self) -> ServiceProcess:
        assert self.compute.catalog is not None
        return self.compute.catalog

    @property
    def storage(self) -> ServiceProcess:
        return self.compute.storage

    def compute_endpoints(self) -> str:
        return ",".join(f"{name}={p.address}" for name, p in self.compute.computes.items())

    def start_adapter(self, *extra: str) -> ServiceProcess:
        process = ServiceProcess(
            "services.adapter",
            [
                "--listen",
                "127.0.0.1:0",
                "--oracle",
                self.oracle.address,
                "--storage",
                self.storage.address,
                "--catalog",
                self.catalog.address,
                "--compute",
                self.compute_endpoints(),
                *self._session_keys_flag(),
                *self.adapter_extra,
                *extra,
            ],
        )
        self.adapters.append(process)
        return process

    def _session_keys_flag(self) -> tuple[str, ...]:
        if self.session_keys_file is None:
            return ()
        return ("--session-keys-file", str(self.session_keys_file))

    def start_sources(self) -> ServiceProcess:
        """The sources process (load generators, PostgreSQL sources), started afresh."""
        self.sources = ServiceProcess(
            "services.sources",
            [
                *("--listen", "127.0.0.1:0", "--oracle", self.oracle.address),
                *("--storage", self.storage.address, "--catalog", self.catalog.address),
                *self.sources_extra,
            ],
        )
        return self.sources

    def adapter(self, index: int = 0) -> str:
        """The address of the ``index``-th adapter."""
        return self.adapters[index].address

    def stop(self) -> None:
        for process in self.adapters:
            process.kill()
        if self.sources is not None:
            self.sources.kill()
        self.compute.stop()


async def _warm_up(stack: SqlStack, clusters: Sequence[str]) -> None:
    async with AdapterClient(stack.adapter(0)) as client:
        for cluster in clusters:
            name = f"warm_up_{cluster}"
            result = await client.execute(
                f"SET cluster = {cluster}; CREATE TABLE {name} (x bigint);"
                f"INSERT INTO {name} VALUES (1); CREATE INDEX ON {name} (x);"
                f"SELECT x FROM {name}; DROP TABLE {name} CASCADE; RESET cluster"
            )
            if result.error is not None:
                raise RuntimeError(f"warming up cluster {cluster} failed: {result.error}")


@contextmanager
def sql_stack(
    directory: Path,
    *,
    adapters: int = 2,
    clusters: Sequence[str] = ("default",),
    engine: str = "spark",
    spark_master: str = SPARK_MASTER,
    adapter_extra: Sequence[str] = ADAPTER_EXTRA,
    warm_up: bool = True,
    compute_extra: Mapping[str, Sequence[str]] | None = None,
    sources: bool = False,
    sources_extra: Sequence[str] = (),
) -> Iterator[SqlStack]:
    """The processes, started; with ``warm_up`` each cluster has run one index dataflow
    (Spark's start is paid before the tests). ``compute_extra``: flags per cluster.
    ``sources``: also the sources process (CREATE SOURCE ... FROM LOAD GENERATOR)."""
    storage = start_storage(embedded_backends(directory), extra=FAST_SETTINGS)
    compute = Stack(directory, storage, engine=engine, spark_master=spark_master)
    stack = SqlStack(
        compute,
        adapter_extra=tuple(adapter_extra),
        sources_extra=tuple(sources_extra),
        session_keys_file=ensure_keys_file(directory / "session-keys"),
    )
    try:
        compute.start_oracle_and_catalog()
        if sources:
            stack.start_sources()
        for cluster in clusters:
            compute.start_compute(cluster, (compute_extra or {}).get(cluster, ()))
        for _ in range(adapters):
            stack.start_adapter()
        if warm_up:
            asyncio.run(_warm_up(stack, clusters))
        yield stack
    finally:
        stack.stop()
