"""Hypothesis strategies for protobuf messages, built from their descriptors: every field may be
set (scalars over their whole range and edge values, strings and bytes of any content,
repeated fields of a few items, nested messages to a bounded depth, enums including numbers
the schema does not name). For fuzzing services with well-formed but meaningless requests."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from hypothesis import strategies as st

FD = descriptor.FieldDescriptor
MAX_DEPTH = 3

_INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 2**31, 1_800_000_000_000]),
    st.integers(-(2**63), 2**63 - 1),
)
_UINT64 = st.one_of(
    st.sampled_from([0, 1, 2**64 - 1, 2**63, 1_800_000_000_000]), st.integers(0, 2**64 - 1)
)
_INT32 = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)
)
_UINT32 = st.integers(0, 2**32 - 1)
_TEXT = st.one_of(
    st.sampled_from(["", "u1", "s1", "default", "data", "catalog", "SELECT 1", "\x00", "u" * 300]),
    st.text(max_size=40),
)

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FD.TYPE_INT64: _INT64,
    FD.TYPE_SINT64: _INT64,
    FD.TYPE_SFIXED64: _INT64,
    FD.TYPE_UINT64: _UINT64,
    FD.TYPE_FIXED64: _UINT64,
    FD.TYPE_INT32: _INT32,
    FD.TYPE_SINT32: _INT32,
    FD.TYPE_SFIXED32: _INT32,
    FD.TYPE_UINT32: _UINT32,
    FD.TYPE_FIXED32: _UINT32,
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FD.TYPE_FLOAT: st.floats(width=32, allow_nan=True, allow_infinity=True),
    FD.TYPE_STRING: _TEXT,
    FD.TYPE_BYTES: st.binary(max_size=64),
}


def message_class(message_descriptor: descriptor.Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(message_descriptor)


def _value(field: descriptor.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FD.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if field.type == FD.TYPE_ENUM:
        named = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(named), st.integers(-5, 100))
    return _SCALARS[field.type]


@st.composite
def _message(draw: st.DrawFn, message_descriptor: descriptor.Descriptor, depth: int) -> Message:
    cls = message_class(message_descriptor)
    built = cls()
    for field in message_descriptor.fields:
        if field.message_type is not None and depth >= MAX_DEPTH:
            continue
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            entries = draw(
                st.dictionaries(_value(key_field, depth), _value(value_field, depth), max_size=3)
            )
            target = getattr(built, field.name)
            for key, value in entries.items():
                if value_field.message_type is not None:
                    target[key].CopyFrom(value)
                else:
                    target[key] = value
            continue
        if field.is_repeated:
            items = draw(st.lists(_value(field, depth), max_size=4))
            target = getattr(built, field.name)
            for item in items:
                if field.message_type is not None:
                    target.add().CopyFrom(item)
                else:
                    target.append(item)
        elif field.message_type is not None:
            getattr(built, field.name).CopyFrom(draw(_value(field, depth)))
        else:
            setattr(built, field.name, draw(_value(field, depth)))
    return built


def messages(
    message_descriptor: descriptor.Descriptor, depth: int = 0
) -> st.SearchStrategy[Message]:
    """Random messages of ``message_descriptor``'s type."""
    return _message(message_descriptor, depth)
