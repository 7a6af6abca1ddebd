"""The consensus contract, run against every backend: memory, SQLite and a real etcd, over
plaintext and over TLS with client certificates.

The first part is one parametrized suite (fixture ``store``) that every backend must pass.
The outage tests at the end take the backend away in the way that fits it (etcd: kill,
freeze and restart the server; SQLite: another connection holds the write lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.etcd import EtcdServer
from tests.support.ports import free_port
from tidemark.consensus import (
    Committed,
    Consensus,
    Mismatch,
    VersionedData,
    open_consensus,
)
from tidemark.consensus.etcd import EtcdConsensus
from tidemark.consensus.memory import MemoryConsensus
from tidemark.consensus.sqlite import SqliteConsensus, prefix_upper_bound
from tidemark.errors import Indeterminate, InvalidArgument, Unavailable, ValueTooLarge

# Generous bound for anything that waits on another task or process; a hang fails the test.
WAIT_S = 30.0


@dataclass
class Backend:
    """One backend under test. ``url`` is ``None`` when other processes cannot share it."""

    name: str
    url: str | None

    def open(self) -> Consensus:
        return open_consensus(self.url or "memory://")


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("sqlite"),
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("etcd-tls", marks=pytest.mark.etcd),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param in ("etcd", "etcd-tls"):
        fixture = "etcd_server" if request.param == "etcd" else "tls_etcd_server"
        server: EtcdServer = request.getfixturevalue(fixture)
        return Backend(request.param, with_option(server.url, "timeout=3"))
    if request.param == "sqlite":
        return Backend("sqlite", f"sqlite://{tmp_path / 'consensus.db'}?timeout=3")
    return Backend("memory", None)


def with_option(url: str, option: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{option}"


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Consensus]:
    opened = backend.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests can share one etcd server."""
    return f"test/{uuid.uuid4().hex}/"


async def created(store: Consensus, key: str, data: bytes) -> int:
    result = await store.compare_and_set(key, None, data)
    assert isinstance(result, Committed), result
    return result.version


async def updated(store: Consensus, key: str, expected: int, data: bytes) -> int:
    result = await store.compare_and_set(key, expected, data)
    assert isinstance(result, Committed), result
    return result.version


# -- basic contract ---------------------------------------------------------------------------


async def test_create_then_update_raises_version(store: Consensus, prefix: str) -> None:
    key = prefix + "k"
    assert await store.head(key) is None

    first = await created(store, key, b"one")
    assert first >= 1
    assert await store.head(key) == VersionedData(first, b"one")

    second = await updated(store, key, first, b"two")
    assert second > first
    assert await store.head(key) == VersionedData(second, b"two")


async def test_mismatch_reports_the_current_state(store: Consensus, prefix: str) -> None:
    key = prefix + "k"
    v1 = await created(store, key, b"one")
    v2 = await updated(store, key, v1, b"two")
    current = VersionedData(v2, b"two")

    assert await store.compare_and_set(key, v1, b"stale") == Mismatch(current)
    assert await store.compare_and_set(key, None, b"again") == Mismatch(current)
    assert await store.compare_and_set(key, v2 + 1000, b"future") == Mismatch(current)
    assert await store.compare_and_set(prefix + "absent", v2, b"x") == Mismatch(None)
    assert await store.head(key) == current


async def test_delete_is_compare_and_delete(store: Consensus, prefix: str) -> None:
    key = prefix + "k"
    v1 = await created(store, key, b"one")
    v2 = await updated(store, key, v1, b"two")

    assert await store.delete(key, v1) == Mismatch(VersionedData(v2, b"two"))
    assert await store.head(key) == VersionedData(v2, b"two")

    assert await store.delete(key, v2) == Committed(v2)
    assert await store.head(key) is None
    assert await store.delete(key, v2) == Mismatch(None)
    assert await store.compare_and_set(key, v2, b"zombie") == Mismatch(None)

    # Re-created keys are newer than anything the key held before.
    v3 = await created(store, key, b"three")
    assert v3 > v2
    assert await store.head(key) == VersionedData(v3, b"three")


