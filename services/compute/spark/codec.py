"""Typed messages as MessagePack: only registered dataclasses and engine values go in or out.

A message is a MessagePack array ``[tag, field, ...]``: the tag names a registered dataclass
kind and its fields follow in declaration order. Field values are the engine's values only:
None, bool, int, float, str, bytes, tuples (rows, updates), lists and dicts of them, and four
extension types: ``Decimal`` (its text, so the scale survives), ``date`` (days since
0001-01-01), ``datetime`` (naive, microseconds from 1970), and ints outside 64 bits (signed
big-endian bytes). A registered kind may also sit inside a field (``Work`` in a ``Stats``
reply), as an extension holding its own ``[tag, field, ...]``, one level deep at most.

Decoding builds nothing else: an unknown tag or extension code, a field count that does not
match, a scalar field of the wrong type or bytes that are not MessagePack raise
``MalformedMessage`` (MessagePack's own timestamp extension is read as a plain int).
MessagePack's own limits keep a claimed array, map or string length within the frame's size,
so a hostile length allocates nothing.

MessagePack arrays come back as tuples. A field annotated with ``list`` (``list[Update]``,
``tuple[list[Update], ...]``) is made a list again from its annotation; a field annotated
``Any`` (``Reply.value``) carries whether its top level was a list.

Registering a kind is one line (see ``wire.py``)::

    CODEC.register(12, Heartbeat)

with a tag no other kind uses: both ends run the same code, so tags only need to be unique
and stable within one build.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Callable
from decimal import Decimal
from operator import attrgetter
from typing import Any

import msgpack

_EXT_DECIMAL = 1
_EXT_DATE = 2
_EXT_TIMESTAMP = 3
_EXT_BIG_INT = 4
_EXT_STRUCT = 5

_EPOCH = datetime.datetime(1970, 1, 1)
_MICROSECOND = datetime.timedelta(microseconds=1)

Convert = Callable[[Any], Any]


class MalformedMessage(ValueError):
    """Bytes that are not a message of a registered kind."""


@dataclasses.dataclass(frozen=True)
class _Kind:
    tag: int
    cls: type
    fields: Callable[[Any], tuple[Any, ...]]
    # Per field: how to turn its value into MessagePack, and back (None: as it is).
    encoders: tuple[Convert | None, ...]
    decoders: tuple[Convert | None, ...]
    converts: bool

    def encode(self, message: Any) -> list[Any]:
        values = self.fields(message)
        if self.converts:
            values = tuple(
                value if encode is None else encode(value)
                for value, encode in zip(values, self.encoders, strict=True)
            )
        return [self.tag, *values]

    def decode(self, array: tuple[Any, ...]) -> Any:
        if len(array) != len(self.decoders) + 1:
            raise MalformedMessage(
                f"{self.cls.__name__} has {len(self.decoders)} fields, not {len(array) - 1}"
            )
        values = [
            value if decode is None else decode(value)
            for value, decode in zip(array[1:], self.decoders, strict=True)
        ]
        try:
            return self.cls(*values)
        except Exception as error:  # a kind that validates its fields refused them
            raise MalformedMessage(f"not a {self.cls.__name__}: {error}") from None


class Codec:
    """A set of message kinds, each a dataclass under a small integer tag."""

    def __init__(self) -> None:
        self._by_tag: dict[int, _Kind] = {}
        self._by_type: dict[type, _Kind] = {}
        self._default = self._make_default(nested=False)
        self._inner_default = self._make_default(nested=True)
        self._ext_hook = self._make_ext_hook(nested=False)
        self._inner_ext_hook = self._make_ext_hook(nested=True)

    def register(self, tag: int, cls: type) -> None:
        """Adds the dataclass ``cls`` under ``tag``; its fields' annotations say which of
        them come back as lists."""
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        if tag in self._by_tag or cls in self._by_type:
            raise ValueError(f"tag {tag} or {cls.__name__} is registered already")
        names = [field.name for field in dataclasses.fields(cls) if field.init]
        hints = typing.get_type_hints(cls)
        encoders: list[Convert | None] = []
        decoders: list[Convert | None] = []
        for name in names:
            encode, decode = _field_codec(hints[name])
            encoders.append(encode)
            decoders.append(decode)
        kind = _Kind(tag, cls, _getter(names), tuple(encoders), tuple(decoders), any(encoders))
        self._by_tag[tag] = kind
        self._by_type[cls] = kind

    def encode(self, message: object) -> bytes:
        kind = self._by_type.get(type(message))
        if kind is None:
            raise TypeError(f"{type(message).__name__} is not a registered message kind")
        packed: bytes = msgpack.packb(
            kind.encode(message), default=self._default, use_bin_type=True
        )
        return packed

    def decode(self, data: bytes | bytearray | memoryview) -> object:
        """The message in ``data``; ``MalformedMessage`` for anything but a whole message
        of a registered kind."""
        try:
            return self._message(self._unpack(data, self._ext_hook))
        except MalformedMessage:
            raise
        except (ValueError, TypeError, ArithmeticError, RecursionError) as e:
            # msgpack's ExtraData, FormatError and StackError are ValueErrors, a bad decimal
            # an ArithmeticError, extensions nested in extensions a RecursionError.
            raise MalformedMessage(f"not a message: {type(e).__name__}: {e}") from None

    def _unpack(
        self, data: bytes | bytearray | memoryview, ext_hook: Callable[[int, bytes], Any]
    ) -> Any:
        return msgpack.unpackb(
            data,
            use_list=False,
            raw=False,
            strict_map_key=False,  # rows (tuples) key a Peek reply
            ext_hook=ext_hook,
            # MessagePack's own timestamps are not ours: read them as plain ints.
            timestamp=2,
        )

    def _message(self, array: Any) -> object:
        if not isinstance(array, tuple) or not array or type(array[0]) is not int:
            raise MalformedMessage("a message is an array that starts with its tag")
        kind = self._by_tag.get(array[0])
        if kind is None:
            raise MalformedMessage(f"unknown message tag {array[0]}")
        return kind.decode(array)

    def _make_ext_hook(self, nested: bool) -> Callable[[int, bytes], Any]:
        """Reads extensions; a registered kind inside a message (``nested`` False) is read
        with ``nested`` True, where one more is refused: nesting without end would otherwise
        exhaust the C stack before Python noticed."""
        decimal, from_ordinal, from_bytes = Decimal, datetime.date.fromordinal, int.from_bytes

        def ext_hook(code: int, data: bytes) -> Any:
            # Called once per value MessagePack has no type for, so the two common ones
            # come first and bind their functions locally.
            if code == _EXT_DECIMAL:
                return decimal(data.decode("ascii"))
            if code == _EXT_DATE:
                return from_ordinal(from_bytes(data, "big"))
            if code == _EXT_STRUCT and not nested:
                return self._message(self._unpack(data, self._inner_ext_hook))
            read = _READERS.get(code)
            if read is None:
                raise MalformedMessage(f"unknown extension type {code}")
            return read(data)

        return ext_hook

    def _make_default(self, nested: bool) -> Callable[[Any], msgpack.ExtType]:
        by_type = self._by_type
        new, ext_type, decimal, date = tuple.__new__, msgpack.ExtType, Decimal, datetime.date

        def default(value: Any) -> msgpack.ExtType:
            """What MessagePack has no type for (called only for those values)."""
            kind = type(value)
            # ExtType's constructor checks cost more than the rest, and the codes and data
            # here are valid: made directly (it is a named tuple).
            if kind is decimal:
                return new(ext_type, (_EXT_DECIMAL, str(value).encode("ascii")))
            if kind is date:
                return new(ext_type, (_EXT_DATE, value.toordinal().to_bytes(4, "big")))
            write = _WRITERS.get(kind)
            if write is not None:
                return write(value)
            struct = by_type.get(kind)
            if struct is not None and not nested:
                packed = msgpack.packb(
                    struct.encode(value), default=self._inner_default, use_bin_type=True
                )
                return _ext((_EXT_STRUCT, packed))
            raise TypeError(f"a {kind.__name__} cannot travel between driver and tasks")

        return default


def _ext(code_and_data: tuple[int, bytes]) -> msgpack.ExtType:
    """An ``ExtType`` without its constructor's checks (the codes and data here are valid)."""
    return tuple.__new__(msgpack.ExtType, code_and_data)


