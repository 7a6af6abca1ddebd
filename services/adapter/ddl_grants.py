"""What GRANT, REVOKE and ALTER ... OWNER TO draft: the item rewritten with its new
``privileges`` or ``owner`` (same id, so nothing that depends on it notices). Only the owner
(or a member of the owning role) and superusers may change either, as in PostgreSQL without
grant options."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.catalog_names import KIND_NAMES, catalog_view, resolve
from services.adapter.ddl import CatalogDraft, DdlOutcome, resolve_drop_target, unknown_object
from services.adapter.privileges import (
    KIND_PRIVILEGES,
    MEMBER,
    PUBLIC,
    Privileges,
)
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import dotted
from tidemark.catalog_items import role_named
from tidemark.plan.catalog_relations import RELATION_KINDS
from tidemark.v1 import catalog_pb2

UNDEFINED_OBJECT = "42704"
UNDEFINED_DATABASE = "3D000"
UNDEFINED_SCHEMA = "3F000"
INVALID_GRANT_OPERATION = "0LP01"


def grant(
    statement: ast.Grant, settings: Settings, draft: CatalogDraft, privileges: Privileges
) -> DdlOutcome:
    state = draft.state
    for grantee in statement.grantees:
        _require_role(state, grantee, statement.position)
    rewrites = _Rewrites()
    for item in _targets(statement, settings, state):
        privileges.require_owner(item, statement.position)
        allowed = KIND_PRIVILEGES[kind_of(item)]
        actions = statement.privileges or allowed
        for action in actions:
            if action not in allowed:
                raise SqlError(
                    INVALID_GRANT_OPERATION,
                    f"invalid privilege type {action} for {KIND_NAMES[kind_of(item)]}",
                    statement.position,
                )
        for grantee in statement.grantees:
            rewrites.change(
                item, partial(_change, grantee=grantee, actions=actions, revoke=statement.revoke)
            )
    rewrites.draft_into(draft)
    return DdlOutcome("REVOKE" if statement.revoke else "GRANT")


def grant_role(statement: ast.GrantRole, draft: CatalogDraft, privileges: Privileges) -> DdlOutcome:
    """Membership: kept on the granted role as a MEMBER privilege of each member."""
    state = draft.state
    granted = [role_named(state, name) for name in statement.roles]
    privileges.require_role_admin("grant or revoke role membership", granted, statement.position)
    for member in statement.members:
        _require_role(state, member, statement.position)
    rewrites = _Rewrites()
    for name in statement.roles:
        role = _require_role(state, name, statement.position)
        assert role is not None
        for member in statement.members:
            # GRANT name TO member when name is a member of member already: a loop.
            if not statement.revoke and member in Privileges.of(state, Principal(name)).acting_as:
                raise SqlError(
                    INVALID_GRANT_OPERATION,
                    f'role "{member}" is a member of role "{name}" (GRANT would make a loop)',
                    statement.position,
                )
            rewrites.change(
                role, partial(_change, grantee=member, actions=(MEMBER,), revoke=statement.revoke)
            )
    rewrites.draft_into(draft)
    return DdlOutcome("REVOKE ROLE" if statement.revoke else "GRANT ROLE")


def alter_owner(
    statement: ast.AlterOwner, settings: Settings, draft: CatalogDraft, privileges: Privileges
) -> DdlOutcome:
    state = draft.state
    drop = ast.Drop(text=statement.text, position=statement.position, kind=statement.kind, names=())
    item = resolve_drop_target(state, settings, drop, statement.name)
    if item is None:
        raise unknown_object(drop, statement.name)
    privileges.require_owner(item, statement.position)
    _require_role(state, statement.owner, statement.position)
    if not privileges.superuser and statement.owner not in privileges.acting_as:
        raise SqlError(
            "42501", f'must be able to act as role "{statement.owner}"', statement.position
        )

    def owned(current: catalog_pb2.CatalogItem) -> catalog_pb2.CatalogItem:
        changed = catalog_pb2.CatalogItem()
        changed.CopyFrom(current)
        changed.owner = statement.owner
        return changed

    rewrites = _Rewrites()
    rewrites.change(item, owned)
    rewrites.draft_into(draft)
    return DdlOutcome(f"ALTER {statement.kind.upper()}")


def forget_memberships(draft: CatalogDraft, dropped: list[catalog_pb2.CatalogItem]) -> None:
    """DROP ROLE: the memberships of the dropped roles go with them (as in PostgreSQL)."""
    names = {item.name.item for item in dropped if kind_of(item) == "role"}
    gone = {item.id for item in dropped}
    rewrites = _Rewrites()
    for item in draft.state:
        if kind_of(item) != "role" or item.id in gone:
            continue
        for grantee in names & {g.grantee for g in item.privileges}:
            rewrites.change(item, partial(_change, grantee=grantee, actions=(MEMBER,), revoke=True))
    rewrites.draft_into(draft)


# -- helpers --------------------------------------------------------------------------------


def _require_role(state: CatalogState, name: str, position: int) -> catalog_pb2.CatalogItem | None:
    if name == PUBLIC:
        return None
    found = role_named(state, name)
    if found is None:
        raise SqlError(UNDEFINED_OBJECT, f'role "{name}" does not exist', position)
    return found


def _targets(
    statement: ast.Grant, settings: Settings, state: CatalogState
) -> list[catalog_pb2.CatalogItem]:
    view = catalog_view(state)
    found: list[catalog_pb2.CatalogItem] = []
    position = statement.position
    for name in statement.names:
        if statement.kind == "relation":
            found.append(resolve(state, settings, name, RELATION_KINDS, position))
        elif statement.kind == "cluster":
            cluster = state.cluster_named(name[0])
            if cluster is None:
                raise SqlError(UNDEFINED_OBJECT, f'cluster "{name[0]}" does not exist', position)
            found.append(cluster)
        elif statement.kind == "database":
            database_item = view.database(name[0])
            if database_item is None:
                raise SqlError(UNDEFINED_DATABASE, f'database "{name[0]}" does not exist', position)
            found.append(database_item)
        else:
            database, schema_name = (settings.database, name[0]) if len(name) == 1 else name[:2]
            schema = view.schema(database, schema_name)
            if schema is None:
                raise SqlError(
                    UNDEFINED_SCHEMA, f'schema "{dotted(name)}" does not exist', position
                )
            if statement.kind == "schema":
                found.append(schema)
            else:
                found += view.objects_in(database, schema_name, RELATION_KINDS)
    return found


def _change(
    item: catalog_pb2.CatalogItem, grantee: str, actions: tuple[str, ...], revoke: bool
) -> catalog_pb2.CatalogItem:
    """``item`` with ``actions`` added to (or taken from) ``grantee``'s privileges."""
    held: dict[str, list[str]] = {p.grantee: list(p.actions) for p in item.privileges}
    current = held.get(grantee, [])
    if revoke:
        current = [a for a in current if a not in actions]
    else:
        current += [a for a in actions if a not in current]
    held[grantee] = current
    changed = catalog_pb2.CatalogItem()
    changed.CopyFrom(item)
    del changed.privileges[:]
    for name in sorted(held):
        if held[name]:
            changed.privileges.add(grantee=name, actions=held[name])
    return changed


class _Rewrites:
    """Items changed by one statement (several grantees may change one item), drafted as one
    retraction and one insertion each."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[catalog_pb2.CatalogItem, catalog_pb2.CatalogItem]] = {}

    def change(
        self,
        item: catalog_pb2.CatalogItem,
        how: Callable[[catalog_pb2.CatalogItem], catalog_pb2.CatalogItem],
    ) -> None:
        original, current = self._items.get(item.id, (item, item))
        self._items[item.id] = (original, how(current))

    def draft_into(self, draft: CatalogDraft) -> None:
        for original, changed in self._items.values():
            if changed != original:
                draft.drop(original)
                draft.create(changed)