async def test_versions_rise_across_keys_and_deletes(store: Consensus, prefix: str) -> None:
    seen: list[int] = []
    for round_ in range(3):
        key = f"{prefix}k{round_ % 2}"
        version = await created(store, key, b"x")
        seen.append(version)
        seen.append(await updated(store, key, version, b"y"))
        assert await store.delete(key, seen[-1]) == Committed(seen[-1])
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)


async def test_values_keep_their_exact_bytes(store: Consensus, prefix: str) -> None:
    values = {
        "empty": b"",
        "nul": b"\x00\x00\x01\x00",
        "binary": bytes(range(256)),
        "text": "Grüße, 世界".encode(),
    }
    for name, data in values.items():
        await created(store, prefix + name, data)
    for name, data in values.items():
        head = await store.head(prefix + name)
        assert head is not None and head.data == data


async def test_scan_returns_the_prefix_sorted_at_one_point(store: Consensus, prefix: str) -> None:
    inside = ["a/1", "a/2", "a/10", "a/é", "a/\uffff", "a/\U0001f600", "a/z/deep"]
    outside = ["a", "a0", "b/1", "A/1"]
    versions: dict[str, int] = {}
    for name in inside + outside:
        versions[name] = await created(store, prefix + name, name.encode())
    # Change one key so scan must return the latest version, not the first.
    versions["a/2"] = await updated(store, prefix + "a/2", versions["a/2"], b"changed")

    scanned = await store.scan(prefix + "a/")

    expected_names = sorted(inside, key=lambda name: name.encode("utf-8"))
    assert [key for key, _ in scanned] == [prefix + name for name in expected_names]
    for key, value in scanned:
        name = key.removeprefix(prefix)
        assert value.version == versions[name]
        assert value.data == (b"changed" if name == "a/2" else name.encode())
    assert await store.scan(prefix + "nothing/") == []
    everything = await store.scan(prefix)
    assert len(everything) == len(inside) + len(outside)


async def test_scan_with_empty_prefix_includes_every_key(store: Consensus, prefix: str) -> None:
    await created(store, prefix + "x", b"1")
    keys = [key for key, _ in await store.scan("")]
    assert prefix + "x" in keys
    assert keys == sorted(keys, key=lambda key: key.encode("utf-8"))


async def test_largest_value_fits_and_one_byte_more_is_refused(
    store: Consensus, prefix: str
) -> None:
    limit = store.max_value_bytes
    assert limit >= 1 << 20  # the state records are planned against 1 MiB
    key = prefix + "big"
    largest = bytes(i % 251 for i in range(limit))

    version = await created(store, key, largest)
    assert await store.head(key) == VersionedData(version, largest)
    assert await store.scan(key) == [(key, VersionedData(version, largest))]

    with pytest.raises(ValueTooLarge, match=str(limit)):
        await store.compare_and_set(key, version, largest + b"!")
    with pytest.raises(ValueTooLarge):
        await store.compare_and_set(prefix + "other", None, largest + b"!")
    assert await store.head(key) == VersionedData(version, largest)
    assert await store.head(prefix + "other") is None


async def test_bad_arguments_are_refused_before_anything_is_written(
    store: Consensus, prefix: str
) -> None:
    with pytest.raises(InvalidArgument):
        await store.compare_and_set("", None, b"x")
    with pytest.raises(InvalidArgument):
        await store.compare_and_set(prefix + "k", 0, b"x")
    with pytest.raises(InvalidArgument):
        await store.delete(prefix + "k", 0)
    with pytest.raises(InvalidArgument):
        await store.compare_and_set(prefix + "\ud800", None, b"x")
    with pytest.raises(InvalidArgument):
        await store.head("k" * 5000)
    assert await store.scan(prefix) == []


async def test_calls_after_close_are_unavailable(backend: Backend, prefix: str) -> None:
    opened = backend.open()
    await created(opened, prefix + "k", b"x")
    await opened.close()
    with pytest.raises(Unavailable):
        await opened.head(prefix + "k")


# -- concurrent compare-and-set -----------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    worker: int
    expected: int | None
    won: int | None  # the new version, if this attempt committed
    payload: bytes
    reported: int | None  # on a mismatch: the current version it reported


