"""The catalog's append validation, on the in-memory index alone."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from services.catalog.catalog import bootstrap_items
from services.catalog.index import CatalogIndex, Step
from services.catalog.items import Row, check_item, container_key, namespace_key
from services.catalog.validation import plan_append
from tests.support.catalog_items import Draft, int_columns
from tidemark.errors import AlreadyExists, FailedPrecondition, InvalidArgument, TidemarkError
from tidemark.v1 import catalog_pb2

T0 = 100


def fresh_index() -> CatalogIndex:
    return CatalogIndex(Row.of(item) for item in bootstrap_items(defaults=True))


def snapshot_of(index: CatalogIndex) -> dict[str, bytes]:
    return {key: row.data for key, row in index.rows.items()}


def accept(
    index: CatalogIndex,
    updates: Sequence[catalog_pb2.CatalogUpdate],
    time: int,
) -> list[Step]:
    """Validate an append at ``[time, time + 1)`` and apply it."""
    steps = plan_append(index, updates, time, time + 1)
    index.apply_all(steps)
    return steps


def reject(
    index: CatalogIndex,
    updates: Sequence[catalog_pb2.CatalogUpdate],
    time: int,
    error: type[TidemarkError],
    match: str,
) -> None:
    before = snapshot_of(index)
    with pytest.raises(error, match=match):
        plan_append(index, updates, time, time + 1)
    assert snapshot_of(index) == before


def test_bootstrap_items_form_a_valid_catalog() -> None:
    index = CatalogIndex()
    updates = [catalog_pb2.CatalogUpdate(item=i, time=5, diff=1) for i in bootstrap_items(True)]
    steps = plan_append(index, updates, 0, 6)
    assert len(index) == 0  # planning leaves the index untouched
    index.apply_all(steps)
    assert sorted(index.rows) == ["allocator:system", "allocator:user", "s2", "s3", "s4"]
    assert index.get("allocator:system").item.id_allocator.next == 5  # type: ignore[union-attr]


def test_create_table_and_view_then_drop_both() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    table = draft.table("t")
    view = draft.view("v", [table.id])
    accept(index, draft.updates(), T0)
    assert index.get(table.id) is not None and index.get(view.id) is not None
    assert index.get("allocator:user").item.id_allocator.next == 3  # type: ignore[union-attr]
    assert index.dependents_of(table.id) == {view.id}

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.drop(table)
    reject(index, draft.updates(), T0 + 1, FailedPrecondition, r"cannot drop table.*view")
    draft.drop(view)
    accept(index, draft.updates(), T0 + 1)
    assert index.get(table.id) is None and index.dependents_of(table.id) == set()


def test_names_are_unique_per_schema_and_shared_by_relations_and_indexes() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    draft.table("t")
    draft.schema("other")
    accept(index, draft.updates(), T0)

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.table("t")
    reject(index, draft.updates(), T0 + 1, AlreadyExists, r"item tidemark.public.t already")

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.table("t", schema="other")  # another schema: fine
    accept(index, draft.updates(), T0 + 1)

    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    table = draft.by_name("t", "table")
    draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=catalog_pb2.QualifiedName(database="tidemark", schema="other", item="t"),
            depends_on=[table.id, "s4"],
            index=catalog_pb2.Index(on_id=table.id, key_columns=["a"], cluster_id="s4"),
        )
    )
    reject(index, draft.updates(), T0 + 2, AlreadyExists, "already exists")

    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    draft.table("u")
    draft.table("u")
    reject(index, draft.updates(), T0 + 2, AlreadyExists, "claimed twice")


def test_a_name_freed_and_taken_at_the_same_time_and_a_rename() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    old = draft.table("t")
    accept(index, draft.updates(), T0)

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.drop(old)
    new = draft.table("t")
    accept(index, draft.updates(), T0 + 1)
    assert index.owner_of(("item", "tidemark", "public", "t")) == new.id

    renamed = catalog_pb2.CatalogItem()
    renamed.CopyFrom(new)
    renamed.name.item = "t2"
    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    draft.replace(new, renamed)
    accept(index, draft.updates(), T0 + 2)
    assert index.owner_of(("item", "tidemark", "public", "t")) is None
    assert index.owner_of(("item", "tidemark", "public", "t2")) == new.id


def test_ids_are_never_bound_twice() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    table = draft.table("t")
    accept(index, draft.updates(), T0)
    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.drop(table)
    accept(index, draft.updates(), T0 + 1)

    # The dropped id again, under another name: it was allocated before this append.
    again = catalog_pb2.CatalogItem()
    again.CopyFrom(table)
    again.name.item = "again"
    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    draft.create(again)
    reject(index, draft.updates(), T0 + 2, AlreadyExists, "allocated before this append")

    # An id the allocator has not reached, without moving the allocator.
    ahead = catalog_pb2.CatalogItem()
    ahead.CopyFrom(again)
    ahead.id = "u7"
    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    draft.create(ahead)
    reject(index, draft.updates(), T0 + 2, InvalidArgument, "not below the 'user' allocator")

    # Bound, dropped and bound again within one append.
    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    fresh = draft.table("x")
    updates = draft.updates()
    updates += [
        catalog_pb2.CatalogUpdate(item=fresh, time=T0 + 3, diff=-1),
        catalog_pb2.CatalogUpdate(item=fresh, time=T0 + 4, diff=1),
    ]
    before = snapshot_of(index)
    with pytest.raises(AlreadyExists, match="already bound at"):
        plan_append(index, updates, T0 + 2, T0 + 5)
    assert snapshot_of(index) == before

    # An id that is bound right now cannot be inserted again.
    draft = Draft((r.item for r in index.rows.values()), T0 + 2)
    system = catalog_pb2.CatalogItem(
        id="s2", name=catalog_pb2.QualifiedName(database="second"), database=catalog_pb2.Database()
    )
    draft.create(system)
    reject(index, draft.updates(), T0 + 2, AlreadyExists, "s2 is already bound")


def test_allocators_only_move_forward_and_stay() -> None:
    index = fresh_index()
    allocator = index.get("allocator:user").item  # type: ignore[union-attr]
    back = catalog_pb2.CatalogItem()
    back.CopyFrom(allocator)
    back.id_allocator.next = 0
    updates = [
        catalog_pb2.CatalogUpdate(item=allocator, time=T0, diff=-1),
        catalog_pb2.CatalogUpdate(item=back, time=T0, diff=1),
    ]
    reject(index, updates, T0, InvalidArgument, "cannot move backwards")
    reject(index, updates[:1], T0, InvalidArgument, "cannot be dropped")
    unknown = catalog_pb2.CatalogItem(id_allocator=catalog_pb2.IdAllocator(name="other", next=1))
    reject(
        index,
        [catalog_pb2.CatalogUpdate(item=unknown, time=T0, diff=1)],
        T0,
        InvalidArgument,
        "unknown id allocator",
    )


def test_containers_must_exist_and_be_empty_to_go() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    draft.table("t", schema="missing")
    reject(index, draft.updates(), T0, FailedPrecondition, "schema tidemark.missing does not")

    draft = Draft((r.item for r in index.rows.values()), T0)
    draft.schema("s", database="nowhere")
    reject(index, draft.updates(), T0, FailedPrecondition, "database nowhere does not exist")

    draft = Draft((r.item for r in index.rows.values()), T0)
    schema = draft.schema("s")
    table = draft.table("t", schema="s")
    accept(index, draft.updates(), T0)
    assert index.contained(("schema", "tidemark", "s")) == 1

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.drop(schema)
    reject(index, draft.updates(), T0 + 1, FailedPrecondition, "still live in it")
    renamed = catalog_pb2.CatalogItem()
    renamed.CopyFrom(schema)
    renamed.name.schema = "s2"
    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.replace(schema, renamed)
    reject(index, draft.updates(), T0 + 1, FailedPrecondition, "cannot drop or rename")

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    draft.drop(table)
    draft.drop(schema)
    accept(index, draft.updates(), T0 + 1)
    assert index.contained(("schema", "tidemark", "s")) == 0


def test_references_need_the_right_kind_and_must_be_dependencies() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    table = draft.table("t")
    accept(index, draft.updates(), T0)

    def index_item(draft: Draft, on: str, cluster: str, deps: list[str]) -> None:
        draft.create(
            catalog_pb2.CatalogItem(
                id=draft.allocate(),
                name=catalog_pb2.QualifiedName(database="tidemark", schema="public", item="i"),
                depends_on=deps,
                index=catalog_pb2.Index(on_id=on, key_columns=["a"], cluster_id=cluster),
            )
        )

    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    index_item(draft, table.id, "s4", [table.id])
    reject(index, draft.updates(), T0 + 1, InvalidArgument, "must be listed in depends_on")
    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    index_item(draft, table.id, table.id, [table.id])
    reject(index, draft.updates(), T0 + 1, FailedPrecondition, "its cluster u1 is a table")
    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    index_item(draft, "u99", "s4", ["u99", "s4"])
    reject(index, draft.updates(), T0 + 1, FailedPrecondition, "depends on u99, which does not")
    draft = Draft((r.item for r in index.rows.values()), T0 + 1)
    index_item(draft, table.id, "s4", [table.id, "s4"])
    accept(index, draft.updates(), T0 + 1)

    cluster = index.get("s4").item  # type: ignore[union-attr]
    reject(
        index,
        [catalog_pb2.CatalogUpdate(item=cluster, time=T0 + 2, diff=-1)],
        T0 + 2,
        FailedPrecondition,
        "cannot drop cluster default",
    )


def test_malformed_requests() -> None:
    index = fresh_index()
    draft = Draft((r.item for r in index.rows.values()), T0)
    table = draft.table("t")
    updates = draft.updates()
    with pytest.raises(InvalidArgument, match="must be greater than"):
        plan_append(index, updates, T0, T0)
    with pytest.raises(InvalidArgument, match=r"lies outside \[101, 102\)"):
        plan_append(index, updates, T0 + 1, T0 + 2)
    double = [catalog_pb2.CatalogUpdate(item=table, time=T0, diff=2)]
    with pytest.raises(InvalidArgument, match="changes by 2"):
        plan_append(index, double, T0, T0 + 1)
    retract_missing = [catalog_pb2.CatalogUpdate(item=table, time=T0, diff=-1)]
    with pytest.raises(FailedPrecondition, match="does not match the catalog"):
        plan_append(index, retract_missing, T0, T0 + 1)
    # Kind changes, bodies and names that do not fit the kind.
    database = index.get("s2").item  # type: ignore[union-attr]
    as_schema = catalog_pb2.CatalogItem(
        id="s2", name=catalog_pb2.QualifiedName(database="tidemark"), schema=catalog_pb2.Schema()
    )
    with pytest.raises(InvalidArgument, match=r"name\.schema must not be empty"):
        check_item(as_schema)
    as_cluster = catalog_pb2.CatalogItem(
        id="s2", name=catalog_pb2.QualifiedName(item="c"), cluster=catalog_pb2.Cluster(size="x")
    )
    changes = [
        catalog_pb2.CatalogUpdate(item=database, time=T0, diff=-1),
        catalog_pb2.CatalogUpdate(item=as_cluster, time=T0, diff=1),
    ]
    with pytest.raises(InvalidArgument, match="cannot change kind"):
        plan_append(index, changes, T0, T0 + 1)
    for bad, match in [
        (catalog_pb2.CatalogItem(id="u1", name=catalog_pb2.QualifiedName(database="d")), "no body"),
        (
            catalog_pb2.CatalogItem(
                id="x1",
                name=catalog_pb2.QualifiedName(database="d"),
                database=catalog_pb2.Database(),
            ),
            "not a GlobalId",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1",
                name=catalog_pb2.QualifiedName(database="d", schema="s", item="v"),
                depends_on=["u1"],
                view=catalog_pb2.View(sql="SELECT 1", schema=int_columns("a")),
            ),
            "depends on itself",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1",
                name=catalog_pb2.QualifiedName(database="d", schema="s", item="v"),
                view=catalog_pb2.View(),
            ),
            "no SQL text",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1", name=catalog_pb2.QualifiedName(item="c"), cluster=catalog_pb2.Cluster()
            ),
            "has no size",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1",
                name=catalog_pb2.QualifiedName(database="d", schema="s", item="t"),
                table=catalog_pb2.Table(),
            ),
            "schema has no columns",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1",
                name=catalog_pb2.QualifiedName(database="d", schema="s", item="t"),
                table=catalog_pb2.Table(schema=int_columns("a", "a")),
            ),
            "appears twice",
        ),
        (
            catalog_pb2.CatalogItem(
                id="u1",
                name=catalog_pb2.QualifiedName(database="d", item="c"),
                cluster=catalog_pb2.Cluster(size="s"),
            ),
            r"has no name\.database",
        ),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            check_item(bad)


# --- randomized: whatever is accepted keeps the catalog valid, whatever is rejected changes
# --- nothing ---------------------------------------------------------------------------------


def _check_invariants(index: CatalogIndex) -> None:
    rebuilt = CatalogIndex(index.rows.values())
    assert rebuilt.names == index.names
    assert rebuilt.dependents == index.dependents
    assert rebuilt.children == index.children
    names = [namespace_key(row.item) for row in index.rows.values()]
    named = [name for name in names if name is not None]
    assert len(named) == len(set(named))
    for row in index.rows.values():
        for dependency in row.item.depends_on:
            assert dependency in index.rows
        container = container_key(row.item)
        if container is not None:
            assert container in index.names


def _random_append(rng: random.Random, index: CatalogIndex, time: int) -> Draft:
    draft = Draft((r.item for r in index.rows.values()), time)
    objects = [r.item for r in index.rows.values() if r.item.id.startswith("u")]
    for _ in range(rng.randint(1, 3)):
        action = rng.choice(["table", "view", "schema", "drop", "drop", "rename", "stale"])
        schemas = [r.item.name.schema for r in index.rows.values() if r.kind == "schema"]
        if action == "table":
            draft.table(f"t{rng.randint(0, 6)}", schema=rng.choice([*schemas, "ghost"]))
        elif action == "schema":
            draft.schema(f"s{rng.randint(0, 3)}")
        elif action == "view" and objects:
            deps = rng.sample([o.id for o in objects], k=min(len(objects), rng.randint(1, 2)))
            deps = [d for d in deps if d in draft.items]
            draft.view(f"v{rng.randint(0, 6)}", deps or ["u999"])
        elif action == "drop" and objects:
            victim = rng.choice(objects)
            if victim.id in draft.items:
                draft.drop(victim)
        elif action == "rename" and objects:
            victim = rng.choice(objects)
            if victim.id in draft.items and victim.name.item:
                renamed = catalog_pb2.CatalogItem()
                renamed.CopyFrom(victim)
                renamed.name.item = f"t{rng.randint(0, 6)}"
                draft.replace(victim, renamed)
        elif action == "stale" and objects:
            # A retraction of a row that is not current (an adapter working from old state).
            stale = catalog_pb2.CatalogItem()
            stale.CopyFrom(rng.choice(objects))
            stale.owner = "someone else"
            draft._updates.append(catalog_pb2.CatalogUpdate(item=stale, time=time, diff=-1))
    return draft


@pytest.mark.parametrize("seed", range(6))
def test_random_appends_keep_the_catalog_valid(seed: int) -> None:
    rng = random.Random(seed)
    index = fresh_index()
    accepted = 0
    for step in range(150):
        time = T0 + step
        draft = _random_append(rng, index, time)
        before = snapshot_of(index)
        try:
            steps = plan_append(index, draft.updates(), time, time + 1)
        except TidemarkError:
            assert snapshot_of(index) == before
            continue
        assert snapshot_of(index) == before
        index.apply_all(steps)
        accepted += 1
        _check_invariants(index)
    # Both outcomes must have been exercised for the test to mean anything.
    assert 10 < accepted < 140
