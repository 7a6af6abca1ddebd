"""Signed sessions (services/adapter/session_signing.py) and the keys file
(tidemark/session_keys.py): any change to a signed session is refused, keys rotate."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from services.adapter.session_signing import INVALID, SessionSigner, canonical
from tidemark.errors import InvalidArgument
from tidemark.session_keys import (
    KeyFileError,
    SessionKey,
    ensure_keys_file,
    key_line,
    new_key,
    parse_keys,
    read_keys,
)
from tidemark.v1 import adapter_pb2

OLD = SessionKey("old", b"o" * 32)
NEW = SessionKey("new", b"n" * 32)

settings_maps = st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=4)
sessions = st.builds(
    lambda settings, transaction: adapter_pb2.Session(settings=settings, transaction=transaction),
    settings_maps,
    st.binary(max_size=64),
).filter(lambda s: bool(s.settings) or bool(s.transaction))


def signed(session: adapter_pb2.Session, signer: SessionSigner, user: str) -> adapter_pb2.Session:
    copy = adapter_pb2.Session()
    copy.CopyFrom(session)
    signer.sign(copy, user)
    return copy


def rejected(signer: SessionSigner, session: adapter_pb2.Session, user: str) -> bool:
    try:
        signer.verify(session, user)
    except InvalidArgument as exc:
        assert exc.message == INVALID
        return True
    return False


@given(sessions, st.text(max_size=8))
def test_a_signed_session_verifies_for_its_user_only(
    session: adapter_pb2.Session, user: str
) -> None:
    signer = SessionSigner([NEW])
    session = signed(session, signer, user)
    assert session.signature.startswith(b"new:")
    assert not rejected(signer, session, user)
    assert rejected(signer, session, user + "x")
    assert rejected(SessionSigner([SessionKey("new", b"m" * 32)]), session, user)


@given(sessions, st.data())
def test_any_changed_byte_of_a_signed_session_is_rejected(
    session: adapter_pb2.Session, data: st.DataObject
) -> None:
    """Flip one byte anywhere in the session as it travels: either it no longer parses, or the
    result is refused, or it is the very same session (a change protobuf itself discards,
    such as an unknown field), or an empty one (a new session: nothing of the old one is
    kept)."""
    signer = SessionSigner([NEW])
    wire = signed(session, signer, "alice").SerializeToString()
    index = data.draw(st.integers(0, len(wire) - 1), label="index")
    flip = data.draw(st.integers(1, 255), label="xor")
    changed = bytearray(wire)
    changed[index] ^= flip
    try:
        tampered = adapter_pb2.Session.FromString(bytes(changed))
    except DecodeError:
        return
    if rejected(signer, tampered, "alice") or not (tampered.settings or tampered.transaction):
        return
    assert dict(tampered.settings) == dict(session.settings)
    assert tampered.transaction == session.transaction


@given(sessions, st.data())
def test_any_edit_of_a_part_is_rejected(session: adapter_pb2.Session, data: st.DataObject) -> None:
    """The same, part by part: a setting's name or value, the transaction, the signature."""
    signer = SessionSigner([NEW])
    session = signed(session, signer, "")
    part = data.draw(st.sampled_from(["setting", "transaction", "signature", "drop"]))
    if part == "transaction" or (part == "setting" and not session.settings):
        original = session.transaction
        session.transaction = data.draw(st.binary(max_size=64).filter(lambda b: b != original))
    elif part == "setting":
        name = data.draw(st.sampled_from(sorted(session.settings)))
        value = session.settings[name]
        if data.draw(st.booleans()):
            session.settings[name] = data.draw(st.text(max_size=12).filter(lambda v: v != value))
        else:
            del session.settings[name]
            session.settings[data.draw(st.text(max_size=12).filter(lambda n: n != name))] = value
    elif part == "signature":
        signature = bytearray(session.signature)
        signature[data.draw(st.integers(0, len(signature) - 1))] ^= data.draw(st.integers(1, 255))
        session.signature = bytes(signature)
    else:
        session.signature = b""
    if session.settings or session.transaction:
        assert rejected(signer, session, "")


