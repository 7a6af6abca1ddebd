"""The privilege rules over a hand-made catalog: superusers, owners and their members, grants
to roles and PUBLIC, views read with their owner's rights, what each role may list; and the
GRANT / REVOKE / ALTER ... OWNER TO syntax."""

from __future__ import annotations

import pytest

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState
from services.adapter.ddl_grants import _change
from services.adapter.privileges import (
    Privileges,
    check_buffered_write,
    check_role_unused,
    visible_view,
)
from services.adapter.sql import parse
from services.adapter.sql import statements as st
from services.adapter.sql.errors import SqlError
from tidemark.v1 import catalog_pb2


def _item(
    global_id: str,
    owner: str,
    at: tuple[str, str, str],
    *,
    grants: dict[str, list[str]] | None = None,
    depends_on: tuple[str, ...] = (),
    **body: object,
) -> catalog_pb2.CatalogItem:
    """An item named ``at`` = (database, schema, item), with ``body`` its one body field."""
    database, schema, name = at
    made = catalog_pb2.CatalogItem(
        id=global_id,
        owner=owner,
        name=catalog_pb2.QualifiedName(database=database, schema=schema, item=name),
        depends_on=list(depends_on),
        **body,  # type: ignore[arg-type]
    )
    for grantee, actions in (grants or {}).items():
        made.privileges.add(grantee=grantee, actions=actions)
    return made


def _role(
    global_id: str, name: str, *, superuser: bool = False, members: tuple[str, ...] = ()
) -> catalog_pb2.CatalogItem:
    return _item(
        global_id,
        "tidemark",
        ("", "", name),
        role=catalog_pb2.Role(login=True, superuser=superuser),
        grants={member: ["MEMBER"] for member in members},
    )


USAGE = {"alice": ["USAGE"], "bob": ["USAGE"]}
T = ("a", "public", "t")


def _state(*extra: catalog_pb2.CatalogItem) -> CatalogState:
    items = [
        _role("u1", "root", superuser=True),
        _role("u2", "alice"),
        _role("u3", "bob", members=("carol",)),
        _role("u4", "carol"),
        _role("u5", "dave", members=("alice",)),  # alice is a member of dave
        _item("u10", "root", ("a", "", ""), grants=USAGE, database=catalog_pb2.Database()),
        _item("u11", "root", ("a", "public", ""), grants=USAGE, schema=catalog_pb2.Schema()),
        _item(
            "u12",
            "root",
            ("", "", "ca"),
            grants={"alice": ["USAGE"]},
            cluster=catalog_pb2.Cluster(size="local"),
        ),
        _item("u20", "alice", T, table=catalog_pb2.Table()),
        _item(
            "u21",
            "bob",
            ("a", "public", "v"),
            depends_on=("u20",),
            grants={"dave": ["SELECT"]},
            view=catalog_pb2.View(),
        ),
        _item(
            "u22",
            "alice",
            ("a", "public", "t_idx"),
            depends_on=("u20",),
            index=catalog_pb2.Index(on_id="u20"),
        ),
        *extra,
    ]
    return CatalogState(1, {i.id: i for i in items})


def _of(state: CatalogState, name: str) -> Privileges:
    return Privileges.of(state, Principal(name))


def test_superusers_and_owners_hold_everything_others_what_was_granted() -> None:
    state = _state()
    table, cluster = state.get("u20"), state.get("u12")
    assert table is not None and cluster is not None
    for action in ("SELECT", "INSERT", "UPDATE", "DELETE"):
        assert _of(state, "root").has(table, action)
        assert _of(state, "alice").has(table, action)
        assert not _of(state, "bob").has(table, action)
    assert Privileges.of(state, Principal("someone", administrator=True)).has(table, "DELETE")
    assert _of(state, "alice").has(cluster, "USAGE")
    assert not _of(state, "alice").has(cluster, "CREATE")
    assert not _of(state, "bob").has(cluster, "USAGE")
    with pytest.raises(SqlError) as caught:
        _of(state, "bob").require(table, "SELECT")
    assert (caught.value.code, caught.value.message) == ("42501", "permission denied for table t")
    with pytest.raises(SqlError) as owner:
        _of(state, "bob").require_owner(table)
    assert owner.value.message == "must be owner of table t"


def test_public_and_membership_grants() -> None:
    public = _item(
        "u30",
        "bob",
        ("a", "public", "open"),
        grants={"PUBLIC": ["SELECT"]},
        table=catalog_pb2.Table(),
    )
    state = _state(public)
    assert _of(state, "alice").has(public, "SELECT")
    assert not _of(state, "alice").has(public, "INSERT")
    # carol is a member of bob: she acts as bob, owner of the view and of "open".
    view = state.get("u21")
    assert view is not None
    assert _of(state, "carol").owns(view) and _of(state, "carol").has(public, "INSERT")
    assert _of(state, "alice").acting_as == {"alice", "dave", "PUBLIC"}


def test_a_view_is_read_with_its_owners_rights() -> None:
    state = _state()
    # alice holds SELECT on v through dave, but v's owner bob cannot read t: denied.
    with pytest.raises(SqlError) as caught:
        _of(state, "alice").require_read(["u21"], 7)
    assert caught.value.message == "permission denied for table t"
    assert caught.value.position == 7
    granted = _state()
    table = granted.get("u20")
    assert table is not None
    table.privileges.add(grantee="bob", actions=["SELECT"])
    _of(granted, "alice").require_read(["u21"], 0)
    # bob reads his view; carol (bob's member) too; nobody else.
    _of(granted, "carol").require_read(["u21"], 0)
    with pytest.raises(SqlError):
        _of(granted, "nobody").require_read(["u21"], 0)


