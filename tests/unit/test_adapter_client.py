"""Decoding of the adapter's wire values, results and subscription messages into Python."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from decimal import Decimal

import grpc.aio
import pytest

from tidemark.clients.adapter import (
    AdapterClient,
    BlockingAdapterClient,
    Change,
    Changes,
    Column,
    Progress,
    Row,
    StatementError,
    StatementResult,
    SubscribeError,
    SubscribeEvent,
    SubscribeHeader,
    decode_row,
    decode_subscribe_event,
    decode_value,
)
from tidemark.rpc import NO_RETRY
from tidemark.v1 import adapter_pb2, adapter_pb2_grpc, common_pb2

V = adapter_pb2.SqlValue


@pytest.mark.parametrize(
    ("value", "type_name", "expected"),
    [
        (V(), "bigint", None),
        (V(), "text", None),
        (V(bool_value=False), "boolean", False),
        (V(bool_value=True), "boolean", True),
        (V(int_value=-(2**63)), "bigint", -(2**63)),
        (V(int_value=0), "bigint", 0),
        (V(float_value=2.5), "double precision", 2.5),
        (V(text_value="12.340"), "numeric(10,3)", Decimal("12.340")),
        (V(text_value="-0.5"), "numeric", Decimal("-0.5")),
        (V(text_value="2024-02-29"), "date", datetime.date(2024, 2, 29)),
        (
            V(text_value="2024-02-29 13:14:15.25"),
            "timestamp",
            datetime.datetime(2024, 2, 29, 13, 14, 15, 250000),
        ),
        (V(text_value='{"a": [1, 2]}'), "jsonb", '{"a": [1, 2]}'),
        (V(text_value="héllo"), "text", "héllo"),
        (V(text_value=""), "text", ""),
        (V(bytes_value=b"\x00\xff"), "bytea", b"\x00\xff"),
        # Text the type cannot parse stays text instead of failing the whole result.
        (V(text_value="infinity"), "date", "infinity"),
        # Without a known type, text stays text.
        (V(text_value="1.5"), "", "1.5"),
    ],
)
def test_decode_value(value: adapter_pb2.SqlValue, type_name: str, expected: object) -> None:
    decoded = decode_value(value, type_name)
    assert decoded == expected
    assert type(decoded) is type(expected)


def test_decode_row_types_each_value_by_its_column() -> None:
    columns = [Column("n", "numeric(5,1)"), Column("d", "date"), Column("s", "text")]
    row = adapter_pb2.SqlRow(values=[V(text_value="1.5"), V(text_value="2020-01-02"), V()])
    assert decode_row(row, columns) == (Decimal("1.5"), datetime.date(2020, 1, 2), None)
    # A value beyond the described columns decodes untyped rather than failing.
    longer = adapter_pb2.SqlRow(values=[*row.values, V(text_value="7")])
    assert decode_row(longer, columns)[3] == "7"


def test_statement_result_from_proto() -> None:
    proto = adapter_pb2.StatementResult(
        tag="SELECT 2",
        columns=[
            adapter_pb2.SqlColumn(name="a", type="bigint", nullable=False),
            adapter_pb2.SqlColumn(name="b", type="numeric(4,2)", nullable=True),
        ],
        rows=[
            adapter_pb2.SqlRow(values=[V(int_value=1), V(text_value="0.10")]),
            adapter_pb2.SqlRow(values=[V(int_value=2), V()]),
        ],
        notices=["hello"],
        timestamp=42,
    )
    result = StatementResult.from_proto(proto)
    assert result.tag == "SELECT 2"
    assert result.columns == [Column("a", "bigint", False), Column("b", "numeric(4,2)", True)]
    assert result.rows == [(1, Decimal("0.10")), (2, None)]
    assert result.notices == ["hello"]
    assert result.error is None
    assert result.timestamp == 42


def test_statement_error_from_proto() -> None:
    proto = adapter_pb2.StatementResult(
        error=adapter_pb2.SqlError(
            code="42P01", message='unknown table "x"', position=15, hint="create it"
        )
    )
    result = StatementResult.from_proto(proto)
    assert result.error == StatementError("42P01", 'unknown table "x"', 15, "create it")
    assert str(result.error) == 'unknown table "x" (SQLSTATE 42P01)'


def test_subscribe_events_decode_rows_by_the_header_columns() -> None:
    header = adapter_pb2.SubscribeSqlResponse(
        header=adapter_pb2.SubscribeHeader(
            columns=[adapter_pb2.SqlColumn(name="n", type="numeric")], as_of=7
        )
    )
    event = decode_subscribe_event(header, [])
    assert event == SubscribeHeader([Column("n", "numeric", False)], 7)
    assert isinstance(event, SubscribeHeader)
    changes = adapter_pb2.SubscribeSqlResponse(
        changes=adapter_pb2.SqlChanges(
            changes=[
                adapter_pb2.SqlChange(
                    timestamp=8, diff=-2, row=adapter_pb2.SqlRow(values=[V(text_value="3.0")])
                )
            ]
        )
    )
    assert decode_subscribe_event(changes, event.columns) == Changes(
        [Change(8, -2, (Decimal("3.0"),))]
    )
    progress = adapter_pb2.SubscribeSqlResponse(progress=common_pb2.Frontier(elements=[9]))
    assert decode_subscribe_event(progress, event.columns) == Progress(9)
    closed = adapter_pb2.SubscribeSqlResponse(progress=common_pb2.Frontier())
    assert decode_subscribe_event(closed, event.columns) == Progress(None)
    error = adapter_pb2.SubscribeSqlResponse(error=adapter_pb2.SqlError(code="XX000", message="x"))
    assert decode_subscribe_event(error, []) == SubscribeError(StatementError("XX000", "x"))
    assert decode_subscribe_event(adapter_pb2.SubscribeSqlResponse(), []) is None


# -- against a fake adapter over real gRPC ----------------------------------------------------


class FakeAdapter(adapter_pb2_grpc.AdapterServicer):
    """Echoes the SQL as a text row and counts calls in a session setting."""

    def __init__(self) -> None:
        self.sessions: list[adapter_pb2.Session] = []
        self.credentials: list[dict[str, str]] = []

    def _remember(self, context: object) -> None:
        metadata = context.invocation_metadata()  # type: ignore[attr-defined]
        self.credentials.append({k: v for k, v in metadata if k.startswith("tidemark-")})

    async def Execute(
        self, request: adapter_pb2.ExecuteRequest, context: object
    ) -> adapter_pb2.ExecuteResponse:
        self._remember(context)
        self.sessions.append(request.session)
        calls = int(request.session.settings.get("calls", "0")) + 1
        session = adapter_pb2.Session(settings={**request.session.settings, "calls": str(calls)})
        result = adapter_pb2.StatementResult(
            tag="SELECT 1",
            columns=[adapter_pb2.SqlColumn(name="sql", type="text")],
            rows=[adapter_pb2.SqlRow(values=[V(text_value=request.sql)])],
        )
        return adapter_pb2.ExecuteResponse(results=[result], session=session)

    async def Subscribe(
        self, request: adapter_pb2.SubscribeSqlRequest, context: object
    ) -> AsyncIterator[adapter_pb2.SubscribeSqlResponse]:
        self._remember(context)
        yield adapter_pb2.SubscribeSqlResponse(
            header=adapter_pb2.SubscribeHeader(
                columns=[adapter_pb2.SqlColumn(name="d", type="date")], as_of=1
            )
        )
        for t in (1, 2):
            change = adapter_pb2.SqlChange(
                timestamp=t, diff=1, row=adapter_pb2.SqlRow(values=[V(text_value=f"2020-01-0{t}")])
            )
            yield adapter_pb2.SubscribeSqlResponse(changes=adapter_pb2.SqlChanges(changes=[change]))
            yield adapter_pb2.SubscribeSqlResponse(progress=common_pb2.Frontier(elements=[t + 1]))


@pytest.fixture
async def fake_adapter() -> AsyncIterator[tuple[str, FakeAdapter]]:
    server = grpc.aio.server()
    servicer = FakeAdapter()
    adapter_pb2_grpc.add_AdapterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", servicer
    await server.stop(None)


async def test_client_carries_the_session_from_call_to_call(
    fake_adapter: tuple[str, FakeAdapter],
) -> None:
    address, servicer = fake_adapter
    async with AdapterClient(address, retry=NO_RETRY, settings={"cluster": "c1"}) as client:
        first = await client.execute("SELECT 'x'")
        assert first.results[0].rows == [("SELECT 'x'",)]
        assert first.error is None
        await client.execute("SELECT 2")
        assert dict(client.session.settings) == {"cluster": "c1", "calls": "2"}
        # An explicit session is used for that call, and its result becomes the client's.
        await client.execute("SELECT 3", adapter_pb2.Session())
    assert [dict(s.settings) for s in servicer.sessions] == [
        {"cluster": "c1"},
        {"cluster": "c1", "calls": "1"},
        {},
    ]


async def test_client_subscribe_yields_decoded_events(
    fake_adapter: tuple[str, FakeAdapter],
) -> None:
    address, _ = fake_adapter
    async with AdapterClient(address) as client:
        events = [event async for event in client.subscribe("SUBSCRIBE t")]
    assert events == [
        SubscribeHeader([Column("d", "date", False)], 1),
        Changes([Change(1, 1, (datetime.date(2020, 1, 1),))]),
        Progress(2),
        Changes([Change(2, 1, (datetime.date(2020, 1, 2),))]),
        Progress(3),
    ]


async def test_blocking_client_runs_the_same_calls(fake_adapter: tuple[str, FakeAdapter]) -> None:
    address, _ = fake_adapter

    # The fake server runs on this test's loop; the blocking client's calls must not block it.
    def use() -> tuple[list[Row], list[SubscribeEvent]]:
        with BlockingAdapterClient(address) as client:
            rows = list(client.execute("SELECT 1").results[0].rows)
            events = list(client.subscribe("SUBSCRIBE t"))
        return rows, events

    rows, events = await asyncio.to_thread(use)
    assert rows == [("SELECT 1",)]
    assert events[1] == Changes([Change(1, 1, (datetime.date(2020, 1, 1),))])
    assert len(events) == 5


async def test_user_and_password_travel_in_every_calls_metadata(
    fake_adapter: tuple[str, FakeAdapter],
) -> None:
    address, servicer = fake_adapter
    async with AdapterClient(address, retry=NO_RETRY, user="alice", password="pw") as client:
        await client.execute("SELECT 1")
        async for _ in client.subscribe("SUBSCRIBE t"):
            break
    async with AdapterClient(address, retry=NO_RETRY) as anonymous:
        await anonymous.execute("SELECT 1")
    alice = {"tidemark-user": "alice", "tidemark-password": "pw"}
    assert servicer.credentials == [alice, alice, {}]
