"""The driver<->task frames: every message kind round-trips with rows of every datum type, and
frames that are not messages are refused without building anything or allocating what they
claim."""

from __future__ import annotations

import datetime
import math
import pickle
import socket
import struct
import threading
import tracemalloc
from decimal import Decimal
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.compute.dataflow.ordering import NAN
from services.compute.dataflow.work import Work
from services.compute.spark import requests as rq
from services.compute.spark.codec import Codec, MalformedMessage
from services.compute.spark.transport import normalizer
from services.compute.spark.wire import (
    CODEC,
    MAX_FRAME_BYTES,
    ConnectionLost,
    ProtocolError,
    receive_message,
    send_message,
)
from tidemark.columnar import ColumnType
from tidemark.plan.scalar_types import ScalarType

INT64 = st.integers(-(2**63), 2**63 - 1)
# Diffs and times are Python ints; the codec carries any int, not only 64-bit ones.
ANY_INT = st.one_of(INT64, st.integers(-(2**200), 2**200))
FLOATS = st.one_of(st.floats(), st.sampled_from([math.nan, -0.0, 0.0, math.inf, -math.inf]))
DECIMALS = st.decimals(allow_nan=False, allow_infinity=False).filter(lambda d: d.is_finite())
DATES = st.dates()
TIMESTAMPS = st.datetimes()  # naive, years 1..9999: the engine's TIMESTAMP

DATUMS: dict[ColumnType, st.SearchStrategy[Any]] = {
    ColumnType.BOOL: st.booleans(),
    ColumnType.INT64: ANY_INT,
    ColumnType.FLOAT64: FLOATS,
    ColumnType.DECIMAL: DECIMALS,
    ColumnType.TEXT: st.text(),
    ColumnType.BYTES: st.binary(),
    ColumnType.DATE: DATES,
    ColumnType.TIMESTAMP: TIMESTAMPS,
    ColumnType.JSON: st.sampled_from(['{"a": [1, 2.5, null]}', "[]", '"x"', "3"]),
}

KINDS = st.lists(st.sampled_from(list(ColumnType)), max_size=6)


@st.composite
def typed_rows(draw: st.DrawFn, kinds: list[ColumnType]) -> list[tuple[Any, ...]]:
    row = st.tuples(*(st.one_of(st.none(), DATUMS[kind]) for kind in kinds))
    return draw(st.lists(row, max_size=8))


@st.composite
def update_lists(draw: st.DrawFn, kinds: list[ColumnType]) -> list[tuple[Any, int, int]]:
    rows = draw(typed_rows(kinds))
    return [(row, draw(ANY_INT), draw(ANY_INT)) for row in rows]


IDS = st.text(max_size=20)

STEP_IO = st.builds(
    rq.StepIO,
    st.text(),
    st.dictionaries(st.text(), st.text(), max_size=3),
    st.dictionaries(
        INT64,
        st.lists(st.tuples(st.text(), INT64, INT64, INT64, INT64), max_size=3),
        max_size=2,
    ),
    st.text(),
    st.binary(),
    st.booleans(),
)