async def race(store: Consensus, key: str, worker: int, attempts: int) -> list[Attempt]:
    """Compare-and-set ``attempts`` times, each time from the version last learned (from a
    commit or from a mismatch's report), as a real read-modify-write loop does."""
    outcomes: list[Attempt] = []
    known: int | None = None
    for i in range(attempts):
        payload = f"{worker}:{i}".encode()
        result = await store.compare_and_set(key, known, payload)
        if isinstance(result, Committed):
            outcomes.append(Attempt(worker, known, result.version, payload, None))
            known = result.version
        else:
            reported = result.current.version if result.current else None
            outcomes.append(Attempt(worker, known, None, payload, reported))
            known = reported
    return outcomes


def race_in_process(
    url: str, key: str, worker: int, attempts: int, barrier: Any, results: Any
) -> None:
    """Entry point of a racing OS process (spawned, so it imports only this module)."""

    async def run() -> list[Attempt]:
        store = open_consensus(url)
        try:
            await store.head(key)  # connect before the start line
            barrier.wait(WAIT_S)
            return await race(store, key, worker, attempts)
        finally:
            await store.close()

    results.put(asyncio.run(run()))


def check_one_winner_per_version(outcomes: list[Attempt], final: VersionedData) -> None:
    wins = [attempt for attempt in outcomes if attempt.won is not None]
    by_expected: dict[int | None, list[Attempt]] = {}
    for attempt in wins:
        by_expected.setdefault(attempt.expected, []).append(attempt)
    assert all(len(group) == 1 for group in by_expected.values()), by_expected

    # The wins form one chain from "absent" to the final state, with no version skipped.
    chain: list[int | None] = [None]
    while chain[-1] in by_expected:
        chain.append(by_expected[chain[-1]][0].won)
    assert len(chain) == len(wins) + 1
    last_win = by_expected[chain[-2]][0]
    assert final == VersionedData(chain[-1], last_win.payload)  # type: ignore[arg-type]

    committed = set(chain)
    for attempt in outcomes:
        if attempt.won is None:
            assert attempt.reported != attempt.expected
            assert attempt.reported in committed


async def watch_until(
    store: Consensus, key: str, done: Callable[[VersionedData | None], bool]
) -> list[VersionedData | None]:
    """Every state the watch yields, up to and including the first that ``done`` accepts."""
    seen: list[VersionedData | None] = []
    async with asyncio.timeout(WAIT_S):
        async for state in store.watch(key):
            seen.append(state)
            if done(state):
                return seen
    raise AssertionError(f"watch ended early after {seen}")


class Follower:
    """Follows a watch in a background task and records every state it yields."""

    def __init__(self, states: AsyncIterator[VersionedData | None]) -> None:
        self.seen: list[VersionedData | None] = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._follow(states))
        self.task.add_done_callback(lambda _: self._changed.set())

    async def _follow(self, states: AsyncIterator[VersionedData | None]) -> None:
        async for state in states:
            self.seen.append(state)
            self._changed.set()

    async def until(self, reached: Callable[[VersionedData | None], bool]) -> None:
        """Wait until the latest state seen satisfies ``reached``."""
        async with asyncio.timeout(WAIT_S):
            while not (self.seen and reached(self.seen[-1])):
                if self.task.done():
                    raise AssertionError(f"watch ended after {self.seen}")
                self._changed.clear()
                await self._changed.wait()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def assert_increasing(states: list[VersionedData | None]) -> None:
    versions = [state.version for state in states if state is not None]
    assert versions == sorted(set(versions)), versions


async def test_concurrent_compare_and_set_has_one_winner_per_version(
    backend: Backend, store: Consensus, prefix: str
) -> None:
    key = prefix + "contended"
    workers, attempts = 4, 25
    follower = Follower(store.watch(key))

    if backend.url is None:
        # In-process only: race tasks on the shared store instead of processes.
        per_worker = await asyncio.gather(
            *(race(store, key, worker, attempts) for worker in range(workers))
        )
    else:
        per_worker = await race_processes(backend.url, key, workers, attempts)
    outcomes = [attempt for batch in per_worker for attempt in batch]
    assert len(outcomes) == workers * attempts

    final = await store.head(key)
    assert final is not None
    check_one_winner_per_version(outcomes, final)
    assert any(a.won is None for a in outcomes)  # they really raced

    # Every write came from elsewhere (other processes), yet the watch must reach the end.
    await follower.until(lambda state: state == final)
    await follower.stop()
    assert_increasing(follower.seen)


