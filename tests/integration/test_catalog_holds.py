"""Catalog objects stay readable through crashes: kill -9 of storage, of compute, of the adapter,
and of all three at once, each down for longer than the capability lease, while rows are
inserted in a loop. Afterwards the table holds every acknowledged insert once, the materialized
view over it equals its recomputation, and both collections still carry the catalog's durable
read hold (``services/catalog/holds.py``). DROP releases it. A view whose since was lost anyway
(provoked by hand, as the runaway used to happen) is reported with 55000 and comes back with
``ALTER MATERIALIZED VIEW … REBUILD``.

Real processes, each restarted on its old port; compute runs the in-process engine (the holds
do not depend on the engine, and Spark's start would dominate every restart)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.compute import Stack, eventually
from tests.support.service_process import ServiceProcess
from tests.support.storage import FAST_SETTINGS, embedded_backends, start_storage
from tidemark.catalog_items import CATALOG_HOLDER
from tidemark.clients.adapter import AdapterClient, StatementResult, SubscribeError
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import CollectionInfo, StorageClient

LEASE_S = 15.0  # above the adapter's 10 s renewal period; every outage below outlasts it
STORAGE_ARGS = (*FAST_SETTINGS, "--lease-seconds", str(LEASE_S))
COMPUTE_ARGS = ("--lease-ms", str(int(LEASE_S * 1000)))
CATALOG_ARGS = ("--hold-interval", "0.5")
ADAPTER_ARGS = ("--peek-wait-seconds", "120")
PATIENCE_S = 180.0
CHECK_TIMEOUT_S = 60.0


class Processes:
    """The stack, with restarts on the same ports (the others keep their addresses)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stack = Stack(
            directory,
            start_storage(embedded_backends(directory), extra=STORAGE_ARGS),
            engine="local",
            compute_extra=COMPUTE_ARGS,
            catalog_extra=CATALOG_ARGS,
        )
        self.stack.start_oracle_and_catalog()
        self.stack.start_compute()
        self.adapter = self._start_adapter()

    def _start_adapter(self) -> ServiceProcess:
        assert self.stack.oracle is not None and self.stack.catalog is not None
        return ServiceProcess(
            "services.adapter",
            [
                *("--listen", "127.0.0.1:0", "--oracle", self.stack.oracle.address),
                *("--storage", self.stack.storage.address, "--catalog", self.stack.catalog.address),
                *("--compute", f"default={self.stack.compute().address}", *ADAPTER_ARGS),
            ],
        )

    def kill(self, name: str) -> None:
        {
            "storage": self.stack.storage,
            "compute": self.stack.compute(),
            "adapter": self.adapter,
            "catalog": self.stack.catalog,
        }[name].kill()  # type: ignore[union-attr]

    def restart(self, name: str) -> None:
        if name == "storage":
            port = self.stack.storage.port
            self.stack.storage = start_storage(
                embedded_backends(self.directory), port=port, extra=STORAGE_ARGS
            )
        elif name == "compute":
            args = self.stack.compute_args("default")
            args[1] = self.stack.compute().address
            self.stack.computes["default"] = ServiceProcess("services.compute", args)
        elif name == "catalog":
            catalog = self.stack.catalog
            assert catalog is not None and self.stack.oracle is not None
            self.stack.catalog = ServiceProcess(
                "services.catalog",
                [
                    *("--listen", catalog.address, "--storage", self.stack.storage.address),
                    *("--oracle", self.stack.oracle.address, *CATALOG_ARGS),
                ],
            )
        elif name == "adapter":
            self.adapter = self._start_adapter()

    def stop(self) -> None:
        self.adapter.kill()
        self.stack.stop()

    def log_tails(self, lines: int = 25) -> str:
        """The last log lines of every process, for a failure's message: a check that never
        passes says nothing about which process stopped making progress."""
        running = {
            "storage": self.stack.storage,
            "catalog": self.stack.catalog,
            "compute": self.stack.compute(),
            "adapter": self.adapter,
        }
        return "\n".join(
            f"--- {name} ---\n" + "\n".join(process.stderr_lines[-lines:])
            for name, process in running.items()
            if process is not None
        )


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    running = Processes(tmp_path_factory.mktemp("holds"))
    try:
        yield running
    finally:
        running.stop()


async def run(address: str, sql: str) -> StatementResult:
    async with AdapterClient(address) as client:
        result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


