"""Every gRPC method of every Tidemark service, fed malformed bytes and random well-typed
messages (hypothesis, fields filled from the descriptors), against the real processes: each
answer is a reply or a clear status — never INTERNAL or UNKNOWN, never a crash, never a call
that outlives its deadline without an answer.

Methods are enumerated from the generated descriptors, so a new method is fuzzed without
touching this file. Streaming methods get the same treatment: one request (or a stream of a
few) and the first few responses, within the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import descriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.proto_strategies import message_class, messages
from tests.support.sql_stack import SqlStack, sql_stack
from tidemark.v1 import adapter_pb2, catalog_pb2, compute_pb2, oracle_pb2, storage_pb2

DEADLINE = 3.0
# A subscription that is answering keeps going; the fuzz reads this many responses of it.
STREAM_RESPONSES = 3
# Statuses that mean "the server failed", not "the request was wrong".
SERVER_FAILURES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
EXAMPLES = 20


@dataclass(frozen=True)
class Method:
    service: str  # the process: oracle, storage, catalog, compute, adapter
    descriptor: descriptor.MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.descriptor.containing_service.full_name}/{self.descriptor.name}"

    def __str__(self) -> str:
        return self.path


PROCESSES = {
    "tidemark.v1.TimestampOracle": "oracle",
    "tidemark.v1.Storage": "storage",
    "tidemark.v1.Catalog": "catalog",
    "tidemark.v1.Compute": "compute",
    "tidemark.v1.Adapter": "adapter",
}
METHODS = [
    Method(PROCESSES[service.full_name], method)
    for module in (oracle_pb2, storage_pb2, catalog_pb2, compute_pb2, adapter_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def test_every_service_is_fuzzed() -> None:
    assert {m.service for m in METHODS} == set(PROCESSES.values())
    assert len(METHODS) >= 25


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStack]:
    with sql_stack(tmp_path_factory.mktemp("fuzz"), adapters=1, engine="local") as running:
        yield running


@pytest.fixture(scope="module")
def channels(stack: SqlStack) -> Iterator[dict[str, grpc.Channel]]:
    addresses = {
        "oracle": stack.oracle.address,
        "storage": stack.storage.address,
        "catalog": stack.catalog.address,
        "compute": stack.compute.compute("default").address,
        "adapter": stack.adapter(0),
    }
    opened = {name: grpc.insecure_channel(address) for name, address in addresses.items()}
    yield opened
    for channel in opened.values():
        channel.close()


def _invoke(channel: grpc.Channel, method: Method, payload: list[bytes]) -> grpc.StatusCode:
    """Sends ``payload`` (one message, or a stream of them) as raw bytes; the status."""
    d = method.descriptor
    try:
        if not d.client_streaming and not d.server_streaming:
            channel.unary_unary(method.path)(payload[0], timeout=DEADLINE)
            return grpc.StatusCode.OK
        if not d.client_streaming:
            responses = channel.unary_stream(method.path)(payload[0], timeout=DEADLINE)
        elif not d.server_streaming:
            channel.stream_unary(method.path)(iter(payload), timeout=DEADLINE)
            return grpc.StatusCode.OK
        else:
            responses = channel.stream_stream(method.path)(iter(payload), timeout=DEADLINE)
        for count, _ in enumerate(responses, 1):
            if count >= STREAM_RESPONSES:
                responses.cancel()
                break
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        if code in SERVER_FAILURES:
            raise AssertionError(
                f"{method}: {code.name}: {exc.details()}"  # type: ignore[attr-defined]
            ) from exc
        if code is grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK  # we hung up on a stream that was answering
        return code  # type: ignore[no-any-return]


# A service may report NOT_SERVING for a moment while it recovers (the catalog resuming its
# log after a failed read); it must be serving again within this many seconds.
RECOVERY_S = 10.0


def _still_serving(channel: grpc.Channel, method: Method) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + RECOVERY_S
    while True:
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE)
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return
        assert time.monotonic() < deadline, f"{method}: not serving for {RECOVERY_S} s"
        time.sleep(0.2)


def _check(channel: grpc.Channel, method: Method, payload: list[bytes]) -> None:
    code = _invoke(channel, method, payload)
    # A unary call that ran into its deadline did not answer: that is a hang, unless the
    # method waits by design (a read at a time that has not come, which must then be refused
    # within the deadline by the service's own wait limit — longer than ours).
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and not method.descriptor.server_streaming:
        assert method.descriptor.name in WAITING_METHODS, f"{method} hung for {DEADLINE} s"
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as waited:
            channel.unary_unary(method.path)(payload[0], timeout=DEADLINE / 2)
        assert waited.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert time.monotonic() - started < DEADLINE, f"{method} ignored its deadline"
    _still_serving(channel, method)


# Unary methods whose contract is to wait for a requested time to come (a catalog snapshot at,
# a catalog frontier past, a peek or a statement AS OF a future time) for as long as the
# caller's deadline allows: DEADLINE_EXCEEDED is their clear answer to a time that does not
# come in time. Each still has to give it when the deadline passes, checked below with a
# deadline twice as short.
WAITING_METHODS = {"SnapshotAt", "AdvanceCatalogFrontier", "Peek", "Execute"}


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_malformed_bytes_get_a_clear_status(
    channels: dict[str, grpc.Channel], method: Method
) -> None:
    channel = channels[method.service]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=3))
    def fuzz(payload: list[bytes]) -> None:
        _check(channel, method, payload)

    fuzz()


@pytest.mark.parametrize("method", METHODS, ids=str)
def test_random_messages_get_a_clear_status(
    channels: dict[str, grpc.Channel], method: Method
) -> None:
    channel = channels[method.service]
    request = method.descriptor.input_type
    assert message_class(request)  # the generated class exists

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(messages(request), min_size=1, max_size=3))
    def fuzz(requests: list[object]) -> None:
        _check(channel, method, [r.SerializeToString() for r in requests])  # type: ignore[attr-defined]

    fuzz()
