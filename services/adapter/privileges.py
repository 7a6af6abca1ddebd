"""Who may do what: the privilege rules, as PostgreSQL has them, over one catalog state.

- Superusers (a role with SUPERUSER, or an administrator by configuration) may do anything.
- An item's owner, and every member of the owner role (``GRANT owner TO member``), holds
  every privilege on it, and alone (with superusers) may DROP, ALTER or GRANT on it.
- Others hold what ``GRANT`` gave them, or a role they are a member of, or ``PUBLIC``:
  USAGE and CREATE on clusters, databases and schemas; SELECT, INSERT, UPDATE and DELETE on
  relations. Nothing is granted by default, not even on the default database, schema and
  cluster (owned by ``system``): a tenant's roles see and use only what they were given.
- Reading a relation needs SELECT on it and USAGE on its schema and database; a view is read
  with its owner's rights (the owner needs them on what the view reads, the reader only
  SELECT on the view). Running a query that reads relations needs USAGE on the cluster.

Failures are SQLSTATE 42501 with PostgreSQL's wording (``permission denied for table t``,
``must be owner of table t``).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState, kind_of
from services.adapter.catalog_names import KIND_NAMES, catalog_view
from services.adapter.sql.catalog_view import CatalogView
from services.adapter.sql.errors import INSUFFICIENT_PRIVILEGE, SqlError
from services.adapter.sql.planned import PlannedQuery
from tidemark.catalog_items import role_named
from tidemark.plan.catalog_relations import RELATION_KINDS
from tidemark.v1 import catalog_pb2

PUBLIC = "PUBLIC"
MEMBER = "MEMBER"
RELATION_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
CONTAINER_PRIVILEGES = ("USAGE", "CREATE")
KIND_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "cluster": CONTAINER_PRIVILEGES,
    "database": CONTAINER_PRIVILEGES,
    "schema": CONTAINER_PRIVILEGES,
    **{kind: RELATION_PRIVILEGES for kind in RELATION_KINDS},
}
_MEMO = "privileges"
_VISIBLE_MEMO = "visible_views"


def denied(what: str, position: int = 0) -> SqlError:
    return SqlError(INSUFFICIENT_PRIVILEGE, f"permission denied {what}", position)


def describe(item: catalog_pb2.CatalogItem) -> str:
    """``table t``, ``schema public``: how errors name an item (PostgreSQL's wording)."""
    name = item.name
    kind = KIND_NAMES.get(kind_of(item), kind_of(item))
    return f"{kind} {name.item or name.schema or name.database}"


class Privileges:
    """What one principal may do in one catalog state."""

    def __init__(self, state: CatalogState, principal: Principal) -> None:
        self.state = state
        self.principal = principal
        role = role_named(state, principal.name) if principal.name else None
        self.superuser = principal.administrator or (role is not None and role.role.superuser)
        self.createrole = self.superuser or (role is not None and role.role.createrole)
        # The roles whose privileges the principal uses: its own, those it is a member of
        # (transitively), and PUBLIC.
        self.acting_as = _memberships(state, principal.name) | {PUBLIC}

    @classmethod
    def of(cls, state: CatalogState, principal: Principal) -> Privileges:
        """Built once per state and principal (statements share the state's memo)."""
        memo = state.memo.setdefault(_MEMO, {})
        assert isinstance(memo, dict)
        found = memo.get(principal)
        if not isinstance(found, Privileges):
            found = cls(state, principal)
            memo[principal] = found
        return found

    # -- rules ----------------------------------------------------------------------------

    def owns(self, item: catalog_pb2.CatalogItem) -> bool:
        return self.superuser or item.owner in self.acting_as

    def has(self, item: catalog_pb2.CatalogItem, action: str) -> bool:
        if self.owns(item):
            return True
        return any(
            grant.grantee in self.acting_as and action in grant.actions for grant in item.privileges
        )

    def any_privilege(self, item: catalog_pb2.CatalogItem) -> bool:
        """Whether the principal may see the item at all (it owns it or holds a grant)."""
        if self.owns(item):
            return True
        return any(grant.grantee in self.acting_as and grant.actions for grant in item.privileges)

    def visible(self, item: catalog_pb2.CatalogItem) -> bool:
        """What SHOW and the catalog tables list: items with some privilege, and the indexes
        of the relations among them."""
        if self.superuser:
            return True
        if kind_of(item) == "index":
            on = self.state.get(item.index.on_id)
            return on is not None and self.any_privilege(on)
        if kind_of(item) == "role":
            return item.name.item in self.acting_as
        return self.any_privilege(item)

    # -- checks ---------------------------------------------------------------------------

    def require(self, item: catalog_pb2.CatalogItem, action: str, position: int = 0) -> None:
        if not self.has(item, action):
            raise denied(f"for {describe(item)}", position)

    def require_owner(self, item: catalog_pb2.CatalogItem, position: int = 0) -> None:
        if not self.owns(item):
            raise SqlError(INSUFFICIENT_PRIVILEGE, f"must be owner of {describe(item)}", position)

    def require_superuser(self, what: str, position: int = 0) -> None:
        if not self.superuser:
            raise denied(f"to {what}", position)

    def require_role_admin(
        self, what: str, roles: Iterable[catalog_pb2.CatalogItem | None], position: int
    ) -> None:
        """Managing roles: superusers, or CREATEROLE for roles that are not superusers."""
        if self.superuser:
            return
        if not self.createrole or any(r is not None and r.role.superuser for r in roles):
            raise denied(f"to {what}", position)

    def require_usage_of_container(self, item: catalog_pb2.CatalogItem, position: int) -> None:
        """USAGE on the database (and schema) an item lives in."""
        view = catalog_view(self.state)
        database = view.database(item.name.database) if item.name.database else None
        if database is not None and database.id != item.id:
            self.require(database, "USAGE", position)
        schema = view.schema(item.name.database, item.name.schema) if item.name.schema else None
        if schema is not None and schema.id != item.id:
            self.require(schema, "USAGE", position)

    def require_create_in(self, database: str, schema: str, position: int) -> None:
        """CREATE on the schema a new object goes into (and USAGE on its database)."""
        view = catalog_view(self.state)
        found_database = view.database(database)
        if found_database is not None:
            self.require(found_database, "USAGE", position)
        found_schema = view.schema(database, schema)
        if found_schema is not None:
            self.require(found_schema, "CREATE", position)

    def require_cluster(self, name: str, action: str, position: int) -> None:
        """``action`` on the cluster called ``name`` (an unknown one fails later, elsewhere)."""
        cluster = self.state.cluster_named(name)
        if cluster is not None:
            self.require(cluster, action, position)

    def require_read(self, ids: Iterable[str], position: int) -> None:
        """SELECT on each relation a statement names, USAGE on where it lives; a view's
        owner must hold the same on what the view names."""
        for global_id in ids:
            item = self.state.get(global_id)
            if item is None or kind_of(item) not in RELATION_KINDS:
                continue
            self.require_usage_of_container(item, position)
            self.require(item, "SELECT", position)
            if kind_of(item) == "view":
                owner = Privileges.of(self.state, Principal(item.owner))
                owner.require_read((d for d in item.depends_on if d != global_id), position)


def _memberships(state: CatalogState, name: str) -> set[str]:
    """``name`` and every role it is a member of, directly or through others."""
    members: dict[str, set[str]] = {}
    for item in state:
        if item.WhichOneof("body") != "role":
            continue
        for grant in item.privileges:
            if MEMBER in grant.actions:
                members.setdefault(grant.grantee, set()).add(item.name.item)
    found = {name} if name else set()
    pending = list(found)
    while pending:
        for role in members.get(pending.pop(), ()):
            if role not in found:
                found.add(role)
                pending.append(role)
    return found


def check_query(
    state: CatalogState, principal: Principal, planned: PlannedQuery, cluster: str, position: int
) -> None:
    """What running a query needs: SELECT on what it reads and, when it reads anything,
    USAGE on the cluster it runs on."""
    privileges = Privileges.of(state, principal)
    privileges.require_read(planned.depends_on, position)
    if planned.depends_on:
        privileges.require_cluster(cluster, "USAGE", position)


def visible_view(state: CatalogState, principal: Principal) -> CatalogView:
    """The catalog as ``principal`` may list it (SHOW, pg_catalog, information_schema):
    what it owns or holds a privilege on, as PostgreSQL's information_schema filters by the
    has_*_privilege functions. Superusers see everything."""
    privileges = Privileges.of(state, principal)
    if privileges.superuser:
        return catalog_view(state)
    memo = state.memo.setdefault(_VISIBLE_MEMO, {})
    found = memo.get(principal)
    if not isinstance(found, CatalogView):
        found = CatalogView(item for item in state if privileges.visible(item))
        memo[principal] = found
    return found


def check_role_unused(state: CatalogState, role: catalog_pb2.CatalogItem, position: int) -> None:
    """As PostgreSQL: a role that owns objects or holds privileges cannot be dropped (2BP01),
    so no object is left with an owner nobody can act as."""
    name = role.name.item
    # Roles themselves are not objects a role owns (their memberships go with the drop).
    uses = [
        item
        for item in state
        if kind_of(item) != "role"
        and (item.owner == name or any(grant.grantee == name for grant in item.privileges))
    ]
    if uses:
        named = ", ".join(describe(item) for item in uses[:5])
        raise SqlError(
            "2BP01",
            f'role "{name}" cannot be dropped because some objects depend on it ({named}'
            + (f" and {len(uses) - 5} more" if len(uses) > 5 else "")
            + ")",
            position,
            hint="ALTER ... OWNER TO another role and REVOKE its privileges first",
        )


def check_buffered_write(
    state: CatalogState,
    principal: Principal,
    target: catalog_pb2.CatalogItem,
    changes: Iterable[tuple[object, int]],
) -> None:
    """COMMIT of a transaction's write: the target must be a table, and the committer must
    hold INSERT (or UPDATE) for added rows and DELETE (or UPDATE) for removed ones."""
    if kind_of(target) != "table":
        raise SqlError("42809", f"cannot write to {describe(target)}: it is not a table")
    privileges = Privileges.of(state, principal)
    diffs = {diff > 0 for _, diff in changes}
    for adds, action in ((True, "INSERT"), (False, "DELETE")):
        if adds in diffs and not (
            privileges.has(target, action) or privileges.has(target, "UPDATE")
        ):
            raise denied(f"for {describe(target)}")