@st.composite
def messages(draw: st.DrawFn) -> object:
    kinds = draw(KINDS)
    updates = update_lists(kinds)
    options: list[st.SearchStrategy[object]] = [
        st.builds(
            rq.Install,
            IDS,
            st.binary(),
            st.booleans(),
            st.one_of(st.none(), st.lists(INT64).map(tuple)),
            INT64,
        ),
        st.builds(rq.Drop, IDS),
        st.builds(
            rq.Exchange, INT64, INT64, st.lists(updates, max_size=3).map(tuple), st.booleans()
        ),
        st.builds(
            rq.Step,
            IDS,
            st.dictionaries(INT64, updates, max_size=3),
            st.one_of(st.none(), INT64),
            INT64,
            st.one_of(st.none(), STEP_IO),
        ),
        st.builds(rq.MeshAddress),
        st.builds(
            rq.JoinMesh,
            st.lists(st.tuples(st.text(), INT64), max_size=3).map(tuple),
            st.booleans(),
            INT64,
        ),
        st.builds(rq.MeshPeer, st.text(), INT64),
        st.builds(rq.ApplyIndex, IDS, updates, INT64),
        st.builds(rq.CompactIndex, IDS, INT64),
        st.builds(rq.Peek, IDS, INT64),
        st.builds(rq.IndexChanges, IDS, INT64, INT64),
        st.builds(rq.Stats, IDS),
        st.builds(
            rq.Hydrate,
            IDS,
            st.text(),
            st.dictionaries(st.text(), st.text(), max_size=4),
            INT64,
            st.dictionaries(INT64, st.lists(st.lists(st.text(), max_size=3).map(tuple)).map(tuple)),
            st.lists(st.text(), max_size=3).map(tuple),
            st.dictionaries(
                INT64,
                st.lists(
                    st.one_of(
                        st.none(),
                        st.builds(
                            rq.PartsShare,
                            st.text(),
                            st.lists(st.text(), max_size=3).map(tuple),
                            st.lists(st.text(), max_size=3).map(tuple),
                        ),
                    ),
                    max_size=2,
                ).map(tuple),
                max_size=2,
            ),
        ),
        st.builds(
            rq.LoadRows,
            IDS,
            st.dictionaries(INT64, st.lists(updates, max_size=2).map(tuple), max_size=3),
            updates,
            INT64,
        ),
        st.just(rq.Stop()),
    ]
    replies: list[st.SearchStrategy[Any]] = [
        st.none(),
        updates,  # Process
        st.dictionaries(st.tuples(*(DATUMS[kind] for kind in kinds)), ANY_INT),  # Peek
        st.tuples(INT64, st.builds(Work, INT64, INT64)),  # Stats
        st.tuples(INT64, ANY_INT),  # Hydrate
        st.builds(  # Step with StepIO
            rq.StepWritten,
            st.one_of(st.none(), st.tuples(st.text(), INT64, INT64)),
            INT64,
            INT64,
            ANY_INT,
            st.one_of(st.none(), updates),
        ),
    ]
    reply = st.builds(
        rq.Reply,
        st.one_of(replies),
        st.one_of(st.none(), st.sampled_from(["NotFound", "Internal"])),
        st.text(),
    )
    return draw(st.one_of(*options, reply))


def fingerprint(value: Any) -> Any:
    """What must survive the trip, comparable with ``==``: types exactly (a list stays a
    list, a bool a bool), a Decimal's digits and scale, a float's bits (any NaN as one)."""
    kind = type(value)
    if kind is float:
        return ("float", "nan" if value != value else struct.pack(">d", value))
    if kind is Decimal:
        return ("decimal", str(value))
    if kind in (list, tuple):
        return (kind.__name__, tuple(fingerprint(item) for item in value))
    if kind is dict:
        items = [(fingerprint(key), fingerprint(item)) for key, item in value.items()]
        return ("dict", tuple(sorted(items, key=repr)))
    if hasattr(value, "__dataclass_fields__"):
        fields = tuple(fingerprint(getattr(value, name)) for name in value.__dataclass_fields__)
        return (kind.__name__, fields)
    return (kind.__name__, value)


@given(messages())
def test_every_message_kind_round_trips(message: object) -> None:
    decoded = CODEC.decode(CODEC.encode(message))
    assert type(decoded) is type(message)
    assert fingerprint(decoded) == fingerprint(message)


@given(st.data())
def test_decoded_floats_normalise_as_the_engine_needs(data: st.DataObject) -> None:
    kinds = data.draw(KINDS)
    updates = data.draw(update_lists(kinds))
    decoded = CODEC.decode(CODEC.encode(rq.ApplyIndex("d", updates, 1)))
    assert isinstance(decoded, rq.ApplyIndex)
    types = [
        ScalarType.decimal(38, 0) if kind is ColumnType.DECIMAL else ScalarType(kind)
        for kind in kinds
    ]
    normalised = normalizer(types).apply([decoded.updates])
    for (row, _, _), (original, _, _) in zip(normalised, updates, strict=True):
        for kind, value, before in zip(kinds, row, original, strict=True):
            if kind is ColumnType.FLOAT64 and before is not None and before != before:
                assert value is NAN  # the one NaN the operators meet in dictionaries
            elif kind is ColumnType.FLOAT64 and before == 0.0:
                assert math.copysign(1.0, value) == 1.0  # -0.0 became 0.0


