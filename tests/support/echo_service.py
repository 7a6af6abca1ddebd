"""A test-only service built on the RPC plumbing, misbehaving on request.

Run it as its own process the way real services run::

    python -m tests.support.echo_service --listen 127.0.0.1:0

It prints the bound port on stdout (one line) once it serves, and logs to stderr.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio

from tidemark import errors
from tidemark.config import ServiceConfig, setting
from tidemark.logging import get_logger
from tidemark.rpc import Service, announce_port, current_request_id, serve
from tidemark.runner import run_service
from tidemark.v1 import testing_pb2, testing_pb2_grpc

log = get_logger("tests.echo")

SERVICE_NAME = testing_pb2.DESCRIPTOR.services_by_name["Echo"].full_name


def make_error(name: str, message: str) -> Exception:
    """The exception a request names: a tidemark.errors class, ValueError or
    NotImplementedError."""
    if name == "ValueError":
        return ValueError(message)
    if name == "NotImplementedError":
        return NotImplementedError(message)
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.TidemarkError)):
        return errors.InvalidArgument(f"no such error class {name!r}")
    return cls(message)


class EchoServicer(testing_pb2_grpc.EchoServicer):
    def __init__(self, reply_prefix: str = "") -> None:
        self.reply_prefix = reply_prefix
        self.calls_by_key: Counter[str] = Counter()

    async def Echo(
        self, request: testing_pb2.EchoRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> testing_pb2.EchoReply:
        attempt = 0
        if request.key:
            self.calls_by_key[request.key] += 1
            attempt = self.calls_by_key[request.key]
            if attempt <= request.unavailable_times:
                raise errors.Unavailable(f"attempt {attempt} for {request.key} refused")
        if request.sleep_ms:
            log.info("echo_sleeping", sleep_ms=request.sleep_ms)
            await asyncio.sleep(request.sleep_ms / 1000)
        if request.abort_code:
            await context.abort(grpc.StatusCode[request.abort_code], request.text)
        if request.raise_error:
            raise make_error(request.raise_error, request.text)
        return testing_pb2.EchoReply(
            text=self.reply_prefix + request.text,
            attempt=attempt,
            request_id=current_request_id() or "",
        )

    async def Count(
        self, request: testing_pb2.CountRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[testing_pb2.CountReply]:
        for value in range(request.n):
            if request.fail_after and value == request.fail_after:
                raise make_error(request.raise_error, f"failed after {value} items")
            yield testing_pb2.CountReply(value=value)


def echo_service(servicer: EchoServicer) -> Service[EchoServicer]:
    return Service(
        testing_pb2.DESCRIPTOR.services_by_name["Echo"],
        servicer,
        testing_pb2_grpc.add_EchoServicer_to_server,
    )


@dataclass(frozen=True)
class EchoConfig(ServiceConfig):
    reply_prefix: str = setting("", help="text put in front of every echoed reply")


async def main(config: EchoConfig) -> None:
    await serve(
        [echo_service(EchoServicer(config.reply_prefix))],
        config.listen,
        grace=config.shutdown_grace,
        on_started=announce_port,
    )


if __name__ == "__main__":
    run_service(
        main,
        EchoConfig,
        prog="python -m tests.support.echo_service",
        description="Echo: a test service exercising Tidemark's RPC plumbing.",
    )
