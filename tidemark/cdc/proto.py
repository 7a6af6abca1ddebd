"""CDCv2 messages on the wire (``tidemark.v1.CdcMessage``), for the u64 timeline.

Row-at-a-time updates carry opaque ``bytes`` data. The columnar ``arrow_ipc`` form belongs to
the storage service, which passes its decoder to ``from_proto``; without one, a message using
it is rejected rather than read as if it had no updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar, overload

from tidemark.cdc.messages import Message, Progress, Updates
from tidemark.errors import InvalidArgument
from tidemark.frontier import Antichain
from tidemark.lattice import U64, is_u64
from tidemark.updates import Update
from tidemark.v1 import common_pb2

D = TypeVar("D")

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

ArrowDecoder = Callable[[bytes], Iterable[Update[D, int]]]
"""Turns an ``Updates.arrow_ipc`` payload into update triples."""


def frontier_to_proto(frontier: Antichain[int]) -> common_pb2.Frontier:
    for t in frontier:
        _check_time(t)
    return common_pb2.Frontier(elements=sorted(frontier))


def frontier_from_proto(proto: common_pb2.Frontier) -> Antichain[int]:
    """The antichain the elements name; a list that is not an antichain (e.g. ``[3, 5]`` on
    the u64 timeline, or a repeated time) is malformed."""
    frontier = Antichain(U64, proto.elements)
    if len(frontier) != len(proto.elements):
        raise InvalidArgument(f"frontier {list(proto.elements)} is not an antichain")
    return frontier


def to_proto(message: Message[bytes, int]) -> common_pb2.CdcMessage:
    if isinstance(message, Updates):
        rows = []
        for data, time, diff in message.updates:
            if not isinstance(data, bytes):
                raise InvalidArgument(f"CDC data on the wire is bytes, got {type(data).__name__}")
            _check_time(time)
            if not _I64_MIN <= diff <= _I64_MAX:
                raise InvalidArgument(f"diff {diff} does not fit in 64 bits")
            rows.append(common_pb2.Update(data=data, time=time, diff=diff))
        return common_pb2.CdcMessage(updates=common_pb2.Updates(updates=rows))
    if isinstance(message, Progress):
        counts = []
        for time, count in message.counts:
            _check_time(time)
            if not is_u64(count):
                raise InvalidArgument(f"count {count} at {time} does not fit in 64 bits")
            counts.append(common_pb2.TimeCount(time=time, count=count))
        # Both bounds are always present on the wire, even when empty: a missing upper must not
        # be mistaken for the end of the stream.
        return common_pb2.CdcMessage(
            progress=common_pb2.Progress(
                lower=frontier_to_proto(message.lower),
                upper=frontier_to_proto(message.upper),
                counts=counts,
            )
        )
    raise InvalidArgument(f"not a CDC message: {type(message).__name__}")


@overload
def from_proto(proto: common_pb2.CdcMessage) -> Message[bytes, int]: ...


@overload
def from_proto(
    proto: common_pb2.CdcMessage, decode_arrow: ArrowDecoder[D]
) -> Message[bytes | D, int]: ...


def from_proto(
    proto: common_pb2.CdcMessage, decode_arrow: ArrowDecoder[D] | None = None
) -> Message[bytes | D, int]:
    """The message ``proto`` carries. Malformed input (no kind, missing progress bounds,
    bounds that are not antichains, counts outside their interval, zero diffs, Arrow payload
    without a decoder) raises ``InvalidArgument``."""
    kind = proto.WhichOneof("kind")
    if kind == "updates":
        updates: list[Update[bytes | D, int]] = [
            (u.data, u.time, u.diff) for u in proto.updates.updates
        ]
        if proto.updates.arrow_ipc:
            if decode_arrow is None:
                raise InvalidArgument("CDC updates in Arrow IPC form, and no decoder to read them")
            updates.extend(decode_arrow(proto.updates.arrow_ipc))
        return Updates(updates)
    if kind == "progress":
        progress = proto.progress
        if not progress.HasField("lower") or not progress.HasField("upper"):
            raise InvalidArgument("CDC progress statement without a lower or an upper frontier")
        return Progress(
            frontier_from_proto(progress.lower),
            frontier_from_proto(progress.upper),
            [(c.time, c.count) for c in progress.counts],
        )
    raise InvalidArgument("CDC message with neither updates nor progress")


def _check_time(t: int) -> None:
    if not is_u64(t):
        raise InvalidArgument(f"time {t!r} is not an unsigned 64-bit integer")
