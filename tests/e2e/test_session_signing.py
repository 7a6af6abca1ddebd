"""Tamper-proof sessions through the public gRPC API: two adapters sharing a keys file take each
other's sessions; a transaction whose read set was stripped, or whose buffered rows were edited,
is refused at COMMIT with nothing written; a session signed for one user, or with a key an
adapter does not hold, is refused; keys rotate (services/adapter/session_signing.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from services.adapter.transactions import Transaction
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.clients.adapter import AdapterClient, StatementResult
from tidemark.errors import InvalidArgument
from tidemark.session_keys import key_line, new_key, read_keys
from tidemark.v1 import adapter_pb2, adapter_pb2_grpc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("signing"), adapters=2, engine="local") as running:
        yield running


@pytest.fixture
async def a(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(0)) as client:
        yield client


@pytest.fixture
async def b(stack: SqlStack) -> AsyncIterator[AdapterClient]:
    async with AdapterClient(stack.adapter(1)) as client:
        yield client


async def ok(client: AdapterClient, sql: str) -> StatementResult:
    result = await client.execute(sql)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]


async def values(client: AdapterClient, sql: str) -> list[tuple[object, ...]]:
    return list((await ok(client, sql)).rows)


def edited(session: adapter_pb2.Session, transaction: Transaction) -> adapter_pb2.Session:
    """``session`` with its transaction replaced, the signature left as it was."""
    copy = adapter_pb2.Session()
    copy.CopyFrom(session)
    copy.transaction = transaction.encode()
    return copy


async def test_a_session_moves_between_adapters_sharing_the_keys_file(
    a: AdapterClient, stack: SqlStack
) -> None:
    await ok(a, "CREATE TABLE moved (x bigint)")
    await ok(a, "SET statement_timeout = 60000; BEGIN; INSERT INTO moved VALUES (7)")
    assert a.session.signature.startswith(b"local:")
    async with AdapterClient(stack.adapter(1)) as elsewhere:
        elsewhere.session = a.session
        assert (await ok(elsewhere, "SHOW statement_timeout")).rows == [("60000",)]
        assert (await ok(elsewhere, "COMMIT")).tag == "COMMIT"
        assert await values(elsewhere, "SELECT x FROM moved") == [(7,)]


async def test_stripping_the_read_set_does_not_make_a_blind_write(
    a: AdapterClient, b: AdapterClient
) -> None:
    await ok(a, "CREATE TABLE rw (id bigint, v bigint); INSERT INTO rw VALUES (1, 10)")
    await ok(a, "BEGIN; SELECT v FROM rw WHERE id = 1; UPDATE rw SET v = 11 WHERE id = 1")
    signed = a.session
    transaction = Transaction.decode(signed.transaction)
    assert transaction.has_reads and transaction.reads
    await ok(b, "UPDATE rw SET v = 20 WHERE id = 1")  # what a read has changed since

    transaction.read_ts, transaction.reads = None, set()  # a blind write would now commit
    a.session = edited(signed, transaction)
    with pytest.raises(InvalidArgument, match="session signature invalid"):
        await a.execute("COMMIT")
    assert await values(b, "SELECT id, v FROM rw") == [(1, 20)]
    # The session as signed still fails the way it should: its read is stale.
    a.session = signed
    failure = (await a.execute("COMMIT")).error
    assert failure is not None and failure.code == "40001"
    assert await values(b, "SELECT id, v FROM rw") == [(1, 20)]


async def test_editing_the_buffered_rows_is_refused(a: AdapterClient, b: AdapterClient) -> None:
    await ok(a, "CREATE TABLE bufd (x bigint); BEGIN; INSERT INTO bufd VALUES (1)")
    signed = a.session
    transaction = Transaction.decode(signed.transaction)
    assert transaction.write is not None
    transaction.write.rows = [((1_000_000,), 1)]
    a.session = edited(signed, transaction)
    with pytest.raises(InvalidArgument, match="session signature invalid"):
        await a.execute("COMMIT")
    assert await values(b, "SELECT count(*) FROM bufd") == [(0,)]
    # Forged from scratch, without a signature, it is refused too.
    a.session = adapter_pb2.Session(transaction=transaction.encode())
    with pytest.raises(InvalidArgument, match="session signature invalid"):
        await a.execute("COMMIT")
    assert await values(b, "SELECT count(*) FROM bufd") == [(0,)]
    a.session = signed
    assert (await ok(a, "COMMIT")).tag == "COMMIT"
    assert await values(b, "SELECT x FROM bufd") == [(1,)]


async def test_every_call_taking_a_session_checks_it(stack: SqlStack) -> None:
    forged = adapter_pb2.Session(settings={"cluster": "default"}, signature=b"local:" + bytes(32))
    async with AdapterClient(stack.adapter(0)) as client:
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            await client.execute("SELECT 1", forged)
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            await client.copy_in("COPY t FROM STDIN", [b"1\n"], forged)
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            async for _ in client.copy_out("COPY (SELECT 1) TO STDOUT", forged):
                pass
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            async for _ in client.subscribe("SELECT 1", forged):
                pass
        # A new session (empty) needs no signature, and what comes back is signed.
        result = await client.execute("SET search_path = public", adapter_pb2.Session())
        assert result.error is None and client.session.signature.startswith(b"local:")


async def test_a_session_is_bound_to_its_user(stack: SqlStack) -> None:
    async with AdapterClient(stack.adapter(0)) as superuser:
        for role in ("alice", "bob"):
            created = await superuser.execute(f"CREATE ROLE {role} LOGIN")
            assert created.error is None, created.error
    async with grpc.aio.insecure_channel(stack.adapter(0)) as channel:
        stub = adapter_pb2_grpc.AdapterStub(channel)

        async def execute(session: adapter_pb2.Session, user: str) -> adapter_pb2.Session:
            request = adapter_pb2.ExecuteRequest(session=session, sql="SET search_path = s1")
            response = await stub.Execute(request, metadata=(("tidemark-user", user),))
            return response.session

        alices = await execute(adapter_pb2.Session(), "alice")
        assert dict(alices.settings) == {"search_path": "s1"}
        assert await execute(alices, "alice") == alices
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await execute(alices, "bob")
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "session signature invalid"


async def test_keys_rotate_across_adapters(
    a: AdapterClient, stack: SqlStack, tmp_path: Path
) -> None:
    """An adapter whose file lists a new key first and the shared one second takes the old
    sessions and signs with the new key; one holding only the new key refuses the old ones;
    the old adapters refuse what the new key signed, until they get it too."""
    shared = read_keys(stack.session_keys_file or Path())
    new = new_key("next")
    rotating = tmp_path / "rotating"
    rotating.write_text(f"{key_line(new)}\n{key_line(shared[0])}\n")
    only_new = tmp_path / "only-new"
    only_new.write_text(key_line(new) + "\n")
    rotated = stack.start_adapter("--session-keys-file", str(rotating))
    retired = stack.start_adapter("--session-keys-file", str(only_new))
    try:
        await ok(a, "SET search_path = rotation")
        old_session = a.session
        async with AdapterClient(rotated.address) as client:
            client.session = old_session
            assert (await ok(client, "SHOW search_path")).rows == [("rotation",)]
            assert client.session.signature.startswith(b"next:")
            new_session = client.session
        async with AdapterClient(retired.address) as client:
            with pytest.raises(InvalidArgument, match="session signature invalid"):
                await client.execute("SHOW search_path", old_session)
            assert (await ok_with(client, "SHOW search_path", new_session)).rows == [("rotation",)]
        with pytest.raises(InvalidArgument, match="session signature invalid"):
            await a.execute("SHOW search_path", new_session)
    finally:
        for process in (rotated, retired):
            stack.adapters.remove(process)
            process.kill()


async def ok_with(client: AdapterClient, sql: str, session: adapter_pb2.Session) -> StatementResult:
    result = await client.execute(sql, session)
    assert result.error is None, f"{sql!r} failed: {result.error}"
    return result.results[-1]
