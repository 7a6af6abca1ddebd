"""DDL: changes to the catalog, made with compare-and-append.

Each statement is checked against the newest catalog this adapter knows (at least as new as
the oracle's catalog read timestamp), turned into catalog updates at a fresh catalog write
timestamp ``w``, and appended with ``expected_upper`` = the catalog's upper. If another
adapter appended first, the copy catches up to the new upper and the statement is checked
again from scratch (the name may be taken now, the dependency gone), then retried.

New GlobalIds come from the "user" allocator, bumped in the same append. Tables, sources and
materialized views keep their data in a storage collection whose id is the item's own id; it is
created (initial frontier ``ReadTs(data)``, with the catalog's durable read hold,
``services/catalog/holds.py``) before the append that names it. If that append
then loses, the collection is kept for the retry when the retry takes the same id, and
otherwise released: an orphan is harmless.

Dropping releases this adapter's capabilities on the dropped collections (every other adapter
does the same when its copy of the catalog sees the drop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.adapter.catalog_cache import CatalogCache, CatalogState, kind_of
from services.adapter.catalog_names import (
    KIND_NAMES,
    catalog_view,
    find_in_schemas,
    full_name,
    in_schema,
    kind_name,
    resolve,
)
from services.adapter.holds import CollectionHolds
from services.adapter.results import DEPENDENT_OBJECTS_STILL_EXIST, DUPLICATE_OBJECT
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.ddl import relation_schema
from services.adapter.sql.errors import SqlError
from services.adapter.sql.names import dotted
from services.adapter.timestamps import Timestamps
from tidemark.catalog_items import CATALOG_HOLDER, item_key, role_named
from tidemark.clients.catalog import CatalogClient, CatalogUpperMismatch, insert, retract
from tidemark.clients.storage import StorageClient
from tidemark.columnar import RelationSchema
from tidemark.errors import AlreadyExists, TidemarkError
from tidemark.logging import get_logger
from tidemark.plan.catalog_relations import RELATION_KINDS
from tidemark.rpc.identity import compute_identity
from tidemark.v1 import catalog_pb2

log = get_logger("services.adapter.ddl")

DUPLICATE_TABLE = "42P07"
DUPLICATE_DATABASE = "42P04"
DUPLICATE_SCHEMA = "42P06"
INVALID_PARAMETER = "22023"
OWNER = "tidemark"
DEFAULT_CLUSTER_SIZE = "local"
CATALOG_WAIT_SECONDS = 30.0
MAX_ATTEMPTS = 100


@dataclass
class DdlOutcome:
    tag: str
    notices: list[str] = field(default_factory=list)
    dropped_collections: list[str] = field(default_factory=list)
    # Run once the catalog append has succeeded (e.g. dropping a replication slot
    # upstream); each may return a notice.
    after_commit: list[Callable[[], Awaitable[str | None]]] = field(default_factory=list)


class CatalogDraft:
    """The updates of one append at catalog time ``time``, checked against ``state``;
    ``owner`` owns what it creates (the role running the statement)."""

    def __init__(self, state: CatalogState, time: int, owner: str = OWNER) -> None:
        self.state = state
        self.time = time
        self.owner = owner
        self._allocator = state.allocator("user")
        self._next = self._allocator.id_allocator.next
        self._updates: list[catalog_pb2.CatalogUpdate] = []
        self._added: dict[str, catalog_pb2.CatalogItem] = {}
        self._dropped: set[str] = set()

    def allocate(self) -> str:
        global_id = f"u{self._next}"
        self._next += 1
        return global_id

    def create(self, item: catalog_pb2.CatalogItem) -> catalog_pb2.CatalogItem:
        self._updates.append(insert(item, self.time))
        self._added[item_key(item)] = item
        return item

    def drop(self, item: catalog_pb2.CatalogItem) -> None:
        if item_key(item) in self._dropped:
            return
        self._dropped.add(item_key(item))
        self._updates.append(retract(item, self.time))

    def added(self, key: str) -> catalog_pb2.CatalogItem:
        """The item this draft creates under ``key``."""
        return self._added[key]

    @property
    def empty(self) -> bool:
        return not self._updates

    def updates(self) -> list[catalog_pb2.CatalogUpdate]:
        """The append's updates, with the allocator moved past every id taken."""
        updates = list(self._updates)
        if self._next != self._allocator.id_allocator.next:
            bumped = catalog_pb2.CatalogItem()
            bumped.CopyFrom(self._allocator)
            bumped.id_allocator.next = self._next
            updates.append(retract(self._allocator, self.time))
            updates.append(insert(bumped, self.time))
        return updates


def view_writer(database: str, cluster: str) -> str:
    """The identity that writes a materialized view's output: the cluster maintaining it,
    serving the view's database as its tenant."""
    return compute_identity(database, cluster).uri


