"""A bank: concurrent transfers through read-then-write transactions on two adapter processes.

Each transfer reads both balances, and if the payer can afford it, moves money with one UPDATE,
then commits; a serialization failure (40001) is retried by the client, as a client should.
The total never changes, which is checked at every timestamp we can name: by SELECT ... AS OF
at every commit (and just before it), by a materialized view, by plain reads on both adapters
while the transfers run, and by a SUBSCRIBE that sees every change. No transfer is lost: the
final balances are what the committed transfers add up to.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.sql_results import ok
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import (
    AdapterClient,
    Changes,
    Progress,
    SubscribeError,
    SubscribeHeader,
)

pytestmark = pytest.mark.spark

ACCOUNTS = 8
START_BALANCE = 100
TOTAL = ACCOUNTS * START_BALANCE
WORKERS_PER_ADAPTER = 2
TRANSFERS_PER_WORKER = 8
MAX_ATTEMPTS = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("bank"), adapters=2) as running:
        yield running


@dataclass(frozen=True)
class Transfer:
    payer: int
    payee: int
    amount: int
    timestamp: int


async def transfer(client: AdapterClient, rng: random.Random, retries: Counter[str]) -> Transfer:
    """One transfer, retried until it commits (or is skipped for want of money)."""
    payer, payee = rng.sample(range(ACCOUNTS), 2)
    amount = rng.randrange(1, 60)
    for _ in range(MAX_ATTEMPTS):
        read = await client.execute(
            f"BEGIN; SELECT id, balance FROM accounts WHERE id = {payer} OR id = {payee}"
        )
        assert read.error is None, read.error
        balances = dict(read.results[-1].rows)
        assert len(balances) == 2
        if balances[payer] < amount:
            await ok(client, "COMMIT")
            return Transfer(payer, payee, 0, 0)
        written = await client.execute(
            f"UPDATE accounts SET balance = balance + CASE WHEN id = {payer} THEN {-amount} "
            f"ELSE {amount} END WHERE id = {payer} OR id = {payee}; COMMIT"
        )
        if written.error is None:
            assert written.results[0].tag == "UPDATE 2"
            return Transfer(payer, payee, amount, written.results[-1].timestamp)
        assert written.error.code == "40001", written.error
        retries[written.error.code] += 1
        if client.session.transaction:
            await ok(client, "ROLLBACK")
    raise AssertionError(f"a transfer did not commit in {MAX_ATTEMPTS} attempts")


async def worker(address: str, seed: int, retries: Counter[str]) -> list[Transfer]:
    rng = random.Random(seed)
    async with AdapterClient(address) as client:
        return [await transfer(client, rng, retries) for _ in range(TRANSFERS_PER_WORKER)]


async def watch_totals(address: str, stop: asyncio.Event) -> int:
    """Reads the total until told to stop; the number of reads."""
    reads = 0
    async with AdapterClient(address) as client:
        while not stop.is_set():
            result = await ok(client, "SELECT sum(balance), count(*) FROM accounts")
            assert result.rows == [(TOTAL, ACCOUNTS)], result
            reads += 1
    return reads


async def test_concurrent_transfers_keep_the_total(stack: SqlStack) -> None:
    async with AdapterClient(stack.adapter(0)) as a, AdapterClient(stack.adapter(1)) as b:
        await ok(a, "CREATE TABLE accounts (id bigint NOT NULL, balance bigint NOT NULL)")
        values = ", ".join(f"({i}, {START_BALANCE})" for i in range(ACCOUNTS))
        opened = await ok(a, f"INSERT INTO accounts VALUES {values}")
        await ok(
            b, "CREATE MATERIALIZED VIEW bank_total AS SELECT sum(balance) AS total FROM accounts"
        )
        start = opened.timestamp

        # Every change from the opening on, on the other adapter.
        changes: list[tuple[int, int, tuple[object, ...]]] = []
        progress: list[int] = []
        subscribed = asyncio.Event()
        progressed = asyncio.Event()

        async def subscribe() -> None:
            async for event in b.subscribe(f"SUBSCRIBE accounts AS OF {start}"):
                assert not isinstance(event, SubscribeError), event
                if isinstance(event, SubscribeHeader):
                    assert event.as_of == start
                    subscribed.set()
                elif isinstance(event, Changes):
                    changes.extend((c.timestamp, c.diff, c.row) for c in event.changes)
                elif isinstance(event, Progress) and event.upper is not None:
                    progress.append(event.upper)
                    progressed.set()

        subscription = asyncio.create_task(subscribe())
        await asyncio.wait_for(subscribed.wait(), 120)

        retries: Counter[str] = Counter()
        stop = asyncio.Event()
        watchers = [asyncio.create_task(watch_totals(stack.adapter(i), stop)) for i in range(2)]
        workers = [
            worker(stack.adapter(i % 2), 7000 + i, retries) for i in range(2 * WORKERS_PER_ADAPTER)
        ]
        done = [t for batch in await asyncio.gather(*workers) for t in batch]
        stop.set()
        reads = await asyncio.gather(*watchers)
        assert all(n > 0 for n in reads)
        committed = [t for t in done if t.amount]
        assert committed, "no transfer committed"

        # Nothing lost, nothing doubled.
        expected = {i: START_BALANCE for i in range(ACCOUNTS)}
        for t in committed:
            expected[t.payer] -= t.amount
            expected[t.payee] += t.amount
        final = await ok(a, "SELECT id, balance FROM accounts")
        assert dict(final.rows) == expected
        assert len({t.timestamp for t in committed}) == len(committed)

        # The total at every commit and just before it, on both adapters, and in the view.
        times = sorted(
            {start} | {t.timestamp for t in committed} | {t.timestamp - 1 for t in committed}
        )
        for index, time in enumerate(times):
            client = (a, b)[index % 2]
            total = await ok(client, f"SELECT sum(balance) FROM accounts AS OF {time}")
            assert total.rows == [(TOTAL,)], time
        for time in times[:: max(1, len(times) // 10)]:
            view = await ok(a, f"SELECT total FROM bank_total AS OF {time}")
            assert view.rows == [(TOTAL,)], time

        # The subscription saw every change: the total is right at each of its times, and its
        # contents end as the table does.
        last = max(t.timestamp for t in committed)
        async with asyncio.timeout(120):
            while not progress or progress[-1] <= last:
                progressed.clear()
                await progressed.wait()
        subscription.cancel()
        contents: Counter[tuple[object, ...]] = Counter()
        by_time: dict[int, list[tuple[int, tuple[object, ...]]]] = {}
        for time, diff, row in changes:
            by_time.setdefault(time, []).append((diff, row))
        for time in sorted(by_time):
            for diff, row in by_time[time]:
                contents[row] += diff
            assert sum(row[1] * n for row, n in contents.items()) == TOTAL, time  # type: ignore[operator]
        assert {row: n for row, n in contents.items() if n} == {
            (i, balance): 1 for i, balance in expected.items()
        }
        assert {t.timestamp for t in committed} <= set(by_time)
        print(
            f"bank: {len(committed)} transfers committed, {retries['40001']} serialization "
            f"failures retried, {sum(reads)} concurrent total reads"
        )