def test_a_decimal_keeps_its_scale_and_a_list_field_is_a_list() -> None:
    message = rq.Exchange(1, 2, ([((Decimal("1.50"), Decimal("-0E-3")), 3, -1)],))
    decoded = CODEC.decode(CODEC.encode(message))
    assert isinstance(decoded, rq.Exchange)
    assert type(decoded.inputs) is tuple and type(decoded.inputs[0]) is list
    [(row, time, diff)] = decoded.inputs[0]
    assert [str(value) for value in row] == ["1.50", "-0.000"] and (time, diff) == (3, -1)


def test_a_reply_keeps_the_shape_of_its_value() -> None:
    for value in [[((1,), 2, 3)], ((1,), 2, 3), {(1, "a"): 2}, (4, Work(5, 6)), None]:
        decoded = CODEC.decode(CODEC.encode(rq.Reply(value)))
        assert isinstance(decoded, rq.Reply) and fingerprint(decoded.value) == fingerprint(value)


def test_anything_else_does_not_encode() -> None:
    with pytest.raises(TypeError, match="not a registered message kind"):
        CODEC.encode(("hello", b"token"))
    with pytest.raises(TypeError, match="a set cannot travel"):
        CODEC.encode(rq.Reply({1, 2}))
    with pytest.raises(TypeError, match="only naive timestamps"):
        CODEC.encode(rq.Reply(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)))


def test_a_new_kind_is_one_registration() -> None:
    codec = Codec()

    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Ping:
        sequence: int
        sent: list[float]

    codec.register(1, Ping)
    assert codec.decode(codec.encode(Ping(3, [1.5]))) == Ping(3, [1.5])
    with pytest.raises(ValueError, match="registered already"):
        codec.register(1, rq.Stop)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">Q", len(payload)) + payload


