"""``pg_catalog`` and ``information_schema`` rows built from one snapshot of the adapter's
catalog: databases, schemas, relations (tables, sources, views, materialized views, indexes),
their columns and the types Tidemark has. OIDs are stable for a catalog item (derived from its
id), so a client may look a relation up by name and then by OID in a later query.
"""

from __future__ import annotations

import zlib
from typing import Any

from services.adapter.pgwire import pgtypes
from services.adapter.results import sql_type_name
from services.adapter.sql.catalog_view import CatalogView, item_kind
from tidemark.plan.catalog_relations import relation_schema
from tidemark.v1 import catalog_pb2

Row = dict[str, Any]
PG_CATALOG_OID = 11
INFORMATION_SCHEMA_OID = 13
OWNER = "tidemark"
OWNER_OID = 10
_RELKINDS = {
    "table": "r",
    "source": "r",
    "view": "v",
    "materialized_view": "m",
    "index": "i",
}
_TYPES = [
    (pgtypes.BOOL, "bool", 1, 1000),
    (pgtypes.BYTEA, "bytea", -1, 1001),
    (pgtypes.INT8, "int8", 8, 1016),
    (pgtypes.INT2, "int2", 2, 1005),
    (pgtypes.INT4, "int4", 4, 1007),
    (pgtypes.TEXT, "text", -1, 1009),
    (pgtypes.OID, "oid", 4, 1028),
    (pgtypes.JSON, "json", -1, 199),
    (pgtypes.FLOAT4, "float4", 4, 1021),
    (pgtypes.FLOAT8, "float8", 8, 1022),
    (pgtypes.VARCHAR, "varchar", -1, 1015),
    (pgtypes.DATE, "date", 4, 1182),
    (pgtypes.TIMESTAMP, "timestamp", 8, 1115),
    (pgtypes.TIMESTAMPTZ, "timestamptz", 8, 1185),
    (pgtypes.NUMERIC, "numeric", -1, 1231),
    (pgtypes.JSONB, "jsonb", -1, 3807),
]
REGTYPE_NAMES = {
    pgtypes.BOOL: "boolean",
    pgtypes.INT8: "bigint",
    pgtypes.INT2: "smallint",
    pgtypes.INT4: "integer",
    pgtypes.FLOAT4: "real",
    pgtypes.FLOAT8: "double precision",
    pgtypes.VARCHAR: "character varying",
    pgtypes.TIMESTAMP: "timestamp without time zone",
    pgtypes.TIMESTAMPTZ: "timestamp with time zone",
}


def oid_of(item_id: str) -> int:
    """A stable OID for a catalog item, above PostgreSQL's reserved range."""
    return 16384 + zlib.crc32(item_id.encode()) % (1 << 30)


# The owner of the default objects: shown as the bootstrap superuser, as PostgreSQL shows its
# bootstrap objects owned by the bootstrap superuser.
SYSTEM_OWNER = "system"


def role_oid(name: str) -> int:
    """A stable OID for a role, by name (roles are named globally)."""
    if name in (OWNER, SYSTEM_OWNER, ""):
        return OWNER_OID
    return oid_of(f"role:{name}")


