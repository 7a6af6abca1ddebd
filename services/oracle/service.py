"""The gRPC face of the timestamp oracle."""

from __future__ import annotations

import grpc.aio

from services.oracle.oracle import TimestampOracle
from tidemark.rpc import Service
from tidemark.rpc.authorization import CallerPolicy, kinds
from tidemark.v1 import oracle_pb2, oracle_pb2_grpc

Context = grpc.aio.ServicerContext[object, object]


# With mTLS on: the services that read and write data or catalog times.
ORACLE_CALLERS = CallerPolicy(default=kinds("adapter", "catalog", "compute", "sources"))


class OracleServicer(oracle_pb2_grpc.TimestampOracleServicer):
    def __init__(self, oracle: TimestampOracle) -> None:
        self.oracle = oracle

    async def ReadTs(
        self, request: oracle_pb2.ReadTsRequest, context: Context
    ) -> oracle_pb2.TimestampResponse:
        return oracle_pb2.TimestampResponse(timestamp=await self.oracle.read_ts(request.timeline))

    async def WriteTs(
        self, request: oracle_pb2.WriteTsRequest, context: Context
    ) -> oracle_pb2.TimestampResponse:
        ts = await self.oracle.write_ts(request.timeline, request.count or 1)
        return oracle_pb2.TimestampResponse(timestamp=ts)

    async def ApplyWrite(
        self, request: oracle_pb2.ApplyWriteRequest, context: Context
    ) -> oracle_pb2.ApplyWriteResponse:
        await self.oracle.apply_write(request.timeline, request.timestamp)
        return oracle_pb2.ApplyWriteResponse()

    async def PeekWriteTs(
        self, request: oracle_pb2.PeekWriteTsRequest, context: Context
    ) -> oracle_pb2.TimestampResponse:
        ts = await self.oracle.peek_write_ts(request.timeline)
        return oracle_pb2.TimestampResponse(timestamp=ts)


def oracle_service(oracle: TimestampOracle) -> Service[OracleServicer]:
    return Service(
        oracle_pb2.DESCRIPTOR.services_by_name["TimestampOracle"],
        OracleServicer(oracle),
        oracle_pb2_grpc.add_TimestampOracleServicer_to_server,
        hot=True,
        callers=ORACLE_CALLERS,
    )