def test_reading_needs_usage_on_the_database_and_schema() -> None:
    state = _state()
    schema = state.get("u11")
    assert schema is not None
    del schema.privileges[:]
    with pytest.raises(SqlError) as caught:
        _of(state, "alice").require_read(["u20"], 0)
    assert caught.value.message == "permission denied for schema public"


def test_each_role_lists_what_it_owns_or_was_granted() -> None:
    state = _state()
    alice = visible_view(state, Principal("alice"))
    # Her database, schema and cluster (USAGE), her table and its index, the view through
    # dave; of the roles, those she acts as.
    expected = ["u2", "u5", "u10", "u11", "u12", "u20", "u21", "u22"]
    assert sorted(i.id for i in alice.items) == sorted(expected)
    bob = visible_view(state, Principal("bob"))
    assert sorted(i.id for i in bob.items) == sorted(["u3", "u10", "u11", "u21"])
    assert len(visible_view(state, Principal("root")).items) == len(state)


def test_grant_and_revoke_merge_per_grantee() -> None:
    item = _item("u1", "root", ("", "", "c"), cluster=catalog_pb2.Cluster())
    granted = _change(item, grantee="alice", actions=("USAGE",), revoke=False)
    granted = _change(granted, grantee="alice", actions=("USAGE", "CREATE"), revoke=False)
    granted = _change(granted, grantee="PUBLIC", actions=("USAGE",), revoke=False)
    assert [(p.grantee, list(p.actions)) for p in granted.privileges] == [
        ("PUBLIC", ["USAGE"]),
        ("alice", ["USAGE", "CREATE"]),
    ]
    revoked = _change(granted, grantee="alice", actions=("USAGE", "CREATE"), revoke=True)
    assert [p.grantee for p in revoked.privileges] == ["PUBLIC"]


def test_grant_syntax() -> None:
    (grant,) = parse("GRANT SELECT, insert ON TABLE a.public.t, u TO alice, PUBLIC")
    assert grant == st.Grant(
        text="GRANT SELECT, insert ON TABLE a.public.t, u TO alice, PUBLIC",
        position=1,
        revoke=False,
        privileges=("SELECT", "INSERT"),
        kind="relation",
        names=(("a", "public", "t"), ("u",)),
        grantees=("alice", "PUBLIC"),
    )
    (revoke,) = parse("REVOKE ALL PRIVILEGES ON ALL TABLES IN SCHEMA s FROM bob")
    assert isinstance(revoke, st.Grant) and revoke.revoke and revoke.privileges == ()
    assert revoke.kind == "all tables in schema" and revoke.names == (("s",),)
    (member,) = parse("GRANT bob TO carol")
    assert member == st.GrantRole(
        text="GRANT bob TO carol", position=1, revoke=False, roles=("bob",), members=("carol",)
    )
    (owner,) = parse("ALTER MATERIALIZED VIEW m OWNER TO bob")
    assert owner == st.AlterOwner(
        text="ALTER MATERIALIZED VIEW m OWNER TO bob",
        position=1,
        kind="materialized view",
        name=("m",),
        owner="bob",
    )
    for bad in ("GRANT FLY ON t TO x", "GRANT SELECT ON t", "GRANT SELECT ON t TO"):
        with pytest.raises(SqlError) as caught:
            parse(bad)
        assert caught.value.code == "42601"


def test_a_committed_write_is_checked_again() -> None:
    state = _state()
    table, view = state.get("u20"), state.get("u21")
    assert table is not None and view is not None
    check_buffered_write(state, Principal("alice"), table, [((1,), 1), ((2,), -1)])
    with pytest.raises(SqlError) as caught:
        check_buffered_write(state, Principal("bob"), table, [((1,), 1)])
    assert caught.value.code == "42501"
    table.privileges.add(grantee="bob", actions=["INSERT"])
    fresh = CatalogState(2, {i.id: i for i in state})
    check_buffered_write(fresh, Principal("bob"), table, [((1,), 1)])
    with pytest.raises(SqlError):
        check_buffered_write(fresh, Principal("bob"), table, [((1,), -1)])
    with pytest.raises(SqlError) as not_a_table:
        check_buffered_write(fresh, Principal("root"), view, [((1,), 1)])
    assert not_a_table.value.code == "42809"


def test_createrole_manages_roles_but_not_superusers() -> None:
    manager = _item(
        "u40",
        "root",
        ("", "", "manager"),
        role=catalog_pb2.Role(login=True, createrole=True),
    )
    state = _state(manager)
    privileges = _of(state, "manager")
    privileges.require_role_admin("create role", [], 0)
    privileges.require_role_admin("drop role", [state.get("u2")], 0)
    with pytest.raises(SqlError):
        privileges.require_role_admin("drop role", [state.get("u1")], 0)  # a superuser
    with pytest.raises(SqlError):
        _of(state, "alice").require_role_admin("create role", [], 0)


def test_a_role_in_use_cannot_be_dropped() -> None:
    state = _state()
    alice, carol = state.get("u2"), state.get("u4")
    assert alice is not None and carol is not None
    with pytest.raises(SqlError) as caught:
        check_role_unused(state, alice, 0)
    assert caught.value.code == "2BP01" and "table t" in caught.value.message
    check_role_unused(state, carol, 0)  # only a member of bob: that goes with her
