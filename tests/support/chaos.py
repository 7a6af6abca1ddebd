"""The chaos run: a workload through both adapters while processes are kill -9'd and brought
back, then checks that nothing the clients were told was lost, doubled or reordered.

Workload (every operation's outcome recorded as ok, failed — a clear SQL error — or
indeterminate — the connection was lost, so it may or may not have happened):

- bank transfers: ``BEGIN; SELECT`` both balances, ``UPDATE ...; COMMIT`` (40001 retried);
- list appends (Elle's list-append model): read some keys' lists, append unique values;
- inserts of unique ids into ``events``, under a materialized view and an index;
- SUBSCRIBE readers on ``events``, resubscribing from their last progress after a failure;
- CREATE TABLE with fresh names (catalog writes).

Checks (:func:`check_run`): every acknowledged insert present once, an indeterminate one at
most once, a failed one never; the bank total at every sampled ``AS OF`` time; each MV equals
its query over the base tables ``AS OF`` sampled times; each SUBSCRIBE segment replayed up to
``t`` equals ``AS OF t``; and no serializability anomaly in the list-append history
(tests/support/elle.py, with real-time order: strict serializability).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.chaos_cluster import ChaosCluster
from tests.support.elle import Append, Read, Transaction
from tests.support.elle import check as elle_check
from tidemark.clients.adapter import (
    AdapterClient,
    Changes,
    Progress,
    SubscribeError,
    SubscribeHeader,
)

ACCOUNTS = 6
START_BALANCE = 1000
TOTAL = ACCOUNTS * START_BALANCE
LIST_KEYS = 5
GROUPS = 4
CALL_TIMEOUT = 30.0

SCHEMA = [
    "CREATE TABLE accounts (id bigint NOT NULL, balance bigint NOT NULL)",
    "INSERT INTO accounts VALUES " + ", ".join(f"({i}, {START_BALANCE})" for i in range(ACCOUNTS)),
    "CREATE MATERIALIZED VIEW bank_total AS SELECT sum(balance) AS total, count(*) AS n "
    "FROM accounts",
    "CREATE TABLE lists (k bigint NOT NULL, v text NOT NULL)",
    "INSERT INTO lists VALUES " + ", ".join(f"({k}, '')" for k in range(LIST_KEYS)),
    "CREATE TABLE events (id bigint NOT NULL, grp bigint NOT NULL, amount bigint NOT NULL)",
    "CREATE MATERIALIZED VIEW event_totals AS SELECT grp, count(*) AS n, sum(amount) AS total "
    "FROM events GROUP BY grp",
    "CREATE INDEX events_by_grp ON events (grp)",
]
# Each view, and the same query over its base tables.
VIEWS = {
    "SELECT total, n FROM bank_total": "SELECT sum(balance), count(*) FROM accounts",
    "SELECT grp, n, total FROM event_totals": (
        "SELECT grp, count(*), sum(amount) FROM events GROUP BY grp"
    ),
}


@dataclass
class Config:
    seconds: float = 60.0
    fault_interval: float = 4.0
    fault_pause: float = 1.0
    faults: tuple[str, ...] = (
        "oracle",
        "catalog",
        "storage",
        "compute",
        "adapter",
        "etcd",
        "s3",
    )
    bank_workers: int = 2
    list_workers: int = 2
    insert_workers: int = 2
    subscribers: int = 1
    ddl_workers: int = 1
    sampled_times: int = 20
    seed: int = 19


@dataclass
class Segment:
    """One SUBSCRIBE stream, from its header to its end."""

    as_of: int
    changes: list[tuple[int, int, tuple[Any, ...]]] = field(default_factory=list)
    upper: int | None = None


@dataclass
class Record:
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[tuple[float, str]] = field(default_factory=list)  # (unix time, process)
    ops: dict[str, Counter[str]] = field(default_factory=dict)
    inserts: dict[int, str] = field(default_factory=dict)  # id -> ok / failed / indeterminate
    creates: dict[str, str] = field(default_factory=dict)  # table name -> outcome
    transfer_times: list[int] = field(default_factory=list)
    history: list[Transaction] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    start_time: int = 0

    def error(self, text: str) -> None:
        """Counts an error by its kind (ids and times replaced by N)."""
        self.errors[re.sub(r"\d+", "N", text)[:160]] += 1

    def count(self, kind: str, outcome: str) -> None:
        self.ops.setdefault(kind, Counter())[outcome] += 1


class Session:
    """A SQL session that reconnects (to either adapter) after a transport failure."""

    def __init__(self, addresses: Sequence[str], index: int) -> None:
        self.addresses = list(addresses)
        self.index = index
        self.client: AdapterClient | None = None

    def connect(self) -> AdapterClient:
        if self.client is None:
            self.client = AdapterClient(
                self.addresses[self.index % len(self.addresses)], timeout=CALL_TIMEOUT
            )
        return self.client

    async def reset(self) -> None:
        """Drop the connection (and so the session's open transaction); next time, the other
        adapter."""
        if self.client is not None:
            await self.client.close()
        self.client = None
        self.index += 1


async def setup(addresses: Sequence[str]) -> int:
    """Creates the schema (before any fault); the data time the run starts at."""
    async with AdapterClient(addresses[0], timeout=120) as client:
        for sql in SCHEMA:
            result = await client.execute(sql)
            if result.error is not None:
                raise RuntimeError(f"{sql}: {result.error}")
        read = await client.execute("SELECT count(*) FROM accounts")
        assert read.error is None
        return read.results[-1].timestamp


def _outcome(code: str, message: str) -> str:
    """How a statement's SQL error leaves a write: a conflict, or (when a backend stopped
    answering mid-way) unknown, or else failed — and a failed write must change nothing."""
    if code == "40001":
        return "conflict"
    if code.startswith("08") and "outcome is unknown" in message:
        return "indeterminate"
    return "failed"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


async def bank_worker(
    session: Session, rng: random.Random, record: Record, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        payer, payee = rng.sample(range(ACCOUNTS), 2)
        amount = rng.randrange(1, 200)
        try:
            client = session.connect()
            read = await client.execute(
                f"BEGIN; SELECT id, balance FROM accounts WHERE id = {payer} OR id = {payee}"
            )
        except Exception as exc:
            record.error(_error_text(exc))
            record.count("transfer", "failed")
            await session.reset()
            await asyncio.sleep(0.2)
            continue
        if read.error is not None:
            record.error(f"{read.error.code}: {read.error.message[:120]}")
            record.count("transfer", "failed")
            await _rollback(session)
            continue
        balances = dict(read.results[-1].rows)
        if len(balances) != 2 or balances[payer] < amount:
            await _rollback(session)
            continue
        try:
            written = await client.execute(
                f"UPDATE accounts SET balance = balance + CASE WHEN id = {payer} THEN {-amount} "
                f"ELSE {amount} END WHERE id = {payer} OR id = {payee}; COMMIT"
            )
        except Exception as exc:
            record.error(_error_text(exc))
            record.count("transfer", "indeterminate")
            await session.reset()
            continue
        if written.error is None:
            record.count("transfer", "ok")
            record.transfer_times.append(written.results[-1].timestamp)
        else:
            record.error(f"{written.error.code}: {written.error.message[:120]}")
            record.count("transfer", _outcome(written.error.code, written.error.message))
            await _rollback(session)


async def _rollback(session: Session) -> None:
    client = session.client
    if client is None or not client.session.transaction:
        return
    try:
        await client.execute("ROLLBACK")
    except Exception:
        await session.reset()


_txn_ids = itertools.count(1)


def _parse_list(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split())


async def list_worker(
    session: Session, rng: random.Random, record: Record, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        tid = next(_txn_ids)
        read_keys = sorted(rng.sample(range(LIST_KEYS), rng.randint(1, 3)))
        append_keys = sorted(rng.sample(read_keys, rng.randint(1, len(read_keys))))
        values = {k: tid * 10 + i for i, k in enumerate(append_keys)}
        keys = " OR ".join(f"k = {k}" for k in read_keys)
        invoked = time.monotonic()
        try:
            client = session.connect()
            read = await client.execute(f"BEGIN; SELECT k, v FROM lists WHERE {keys}")
        except Exception as exc:
            record.error(_error_text(exc))
            record.count("list_append", "failed")
            await session.reset()
            await asyncio.sleep(0.2)
            continue
        if read.error is not None:
            record.error(f"{read.error.code}: {read.error.message[:120]}")
            record.count("list_append", "failed")
            await _rollback(session)
            continue
        seen = {int(k): _parse_list(str(v)) for k, v in read.results[-1].rows}
        ops: list[Append | Read] = [Read(k, seen.get(k, ())) for k in read_keys]
        ops += [Append(k, values[k]) for k in append_keys]
        case = " ".join(f"WHEN k = {k} THEN ' {values[k]}'" for k in append_keys)
        where = " OR ".join(f"k = {k}" for k in append_keys)
        outcome = "ok"
        try:
            written = await client.execute(
                f"UPDATE lists SET v = v || CASE {case} END WHERE {where}; COMMIT"
            )
            if written.error is not None:
                record.error(f"{written.error.code}: {written.error.message[:120]}")
                kind = _outcome(written.error.code, written.error.message)
                outcome = "info" if kind == "indeterminate" else "fail"
                await _rollback(session)
        except Exception as exc:
            record.error(_error_text(exc))
            outcome = "info"
            await session.reset()
        record.history.append(Transaction(tid, tuple(ops), outcome, invoked, time.monotonic()))  # type: ignore[arg-type]
        record.count(
            "list_append",
            {"ok": "ok", "fail": "failed/conflict", "info": "indeterminate"}[outcome],
        )


_event_ids = itertools.count(1)


async def insert_worker(
    session: Session, rng: random.Random, record: Record, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        event = next(_event_ids)
        sql = f"INSERT INTO events VALUES ({event}, {rng.randrange(GROUPS)}, {rng.randint(1, 9)})"
        try:
            result = await session.connect().execute(sql)
        except Exception as exc:
            record.error(_error_text(exc))
            record.inserts[event] = "indeterminate"
            record.count("insert", "indeterminate")
            await session.reset()
            await asyncio.sleep(0.2)
            continue
        if result.error is None:
            record.inserts[event] = "ok"
            record.count("insert", "ok")
        else:
            record.error(f"{result.error.code}: {result.error.message[:120]}")
            outcome = _outcome(result.error.code, result.error.message)
            record.inserts[event] = outcome
            record.count("insert", outcome)
            await asyncio.sleep(0.1)


_ddl_ids = itertools.count(1)


async def ddl_worker(session: Session, record: Record, stop: asyncio.Event) -> None:
    """CREATE TABLE with fresh names: each acknowledged one must exist once, a failed one
    never (catalog writes are compare-and-append on the catalog collection)."""
    while not stop.is_set():
        name = f"ddl_{next(_ddl_ids)}"
        try:
            result = await session.connect().execute(f"CREATE TABLE {name} (x bigint)")
        except Exception as exc:
            record.error(_error_text(exc))
            record.creates[name] = "indeterminate"
            record.count("create_table", "indeterminate")
            await session.reset()
            await asyncio.sleep(0.5)
            continue
        if result.error is None:
            outcome = "ok"
        else:
            record.error(f"{result.error.code}: {result.error.message[:120]}")
            outcome = _outcome(result.error.code, result.error.message)
        record.creates[name] = outcome
        record.count("create_table", outcome)
        await asyncio.sleep(0.5)


async def subscriber(
    addresses: Sequence[str], index: int, record: Record, stop: asyncio.Event
) -> None:
    as_of = record.start_time
    while not stop.is_set():
        address = addresses[index % len(addresses)]
        index += 1
        segment: Segment | None = None
        try:
            async with AdapterClient(address, timeout=CALL_TIMEOUT) as client:
                async for event in client.subscribe(f"SUBSCRIBE events AS OF {as_of}"):
                    if isinstance(event, SubscribeError):
                        record.error(f"subscribe {event}"[:160])
                        break
                    if isinstance(event, SubscribeHeader):
                        segment = Segment(event.as_of)
                        record.segments.append(segment)
                    elif isinstance(event, Changes) and segment is not None:
                        segment.changes.extend((c.timestamp, c.diff, c.row) for c in event.changes)
                    elif isinstance(event, Progress) and segment is not None:
                        if event.upper is not None:
                            segment.upper = event.upper
                            as_of = max(as_of, event.upper - 1)
                    if stop.is_set():
                        break
        except Exception as exc:
            record.error(_error_text(exc))
        record.count("subscribe_stream", "ok" if segment and segment.upper else "failed")
        if not stop.is_set():
            await asyncio.sleep(0.3)


async def inject_faults(
    cluster: ChaosCluster, config: Config, record: Record, stop: asyncio.Event
) -> None:
    rng = random.Random(config.seed)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), config.fault_interval)
            return
        except TimeoutError:
            pass
        kind = rng.choice([k for k in config.faults if k in cluster.fault_kinds])
        if kind == "adapter":
            name = rng.choice(["adapter0", "adapter1"])
        elif kind == "adapter1":  # only the adapter that ran no DDL (see tests/e2e/test_chaos.py)
            name = "adapter1"
        elif kind == "etcd":
            name = rng.choice([m.name for m in cluster.etcd])
        else:
            name = kind
        await asyncio.to_thread(cluster.kill, name)
        record.faults[kind] += 1
        record.fault_log.append((round(time.time(), 3), name))
        await asyncio.sleep(config.fault_pause)
        await asyncio.to_thread(cluster.restart, name)


async def run_workload(cluster: ChaosCluster, config: Config) -> Record:
    record = Record()
    addresses = cluster.adapters
    record.start_time = await setup(addresses)
    rng = random.Random(config.seed)
    stop = asyncio.Event()
    sessions = itertools.count()
    tasks = [
        *(
            bank_worker(
                Session(addresses, next(sessions)), random.Random(rng.random()), record, stop
            )
            for _ in range(config.bank_workers)
        ),
        *(
            list_worker(
                Session(addresses, next(sessions)), random.Random(rng.random()), record, stop
            )
            for _ in range(config.list_workers)
        ),
        *(
            insert_worker(
                Session(addresses, next(sessions)), random.Random(rng.random()), record, stop
            )
            for _ in range(config.insert_workers)
        ),
        *(subscriber(addresses, i, record, stop) for i in range(config.subscribers)),
        *(
            ddl_worker(Session(addresses, next(sessions)), record, stop)
            for _ in range(config.ddl_workers)
        ),
        inject_faults(cluster, config, record, stop),
    ]
    running = [asyncio.create_task(t) for t in tasks]
    await asyncio.sleep(config.seconds)
    stop.set()
    # Calls in flight finish within their deadline; subscriptions end at their next event.
    _, pending = await asyncio.wait(running, timeout=CALL_TIMEOUT + 10)
    for task in pending:
        task.cancel()
    for task in running:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return record


# -- checks ---------------------------------------------------------------------------------------


async def _retrying(what: Callable[[], Awaitable[Any]], seconds: float = 120.0) -> Any:
    """Runs ``what`` until it does not raise (the cluster is recovering), up to ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        try:
            return await what()
        except Exception:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(1.0)


