"""Client of the timestamp oracle service."""

from __future__ import annotations

import grpc.aio

from tidemark.retry import RetryPolicy
from tidemark.rpc import CLIENT_RETRY, call, open_channel
from tidemark.v1 import oracle_pb2, oracle_pb2_grpc


class OracleClient:
    """``read_ts``/``write_ts``/``apply_write``/``peek_write_ts`` against an oracle address.
    Calls retry while the oracle is unavailable (within ``retry``) and raise Tidemark errors
    otherwise."""

    def __init__(
        self, address: str, *, timeout: float = 10.0, retry: RetryPolicy = CLIENT_RETRY
    ) -> None:
        self.channel: grpc.aio.Channel = open_channel(address)
        self.stub = oracle_pb2_grpc.TimestampOracleStub(self.channel)
        self.timeout = timeout
        self.retry = retry

    async def read_ts(self, timeline: str) -> int:
        request = oracle_pb2.ReadTsRequest(timeline=timeline)
        response = await call(self.stub.ReadTs, request, timeout=self.timeout, retry=self.retry)
        return response.timestamp

    async def write_ts(self, timeline: str) -> int:
        request = oracle_pb2.WriteTsRequest(timeline=timeline)
        response = await call(self.stub.WriteTs, request, timeout=self.timeout, retry=self.retry)
        return response.timestamp

    async def peek_write_ts(self, timeline: str) -> int:
        request = oracle_pb2.PeekWriteTsRequest(timeline=timeline)
        response = await call(
            self.stub.PeekWriteTs, request, timeout=self.timeout, retry=self.retry
        )
        return response.timestamp

    async def apply_write(self, timeline: str, timestamp: int) -> None:
        request = oracle_pb2.ApplyWriteRequest(timeline=timeline, timestamp=timestamp)
        await call(self.stub.ApplyWrite, request, timeout=self.timeout, retry=self.retry)

    async def close(self) -> None:
        await self.channel.close(None)