async def race_processes(url: str, key: str, workers: int, attempts: int) -> list[list[Attempt]]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(target=race_in_process, args=(url, key, worker, attempts, barrier, results))
        for worker in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        collected = [await asyncio.to_thread(results.get, True, 60) for _ in processes]
        for process in processes:
            await asyncio.to_thread(process.join, WAIT_S)
            assert process.exitcode == 0
        return collected
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()


async def test_concurrent_compare_and_set_between_clients_in_one_process(
    backend: Backend, prefix: str
) -> None:
    key = prefix + "contended"
    stores = [backend.open() for _ in range(3)] if backend.url else [backend.open()] * 3
    try:
        per_worker = await asyncio.gather(
            *(race(store, key, worker, 20) for worker, store in enumerate(stores))
        )
        final = await stores[0].head(key)
    finally:
        for opened in set(stores):
            await opened.close()
    assert final is not None
    check_one_winner_per_version([a for batch in per_worker for a in batch], final)


# -- watch ----------------------------------------------------------------------------------------


async def test_watch_sees_changes_in_order_and_ends_on_the_latest(
    store: Consensus, prefix: str
) -> None:
    key = prefix + "watched"
    history: list[VersionedData | None] = [None]
    watcher = asyncio.create_task(
        watch_until(store, key, lambda s: s is not None and s.data == b"final")
    )
    await asyncio.sleep(0.1)  # let the watch take its first reading

    version: int | None = None
    for i in range(30):
        if i == 15:
            assert version is not None
            assert await store.delete(key, version) == Committed(version)
            history.append(None)
            version = None
        data = f"v{i}".encode()
        result = await store.compare_and_set(key, version, data)
        assert isinstance(result, Committed)
        version = result.version
        history.append(VersionedData(version, data))
        if i % 3 == 0:
            await asyncio.sleep(0.01)
    final = await store.compare_and_set(key, version, b"final")
    assert isinstance(final, Committed)
    history.append(VersionedData(final.version, b"final"))

    seen = await watcher
    assert seen[0] is None
    assert seen[-1] == VersionedData(final.version, b"final")
    # Every state seen really existed, in the order it existed, none twice.
    remaining = iter(history)
    assert all(any(state == past for past in remaining) for state in seen), (seen, history)
    assert_increasing(seen)


async def test_slow_watcher_still_reaches_the_latest_state(store: Consensus, prefix: str) -> None:
    key = prefix + "watched"
    version = await created(store, key, b"start")
    seen: list[VersionedData | None] = []
    stream = store.watch(key)
    async with asyncio.timeout(WAIT_S):
        first = await anext(stream)
        assert first == VersionedData(version, b"start")
        # Many writes while the watcher is not looking: it may skip, but must land on the last.
        for i in range(20):
            version = await updated(store, key, version, f"w{i}".encode())
        async for state in stream:
            seen.append(state)
            await asyncio.sleep(0.05)
            if state is not None and state.version == version:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    assert seen[-1] == VersionedData(version, b"w19")
    assert_increasing([first, *seen])


async def test_watch_of_a_deleted_key_yields_none(store: Consensus, prefix: str) -> None:
    key = prefix + "watched"
    version = await created(store, key, b"x")
    stream = store.watch(key)
    async with asyncio.timeout(WAIT_S):
        assert await anext(stream) == VersionedData(version, b"x")
        assert await store.delete(key, version) == Committed(version)
        assert await anext(stream) is None
        again = await created(store, key, b"y")
        assert await anext(stream) == VersionedData(again, b"y")
    await stream.aclose()  # type: ignore[attr-defined]


async def test_watch_ends_when_the_store_is_closed(backend: Backend, prefix: str) -> None:
    opened = backend.open()
    key = prefix + "watched"
    follower = Follower(opened.watch(key))
    version = await created(opened, key, b"x")
    await follower.until(lambda state: state is not None)
    await opened.close()
    async with asyncio.timeout(WAIT_S):
        await follower.task  # returns instead of hanging
    assert follower.seen[-1] == VersionedData(version, b"x")


