"""What one gRPC interaction costs the caller's CPU, with nothing of Tidemark's around it:
``.venv/bin/python bench/grpc_floor.py``.

The whole step of the parts path (``bench/steady_io.py``) makes two such interactions in the
driver: a message on the inputs' ``SubscribePartsJointly`` stream, arriving after the driver
sat idle, and the commit, a message on the writer's ``AppendStream`` that storage answers some
milliseconds later (before, a unary ``AppendParts`` call); and it hands the engine call to a
thread and back. This measures those shapes bare, against
an echo server in a process of its own (raw bytes, no protobuf), in the caller's process CPU
(``getrusage``, all its threads, gRPC's own included):

- ``unary_at_once``: a unary call the server answers at once;
- ``unary_answered_later``: one the server answers after ``DELAY_S`` (as storage's commit);
- ``stream_message_after_idle``: a server-stream message sent ``DELAY_S`` after the last;
- ``bidi_message_answered_later``: a message written on an open two-way stream and answered
  on it ``DELAY_S`` later (as the commit on ``AppendStream``);
- ``streamed_call_answered_later``: the same through ``tidemark.rpc.streamed_calls`` (how
  ``StorageClient`` sends the commit on the stream: a writer task, a reader task, a future per
  call and a deadline), so the difference to the line above is that layer's own cost;
- ``thread_handoff``: ``asyncio.to_thread`` of a call that sleeps ``DELAY_S`` (the engine
  call's hand-off, without its work).

``steady_io.py`` runs it first, so its figures sit next to the step's split measured in the
same run on the same machine.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import grpc.aio

from tidemark.retry import RetryPolicy
from tidemark.rpc.streamed_calls import StreamedCalls

DELAY_S = 0.005
CALLS = 300
_SERVICE = "floor.Echo"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _serve() -> None:
    async def answer(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        delay = float(request.decode() or 0)
        if delay:
            await asyncio.sleep(delay)
        return b"x" * 64

    async def echo(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            sequence, delay = request.decode().split()
            await asyncio.sleep(float(delay))
            yield sequence.encode().ljust(64)

    async def messages(
        request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        count, delay = request.decode().split()
        for _ in range(int(count)):
            await asyncio.sleep(float(delay))
            yield b"x" * 64

    handler = grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Answer": grpc.unary_unary_rpc_method_handler(answer),
            "Messages": grpc.unary_stream_rpc_method_handler(messages),
            "Echo": grpc.stream_stream_rpc_method_handler(echo),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _streamed_calls(
    method: grpc.aio.StreamStreamMultiCallable[bytes, bytes],
) -> StreamedCalls[str, bytes, bytes, bytes]:
    """Tidemark's calls-as-stream-messages (``tidemark.rpc.streamed_calls``, as
    ``StorageClient`` sends appends and commits) over the echo stream, raw bytes."""
    return StreamedCalls(
        method,
        wrap=lambda sequence, delay: f"{sequence} {delay}".encode(),
        unwrap=lambda message: (int(message.split()[0]), message),
        retry=RetryPolicy(),
        name="floor",
    )


async def _per_call(work: Callable[[], Awaitable[object]], calls: int) -> float:
    """The caller's CPU milliseconds per ``work()``, after a few unmeasured ones."""
    for _ in range(10):
        await work()
    started = _cpu()
    for _ in range(calls):
        await work()
    return round((_cpu() - started) / calls * 1000, 3)


async def measure(calls: int = CALLS, delay: float = DELAY_S) -> dict[str, float]:
    """The caller's CPU per interaction of each shape (ms), against a fresh echo server."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(await server.stdout.readline())
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        answer = channel.unary_unary(f"/{_SERVICE}/Answer", None, None)
        stream = channel.unary_stream(f"/{_SERVICE}/Messages", None, None)
        result = {
            "unary_at_once": await _per_call(lambda: answer(b"0"), calls),
            "unary_answered_later": await _per_call(lambda: answer(str(delay).encode()), calls),
        }
        for _ in range(2):  # the first stream also opens the connection's stream machinery
            started = _cpu()
            async for _message in stream(f"{calls} {delay}".encode()):
                pass
        result["stream_message_after_idle"] = round((_cpu() - started) / calls * 1000, 3)
        two_way = channel.stream_stream(f"/{_SERVICE}/Echo", None, None)(None)

        async def exchange() -> object:
            await two_way.write(f"0 {delay}".encode())
            return await two_way.read()

        result["bidi_message_answered_later"] = await _per_call(exchange, calls)
        await two_way.done_writing()
        calls_on_stream = _streamed_calls(channel.stream_stream(f"/{_SERVICE}/Echo", None, None))
        result["streamed_call_answered_later"] = await _per_call(
            lambda: calls_on_stream.call(str(delay), 5.0), calls
        )
        await calls_on_stream.close()
        result["thread_handoff"] = await _per_call(
            lambda: asyncio.to_thread(time.sleep, delay), calls
        )
        await channel.close(None)
        return {**result, "delay_ms": delay * 1000}
    finally:
        server.kill()
        await server.wait()


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(_serve())
        return
    print(json.dumps(asyncio.run(measure()), indent=2))


if __name__ == "__main__":
    main()