class CollectionMaker:
    """Creates the storage collections of new items across the attempts of one statement."""

    def __init__(
        self, storage: StorageClient, holds: CollectionHolds, timestamps: Timestamps
    ) -> None:
        self.storage = storage
        self.holds = holds
        self.timestamps = timestamps
        self.made: dict[str, tuple[RelationSchema, str, str]] = {}
        self.used: set[str] = set()

    async def make(
        self, draft: CatalogDraft, schema: RelationSchema, *, tenant: str, writer: str = ""
    ) -> str:
        """A fresh id from ``draft`` with a collection of ``schema`` behind it, belonging to
        ``tenant`` (the item's database) and written only by ``writer`` if given (see
        :func:`view_writer`): storage enforces both when mTLS is on."""
        while True:
            global_id = draft.allocate()
            if self.made.get(global_id) == (schema, tenant, writer):
                self.used.add(global_id)
                return global_id
            if global_id in self.made:
                continue
            try:
                pair = await self.storage.create(
                    global_id,
                    schema,
                    initial_frontier=await self.timestamps.read_ts(),
                    holder=self.holds.holder,
                    # The catalog's durable hold, there from the first moment on.
                    critical_holder=CATALOG_HOLDER,
                    tenant=tenant,
                    writer=writer,
                )
            except AlreadyExists:
                # Another adapter made it for an append of its own: skip the id.
                continue
            self.holds.adopt(pair)
            self.made[global_id] = (schema, tenant, writer)
            self.used.add(global_id)
            return global_id

    def attempt_over(self) -> None:
        self.used.clear()

    async def release_unused(self) -> None:
        for global_id in set(self.made) - self.used:
            await self.holds.release(global_id)
            # No catalog object will name it: release the catalog's hold too (else the
            # catalog does, once the orphan is old enough).
            with contextlib.suppress(TidemarkError):
                hold = await self.storage.acquire_critical(global_id, CATALOG_HOLDER)
                await self.storage.drop(hold)


Build = Callable[[CatalogDraft, CollectionMaker], Awaitable[DdlOutcome]]


def table_schema(columns: tuple[ast.ColumnDef, ...]) -> RelationSchema:
    """The schema CREATE TABLE/SOURCE declares, which needs a column at least."""
    if not columns:
        raise SqlError("42601", "a table needs at least one column")
    return relation_schema(columns)


class DdlRunner:
    """Runs DDL statements against the catalog; see the module docstring."""

    def __init__(
        self,
        cache: CatalogCache,
        catalog: CatalogClient,
        timestamps: Timestamps,
        storage: StorageClient,
        holds: CollectionHolds,
    ) -> None:
        self.cache = cache
        self.catalog = catalog
        self.timestamps = timestamps
        self.storage = storage
        self.holds = holds

    async def run(self, build: Build, owner: str = OWNER) -> DdlOutcome:
        """Check and append what ``build`` drafts (as role ``owner``), retrying lost
        races."""
        await self.cache.wait_for(await self.timestamps.catalog_read_ts() + 1, CATALOG_WAIT_SECONDS)
        maker = CollectionMaker(self.storage, self.holds, self.timestamps)
        try:
            for _ in range(MAX_ATTEMPTS):
                upper = self.cache.frontier
                state = self.cache.latest()
                w = await self.timestamps.catalog_write_ts()
                if w < upper:
                    continue
                draft = CatalogDraft(state, w, owner)
                maker.attempt_over()
                outcome = await build(draft, maker)
                if draft.empty:
                    return outcome
                try:
                    await self.catalog.compare_and_append(upper, w + 1, draft.updates())
                except CatalogUpperMismatch as lost:
                    await self.cache.wait_for(lost.current_upper, CATALOG_WAIT_SECONDS)
                    continue
                except AlreadyExists:
                    # Our copy was behind on a name: catch up and check again.
                    await self.cache.wait_for(upper + 1, CATALOG_WAIT_SECONDS)
                    continue
                await self._release(outcome.dropped_collections)
                for hook in outcome.after_commit:
                    notice = await hook()
                    if notice is not None:
                        outcome.notices.append(notice)
                return outcome
            raise SqlError(
                "40001",
                f"gave up changing the catalog after {MAX_ATTEMPTS} lost races",
                hint="retry the statement",
            )
        finally:
            await maker.release_unused()

    async def _release(self, collections: list[str]) -> None:
        for collection_id in collections:
            await self.holds.release(collection_id)


# -- checks shared by the builders ----------------------------------------------------------


def check_new_relation_name(
    state: CatalogState,
    name: catalog_pb2.QualifiedName,
    if_not_exists: bool,
    position: int,
    what: str,
) -> str | None:
    """``None`` if the name is free; a notice if it is taken and ``IF NOT EXISTS`` was given;
    else 42P07."""
    existing = in_schema(state, name.database, name.schema, name.item)
    if existing is None:
        return None
    if if_not_exists:
        return f'{kind_name(existing)} "{name.item}" already exists, skipping'
    code = DUPLICATE_TABLE if kind_of(existing) in RELATION_KINDS else DUPLICATE_OBJECT
    raise SqlError(
        code,
        f'{kind_name(existing)} "{full_name(existing)}" already exists'
        + ("" if kind_of(existing) == what else f" (creating a {KIND_NAMES.get(what, what)})"),
        position,
    )


