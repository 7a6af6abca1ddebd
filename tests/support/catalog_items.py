"""Building catalog appends in tests and benchmarks, the way an adapter would.

A :class:`Draft` starts from the items of a snapshot and collects the updates of one append at
one time: it takes new ids from the user allocator (and bumps it once at the end), creates,
replaces and drops items.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tidemark.v1 import catalog_pb2, common_pb2

DATABASE = "tidemark"
SCHEMA = "public"


def int_columns(*names: str) -> common_pb2.RelationSchema:
    return common_pb2.RelationSchema(
        columns=[
            common_pb2.Column(name=name, type=common_pb2.COLUMN_TYPE_INT64, nullable=True)
            for name in names
        ]
    )


class Draft:
    """``upper``: the catalog upper the append will expect (when the caller knows it)."""

    def __init__(self, items: Iterable[catalog_pb2.CatalogItem], time: int, upper: int = 0) -> None:
        self.time = time
        self.upper = upper
        self.items = {self._key(item): item for item in items}
        allocator = self.items["allocator:user"]
        self._allocator = allocator
        self._next = allocator.id_allocator.next
        self._updates: list[catalog_pb2.CatalogUpdate] = []

    @staticmethod
    def _key(item: catalog_pb2.CatalogItem) -> str:
        if item.WhichOneof("body") == "id_allocator":
            return "allocator:" + item.id_allocator.name
        return item.id

    def by_name(self, name: str, kind: str | None = None) -> catalog_pb2.CatalogItem:
        """The item whose last name part is ``name`` (and kind, if given)."""
        for item in self.items.values():
            parts = item.name.item or item.name.schema or item.name.database
            if parts == name and (kind is None or item.WhichOneof("body") == kind):
                return item
        raise KeyError(name)

    def allocate(self) -> str:
        global_id = f"u{self._next}"
        self._next += 1
        return global_id

    def create(self, item: catalog_pb2.CatalogItem) -> catalog_pb2.CatalogItem:
        self._updates.append(catalog_pb2.CatalogUpdate(item=item, time=self.time, diff=1))
        self.items[self._key(item)] = item
        return item

    def drop(self, item: catalog_pb2.CatalogItem) -> None:
        self._updates.append(catalog_pb2.CatalogUpdate(item=item, time=self.time, diff=-1))
        del self.items[self._key(item)]

    def replace(self, old: catalog_pb2.CatalogItem, new: catalog_pb2.CatalogItem) -> None:
        self.drop(old)
        self.create(new)

    def table(
        self, name: str, *, schema: str = SCHEMA, database: str = DATABASE, owner: str = "test"
    ) -> catalog_pb2.CatalogItem:
        global_id = self.allocate()
        return self.create(
            catalog_pb2.CatalogItem(
                id=global_id,
                name=catalog_pb2.QualifiedName(database=database, schema=schema, item=name),
                owner=owner,
                table=catalog_pb2.Table(schema=int_columns("a", "b"), collection_id=global_id),
            )
        )

    def view(
        self, name: str, depends_on: Sequence[str], *, sql: str = "SELECT 1"
    ) -> catalog_pb2.CatalogItem:
        return self.create(
            catalog_pb2.CatalogItem(
                id=self.allocate(),
                name=catalog_pb2.QualifiedName(database=DATABASE, schema=SCHEMA, item=name),
                depends_on=list(depends_on),
                owner="test",
                view=catalog_pb2.View(sql=sql, schema=int_columns("a"), plan=b"plan"),
            )
        )

    def schema(self, name: str, *, database: str = DATABASE) -> catalog_pb2.CatalogItem:
        return self.create(
            catalog_pb2.CatalogItem(
                id=self.allocate(),
                name=catalog_pb2.QualifiedName(database=database, schema=name),
                owner="test",
                schema=catalog_pb2.Schema(),
            )
        )

    def _bumped_allocator(self) -> catalog_pb2.CatalogItem:
        bumped = catalog_pb2.CatalogItem()
        bumped.CopyFrom(self._allocator)
        bumped.id_allocator.next = self._next
        return bumped

    def updates(self) -> list[catalog_pb2.CatalogUpdate]:
        """The append's updates, with the allocator moved past every id taken."""
        updates = list(self._updates)
        if self._next != self._allocator.id_allocator.next:
            updates.append(catalog_pb2.CatalogUpdate(item=self._allocator, time=self.time, diff=-1))
            updates.append(
                catalog_pb2.CatalogUpdate(item=self._bumped_allocator(), time=self.time, diff=1)
            )
        return updates

    def after(self) -> list[catalog_pb2.CatalogItem]:
        """The catalog's items once the append has succeeded."""
        items = dict(self.items)
        items["allocator:user"] = self._bumped_allocator()
        return list(items.values())