HOSTILE = {
    "unknown tag": msgpack.packb([99, "x"]),
    "tag of the wrong type": msgpack.packb(["Drop", "x"]),
    "not an array": msgpack.packb({"tag": 2}),
    "empty array": msgpack.packb([]),
    "too few fields": msgpack.packb([8, "d", "url"]),
    "field of the wrong type": msgpack.packb([2, 5]),
    "list field that is not an array": msgpack.packb([4, "d", 7, 1]),
    "unknown extension": msgpack.packb([10, [False, msgpack.ExtType(77, b"\x00")], None, ""]),
    "malformed decimal": msgpack.packb([10, [False, msgpack.ExtType(1, b"1.2.3")], None, ""]),
    "struct of an unknown tag": msgpack.packb(
        [10, [False, msgpack.ExtType(5, msgpack.packb([99]))], None, ""]
    ),
    "truncated message": msgpack.packb([2, "a long dataflow id"])[:-3],
    "trailing bytes": msgpack.packb([2, "d"]) + b"\x00",
    "array claiming 2**32 - 1 items": b"\xdd\xff\xff\xff\xff" + b"\x00" * 16,
    "string claiming 4 GiB": b"\x92\x02\xdb\xff\xff\xff\xff",
    "a pickle": pickle.dumps(rq.Drop("d")),
    "not MessagePack": b"\xc1\xc1\xc1",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_frame_that_is_not_a_message_is_refused(name: str) -> None:
    driver, task = socket.socketpair()
    with driver, task:
        task.sendall(_frame(HOSTILE[name]))
        with pytest.raises(ProtocolError):
            receive_message(driver)


def test_kinds_nest_one_level_only() -> None:
    once = rq.Reply((1, rq.Reply(2)))
    assert CODEC.decode(CODEC.encode(once)) == once
    with pytest.raises(TypeError, match="a Reply cannot travel"):
        CODEC.encode(rq.Reply(rq.Reply(rq.Reply(2))))
    payload = msgpack.packb([10, [False, None], None, ""])
    for depth in range(3000):
        if depth == 2:
            with pytest.raises(MalformedMessage, match="unknown extension type 5"):
                CODEC.decode(payload)
        payload = msgpack.packb([10, [False, msgpack.ExtType(5, payload)], None, ""])
    with pytest.raises(MalformedMessage):
        CODEC.decode(payload)


def test_a_huge_length_prefix_is_refused_without_allocating_it() -> None:
    driver, task = socket.socketpair()
    with driver, task:
        task.sendall(struct.pack(">Q", MAX_FRAME_BYTES + 1))
        with pytest.raises(ProtocolError, match="over the"):
            receive_message(driver)

    # Within the limit but never sent: the reader holds only what arrived.
    driver, task = socket.socketpair()
    with driver:
        claimed = MAX_FRAME_BYTES - 1
        sender = threading.Thread(target=_send_and_close, args=(task, claimed, 3 << 20))
        tracemalloc.start()
        try:
            sender.start()
            with pytest.raises(ConnectionLost, match="closed by the peer"):
                receive_message(driver)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            sender.join()
        assert peak < 16 << 20  # a few MiB arrived; the claim was 64 GiB


def _send_and_close(sock: socket.socket, claimed: int, sent: int) -> None:
    with sock:
        sock.sendall(struct.pack(">Q", claimed) + b"\x00" * sent)


def test_a_frame_cut_short_is_a_lost_connection() -> None:
    driver, task = socket.socketpair()
    with driver:
        with task:
            task.sendall(_frame(CODEC.encode(rq.Drop("d")))[:-2])
        with pytest.raises(ConnectionLost):
            receive_message(driver)


def test_messages_cross_a_socket_in_order() -> None:
    driver, task = socket.socketpair()
    with driver, task:
        sent = [rq.Peek("d", 3), rq.Reply({(1, NAN): 2}), rq.Stop()]
        for message in sent:
            send_message(driver, message)
        received = [receive_message(task) for _ in sent]
        assert [fingerprint(m) for m in received] == [fingerprint(m) for m in sent]


def test_messagepack_timestamps_are_plain_ints_not_objects() -> None:
    # Extension -1 is MessagePack's own timestamp; the codec never sends one.
    stamp = msgpack.packb(msgpack.Timestamp(5, 0))
    payload = b"\x94\x0a\x92\xc2" + stamp + b"\xc0\xa0"  # [10, [False, <stamp>], None, ""]
    decoded = CODEC.decode(payload)
    assert isinstance(decoded, rq.Reply) and type(decoded.value) is int
    assert decoded.value == 5 * 10**9


ALLOWED = (
    type(None),
    bool,
    int,
    float,
    str,
    bytes,
    Decimal,
    datetime.date,
    datetime.datetime,
    tuple,
    list,
    dict,
)
REGISTERED = (
    rq.Install,
    rq.Drop,
    rq.Step,
    rq.StepIO,
    rq.StepWritten,
    rq.MeshAddress,
    rq.JoinMesh,
    rq.MeshPeer,
    rq.Exchange,
    rq.ApplyIndex,
    rq.CompactIndex,
    rq.Peek,
    rq.IndexChanges,
    rq.Stats,
    rq.Hydrate,
    rq.LoadRows,
    rq.PartsShare,
    rq.Stop,
    rq.Ping,
    rq.Heartbeat,
    rq.Reply,
    Work,
)
"""Every kind a frame may decode to, written out (not read from the codec)."""


def only_engine_values(value: Any) -> bool:
    if isinstance(value, REGISTERED):
        return all(only_engine_values(getattr(value, f)) for f in value.__dataclass_fields__)
    if type(value) not in ALLOWED:
        return False
    if type(value) in (tuple, list):
        return all(only_engine_values(item) for item in value)
    if type(value) is dict:
        return all(only_engine_values(k) and only_engine_values(v) for k, v in value.items())
    return True


@given(messages(), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4))
def test_corrupted_frames_decode_to_messages_or_are_refused(
    message: object, corruptions: list[tuple[int, int]]
) -> None:
    payload = bytearray(CODEC.encode(message))
    for position, byte in corruptions:
        payload[position % len(payload)] = byte
    try:
        decoded = CODEC.decode(bytes(payload))
    except MalformedMessage:
        return
    assert isinstance(decoded, REGISTERED) and only_engine_values(decoded)


def test_rows_to_load_keep_their_lists() -> None:
    """A ``LoadRows``'s inputs per node are lists again (a list field inside a tuple inside
    a dict), as the operators take them."""
    message = rq.LoadRows("d", {3: ([((1, "a"), 5, 2)], [])}, [((1,), 5, 1)], 6)
    decoded = CODEC.decode(CODEC.encode(message))
    assert decoded == message
    assert isinstance(decoded, rq.LoadRows)
    assert type(decoded.nodes[3]) is tuple and type(decoded.nodes[3][0]) is list
    assert type(decoded.index) is list