def _write_timestamp(value: datetime.datetime) -> msgpack.ExtType:
    if value.tzinfo is not None:
        raise TypeError("only naive timestamps travel (the engine's are)")
    micros = (value - _EPOCH) // _MICROSECOND
    return _ext((_EXT_TIMESTAMP, micros.to_bytes(8, "big", signed=True)))


def _write_big_int(value: int) -> msgpack.ExtType:
    """Called for ints only when they are beyond MessagePack's 64 bits."""
    size = (value.bit_length() + 8) // 8
    return _ext((_EXT_BIG_INT, value.to_bytes(size, "big", signed=True)))


def _read_timestamp(data: bytes) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(microseconds=int.from_bytes(data, "big", signed=True))


def _read_big_int(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


_WRITERS: dict[type, Callable[[Any], msgpack.ExtType]] = {
    datetime.datetime: _write_timestamp,
    int: _write_big_int,
}
_READERS: dict[int, Callable[[bytes], Any]] = {
    _EXT_TIMESTAMP: _read_timestamp,
    _EXT_BIG_INT: _read_big_int,
}


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda _: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda message: (get(message),)
    many: Callable[[Any], tuple[Any, ...]] = attrgetter(*names)
    return many


def _field_codec(hint: Any) -> tuple[Convert | None, Convert | None]:
    """How a field of type ``hint`` is written and read back beyond plain MessagePack."""
    if hint is Any:
        return _mark_list, _unmark_list
    return None, _decoder(hint)


def _mark_list(value: Any) -> tuple[bool, Any]:
    return (type(value) is list, value)


def _unmark_list(marked: Any) -> Any:
    is_list, value = marked
    if is_list is True:
        return list(value)
    if is_list is False:
        return value
    raise MalformedMessage("a dynamic field starts with whether it is a list")


_SCALARS: dict[Any, tuple[type, ...]] = {
    str: (str,),
    bytes: (bytes,),
    bool: (bool,),
    int: (int,),
    float: (float, int),
}


def _decoder(hint: Any) -> Convert | None:
    """A check or conversion for a value annotated ``hint`` (None: nothing to do).

    Scalars are checked, ``list`` containers rebuilt; a ``list`` nested in a tuple or a dict
    value is rebuilt too. Other containers are MessagePack's own tuples and dicts already.
    """
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _SCALARS:
        expected = _SCALARS[hint]

        def check(value: Any) -> Any:
            if not isinstance(value, expected):
                raise MalformedMessage(f"expected {hint.__name__}, got {type(value).__name__}")
            return value

        return check
    if origin is list:
        inner = _decoder(args[0]) if args else None
        if inner is None:
            return _as_list
        each: Convert = inner
        return lambda value: [each(item) for item in _as_tuple(value)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner = _decoder(args[0])
        if inner is None:
            return _as_tuple
        every: Convert = inner
        return lambda value: tuple(every(item) for item in _as_tuple(value))
    if origin is dict:
        inner = _decoder(args[1])
        if inner is None:
            return _as_dict
        per_key: Convert = inner
        return lambda value: {key: per_key(item) for key, item in _as_dict(value).items()}
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if len(options) == 1 and len(args) == 2:
            inner = _decoder(options[0])
            if inner is None:
                return None
            present: Convert = inner
            return lambda value: None if value is None else present(value)
    return None


def _as_list(value: Any) -> list[Any]:
    return list(_as_tuple(value))


def _as_tuple(value: Any) -> tuple[Any, ...]:
    if type(value) is not tuple:
        raise MalformedMessage(f"expected an array, got {type(value).__name__}")
    return value


def _as_dict(value: Any) -> dict[Any, Any]:
    if type(value) is not dict:
        raise MalformedMessage(f"expected a map, got {type(value).__name__}")
    return value