class Writer:
    """Inserts ``(id, id % 5, id)`` one row at a time through the current adapter, and records
    which inserts were acknowledged and which were attempted (an insert that failed may still
    have landed)."""

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.acknowledged: list[int] = []
        self.attempted: set[int] = set()
        self._next = 1
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stops the loop. The flag, not only the cancellation, ends it: Python 3.11's
        ``asyncio.wait_for`` can swallow a cancellation that arrives as its call completes,
        and the writer then went on inserting while the checks waited for it forever."""
        assert self._task is not None
        self._stopping = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while not self._stopping:
            row_id = self._next
            self._next += 1
            self.attempted.add(row_id)
            try:
                async with (
                    AdapterClient(self.processes.adapter.address) as client,
                    asyncio.timeout(30),
                ):
                    result = await client.execute(
                        f"INSERT INTO acct VALUES ({row_id}, {row_id % 5}, 1)"
                    )
                if result.error is None:
                    self.acknowledged.append(row_id)
            except Exception:  # a process is down: try the next row in a moment
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.05)


async def check_readable(processes: Processes, writer: Writer, view: str = "acct_sum") -> None:
    """The table holds each acknowledged insert once (and nothing never attempted), and the
    view equals its recomputation from the table."""

    async def check() -> None:
        try:
            table, summed = await asyncio.wait_for(
                asyncio.gather(
                    run(processes.adapter.address, "SELECT id, k FROM acct"),
                    run(processes.adapter.address, f"SELECT k, total, n FROM {view}"),
                ),
                CHECK_TIMEOUT_S,
            )
        except Exception as exc:  # still reconnecting (or, without durable holds, lost)
            raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
        ids = Counter(row[0] for row in table.rows)
        assert all(n == 1 for n in ids.values()), "an insert landed twice"
        assert set(writer.acknowledged) <= set(ids), "an acknowledged insert is lost"
        assert set(ids) <= writer.attempted
        expected: dict[object, list[int]] = {}
        for _, k in table.rows:
            expected.setdefault(k, [0, 0])
            expected[k][0] += 1
            expected[k][1] += 1
        assert {row[0]: [row[1], row[2]] for row in summed.rows} == expected

    try:
        await eventually(check, PATIENCE_S)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n{processes.log_tails()}") from failure


async def describe(processes: Processes, collection_id: str) -> CollectionInfo:
    async with StorageClient(processes.stack.storage.address) as storage:
        return await storage.describe(collection_id)


async def catalog_id(processes: Processes, name: str) -> str:
    """The id (= the collection's id) of the relation called ``name``."""
    assert processes.stack.oracle is not None and processes.stack.catalog is not None
    oracle = OracleClient(processes.stack.oracle.address)
    catalog = CatalogClient(processes.stack.catalog.address)
    try:
        snapshot = await catalog.snapshot_at(await oracle.read_ts("catalog"))
    finally:
        await catalog.close()
        await oracle.close()
    (found,) = [i.id for i in snapshot.items if i.name.item == name]
    return found


async def assert_catalog_holds(processes: Processes, collection_id: str) -> None:
    info = await describe(processes, collection_id)
    holds = [c for c in info.capabilities if c.critical]
    assert [c.holder for c in holds] == [CATALOG_HOLDER], info.capabilities
    assert holds[0].lease_expires_ms == 0
    assert not info.since.is_empty() and info.since.frontier_less_equal(holds[0].frontier)


@pytest.fixture(scope="module")
def rows(processes: Processes) -> Writer:
    """One writer for the module: the table and what was inserted into it are shared."""
    return Writer(processes)


@pytest.fixture
async def writer(rows: Writer) -> AsyncIterator[Writer]:
    yield rows
    if rows._task is not None and not rows._task.done():
        await rows.stop()


async def lose_history(processes: Processes, view_id: str) -> None:
    """The runaway as it used to happen: nothing durable holds the view, every leased holder
    dies, and a restarting writer takes a capability pair and drops the read half."""
    processes.kill("catalog")
    processes.kill("adapter")
    async with StorageClient(processes.stack.storage.address) as storage:
        hold = await storage.acquire_critical(view_id, CATALOG_HOLDER)
        await storage.drop(hold)
        await asyncio.sleep(LEASE_S + 3)
        pair = await storage.acquire(view_id, "provoker")
        for capability in (pair.read, pair.write):
            if capability.usable:  # the read half is not when nothing held the since at all
                await storage.drop(capability)
        assert (await storage.describe(view_id)).since.is_empty()
    processes.restart("catalog")
    processes.restart("adapter")


# Four outages of LEASE_S + 3 s each, and each check may wait PATIENCE_S: past the default
# timeout, pytest would stop the test before a failing check could say why.
@pytest.mark.timeout(1200)
async def test_objects_stay_readable_through_kills_longer_than_the_lease(
    processes: Processes, writer: Writer
) -> None:
    address = processes.adapter.address
    await run(address, "CREATE TABLE acct (id bigint, k bigint, v bigint)")
    await run(
        address,
        "CREATE MATERIALIZED VIEW acct_sum AS "
        "SELECT k, sum(v) AS total, count(*) AS n FROM acct GROUP BY k",
    )
    writer.start()
    await asyncio.sleep(3)
    for down in (("storage",), ("compute",), ("adapter",), ("storage", "compute", "adapter")):
        for name in down:
            processes.kill(name)
        # Longer than the lease: every leased capability of the dead lapses.
        await asyncio.sleep(LEASE_S + 3)
        for name in down:
            processes.restart(name)
        before = len(writer.acknowledged)
        deadline = time.monotonic() + PATIENCE_S
        while len(writer.acknowledged) < before + 5:  # writes go through again
            assert time.monotonic() < deadline, (
                f"no insert acknowledged after {down}\n{processes.log_tails()}"
            )
            await asyncio.sleep(0.5)
        await writer.stop()
        await check_readable(processes, writer)
        writer.start()
    await writer.stop()
    assert len(writer.acknowledged) > 20
    table_id = await catalog_id(processes, "acct")
    view_id = await catalog_id(processes, "acct_sum")
    for collection_id in (table_id, view_id):
        await assert_catalog_holds(processes, collection_id)

    # DROP releases every capability, the catalog's hold included.
    await run(processes.adapter.address, "DROP MATERIALIZED VIEW acct_sum")

    async def released() -> None:
        info = await describe(processes, view_id)
        assert info.capabilities == [] and info.since.is_empty(), info.capabilities

    await eventually(released, 60)
    await assert_catalog_holds(processes, table_id)


async def test_a_lost_history_is_reported_and_rebuild_recovers_it(
    processes: Processes, writer: Writer
) -> None:
    address = processes.adapter.address
    await run(
        address,
        "CREATE MATERIALIZED VIEW acct_by_k AS "
        "SELECT k, sum(v) AS total, count(*) AS n FROM acct GROUP BY k",
    )
    await check_readable(processes, writer, "acct_by_k")
    view_id = await catalog_id(processes, "acct_by_k")
    await lose_history(processes, view_id)
    address = processes.adapter.address

    async def reported() -> None:
        async with AdapterClient(address) as client:
            result = await client.execute("SELECT * FROM acct_by_k")
        assert result.error is not None and result.error.code == "55000", result.error
        assert "lost its stored history" in result.error.message
        assert "ALTER MATERIALIZED VIEW" in result.error.hint and "REBUILD" in result.error.hint

    await eventually(reported, PATIENCE_S)
    async with AdapterClient(address) as client:
        events = [event async for event in client.subscribe("SUBSCRIBE acct_by_k")]
    assert len(events) == 1 and isinstance(events[0], SubscribeError), events
    assert events[0].error.code == "55000", events[0].error
    # The catalog does not paper over it: the view stays lost until rebuilt.
    await asyncio.sleep(2)
    assert (await describe(processes, view_id)).since.is_empty()

    rebuilt = await run(address, "ALTER MATERIALIZED VIEW acct_by_k REBUILD")
    assert rebuilt.tag == "ALTER MATERIALIZED VIEW"
    writer.start()
    await asyncio.sleep(2)
    await writer.stop()
    await check_readable(processes, writer, "acct_by_k")
    await assert_catalog_holds(processes, view_id)

    async with AdapterClient(address) as client:
        wrong = await client.execute("ALTER MATERIALIZED VIEW acct REBUILD")
        assert wrong.error is not None and wrong.error.code == "42809", wrong.error
        missing = await client.execute("ALTER MATERIALIZED VIEW nope REBUILD")
        assert missing.error is not None and missing.error.code == "42P01", missing.error


async def test_compute_rebuilds_a_lost_view_when_it_installs_it(
    processes: Processes, writer: Writer
) -> None:
    await run(
        processes.adapter.address,
        "CREATE MATERIALIZED VIEW acct_again AS "
        "SELECT k, sum(v) AS total, count(*) AS n FROM acct GROUP BY k",
    )
    await check_readable(processes, writer, "acct_again")
    view_id = await catalog_id(processes, "acct_again")
    await lose_history(processes, view_id)
    processes.kill("compute")
    processes.restart("compute")
    # No REBUILD: the restarted compute finds the output lost and writes it anew.
    await check_readable(processes, writer, "acct_again")
    await assert_catalog_holds(processes, view_id)
