"""What the sources process reads from the catalog: which sources it ingests, and where each
subsource's data goes."""

from __future__ import annotations

from tidemark.sources.ingest import IngestTargets
from tidemark.sources.plan import source_plans
from tidemark.v1 import catalog_pb2

LOADGEN = catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR


def item(
    id_: str, role: int, primary: str = "", upstream: str = "", fmt: int = LOADGEN
) -> catalog_pb2.CatalogItem:
    made = catalog_pb2.CatalogItem(
        id=id_, name=catalog_pb2.QualifiedName(database="d", schema="s", item=id_)
    )
    made.source.format = fmt  # type: ignore[assignment]
    made.source.role = role  # type: ignore[assignment]
    made.source.collection_id = id_
    made.source.primary_id = primary
    made.source.upstream_name = upstream
    if primary:
        made.depends_on.append(primary)
    return made


PRIMARY = catalog_pb2.SOURCE_ROLE_PRIMARY
SUB = catalog_pb2.SOURCE_ROLE_SUBSOURCE
PROGRESS = catalog_pb2.SOURCE_ROLE_PROGRESS


def test_a_single_relation_source_holds_its_data_itself() -> None:
    plans = source_plans([item("u1", PRIMARY, upstream="counter"), item("u2", PROGRESS, "u1")])
    assert plans["u1"].complete()
    assert plans["u1"].targets() == IngestTargets("u2", {"counter": "u1"}, ())


def test_subsources_receive_data_and_the_primary_only_time() -> None:
    items = [
        item("u5", SUB, "u3", "bids"),
        item("u3", PRIMARY),
        item("u4", SUB, "u3", "auctions"),
        item("u6", PROGRESS, "u3"),
        item("u9", PRIMARY, upstream="counter"),  # another source, without progress yet
    ]
    plans = source_plans(items)
    assert plans["u3"].targets() == IngestTargets("u6", {"auctions": "u4", "bids": "u5"}, ("u3",))
    assert not plans["u9"].complete()
    # A change to any member changes the plan's key (its task restarts).
    changed = [*items[:2], item("u4", SUB, "u3", "orders"), *items[3:]]
    assert source_plans(changed)["u3"].key() != plans["u3"].key()
    assert source_plans(list(reversed(items)))["u3"].key() == plans["u3"].key()


def test_only_formats_with_a_reader_are_ingested() -> None:
    cdc = item("u7", PRIMARY, fmt=catalog_pb2.SOURCE_FORMAT_CDCV2)
    table = catalog_pb2.CatalogItem(id="u8", table=catalog_pb2.Table(collection_id="u8"))
    assert source_plans([cdc, table]) == {}
    assert set(source_plans([cdc], formats={catalog_pb2.SOURCE_FORMAT_CDCV2})) == {"u7"}


def test_what_the_source_depends_on_comes_along_and_changes_restart_it() -> None:
    """A PostgreSQL source depends on a connection, which depends on a secret: the reader
    gets both, and a change to either changes the plan (its ingestion restarts)."""
    secret = catalog_pb2.CatalogItem(id="u20", database=catalog_pb2.Database())
    connection = catalog_pb2.CatalogItem(id="u21", depends_on=["u20"], schema=catalog_pb2.Schema())
    primary = item("u22", PRIMARY, upstream="counter")
    primary.depends_on.append("u21")
    items = [secret, connection, primary, item("u23", PROGRESS, "u22")]
    plan = source_plans(items)["u22"]
    assert [d.id for d in plan.dependencies] == ["u20", "u21"]
    changed_secret = catalog_pb2.CatalogItem(
        id="u20", owner="rotated", database=catalog_pb2.Database()
    )
    assert source_plans([changed_secret, *items[1:]])["u22"].key() != plan.key()
