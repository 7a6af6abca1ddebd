"""Who a gRPC call acts as: trust takes the metadata's user at its word, password checks it
against the catalog's SCRAM verifiers (and remembers a success briefly)."""

from __future__ import annotations

import pytest

from services.adapter.authentication import (
    PASSWORD,
    TRUST,
    CallAuthenticator,
    Principal,
)
from services.adapter.catalog_cache import CatalogState
from services.adapter.sql.errors import SqlError
from tidemark.scram import ScramVerifier
from tidemark.v1 import catalog_pb2


def _role(name: str, password: str | None, *, login: bool = True) -> catalog_pb2.CatalogItem:
    role = catalog_pb2.Role(login=login)
    if password is not None:
        role.password.CopyFrom(ScramVerifier.from_password(password).to_proto())
    return catalog_pb2.CatalogItem(
        id=f"u{len(name)}", name=catalog_pb2.QualifiedName(item=name), role=role
    )


def test_trust_takes_the_user_at_its_word_and_defaults_to_the_superuser() -> None:
    items = [_role("alice", "s3cret"), _role("carol", None, login=False)]
    auth = CallAuthenticator(TRUST, lambda: items, "admin")
    assert auth.from_metadata([]) == Principal("admin")
    # No password check: any password, or none, is taken.
    assert auth.from_metadata([("tidemark-user", "alice"), ("tidemark-password", "x")]) == (
        Principal("alice")
    )
    # Still, as PostgreSQL's trust: the role must exist and may log in.
    for user, message in (
        ("nobody", 'role "nobody" does not exist'),
        ("carol", 'role "carol" is not permitted to log in'),
    ):
        with pytest.raises(SqlError) as caught:
            auth.from_metadata([("tidemark-user", user)])
        assert (caught.value.code, caught.value.message) == ("28000", message)


def test_password_mode_checks_the_verifier_and_login() -> None:
    items = [_role("alice", "s3cret"), _role("carol", "pw", login=False), _role("dan", None)]
    auth = CallAuthenticator(PASSWORD, lambda: items)
    good = [("tidemark-user", "alice"), ("tidemark-password", "s3cret")]
    assert auth.from_metadata(good) == Principal("alice")
    for user, password in (("alice", "wrong"), ("carol", "pw"), ("dan", ""), ("nobody", "x")):
        with pytest.raises(SqlError) as caught:
            auth.authenticate(user, password)
        assert caught.value.code == "28P01"
        assert caught.value.message == f'password authentication failed for user "{user}"'
    with pytest.raises(SqlError) as missing:
        auth.from_metadata([])
    assert missing.value.code == "28000"


def test_a_verified_password_is_remembered_until_the_verifier_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    items = [_role("alice", "s3cret")]
    now = [0.0]
    auth = CallAuthenticator(PASSWORD, lambda: items, cache_seconds=60, clock=lambda: now[0])
    calls = []
    original = ScramVerifier.matches

    def counting(self: ScramVerifier, password: str) -> bool:
        calls.append(password)
        return original(self, password)

    monkeypatch.setattr(ScramVerifier, "matches", counting)
    auth.authenticate("alice", "s3cret")
    auth.authenticate("alice", "s3cret")
    assert calls == ["s3cret"]  # PBKDF2 ran once
    now[0] = 61.0
    auth.authenticate("alice", "s3cret")
    assert len(calls) == 2  # expired: checked again
    items[0] = _role("alice", "changed")  # ALTER ROLE ... PASSWORD
    with pytest.raises(SqlError):
        auth.authenticate("alice", "s3cret")
    assert auth.authenticate("alice", "changed") == Principal("alice")
    items.clear()  # DROP ROLE
    with pytest.raises(SqlError):
        auth.authenticate("alice", "changed")


def test_roles_are_looked_up_in_the_catalog_state_index() -> None:
    state = CatalogState(1, {"u5": _role("alice", "s3cret")})
    auth = CallAuthenticator(PASSWORD, lambda: state)
    assert auth.authenticate("alice", "s3cret") == Principal("alice")
    assert set(state.memo["roles_by_name"]) == {"alice"}
    with pytest.raises(SqlError):
        auth.authenticate("bob", "s3cret")
