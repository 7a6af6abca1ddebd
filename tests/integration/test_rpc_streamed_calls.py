"""Requests carried over one long-lived stream (tidemark.rpc.streamed_calls), against an
in-process server over a real socket: the server answers each request in its own task (a
scripted storage servicer whose AppendStream acts on the request's token), failures come back
as the errors a unary call would raise while the stream stays open, and a broken stream fails
what was in flight as indeterminate and is opened again on the next request."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import grpc.aio
import pytest
from prometheus_client import REGISTRY

from tidemark.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    Indeterminate,
    Internal,
    Unavailable,
)
from tidemark.retry import RetryPolicy
from tidemark.rpc import Server, Service, open_channel
from tidemark.rpc.streamed_calls import StreamedCalls, answer_streamed_calls
from tidemark.v1 import common_pb2, storage_pb2, storage_pb2_grpc

QUICK = RetryPolicy(total_seconds=0.5, initial_backoff=0.05, max_backoff=0.1)
Outcome = storage_pb2.AppendResponse | common_pb2.CallStatus


KindOf = Callable[[storage_pb2.AppendStreamRequest], str]


def by_oneof(message: storage_pb2.AppendStreamRequest) -> str:
    return message.WhichOneof("kind") or "none"


class ScriptedStorage(storage_pb2_grpc.StorageServicer):
    """AppendStream answers by token: ``ok-N`` with upper ``{N}``, ``slow-N`` the same after
    0.3 s, ``refuse`` FAILED_PRECONDITION, ``maybe`` indeterminate, ``bug`` an unexpected
    exception, ``hang`` never."""

    def __init__(self, kind_of: KindOf | None = by_oneof) -> None:
        self.streams = 0
        self.kind_of = kind_of  # None: answer_streamed_calls' default
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.stopping = asyncio.Event()

    async def AppendStream(  # type: ignore[override]  # reader/writer style
        self,
        request_iterator: AsyncIterator[storage_pb2.AppendStreamRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        self.streams += 1
        labelled = {} if self.kind_of is None else {"kind_of": self.kind_of}
        await answer_streamed_calls(
            request_iterator,
            context.write,
            self._answer,
            lambda message, status: storage_pb2.AppendStreamResponse(
                sequence=message.sequence, error=status
            ),
            method="/tidemark.v1.Storage/AppendStream",
            stopping=self.stopping,
            **labelled,
        )

    async def _answer(
        self, message: storage_pb2.AppendStreamRequest
    ) -> storage_pb2.AppendStreamResponse:
        token = message.append.idempotency_token
        self.started.append(token)
        kind, _, number = token.partition("-")
        if kind == "slow":
            await asyncio.sleep(0.3)
        elif kind == "refuse":
            raise FailedPrecondition("the upper is {7}, not {5}")
        elif kind == "maybe":
            raise Indeterminate("the commit's outcome is unknown")
        elif kind == "bug":
            raise RuntimeError("secret internals")
        elif kind == "hang":
            try:
                await asyncio.Event().wait()
            finally:
                self.cancelled.append(token)
        upper = common_pb2.Frontier(elements=[int(number)])
        return storage_pb2.AppendStreamResponse(
            sequence=message.sequence, appended=storage_pb2.AppendResponse(upper=upper)
        )


def scripted_service(servicer: ScriptedStorage) -> Service[ScriptedStorage]:
    return Service(
        storage_pb2.DESCRIPTOR.services_by_name["Storage"],
        servicer,
        storage_pb2_grpc.add_StorageServicer_to_server,
        on_stopping=servicer.stopping.set,
    )


def unwrap(message: storage_pb2.AppendStreamResponse) -> tuple[int, Outcome]:
    if message.HasField("error"):
        return message.sequence, message.error
    return message.sequence, message.appended


AppendCalls = StreamedCalls[
    str,
    storage_pb2.AppendResponse,
    storage_pb2.AppendStreamRequest,
    storage_pb2.AppendStreamResponse,
]


def calls_to(address: str) -> AppendCalls:
    stub = storage_pb2_grpc.StorageStub(open_channel(address))
    return StreamedCalls(
        stub.AppendStream,
        wrap=lambda sequence, token: storage_pb2.AppendStreamRequest(
            sequence=sequence, append=storage_pb2.AppendRequest(idempotency_token=token)
        ),
        unwrap=unwrap,
        retry=QUICK,
        name="test append",
    )


async def upper(calls: AppendCalls, token: str) -> int:
    response = await calls.call(token, 5.0)
    return int(response.upper.elements[0])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_requests_share_one_stream_finish_in_any_order_and_fail_alone() -> None:
    servicer = ScriptedStorage()
    async with Server([scripted_service(servicer)], "127.0.0.1:0") as server:
        calls = calls_to(f"127.0.0.1:{server.port}")
        finished: list[str] = []

        async def run(token: str) -> int:
            result = await upper(calls, token)
            finished.append(token)
            return result

        slow = asyncio.create_task(run("slow-1"))
        await asyncio.sleep(0.05)
        assert await run("ok-2") == 2
        assert await slow == 1
        assert finished == ["ok-2", "slow-1"]  # the later request did not wait for the earlier

        with pytest.raises(FailedPrecondition, match=r"the upper is \{7\}, not \{5\}"):
            await calls.call("refuse", 5.0)
        with pytest.raises(Indeterminate, match="outcome is unknown"):
            await calls.call("maybe", 5.0)
        with pytest.raises(Internal, match="internal error") as bug:
            await calls.call("bug", 5.0)
        assert "secret" not in bug.value.message
        # Every failure failed alone: the stream is still the first one.
        results = await asyncio.gather(*(upper(calls, f"ok-{n}") for n in range(10, 60)))
        assert results == list(range(10, 60))
        assert servicer.streams == 1
        await calls.close()


async def test_deadline_and_cancelled_callers_leave_the_stream_open() -> None:
    servicer = ScriptedStorage()
    async with Server([scripted_service(servicer)], "127.0.0.1:0") as server:
        calls = calls_to(f"127.0.0.1:{server.port}")
        with pytest.raises(DeadlineExceeded, match="may still take effect"):
            await calls.call("hang-1", 0.2)
        waiting = asyncio.create_task(calls.call("hang-2", 5.0))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await upper(calls, "ok-3") == 3
        assert servicer.streams == 1
        await calls.close()
        # Closing the client ends the stream; the server cancels what it still ran for it.
        for _ in range(50):
            if sorted(servicer.cancelled) == ["hang-1", "hang-2"]:
                break
            await asyncio.sleep(0.05)
        assert sorted(servicer.cancelled) == ["hang-1", "hang-2"]
        with pytest.raises(Unavailable, match="closed"):
            await calls.call("ok-4", 1.0)


async def test_a_broken_stream_fails_what_was_in_flight_as_indeterminate_then_reopens() -> None:
    port = free_port()
    first = ScriptedStorage()
    server = Server([scripted_service(first)], f"127.0.0.1:{port}", grace=0.0)
    await server.start()
    calls = calls_to(f"127.0.0.1:{port}")
    assert await upper(calls, "ok-1") == 1
    in_flight = asyncio.create_task(calls.call("hang-2", 10.0))
    await asyncio.sleep(0.1)
    await server.stop(0.0)
    with pytest.raises(Indeterminate, match="stream broke"):
        await in_flight
    # Nothing listens now: opening a stream fails as Unavailable (nothing was sent).
    with pytest.raises(Unavailable) as down:
        await calls.call("ok-3", 2.0)
    assert not isinstance(down.value, Indeterminate)
    second = ScriptedStorage()
    async with Server([scripted_service(second)], f"127.0.0.1:{port}"):
        assert await upper(calls, "ok-4") == 4
        assert second.streams == 1
    await calls.close()


async def test_stopping_answers_what_runs_then_ends_idle_streams_without_the_grace() -> None:
    port = free_port()
    servicer = ScriptedStorage()
    server = Server([scripted_service(servicer)], f"127.0.0.1:{port}", grace=30.0)
    await server.start()
    calls = calls_to(f"127.0.0.1:{port}")
    assert await upper(calls, "ok-1") == 1
    running = asyncio.create_task(upper(calls, "slow-2"))
    for _ in range(200):  # until the server runs it (a loaded machine may take a while)
        if "slow-2" in servicer.started:
            break
        await asyncio.sleep(0.01)
    assert "slow-2" in servicer.started
    # The open stream does not hold the stop for its 30 s grace; the request it was
    # running is still answered.
    await asyncio.wait_for(server.stop(), timeout=10.0)
    assert await running == 2
    async with Server([scripted_service(ScriptedStorage())], f"127.0.0.1:{port}"):
        assert await upper(calls, "ok-3") == 3
    await calls.close()


class EndsItsFirstStream(ScriptedStorage):
    """Its first stream reads one request and ends cleanly without answering it, as a
    stopping server ends a stream on a request written just before the end; later streams
    answer as ``ScriptedStorage``."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[str] = []

    async def AppendStream(  # type: ignore[override]  # reader/writer style
        self,
        request_iterator: AsyncIterator[storage_pb2.AppendStreamRequest],
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        if self.streams == 0:
            self.streams += 1
            request = await anext(request_iterator)
            self.dropped.append(request.append.idempotency_token)
            return
        await super().AppendStream(request_iterator, context)


async def test_a_request_left_unanswered_by_a_cleanly_ended_stream_goes_again() -> None:
    servicer = EndsItsFirstStream()
    async with Server([scripted_service(servicer)], "127.0.0.1:0") as server:
        calls = calls_to(f"127.0.0.1:{server.port}")
        # Not Indeterminate: the server ran nothing it left unanswered.
        assert await upper(calls, "ok-1") == 1
        assert servicer.dropped == ["ok-1"]
        assert servicer.streams == 2
        await calls.close()


def streamed_calls(code: str, kind: str = "append") -> float:
    labels = {"service": "tidemark.v1.Storage", "method": "AppendStream", "kind": kind}
    value = REGISTRY.get_sample_value("tidemark_rpc_streamed_calls_total", {**labels, "code": code})
    return value or 0.0


def streamed_call_seconds(sample: str) -> float:
    labels = {"service": "tidemark.v1.Storage", "method": "AppendStream", "kind": "append"}
    value = REGISTRY.get_sample_value(
        f"tidemark_rpc_streamed_call_duration_seconds_{sample}", labels
    )
    return value or 0.0


async def test_each_call_on_the_stream_counts_in_the_metrics_by_kind_and_status() -> None:
    codes = ("OK", "FAILED_PRECONDITION", "INTERNAL")
    before = {code: streamed_calls(code) for code in codes}
    timed_before = streamed_call_seconds("count"), streamed_call_seconds("sum")
    servicer = ScriptedStorage()
    async with Server([scripted_service(servicer)], "127.0.0.1:0") as server:
        calls = calls_to(f"127.0.0.1:{server.port}")
        assert await upper(calls, "ok-1") == 1
        assert await upper(calls, "slow-2") == 2
        with pytest.raises(FailedPrecondition):
            await calls.call("refuse", 5.0)
        with pytest.raises(Internal):
            await calls.call("bug", 5.0)
        with pytest.raises(DeadlineExceeded):
            await calls.call("hang-3", 0.2)
        await calls.close()
        for _ in range(50):
            if servicer.cancelled:
                break
            await asyncio.sleep(0.05)
        assert servicer.cancelled == ["hang-3"]
    after = {code: streamed_calls(code) for code in codes}
    assert {code: after[code] - before[code] for code in codes} == {
        "OK": 2,
        "FAILED_PRECONDITION": 1,
        "INTERNAL": 1,
    }
    # Four answered calls are timed, the slow one's 0.3 s among them; the call cancelled
    # with its stream had no answer and counts nowhere.
    assert streamed_call_seconds("count") - timed_before[0] == 4
    assert streamed_call_seconds("sum") - timed_before[1] >= 0.3


def unknowable_kind(message: storage_pb2.AppendStreamRequest) -> str:
    raise ValueError("no kind for this one")


@pytest.mark.parametrize(
    ("kind_of", "kind"),
    [(None, "call"), (unknowable_kind, "unknown")],
    ids=["default-kind", "kind-of-raises"],
)
async def test_a_call_counts_under_its_kind_even_when_none_is_given_or_it_cannot_be_told(
    kind_of: KindOf | None, kind: str
) -> None:
    servicer = ScriptedStorage(kind_of)
    before = streamed_calls("OK", kind), streamed_calls("FAILED_PRECONDITION", kind)
    async with Server([scripted_service(servicer)], "127.0.0.1:0") as server:
        calls = calls_to(f"127.0.0.1:{server.port}")
        # Answered either way: a label that cannot be told must not hold up the answer.
        assert await upper(calls, "ok-4") == 4
        with pytest.raises(FailedPrecondition):
            await calls.call("refuse", 5.0)
        assert await upper(calls, "ok-5") == 5
        await calls.close()
    after = streamed_calls("OK", kind), streamed_calls("FAILED_PRECONDITION", kind)
    assert (after[0] - before[0], after[1] - before[1]) == (2, 1)
