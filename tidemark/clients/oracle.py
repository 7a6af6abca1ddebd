"""Client of the timestamp oracle service.

Concurrent callers of one client share calls, the same way the oracle shares backend round
trips (:mod:`tidemark.batching`): the ``ReadTs`` calls waiting when a call goes out share its
answer, the waiting ``WriteTs`` calls take one run of consecutive timestamps, and the waiting
``ApplyWrite`` calls send only their maximum. Each shared call starts after every caller in it
arrived, so every caller still sees a linearizable oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.batching import GroupCommit
from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, GrpcClient
from tidemark.rpc.tls import TlsSettings
from tidemark.v1 import oracle_pb2, oracle_pb2_grpc


class _TimelineCalls:
    def __init__(self, client: OracleClient, timeline: str) -> None:
        self.client = client
        self.timeline = timeline
        self.reads: GroupCommit[None, int] = GroupCommit(self._read)
        self.writes: GroupCommit[None, int] = GroupCommit(self._write)
        self.applies: GroupCommit[int, None] = GroupCommit(self._apply)

    async def _read(self, callers: Sequence[None]) -> list[int]:
        request = oracle_pb2.ReadTsRequest(timeline=self.timeline)
        response = await self.client._call(self.client.stub.ReadTs, request, repeatable=True)
        return [response.timestamp] * len(callers)

    async def _write(self, callers: Sequence[None]) -> list[int]:
        request = oracle_pb2.WriteTsRequest(timeline=self.timeline, count=len(callers))
        response = await self.client._call(self.client.stub.WriteTs, request, repeatable=True)
        return [response.timestamp + i for i in range(len(callers))]

    async def _apply(self, timestamps: Sequence[int]) -> list[None]:
        # Applying the largest applies every smaller one too.
        request = oracle_pb2.ApplyWriteRequest(timeline=self.timeline, timestamp=max(timestamps))
        await self.client._call(self.client.stub.ApplyWrite, request, repeatable=True)
        return [None] * len(timestamps)

    async def close(self) -> None:
        for batcher in (self.reads, self.writes, self.applies):
            await batcher.close()


class OracleClient(GrpcClient):
    """``read_ts``/``write_ts``/``apply_write``/``peek_write_ts`` against an oracle address.
    Calls retry while the oracle is unavailable (within ``retry``) and raise Tidemark errors
    otherwise."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = CLIENT_RETRY,
        tls: TlsSettings | None = None,
    ) -> None:
        super().__init__(address, timeout=timeout, retry=retry, tls=tls)
        self.stub = oracle_pb2_grpc.TimestampOracleStub(self.channel)
        self._timelines: dict[str, _TimelineCalls] = {}

    def _calls(self, timeline: str) -> _TimelineCalls:
        calls = self._timelines.get(timeline)
        if calls is None:
            calls = self._timelines[timeline] = _TimelineCalls(self, timeline)
        return calls

    async def read_ts(self, timeline: str) -> int:
        return await self._calls(timeline).reads.submit(None)

    async def write_ts(self, timeline: str) -> int:
        return await self._calls(timeline).writes.submit(None)

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        await self._calls(timeline).applies.submit(timestamp)

    async def peek_write_ts(self, timeline: str) -> int:
        request = oracle_pb2.PeekWriteTsRequest(timeline=timeline)
        response = await self._call(self.stub.PeekWriteTs, request, repeatable=True)
        return response.timestamp

    async def close(self) -> None:
        for calls in self._timelines.values():
            await calls.close()
        await super().close()
