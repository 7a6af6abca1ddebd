"""The RPC plumbing, exercised over a real TCP socket against the echo service running as a
separate process (tests/support/echo_service.py): health, reflection, error mapping, access
logs, client retries and deadlines, configuration, graceful shutdown."""

from __future__ import annotations

import asyncio
import inspect
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import grpc.aio
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.ports import free_port
from tests.support.service_process import REPO_ROOT, EchoProcess, LogRecord
from tidemark import errors
from tidemark.retry import RetryPolicy
from tidemark.rpc import NO_RETRY, REQUEST_ID_KEY, call, open_channel, stream
from tidemark.v1 import testing_pb2, testing_pb2_grpc

ECHO = "tidemark.v1.Echo"
ECHO_METHOD = "/tidemark.v1.Echo/Echo"

# Every concrete Tidemark error class: each must reach the client with its own code.
TIDEMARK_ERRORS = sorted(
    (
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.TidemarkError) and cls is not errors.TidemarkError
    ),
    key=lambda cls: cls.__name__,
)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoProcess]:
    process = EchoProcess(["--listen", "127.0.0.1:0", "--shutdown-grace", "2"])
    yield process
    process.signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    finally:
        process.kill()


@pytest.fixture
async def channel(echo: EchoProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with open_channel(echo.address) as opened:
        yield opened


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> testing_pb2_grpc.EchoAsyncStub:
    return testing_pb2_grpc.EchoStub(channel)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def rpc_record(request_id: str) -> LogRecordMatcher:
    return LogRecordMatcher(event="rpc", request_id=request_id)


class LogRecordMatcher:
    """Accepts log records having all the given fields."""

    def __init__(self, **fields: object) -> None:
        self.fields = fields

    def __call__(self, record: LogRecord) -> bool:
        return all(record.get(key) == value for key, value in self.fields.items())


# --- health and reflection ---------------------------------------------------------------


async def test_health_reports_serving_for_the_server_and_each_service(
    channel: grpc.aio.Channel,
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", ECHO):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def _reflect(
    channel: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = [reply async for reply in reflection.ServerReflectionInfo(iter([request]))]
    assert len(replies) == 1
    return replies[0]


async def test_reflection_lists_and_describes_the_echo_service(
    channel: grpc.aio.Channel,
) -> None:
    listed = await _reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {service.name for service in listed.list_services_response.service}
    assert {ECHO, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names

    described = await _reflect(
        channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=ECHO)
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    services = {
        f"{file.package}.{service.name}": [method.name for method in service.method]
        for file in files
        for service in file.service
    }
    assert services[ECHO] == ["Echo", "Count"]


# --- error mapping -----------------------------------------------------------------------


@pytest.mark.parametrize("error_class", TIDEMARK_ERRORS, ids=lambda cls: cls.__name__)
async def test_each_tidemark_error_reaches_the_client_with_its_code_and_message(
    stub: testing_pb2_grpc.EchoAsyncStub, error_class: type[errors.TidemarkError]
) -> None:
    message = f"{error_class.__name__} happened: upper is [17]"
    request = testing_pb2.EchoRequest(text=message, raise_error=error_class.__name__)

    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.Echo(request, timeout=5)
    assert raw.value.code() == error_class.code
    assert raw.value.details() == message

    # Through the client helper, the same failure comes back as a Tidemark exception. The
    # client cannot know a subclass that shares its code (ValueTooLarge is an InvalidArgument)
    # except Indeterminate, which travels with its own marker.
    expected = (
        errors.Indeterminate
        if error_class is errors.Indeterminate
        else type(errors.error_for_status(error_class.code, ""))
    )
    with pytest.raises(errors.TidemarkError) as mapped:
        await call(stub.Echo, request, retry=NO_RETRY)
    assert type(mapped.value) is expected
    assert mapped.value.message == message


async def test_an_unexpected_exception_is_internal_and_keeps_its_traceback_on_the_server(
    stub: testing_pb2_grpc.EchoAsyncStub, echo: EchoProcess
) -> None:
    request_id = unique("crash")
    secret = "connection string postgres://admin:hunter2@db"
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.Echo(
            testing_pb2.EchoRequest(text=secret, raise_error="ValueError"),
            timeout=5,
            metadata=((REQUEST_ID_KEY, request_id),),
        )
    assert raw.value.code() == grpc.StatusCode.INTERNAL
    details = raw.value.details()
    assert request_id in details
    for leak in ("Traceback", "ValueError", "hunter2", ".py"):
        assert leak not in details

    logged = echo.wait_for_record(LogRecordMatcher(event="unhandled_error", request_id=request_id))
    assert "Traceback" in logged["exception"]
    assert f"ValueError: {secret}" in logged["exception"]
    access = echo.wait_for_record(rpc_record(request_id))
    assert (access["status"], access["level"]) == ("INTERNAL", "error")


async def test_a_handler_calling_abort_keeps_its_own_status(
    stub: testing_pb2_grpc.EchoAsyncStub,
) -> None:
    request = testing_pb2.EchoRequest(text="slow down", abort_code="RESOURCE_EXHAUSTED")
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.Echo(request, timeout=5)
    assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raw.value.details() == "slow down"


async def test_bytes_that_do_not_parse_are_invalid_argument_not_unknown(
    channel: grpc.aio.Channel,
) -> None:
    for method in (
        channel.unary_unary(ECHO_METHOD),
        channel.unary_stream("/tidemark.v1.Echo/Count"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            reply = method(b"\x00", timeout=5)
            if hasattr(reply, "__aiter__"):
                async for _ in reply:
                    pass
            else:
                await reply
        assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request" in (raw.value.details() or "")


async def test_not_implemented_and_unknown_methods_are_unimplemented(
    stub: testing_pb2_grpc.EchoAsyncStub, channel: grpc.aio.Channel, echo: EchoProcess
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await stub.Echo(testing_pb2.EchoRequest(raise_error="NotImplementedError"), timeout=5)
    assert raw.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert raw.value.details() == f"{ECHO_METHOD} is not implemented"

    request_id = unique("nope")
    missing = channel.unary_unary(
        "/tidemark.v1.Echo/NoSuchMethod",
        request_serializer=testing_pb2.EchoRequest.SerializeToString,
        response_deserializer=testing_pb2.EchoReply.FromString,
    )
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        await missing(
            testing_pb2.EchoRequest(), timeout=5, metadata=((REQUEST_ID_KEY, request_id),)
        )
    assert raw.value.code() == grpc.StatusCode.UNIMPLEMENTED
    logged = echo.wait_for_record(rpc_record(request_id))
    assert (logged["method"], logged["status"]) == (
        "/tidemark.v1.Echo/NoSuchMethod",
        "UNIMPLEMENTED",
    )


async def test_a_stream_delivers_its_items_and_then_its_mapped_error(
    stub: testing_pb2_grpc.EchoAsyncStub,
) -> None:
    values = [reply.value async for reply in stream(stub.Count, testing_pb2.CountRequest(n=5))]
    assert values == [0, 1, 2, 3, 4]

    received = []
    failing = testing_pb2.CountRequest(n=5, fail_after=2, raise_error="FailedPrecondition")
    with pytest.raises(errors.FailedPrecondition) as caught:
        async for reply in stream(stub.Count, failing, timeout=5):
            received.append(reply.value)
    assert received == [0, 1]
    assert caught.value.message == "failed after 2 items"


# --- access log and request ids ----------------------------------------------------------


async def test_each_call_is_logged_with_method_status_duration_and_the_callers_request_id(
    stub: testing_pb2_grpc.EchoAsyncStub, echo: EchoProcess
) -> None:
    request_id = unique("client-id")
    reply = await call(stub.Echo, testing_pb2.EchoRequest(text="hello"), request_id=request_id)
    assert reply.text == "hello"
    assert reply.request_id == request_id  # the handler's logging context carries it

    logged = echo.wait_for_record(rpc_record(request_id))
    assert logged["method"] == ECHO_METHOD
    assert logged["status"] == "OK"
    assert logged["level"] == "info"
    assert isinstance(logged["duration_ms"], float) and logged["duration_ms"] >= 0
    assert logged["timestamp"].endswith("Z")

    failing_id = unique("client-id")
    with pytest.raises(errors.NotFound):
        await call(
            stub.Echo,
            testing_pb2.EchoRequest(text="gone", raise_error="NotFound"),
            request_id=failing_id,
        )
    assert echo.wait_for_record(rpc_record(failing_id))["status"] == "NOT_FOUND"


async def test_the_server_makes_up_a_request_id_when_none_is_sent_and_returns_it(
    stub: testing_pb2_grpc.EchoAsyncStub, echo: EchoProcess
) -> None:
    pending = stub.Echo(testing_pb2.EchoRequest(text="anonymous"), timeout=5)
    reply = await pending
    trailing = dict(await pending.trailing_metadata())
    request_id = trailing[REQUEST_ID_KEY]
    assert len(request_id) >= 16
    assert reply.request_id == request_id
    assert echo.wait_for_record(rpc_record(request_id))["status"] == "OK"


async def test_a_malformed_request_id_is_replaced_not_logged(
    stub: testing_pb2_grpc.EchoAsyncStub,
) -> None:
    forged = 'x" level=error fake="1'
    pending = stub.Echo(
        testing_pb2.EchoRequest(text="hi"), timeout=5, metadata=((REQUEST_ID_KEY, forged),)
    )
    reply = await pending
    assert reply.request_id not in ("", forged)
    assert dict(await pending.trailing_metadata())[REQUEST_ID_KEY] == reply.request_id


# --- client retries and deadlines --------------------------------------------------------


async def test_the_client_retries_unavailable_until_the_call_succeeds(
    stub: testing_pb2_grpc.EchoAsyncStub,
) -> None:
    request = testing_pb2.EchoRequest(text="eventually", key=unique("flaky"), unavailable_times=3)
    reply = await call(stub.Echo, request, timeout=20)
    assert reply.text == "eventually"
    assert reply.attempt == 4


@pytest.mark.parametrize("error_name", ["Aborted", "Indeterminate", "FailedPrecondition"])
async def test_the_client_does_not_retry_other_failures(
    stub: testing_pb2_grpc.EchoAsyncStub, error_name: str
) -> None:
    key = unique("once")
    with pytest.raises(errors.TidemarkError) as caught:
        await call(stub.Echo, testing_pb2.EchoRequest(text="no", key=key, raise_error=error_name))
    assert type(caught.value).__name__ == error_name
    # The server saw exactly one call with this key before this one.
    follow_up = await call(stub.Echo, testing_pb2.EchoRequest(text="count", key=key))
    assert follow_up.attempt == 2


async def test_the_client_gives_up_on_unavailable_when_its_retry_budget_is_spent(
    stub: testing_pb2_grpc.EchoAsyncStub,
) -> None:
    request = testing_pb2.EchoRequest(key=unique("down"), unavailable_times=1_000_000)
    budget = RetryPolicy(total_seconds=0.3, initial_backoff=0.01, max_backoff=0.05)
    with pytest.raises(errors.Unavailable) as caught:
        await call(stub.Echo, request, timeout=10, retry=budget)
    assert type(caught.value) is errors.Unavailable
    assert "refused" in caught.value.message and "attempts)" in caught.value.message


async def test_a_call_past_its_deadline_fails_with_deadline_exceeded(
    stub: testing_pb2_grpc.EchoAsyncStub, echo: EchoProcess
) -> None:
    request_id = unique("late")
    with pytest.raises(errors.DeadlineExceeded):
        await call(
            stub.Echo,
            testing_pb2.EchoRequest(text="zzz", sleep_ms=5_000),
            timeout=0.3,
            request_id=request_id,
        )
    # The server gave up on the call too, instead of finishing it for nobody.
    logged = echo.wait_for_record(rpc_record(request_id))
    assert logged["status"] in ("DEADLINE_EXCEEDED", "CANCELLED")


# --- processes: configuration, late start, graceful shutdown -----------------------------


async def test_a_call_to_a_server_that_is_not_up_yet_is_retried_until_it_is() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    async with open_channel(address) as channel:
        stub = testing_pb2_grpc.EchoStub(channel)
        with pytest.raises(errors.Unavailable):
            await call(stub.Echo, testing_pb2.EchoRequest(text="nobody"), retry=NO_RETRY)

        patient = RetryPolicy(total_seconds=30, initial_backoff=0.05, max_backoff=0.5)
        pending = asyncio.ensure_future(
            call(stub.Echo, testing_pb2.EchoRequest(text="late"), timeout=30, retry=patient)
        )
        await asyncio.sleep(0.2)
        assert not pending.done()  # still retrying: nothing listens yet

        # Configured through the environment alone, as in a container.
        late = await asyncio.to_thread(
            EchoProcess, (), {"TIDEMARK_LISTEN": address, "TIDEMARK_REPLY_PREFIX": "env:"}
        )
        try:
            assert late.port == port
            reply = await pending
            assert reply.text == "env:late"
        finally:
            late.signal(signal.SIGTERM)
            assert late.wait() == 0
            late.kill()


async def test_a_server_killed_with_a_call_in_flight_is_indeterminate_and_not_retried() -> None:
    """The request reached the server, which may have acted on it before it died: retrying
    on the restarted server could do it twice (an acknowledged INSERT doubled this way)."""
    server = await asyncio.to_thread(EchoProcess)
    try:
        async with open_channel(server.address) as channel:
            stub = testing_pb2_grpc.EchoStub(channel)
            patient = RetryPolicy(total_seconds=30, initial_backoff=0.05, max_backoff=0.5)
            key = uuid.uuid4().hex
            pending = asyncio.ensure_future(
                call(
                    stub.Echo,
                    testing_pb2.EchoRequest(text="slow", key=key, sleep_ms=5000),
                    timeout=30,
                    retry=patient,
                )
            )
            await asyncio.to_thread(
                server.wait_for_record, lambda r: r.get("event") == "echo_sleeping"
            )
            server.kill()
            with pytest.raises(errors.Indeterminate):
                await pending
    finally:
        server.kill()


async def test_a_repeatable_call_rides_out_a_server_killed_with_it_in_flight() -> None:
    address = f"127.0.0.1:{free_port()}"
    server = await asyncio.to_thread(EchoProcess, ("--listen", address))
    try:
        async with open_channel(address) as channel:
            stub = testing_pb2_grpc.EchoStub(channel)
            patient = RetryPolicy(total_seconds=30, initial_backoff=0.05, max_backoff=0.5)
            pending = asyncio.ensure_future(
                call(
                    stub.Echo,
                    testing_pb2.EchoRequest(text="again", sleep_ms=2000),
                    timeout=30,
                    retry=patient,
                    repeatable=True,
                )
            )
            await asyncio.to_thread(
                server.wait_for_record, lambda r: r.get("event") == "echo_sleeping"
            )
            server.kill()
            server = await asyncio.to_thread(EchoProcess, ("--listen", address))
            assert (await pending).text == "again"
    finally:
        server.kill()


async def test_sigterm_finishes_calls_in_flight_reports_not_serving_and_exits_zero() -> None:
    server = EchoProcess(["--listen", "127.0.0.1:0", "--shutdown-grace", "20"])
    try:
        async with open_channel(server.address) as channel:
            stub = testing_pb2_grpc.EchoStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=ECHO))
            statuses = aiter(watch)
            assert (await anext(statuses)).status == health_pb2.HealthCheckResponse.SERVING

            request_id = unique("in-flight")
            in_flight = asyncio.ensure_future(
                call(
                    stub.Echo,
                    testing_pb2.EchoRequest(text="finish me", sleep_ms=1_500),
                    request_id=request_id,
                )
            )
            await asyncio.to_thread(
                server.wait_for_record,
                LogRecordMatcher(event="echo_sleeping", request_id=request_id),
            )
            server.signal(signal.SIGTERM)

            assert (await anext(statuses)).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
            reply = await in_flight
            assert reply.text == "finish me"

            assert await asyncio.to_thread(server.wait) == 0
            with pytest.raises(errors.Unavailable):
                await call(stub.Echo, testing_pb2.EchoRequest(text="anyone?"), retry=NO_RETRY)
        events = [record["event"] for record in server.records()]
        assert events.index("shutdown_requested") < events.index("server_stopped")
        assert server.wait_for_record(rpc_record(request_id))["status"] == "OK"
    finally:
        server.kill()


def test_help_documents_every_flag_with_its_environment_variable() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "tests.support.echo_service", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for flag, variable in [
        ("--listen", "TIDEMARK_LISTEN"),
        ("--log-format", "TIDEMARK_LOG_FORMAT"),
        ("--log-level", "TIDEMARK_LOG_LEVEL"),
        ("--shutdown-grace", "TIDEMARK_SHUTDOWN_GRACE"),
        ("--reply-prefix", "TIDEMARK_REPLY_PREFIX"),
    ]:
        assert flag in shown and variable in shown


def test_a_service_that_cannot_bind_its_port_exits_one_and_says_why(echo: EchoProcess) -> None:
    # gRPC would let a second server share the port by default; ours refuses.
    failed = subprocess.run(
        [sys.executable, "-m", "tests.support.echo_service", "--log-format", "json"],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "TIDEMARK_LISTEN": echo.address},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert "service_failed" in failed.stderr
    assert f"cannot listen on {echo.address}" in failed.stderr
