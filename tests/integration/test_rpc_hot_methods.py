"""Access-log levels of hot services, and the built-in interceptor chain, on an in-process server
over a real socket: successful calls of a hot service log at debug, failures at info, other
services at info; request ids, error mapping and extra interceptors keep working on every call."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import grpc
import grpc.aio
import pytest

from tests.support.echo_service import EchoServicer, echo_service
from tidemark.logging import configure_logging
from tidemark.rpc import REQUEST_ID_KEY, Server, Service, open_channel
from tidemark.rpc.interceptor import CallInterceptor, Context
from tidemark.v1 import testing_pb2, testing_pb2_grpc

ECHO_METHOD = "/tidemark.v1.Echo/Echo"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("json", "debug", stream=out)
    yield out
    configure_logging("json", "info", stream=io.StringIO())


def access_records(out: io.StringIO, request_id: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    return [r for r in records if r.get("event") == "rpc" and r.get("request_id") == request_id]


class CountingInterceptor(CallInterceptor):
    """An extra interceptor: records the method of every call it sees."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def around_call(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AbstractAsyncContextManager[None]:
        self.seen.append(details.method)
        return _nothing()


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


def hot_echo() -> Service[EchoServicer]:
    plain = echo_service(EchoServicer())
    return Service(plain.descriptor, plain.servicer, plain.add_to_server, hot=True)


async def echo(
    address: str, request: testing_pb2.EchoRequest
) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    request_id = f"test-{uuid.uuid4().hex[:12]}"
    async with open_channel(address) as channel:
        call = testing_pb2_grpc.EchoStub(channel).Echo(
            request, timeout=10, metadata=((REQUEST_ID_KEY, request_id),)
        )
        try:
            await call
        except grpc.aio.AioRpcError:
            pass
        trailing = {key: str(value) for key, value in (await call.trailing_metadata() or ())}
        return await call.code(), request_id, trailing


async def test_a_hot_service_logs_successes_at_debug_and_failures_at_info(
    log_lines: io.StringIO,
) -> None:
    async with Server([hot_echo()], "127.0.0.1:0") as server:
        address = f"127.0.0.1:{server.port}"
        ok, ok_id, ok_trailing = await echo(address, testing_pb2.EchoRequest(text="hi"))
        failed, failed_id, _ = await echo(
            address, testing_pb2.EchoRequest(text="no", raise_error="NotFound")
        )
        crashed, crashed_id, _ = await echo(
            address, testing_pb2.EchoRequest(text="boom", raise_error="ValueError")
        )

    assert (ok, failed, crashed) == (
        grpc.StatusCode.OK,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INTERNAL,
    )
    assert ok_trailing[REQUEST_ID_KEY] == ok_id
    [success] = access_records(log_lines, ok_id)
    assert (success["method"], success["status"], success["level"]) == (ECHO_METHOD, "OK", "debug")
    [failure] = access_records(log_lines, failed_id)
    assert (failure["status"], failure["level"]) == ("NOT_FOUND", "info")
    [fault] = access_records(log_lines, crashed_id)
    assert (fault["status"], fault["level"]) == ("INTERNAL", "error")


async def test_a_service_not_marked_hot_logs_successes_at_info(log_lines: io.StringIO) -> None:
    async with Server([echo_service(EchoServicer())], "127.0.0.1:0") as server:
        code, request_id, _ = await echo(
            f"127.0.0.1:{server.port}", testing_pb2.EchoRequest(text="hi")
        )
    assert code == grpc.StatusCode.OK
    [record] = access_records(log_lines, request_id)
    assert (record["status"], record["level"]) == ("OK", "info")


async def test_every_call_is_logged_and_mapped_not_only_the_first_of_its_method(
    log_lines: io.StringIO,
) -> None:
    # The chain reuses each method's wrapped handler: the second call must still get its own
    # request id, log line and status.
    async with Server([echo_service(EchoServicer())], "127.0.0.1:0") as server:
        address = f"127.0.0.1:{server.port}"
        results = [
            await echo(address, testing_pb2.EchoRequest(text="a")),
            await echo(address, testing_pb2.EchoRequest(text="b", raise_error="Aborted")),
            await echo(address, testing_pb2.EchoRequest(text="c")),
        ]
    assert [code for code, _, _ in results] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OK,
    ]
    for code, request_id, trailing in results:
        assert trailing[REQUEST_ID_KEY] == request_id
        [record] = access_records(log_lines, request_id)
        assert record["status"] == code.name


async def test_extra_interceptors_see_every_call(log_lines: io.StringIO) -> None:
    counting = CountingInterceptor()
    async with Server(
        [echo_service(EchoServicer())], "127.0.0.1:0", interceptors=[counting]
    ) as server:
        address = f"127.0.0.1:{server.port}"
        for text in ("a", "b", "c"):
            code, request_id, _ = await echo(address, testing_pb2.EchoRequest(text=text))
            assert code == grpc.StatusCode.OK
            assert len(access_records(log_lines, request_id)) == 1
    assert counting.seen == [ECHO_METHOD] * 3