# -- backend-specific details -------------------------------------------------------------------


def test_open_consensus_picks_the_backend_by_url(tmp_path: Path) -> None:
    assert isinstance(open_consensus("memory://"), MemoryConsensus)
    sqlite_store = open_consensus(f"sqlite://{tmp_path}/c.db?timeout=0.5")
    assert isinstance(sqlite_store, SqliteConsensus)
    assert sqlite_store.path == f"{tmp_path}/c.db"
    assert sqlite_store.busy_timeout_s == 0.5
    etcd_store = open_consensus("etcd://10.0.0.1:2381,[::1]:2390,etcd-2?timeout=2")
    assert isinstance(etcd_store, EtcdConsensus)
    assert [str(e) for e in etcd_store.endpoints] == ["10.0.0.1:2381", "[::1]:2390", "etcd-2:2379"]
    assert etcd_store.timeout_s == 2


@pytest.mark.parametrize(
    "url",
    [
        "",
        "etcd",
        "postgres://db/x",
        "etcd://",
        "etcd://host:port",
        "etcd://host:70000",
        "etcd://host:2379/path",
        "etcd://host:2379?timeout=-1",
        "etcd://host:2379?timeout=soon",
        "etcd://host:2379?colour=blue",
        "sqlite://",
        "sqlite://:memory:",
        "memory://shared-name",
    ],
)
def test_open_consensus_rejects_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument, match="consensus URL"):
        open_consensus(url)


def test_prefix_upper_bound_is_the_least_string_above_the_prefix() -> None:
    assert prefix_upper_bound("a/") == "a0"
    assert prefix_upper_bound("") is None
    assert prefix_upper_bound("\U0010ffff") is None
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\ud7ff") == "\ue000"


# -- outages: etcd --------------------------------------------------------------------------------


@pytest.fixture
async def fragile_etcd(
    fresh_etcd_server: EtcdServer,
) -> AsyncIterator[tuple[EtcdServer, Consensus]]:
    store = open_consensus(f"{fresh_etcd_server.url}?timeout=1")
    try:
        yield fresh_etcd_server, store
    finally:
        await store.close()


@pytest.mark.etcd
async def test_etcd_killed_and_restarted(fragile_etcd: tuple[EtcdServer, Consensus]) -> None:
    server, store = fragile_etcd
    keys = {f"k{i}": f"before-{i}".encode() for i in range(5)}
    versions = {key: await created(store, key, data) for key, data in keys.items()}
    follower = Follower(store.watch("k0"))
    await follower.until(lambda state: state is not None)

    server.kill()
    for call in (
        store.head("k0"),
        store.scan(""),
        store.compare_and_set("k0", versions["k0"], b"during"),
        store.compare_and_set("new", None, b"during"),
        store.delete("k1", versions["k1"]),
    ):
        with pytest.raises(Unavailable, match="etcd"):
            async with asyncio.timeout(WAIT_S):
                await call
    with pytest.raises(Unavailable):
        async with asyncio.timeout(WAIT_S):
            await anext(store.watch("k2"))
    assert not follower.task.done()  # the running watch rides the outage out

    server.start()
    # The first call after the restart already succeeds (no stale connection in the way).
    scanned = await store.scan("")
    assert {key: value for key, value in scanned} == {
        key: VersionedData(versions[key], data) for key, data in keys.items()
    }
    after = await updated(store, "k0", versions["k0"], b"after")
    await follower.until(lambda state: state == VersionedData(after, b"after"))
    await follower.stop()
    assert_increasing(follower.seen)