def test_dropping_the_transaction_is_rejected() -> None:
    """Stripping the open transaction (say, to lose its read set) while keeping the settings
    is an edit like any other."""
    signer = SessionSigner([NEW])
    session = signed(
        adapter_pb2.Session(settings={"cluster": "c"}, transaction=b"TMTX..."), signer, "bob"
    )
    session.transaction = b""
    assert rejected(signer, session, "bob")


def test_an_empty_session_needs_no_signature_and_gets_none() -> None:
    signer = SessionSigner([NEW])
    assert not rejected(signer, adapter_pb2.Session(), "anyone")
    assert not rejected(signer, adapter_pb2.Session(signature=b"junk"), "anyone")
    empty = adapter_pb2.Session()
    signer.sign(empty, "anyone")
    assert empty.signature == b""


def test_unsigned_or_unknown_key_sessions_are_rejected() -> None:
    signer = SessionSigner([NEW])
    assert rejected(signer, adapter_pb2.Session(settings={"cluster": "x"}), "")
    assert rejected(signer, adapter_pb2.Session(transaction=b"t"), "")
    other = signed(adapter_pb2.Session(settings={"cluster": "x"}), SessionSigner([OLD]), "")
    assert rejected(signer, other, "")
    other.signature = b"new" + other.signature[3:]  # the right id does not make the MAC right
    assert rejected(signer, other, "")


def test_rotation_old_key_verifies_while_configured() -> None:
    session = signed(adapter_pb2.Session(settings={"cluster": "c"}), SessionSigner([OLD]), "u")
    # Step 1: the new key is added second (verifies only); step 2: moved first (signs).
    for keys in ([OLD, NEW], [NEW, OLD]):
        assert not rejected(SessionSigner(keys), session, "u")
    rotated = SessionSigner([NEW, OLD])
    resigned = signed(session, rotated, "u")
    assert resigned.signature.startswith(b"new:")
    # Step 3: the old key is removed; what it signed no longer verifies, the re-signed does.
    assert rejected(SessionSigner([NEW]), session, "u")
    assert not rejected(SessionSigner([NEW]), resigned, "u")


def test_the_encoding_ignores_map_order_and_separates_parts() -> None:
    one = canonical({"a": "1", "b": "2"}, b"t", "u", "k")
    assert one == canonical({"b": "2", "a": "1"}, b"t", "u", "k")
    assert one != canonical({"a": "1", "b": "2"}, b"", "tu", "k")
    assert canonical({"ab": ""}, b"", "", "k") != canonical({"a": "b"}, b"", "", "k")


# -- the keys file --------------------------------------------------------------------------


def test_keys_file_lines_in_order() -> None:
    text = f"# rotated 2026-11\n\n{key_line(NEW)}\n  {key_line(OLD)}  \n"
    assert parse_keys(text) == [NEW, OLD]
    assert "o" * 8 not in repr(parse_keys(text))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no keys"),
        ("# only a comment\n", "no keys"),
        ("nokey\n", "line 1: expected id:base64key"),
        (f"bad id:{base64.b64encode(b'x' * 32).decode()}\n", "line 1: expected id:base64key"),
        ("k:not base64!\n", "line 1: key 'k' is not valid base64"),
        (f"k:{base64.b64encode(b'short').decode()}\n", "has 5 bytes, at least 16 needed"),
        (f"{key_line(NEW)}\n{key_line(NEW)}\n", "line 2: key id 'new' appears twice"),
    ],
)
def test_bad_keys_files_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(KeyFileError, match=message):
        parse_keys(text, "keys.txt")


def test_ensure_keys_file_creates_once_owner_only(tmp_path: Path) -> None:
    path = ensure_keys_file(tmp_path / "sub" / "keys")
    first = read_keys(path)
    assert [k.key_id for k in first] == ["local"] and len(first[0].secret) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_keys(ensure_keys_file(path)) == first
    with pytest.raises(KeyFileError, match="cannot read session keys file"):
        read_keys(tmp_path / "missing")


def test_a_signer_from_a_file_signs_with_its_first_key(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{key_line(NEW)}\n{key_line(OLD)}\n")
    signer = SessionSigner.from_file(str(path))
    session = signed(adapter_pb2.Session(settings={"x": "y"}), signer, "")
    assert session.signature.startswith(b"new:")
    generated = SessionSigner.from_file("")
    assert [k.key_id for k in generated.keys] == ["ephemeral"]
    assert generated.keys[0].secret != new_key("ephemeral").secret
