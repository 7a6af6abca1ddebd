"""The anomalies of seed 004 (platform v2) cannot happen across two adapter processes.

Two clients with a side channel (this test) run, each waiting for the previous step's
acknowledgement: c1 ``CREATE TABLE foo``; c2 ``INSERT INTO foo``; c1 ``SELECT * FROM foo``.
With stateless adapters the anomalies would be: the INSERT saying foo does not exist, the
SELECT saying foo does not exist, or the SELECT missing the inserted values. Each round picks
the adapters of the three steps at random, and several chains of rounds run at once so that
catalog appends race (and retry) while they go on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient, StatementResult

pytestmark = pytest.mark.spark

CHAINS = 3
ROUNDS_PER_CHAIN = 15


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("anomalies"), adapters=2) as running:
        yield running


async def step(client: AdapterClient, sql: str, what: str) -> StatementResult:
    result = await client.execute(sql)
    assert result.error is None, f"anomaly or failure in {what} ({sql!r}): {result.error}"
    return result.results[-1]


async def chain(stack: SqlStack, number: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    log: list[str] = []
    clients = [AdapterClient(stack.adapter(0)), AdapterClient(stack.adapter(1))]
    try:
        for round_ in range(ROUNDS_PER_CHAIN):
            name = f"foo_{number}_{round_}"
            creator, inserter, selector = (rng.randrange(2) for _ in range(3))
            indexed = round_ % 5 == 4
            log.append(f"{name}: create@{creator} insert@{inserter} select@{selector}")
            await step(clients[creator], f"CREATE TABLE {name} (x bigint, c text)", "CREATE")
            if indexed:
                await step(clients[creator], f"CREATE INDEX ON {name} (x)", "CREATE INDEX")
            inserted = await step(
                clients[inserter],
                f"INSERT INTO {name} VALUES ({round_}, 'c{number}'), ({round_ + 1}, NULL)",
                "INSERT (anomaly 1: foo does not exist)",
            )
            selected = await step(
                clients[selector],
                f"SELECT x, c FROM {name}",
                "SELECT (anomaly 2: foo does not exist)",
            )
            assert sorted(selected.rows, key=repr) == sorted(
                [(round_, f"c{number}"), (round_ + 1, None)], key=repr
            ), f"anomaly 3: the SELECT missed the insert: {log[-1]}, got {selected.rows}"
            assert selected.timestamp >= inserted.timestamp
            # A write acknowledged on one adapter is visible to the next read on the other.
            other = clients[1 - selector]
            more = await step(other, f"INSERT INTO {name} VALUES (-1, 'late')", "INSERT")
            counted = await step(clients[selector], f"SELECT count(*) FROM {name}", "SELECT")
            assert counted.rows == [(3,)], f"a read missed an acknowledged write: {log[-1]}"
            assert counted.timestamp >= more.timestamp
            if indexed:
                await step(clients[rng.randrange(2)], f"DROP TABLE {name} CASCADE", "DROP")
    finally:
        for client in clients:
            await client.close()
    return log


async def test_no_anomalies_across_two_adapters(stack: SqlStack) -> None:
    logs = await asyncio.gather(*(chain(stack, n, 1000 + n) for n in range(CHAINS)))
    assert sum(len(log) for log in logs) == CHAINS * ROUNDS_PER_CHAIN
    # Every table that was not dropped is there, with its contents, on both adapters.
    async with AdapterClient(stack.adapter(0)) as a, AdapterClient(stack.adapter(1)) as b:
        tables_a = (await a.execute("SHOW TABLES")).results[0].rows
        tables_b = (await b.execute("SHOW TABLES")).results[0].rows
        assert sorted(tables_a) == sorted(tables_b)
        kept = CHAINS * (ROUNDS_PER_CHAIN - ROUNDS_PER_CHAIN // 5)
        assert len(tables_a) == kept