@pytest.mark.etcd
async def test_etcd_writes_in_flight_when_killed_are_honestly_reported(
    fragile_etcd: tuple[EtcdServer, Consensus],
) -> None:
    """A writer keeps going while the server dies. Afterwards the stored value is the last
    committed write or one reported as indeterminate, never one reported as unavailable."""
    server, store = fragile_etcd
    key = "counter"
    version = await created(store, key, b"w-start")
    committed = [b"w-start"]
    maybe: set[bytes] = set()
    refused: set[bytes] = set()

    async def write(i: int) -> None:
        nonlocal version
        payload = f"w{i}".encode()
        try:
            result = await store.compare_and_set(key, version, payload)
        except Indeterminate:
            maybe.add(payload)
        except Unavailable:
            refused.add(payload)
        else:
            assert isinstance(result, Committed)
            version = result.version
            committed.append(payload)

    async with asyncio.timeout(WAIT_S):
        i = 0
        killer: asyncio.Future[None] | None = None
        while len(maybe) + len(refused) < 5:
            await write(i)
            i += 1
            if i == 20:  # kill from another thread while the writes go on
                killer = asyncio.ensure_future(asyncio.to_thread(server.kill))
        assert killer is not None
        await killer
    assert len(committed) >= 20

    server.start()
    final = await store.head(key)
    assert final is not None
    assert final.data in {committed[-1], *maybe}
    assert final.data not in refused
    assert final.version >= version


@pytest.mark.etcd
async def test_etcd_frozen_server_makes_writes_indeterminate(
    fragile_etcd: tuple[EtcdServer, Consensus],
) -> None:
    server, store = fragile_etcd
    version = await created(store, "k", b"before")
    server.pause()
    try:
        with pytest.raises(Indeterminate, match="may have been applied"):
            async with asyncio.timeout(WAIT_S):
                await store.compare_and_set("k", version, b"maybe")
        with pytest.raises(Unavailable) as read_error:
            async with asyncio.timeout(WAIT_S):
                await store.head("k")
        assert not isinstance(read_error.value, Indeterminate)  # reads change nothing
    finally:
        server.resume()

    # Either outcome is allowed, and the indeterminate write may still land after the server
    # resumes (it was sent on a connection the client has since replaced): the store must
    # settle in one of the two states and stay usable.
    for _ in range(20):
        current = await store.head("k")
        assert current is not None and current.data in (b"before", b"maybe")
        result = await store.compare_and_set("k", current.version, b"next")
        if isinstance(result, Committed):
            break
        assert result.current is not None and result.current.data == b"maybe"
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the store never settled after the frozen server resumed")


@pytest.mark.etcd
async def test_etcd_uses_the_next_endpoint_when_one_is_down(etcd_server: EtcdServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = open_consensus(f"etcd://{dead},{etcd_server.endpoint}?timeout=2")
    key = f"test/{uuid.uuid4().hex}/k"
    try:
        version = await created(store, key, b"x")
        assert await store.head(key) == VersionedData(version, b"x")
        stream = store.watch(key)
        async with asyncio.timeout(WAIT_S):
            assert await anext(stream) == VersionedData(version, b"x")
            newer = await updated(store, key, version, b"y")
            assert await anext(stream) == VersionedData(newer, b"y")
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await store.close()


# -- outages: SQLite ------------------------------------------------------------------------------


@contextlib.contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Another connection holding the file's write lock (a stuck writer elsewhere)."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        yield
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()


async def test_sqlite_locked_file_is_unavailable_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "consensus.db"
    store = open_consensus(f"sqlite://{path}?timeout=0.3")
    try:
        version = await created(store, "k", b"before")
        stream = store.watch("k")
        async with asyncio.timeout(WAIT_S):
            assert await anext(stream) == VersionedData(version, b"before")

        with write_lock_held(path):
            for call in (
                store.compare_and_set("k", version, b"during"),
                store.compare_and_set("new", None, b"during"),
                store.delete("k", version),
            ):
                with pytest.raises(Unavailable, match="busy timeout") as error:
                    async with asyncio.timeout(WAIT_S):
                        await call
                assert not isinstance(error.value, Indeterminate)  # the lock was never ours
            # WAL readers are not blocked by a writer.
            assert await store.head("k") == VersionedData(version, b"before")
            assert await store.scan("new") == []

        after = await updated(store, "k", version, b"after")
        async with asyncio.timeout(WAIT_S):
            assert await anext(stream) == VersionedData(after, b"after")
        await stream.aclose()  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_sqlite_file_in_missing_unwritable_place_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the directory should be")
    store = open_consensus(f"sqlite://{blocker}/consensus.db")
    try:
        with pytest.raises(Unavailable, match=r"consensus\.db"):
            await store.head("k")
    finally:
        await store.close()