def dependents_error(
    item: catalog_pb2.CatalogItem, dependents: list[catalog_pb2.CatalogItem], position: int
) -> SqlError:
    named = ", ".join(f"{kind_name(d)} {full_name(d)}" for d in dependents[:5])
    more = f" and {len(dependents) - 5} more" if len(dependents) > 5 else ""
    return SqlError(
        DEPENDENT_OBJECTS_STILL_EXIST,
        f"cannot drop {kind_name(item)} {full_name(item) or item.id}: other objects depend on "
        f"it ({named}{more})",
        position,
        hint="use DROP ... CASCADE to drop the dependent objects too",
    )


def contained_items(
    state: CatalogState, item: catalog_pb2.CatalogItem
) -> list[catalog_pb2.CatalogItem]:
    """What lives in a database or schema (by name, not by dependency)."""
    kind = kind_of(item)
    found = []
    for other in state:
        other_kind = kind_of(other)
        if other.id == item.id or other_kind in ("id_allocator", "cluster", "database", "role"):
            continue
        if kind == "database" and other.name.database == item.name.database:
            found.append(other)
        elif (
            kind == "schema"
            and other_kind != "schema"
            and other.name.database == item.name.database
            and other.name.schema == item.name.schema
        ):
            found.append(other)
    return found


def drop_closure(
    state: CatalogState, targets: list[catalog_pb2.CatalogItem], cascade: bool, position: int
) -> list[catalog_pb2.CatalogItem]:
    """``targets`` plus everything that must go with them; 2BP01 without CASCADE when there
    is anything else."""
    chosen: dict[str, catalog_pb2.CatalogItem] = {t.id: t for t in targets}
    pending = list(targets)
    while pending:
        item = pending.pop()
        extra = contained_items(state, item) + state.dependents([item.id])
        extra = [e for e in extra if e.id not in chosen]
        # A source's subsources and progress relation go with it, CASCADE or not.
        owned = [e for e in extra if is_member_of(e, item.id)]
        others = [e for e in extra if not is_member_of(e, item.id)]
        if others and not cascade:
            raise dependents_error(item, others, position)
        for other in owned + others:
            chosen[other.id] = other
            pending.append(other)
    return list(chosen.values())


def resolve_drop_target(
    state: CatalogState, settings: Settings, statement: ast.Drop, name: tuple[str, ...]
) -> catalog_pb2.CatalogItem | None:
    """The item ``DROP <kind> name`` means; ``None`` if it does not exist."""
    kind = statement.kind.replace(" ", "_")
    position = statement.position
    if kind == "cluster":
        return state.cluster_named(name[-1]) if len(name) == 1 else None
    if kind == "role":
        return role_named(state, name[-1]) if len(name) == 1 else None
    if kind == "database":
        return catalog_view(state).database(name[0]) if len(name) == 1 else None
    if kind == "schema":
        database, schema = (settings.database, name[0]) if len(name) == 1 else name[:2]
        return catalog_view(state).schema(database, schema)
    found = find_in_schemas(state, settings, name)
    if found is None:
        return None
    # Wrong kinds are reported by resolve, with the right SQLSTATE.
    return resolve(state, settings, name, (kind,), position)


def unknown_object(statement: ast.Drop, name: tuple[str, ...]) -> SqlError:
    kind = statement.kind
    code = {
        "table": "42P01",
        "view": "42P01",
        "materialized view": "42P01",
        "source": "42P01",
        "database": "3D000",
        "schema": "3F000",
    }.get(kind, "42704")
    return SqlError(code, f'{kind} "{dotted(name)}" does not exist', statement.position)


def is_member_of(item: catalog_pb2.CatalogItem, primary_id: str) -> bool:
    """Whether ``item`` is a subsource or the progress relation of source ``primary_id``."""
    return (
        item.WhichOneof("body") == "source"
        and item.source.role != catalog_pb2.SOURCE_ROLE_PRIMARY
        and item.source.primary_id == primary_id
    )


def drop_is_protected(item: catalog_pb2.CatalogItem) -> bool:
    """System objects (ids ``s<N>``) other than the default ones cannot be dropped."""
    return item.id.startswith("s") and kind_of(item) not in (
        "cluster",
        "database",
        "schema",
        "role",
    )


def check_droppable(
    item: catalog_pb2.CatalogItem, position: int, state: CatalogState | None = None
) -> None:
    if drop_is_protected(item):
        raise SqlError("42501", f"{kind_name(item)} {full_name(item)} is a system object", position)
    if item.WhichOneof("body") == "source" and item.source.role != catalog_pb2.SOURCE_ROLE_PRIMARY:
        primary = state.get(item.source.primary_id) if state is not None else None
        owner = full_name(primary) if primary is not None else item.source.primary_id
        what = (
            "progress relation"
            if item.source.role == catalog_pb2.SOURCE_ROLE_PROGRESS
            else "subsource"
        )
        raise SqlError(
            "2BP01",
            f"{full_name(item)} is the {what} of source {owner}: it goes with its source",
            position,
            hint=f"DROP SOURCE {owner}",
        )