async def _rows(client: AdapterClient, sql: str) -> tuple[list[tuple[Any, ...]], int]:
    """The rows of a query and its read time; a SQL error raises AssertionError."""
    result = await client.execute(sql)
    if result.error is not None:
        raise AssertionError(f"{sql}: {result.error.code} {result.error.message}")
    return result.results[-1].rows, result.results[-1].timestamp


def _replay(
    changes: Sequence[tuple[int, int, tuple[Any, ...]]], t: int
) -> Counter[tuple[Any, ...]]:
    contents: Counter[tuple[Any, ...]] = Counter()
    for at, diff, row in changes:
        if at <= t:
            contents[row] += diff
    return +contents


async def check_run(addresses: Sequence[str], record: Record, config: Config) -> dict[str, Any]:
    """The checks' findings: ``anomalies`` (must be empty) and what was checked."""
    anomalies: list[str] = []
    checked: Counter[str] = Counter()
    rng = random.Random(config.seed + 1)
    async with AdapterClient(addresses[0], timeout=120) as client:

        async def final_events() -> tuple[list[tuple[Any, ...]], int]:
            return await _rows(client, "SELECT id FROM events")

        rows, now = await _retrying(final_events)

        # Acknowledged writes: present once; unknown outcome: at most once; failed: never.
        present = Counter(int(r[0]) for r in rows)
        for event, outcome in record.inserts.items():
            n = present.get(event, 0)
            if (
                (outcome == "ok" and n != 1)
                or (outcome == "indeterminate" and n > 1)
                or (outcome in ("failed", "conflict") and n != 0)
            ):
                anomalies.append(f"insert {event} ({outcome}) present {n} times")
        for event in set(present) - set(record.inserts):
            anomalies.append(f"insert {event} never sent, present {present[event]} times")
        checked["inserts"] = len(record.inserts)

        # Acknowledged CREATE TABLEs exist once; failed ones do not.
        shown, _ = await _retrying(lambda: _rows(client, "SHOW TABLES"))
        tables = Counter(str(r[0]) for r in shown)
        for name, outcome in record.creates.items():
            n = tables.get(name, 0)
            if (outcome == "ok" and n != 1) or n > 1 or (outcome == "failed" and n != 0):
                anomalies.append(f"create table {name} ({outcome}) present {n} times")
        checked["creates"] = len(record.creates)

        # The bank total, and each MV against its recomputation, at sampled times.
        span = list(range(record.start_time, now + 1))
        times = sorted(
            set(rng.sample(span, min(config.sampled_times, len(span))))
            | set(
                rng.sample(
                    record.transfer_times, min(config.sampled_times, len(record.transfer_times))
                )
            )
        )
        for t in times:
            total, _ = await _retrying(
                lambda t=t: _rows(client, f"SELECT sum(balance), count(*) FROM accounts AS OF {t}")
            )
            if [tuple(r) for r in total] != [(TOTAL, ACCOUNTS)]:
                anomalies.append(f"bank total at {t}: {total}")
            checked["bank_total_times"] += 1
        for view, query in VIEWS.items():
            for t in times[:: max(1, len(times) // config.sampled_times)]:
                try:
                    ours, _ = await _rows(client, f"{view} AS OF {t}")
                except AssertionError as exc:
                    anomalies.append(f"view unreadable at {t}: {exc}")
                    continue
                theirs, _ = await _retrying(lambda t=t, q=query: _rows(client, f"{q} AS OF {t}"))
                if Counter(map(tuple, ours)) != Counter(map(tuple, theirs)):
                    anomalies.append(f"{view} AS OF {t}: {sorted(ours)} != {sorted(theirs)}")
                checked["view_times"] += 1

        # Each SUBSCRIBE segment, replayed to t, equals events AS OF t.
        for segment in record.segments:
            if segment.upper is None or segment.upper <= segment.as_of:
                continue
            for t in {
                segment.as_of,
                segment.upper - 1,
                rng.randrange(segment.as_of, segment.upper),
            }:
                rows_at, _ = await _retrying(
                    lambda t=t: _rows(client, f"SELECT * FROM events AS OF {t}")
                )
                expected = Counter(map(tuple, rows_at))
                replayed = _replay(segment.changes, t)
                if replayed != expected:
                    missing = expected - replayed
                    extra = replayed - expected
                    anomalies.append(
                        f"SUBSCRIBE from {segment.as_of} at {t}: missing {sorted(missing)[:5]}, "
                        f"extra {sorted(extra)[:5]}"
                    )
                checked["subscribe_times"] += 1
            checked["subscribe_segments"] += 1

        # The final lists must contain what every acknowledged append wrote, in history order.
        lists, _ = await _retrying(lambda: _rows(client, "SELECT k, v FROM lists"))
        final = [Transaction(0, tuple(Read(int(k), _parse_list(str(v))) for k, v in lists), "ok")]
    elle = elle_check([*record.history, *final], realtime=True)
    for anomaly in elle.anomalies:
        anomalies.append(f"{anomaly.kind}: {anomaly.explanation}")
    checked["list_append_transactions"] = elle.transactions
    checked["dependency_edges"] = elle.edges
    return {"anomalies": anomalies, "checked": dict(checked)}


def report(
    config: Config, record: Record, findings: dict[str, Any], seconds: float
) -> dict[str, Any]:
    return {
        "config": {
            "seconds": config.seconds,
            "fault_interval": config.fault_interval,
            "faults": list(config.faults),
        },
        "wall_seconds": round(seconds, 1),
        "faults_injected": dict(record.faults),
        "operations": {kind: dict(c) for kind, c in record.ops.items()},
        "checked": findings["checked"],
        "anomaly_kinds": dict(
            Counter(a.split(" at ")[0].split(":")[0] for a in findings["anomalies"])
        ),
        "anomalies": findings["anomalies"],
        "client_errors": dict(record.errors.most_common(15)),
        "fault_log": record.fault_log,
    }