class CatalogTables:
    def __init__(self, view: CatalogView, database: str) -> None:
        self.view = view
        self.database = database
        self.tables: dict[str, list[Row]] = {}
        self._build()

    def rows(self, name: str) -> list[Row] | None:
        return self.tables.get(name.lower())

    def _roles(self) -> list[Row]:
        """The roles listed (those visible) and the owners of what is listed."""
        superusers = {OWNER}
        names = {OWNER}
        for item in self.view.items:
            if item_kind(item) == "role":
                names.add(item.name.item)
                if item.role.superuser:
                    superusers.add(item.name.item)
            elif item.owner and item.owner != SYSTEM_OWNER:
                names.add(item.owner)
        return [
            {"oid": role_oid(name), "rolname": name, "rolsuper": name in superusers}
            for name in sorted(names)
        ]

    def _build(self) -> None:
        view = self.view
        namespaces: list[Row] = [
            {"oid": PG_CATALOG_OID, "nspname": "pg_catalog", "nspowner": OWNER_OID},
            {"oid": INFORMATION_SCHEMA_OID, "nspname": "information_schema", "nspowner": OWNER_OID},
        ]
        schema_oids: dict[str, int] = {}
        for schema in view.schemas(self.database):
            oid = oid_of(schema.id)
            schema_oids[schema.name.schema] = oid
            namespaces.append(
                {"oid": oid, "nspname": schema.name.schema, "nspowner": role_oid(schema.owner)}
            )
        databases = [
            {
                "oid": oid_of(d.id),
                "datname": d.name.database,
                "datdba": role_oid(d.owner),
                "encoding": 6,
                "datcollate": "C",
                "datctype": "C",
                "daticulocale": None,
                "datlocprovider": "c",
                "datacl": None,
                "datallowconn": True,
                "datistemplate": False,
            }
            for d in view.databases()
        ]
        classes: list[Row] = []
        attributes: list[Row] = []
        indexes: list[Row] = []
        info_tables: list[Row] = []
        info_columns: list[Row] = []
        by_id: dict[str, int] = {}
        items = [i for i in view.items if i.name.database == self.database]
        for item in items:
            if item_kind(item) in _RELKINDS:
                by_id[item.id] = oid_of(item.id)
        for item in items:
            kind = item_kind(item)
            relkind = _RELKINDS.get(kind)
            if relkind is None or item.name.schema not in schema_oids:
                continue
            oid = by_id[item.id]
            columns = _columns(item, view)
            classes.append(
                {
                    "oid": oid,
                    "relname": item.name.item,
                    "relnamespace": schema_oids[item.name.schema],
                    "relkind": relkind,
                    "relowner": role_oid(item.owner),
                    "relam": 403 if relkind == "i" else (2 if relkind in "rm" else 0),
                    "relhasindex": bool(view.indexes_on(item.id)),
                    "relpersistence": "p",
                    "relchecks": 0,
                    "relhasrules": False,
                    "relhastriggers": False,
                    "relrowsecurity": False,
                    "relforcerowsecurity": False,
                    "relispartition": False,
                    "reltablespace": 0,
                    "reloftype": 0,
                    "reltoastrelid": 0,
                    "relreplident": "d",
                    "reloptions": None,
                    "relnatts": len(columns),
                    "reltuples": -1.0,
                    "relpages": 0,
                    "relpartbound": None,
                    "reltype": 0,
                }
            )
            if kind == "index":
                indexes.append(
                    {
                        "indexrelid": oid,
                        "indrelid": by_id.get(item.index.on_id, 0),
                        "indisprimary": False,
                        "indisunique": False,
                        "indisclustered": False,
                        "indisvalid": True,
                        "indisready": True,
                        "indislive": True,
                        "indisreplident": False,
                        "indnatts": len(item.index.key_columns),
                        "indnkeyatts": len(item.index.key_columns),
                        "indkey": " ".join(str(n + 1) for n in range(len(item.index.key_columns))),
                        "_definition": (
                            f"CREATE INDEX {item.name.item} ON "
                            f"{item.name.schema}.{_on_name(item, view)} USING btree "
                            f"({', '.join(item.index.key_columns)})"
                        ),
                    }
                )
            for number, (name, sql_type, nullable) in enumerate(columns, 1):
                pg = pgtypes.pg_type(sql_type)
                attributes.append(
                    {
                        "attrelid": oid,
                        "attname": name,
                        "atttypid": pg.oid,
                        "atttypmod": pg.modifier,
                        "attnum": number,
                        "attnotnull": not nullable,
                        "attisdropped": False,
                        "atthasdef": False,
                        "attidentity": "",
                        "attgenerated": "",
                        "attcollation": 0,
                        "attlen": pg.size,
                        "attstorage": "p" if pg.size > 0 else "x",
                        "_format": pgtypes.format_type(sql_type),
                    }
                )
                if relkind != "i":
                    info_columns.append(
                        {
                            "table_catalog": self.database,
                            "table_schema": item.name.schema,
                            "table_name": item.name.item,
                            "column_name": name,
                            "ordinal_position": number,
                            "column_default": None,
                            "is_nullable": "YES" if nullable else "NO",
                            "data_type": pgtypes.format_type(sql_type).split("(")[0],
                            "udt_name": next((t[1] for t in _TYPES if t[0] == pg.oid), "text"),
                        }
                    )
            if relkind != "i":
                info_tables.append(
                    {
                        "table_catalog": self.database,
                        "table_schema": item.name.schema,
                        "table_name": item.name.item,
                        "table_type": "BASE TABLE" if relkind == "r" else "VIEW",
                    }
                )
        types = [
            {
                "oid": oid,
                "typname": name,
                "typnamespace": PG_CATALOG_OID,
                "typlen": size,
                "typarray": array,
                "typtype": "b",
                "typdelim": ",",
                "typelem": 0,
                "typbasetype": 0,
                "typrelid": 0,
                "typcollation": 100 if oid in (pgtypes.TEXT, pgtypes.VARCHAR) else 0,
                "typnotnull": False,
                "typowner": OWNER_OID,
            }
            for oid, name, size, array in _TYPES
        ]
        roles = self._roles()
        self.role_names = {r["oid"]: r["rolname"] for r in roles}
        self.tables = {
            "pg_namespace": namespaces,
            "pg_database": databases,
            "pg_class": classes,
            "pg_attribute": attributes,
            "pg_index": indexes,
            "pg_type": types,
            "pg_am": [{"oid": 2, "amname": "heap"}, {"oid": 403, "amname": "btree"}],
            "pg_roles": roles,
            "pg_user": [{"usesysid": r["oid"], "usename": r["rolname"]} for r in roles],
            "pg_settings": [],
            "pg_description": [],
            "pg_attrdef": [],
            "pg_constraint": [],
            "pg_inherits": [],
            "pg_collation": [],
            "pg_policy": [],
            "pg_statistic_ext": [],
            "pg_publication": [],
            "pg_publication_rel": [],
            "pg_publication_namespace": [],
            "pg_sequence": [],
            "pg_trigger": [],
            "pg_rewrite": [],
            "pg_extension": [],
            "pg_enum": [],
            "pg_range": [],
            "pg_proc": [],
            "pg_tablespace": [],
            "pg_partitioned_table": [],
            "pg_foreign_table": [],
            "tables": info_tables,
            "columns": info_columns,
            "views": [r for r in info_tables if r["table_type"] == "VIEW"],
            "schemata": [
                {
                    "catalog_name": self.database,
                    "schema_name": r["nspname"],
                    "schema_owner": self.role_names.get(r["nspowner"], OWNER),
                }
                for r in namespaces
            ],
        }
        self.class_by_oid = {r["oid"]: r for r in classes}
        self.class_by_name = {}
        namespace_names = {r["oid"]: r["nspname"] for r in namespaces}
        for row in classes:
            self.class_by_name[row["relname"]] = row["oid"]
            self.class_by_name[f"{namespace_names[row['relnamespace']]}.{row['relname']}"] = row[
                "oid"
            ]
        self.index_definitions = {r["indexrelid"]: r["_definition"] for r in indexes}
        self.index_keys = {
            r["attrelid"]: [a["attname"] for a in attributes if a["attrelid"] == r["attrelid"]]
            for r in attributes
            if r["attrelid"] in self.index_definitions
        }
        self.namespace_names = namespace_names


def _on_name(item: catalog_pb2.CatalogItem, view: CatalogView) -> str:
    on = view.by_id(item.index.on_id)
    return on.name.item if on is not None else item.index.on_id


def _columns(item: catalog_pb2.CatalogItem, view: CatalogView) -> list[tuple[str, str, bool]]:
    if item_kind(item) == "index":
        # An index's columns are its keys, typed as the relation's columns of those names.
        on = view.by_id(item.index.on_id)
        types = {}
        if on is not None:
            types = {c.name: (sql_type_name(c), c.nullable) for c in relation_schema(on).columns}
        return [(key, *types.get(key, ("text", True))) for key in item.index.key_columns]
    schema = relation_schema(item)
    return [(c.name, sql_type_name(c), c.nullable) for c in schema.columns]
