"""The statements the adapter runs, one frozen dataclass per kind, as :func:`parse` returns
them.

Every statement carries ``text`` (its source, without the terminating semicolon) and
``position`` (the 1-based offset of its first character in the request). Names are tuples of
identifier parts (``("db", "schema", "t")``, or shorter), already case-folded. Queries are
sqlglot syntax trees wrapped in :class:`Query`; the planner lowers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from sqlglot import exp

from services.adapter.sql.literal_insert import LiteralRows
from services.adapter.sql.names import QualifiedName
from services.adapter.sql.types import SqlType

ObjectKind = Literal[
    "database",
    "schema",
    "table",
    "view",
    "materialized view",
    "index",
    "cluster",
    "source",
    "secret",
    "connection",
    "role",
]
ShowKind = Literal[
    "tables",
    "views",
    "materialized views",
    "indexes",
    "clusters",
    "sources",
    "secrets",
    "connections",
    "subsources",
    "databases",
    "schemas",
]


@dataclass(frozen=True)
class Query:
    """A query (SELECT, VALUES, set operations, WITH ...) as a sqlglot tree."""

    ast: exp.Expr
    text: str
    position: int


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type: SqlType
    # The type as written, e.g. "varchar(20)".
    type_text: str
    not_null: bool
    position: int


@dataclass(frozen=True)
class Statement:
    text: str
    position: int


@dataclass(frozen=True)
class CreateTable(Statement):
    name: QualifiedName
    columns: tuple[ColumnDef, ...]
    if_not_exists: bool = False


@dataclass(frozen=True)
class LoadGeneratorOptions:
    """``FROM LOAD GENERATOR <generator> (options)``, as Materialize spells it."""

    generator: str
    tick_interval_ms: int | None = None
    max_cardinality: int | None = None
    scale_factor: float | None = None
    up_to: int | None = None


@dataclass(frozen=True)
class CreateSource(Statement):
    name: QualifiedName
    # CDCV2: the declared columns; a load generator's come from the generator.
    columns: tuple[ColumnDef, ...]
    # The feed's format: "CDCV2" (ingested through Storage.IngestCdc) or "LOAD GENERATOR".
    format: str
    if_not_exists: bool = False
    load_generator: LoadGeneratorOptions | None = None
    for_all_tables: bool = False
    # EXPOSE PROGRESS AS <name> (default: <source>_progress).
    progress_name: str | None = None
    in_cluster: str | None = None


@dataclass(frozen=True)
class RoleOptions:
    """What CREATE/ALTER ROLE set; ``None`` for what the statement leaves as it is.
    ``password`` ``""`` means PASSWORD NULL (none)."""

    login: bool | None = None
    superuser: bool | None = None
    password: str | None = None
    createrole: bool | None = None

    def __repr__(self) -> str:
        hidden = None if self.password is None else "<hidden>"
        return (
            f"RoleOptions(login={self.login}, superuser={self.superuser}, "
            f"createrole={self.createrole}, password={hidden})"
        )


@dataclass(frozen=True)
class CreateRole(Statement):
    """``CREATE ROLE|USER name [WITH] options``; ``text`` has any password masked."""

    name: str
    options: RoleOptions
    # CREATE USER: LOGIN unless NOLOGIN is given.
    user: bool = False


@dataclass(frozen=True)
class AlterRole(Statement):
    """``ALTER ROLE|USER name [WITH] options``; ``text`` has any password masked."""

    name: str
    options: RoleOptions


GrantKind = Literal["relation", "cluster", "database", "schema", "all tables in schema"]


@dataclass(frozen=True)
class Grant(Statement):
    """``GRANT privileges ON [kind] names TO grantees`` (``revoke``: ``REVOKE ... FROM``).
    ``privileges`` empty means ALL [PRIVILEGES]; a grantee ``PUBLIC`` means every role.
    For ``all tables in schema`` the names are schemas."""

    revoke: bool
    privileges: tuple[str, ...]
    kind: GrantKind
    names: tuple[QualifiedName, ...]
    grantees: tuple[str, ...]


@dataclass(frozen=True)
class GrantRole(Statement):
    """``GRANT role, ... TO member, ...``: the members act with the roles' privileges (and
    own what they own); ``revoke``: ``REVOKE role FROM member``."""

    revoke: bool
    roles: tuple[str, ...]
    members: tuple[str, ...]


@dataclass(frozen=True)
class AlterOwner(Statement):
    """``ALTER <kind> name OWNER TO role``."""

    kind: ObjectKind
    name: QualifiedName
    owner: str


@dataclass(frozen=True)
class CreateSecret(Statement):
    """``CREATE SECRET name AS 'value'``; ``text`` has the value masked."""

    name: QualifiedName
    value: bytes
    if_not_exists: bool = False

    def __repr__(self) -> str:
        return f"CreateSecret(name={self.name!r}, value=<hidden>)"


@dataclass(frozen=True)
class CreateConnection(Statement):
    """``CREATE CONNECTION name TO POSTGRES (HOST '...', PORT n, USER '...', PASSWORD SECRET
    s, DATABASE '...')``. ``options`` maps the option (lower case, ``password`` for PASSWORD
    SECRET) to its value: a string, a number as text, or for a secret its name."""

    name: QualifiedName
    kind: str
    options: tuple[tuple[str, str | QualifiedName], ...]
    if_not_exists: bool = False


@dataclass(frozen=True)
class PostgresTableRef:
    # ("t",) or ("schema", "t") upstream.
    upstream: QualifiedName
    # The subsource's name: the alias, else the upstream table's name.
    alias: str | None


@dataclass(frozen=True)
class CreatePostgresSource(Statement):
    """``CREATE SOURCE s FROM POSTGRES CONNECTION c (PUBLICATION 'p' [, TEXT COLUMNS (...)])
    FOR ALL TABLES | FOR TABLES (t1, s.t2 AS alias) | FOR SCHEMAS (s1, ...)``."""

    name: QualifiedName
    connection: QualifiedName
    publication: str
    # None: FOR ALL TABLES.
    tables: tuple[PostgresTableRef, ...] | None
    in_cluster: str | None = None
    if_not_exists: bool = False
    # EXPOSE PROGRESS AS name; None: <source>_progress.
    progress_name: str | None = None
    # FOR SCHEMAS (...): the publication's tables in these schemas.
    schemas: tuple[str, ...] | None = None
    # TEXT COLUMNS (t.c, ...): columns replicated as their text form, whatever their type.
    text_columns: tuple[QualifiedName, ...] = ()


@dataclass(frozen=True)
class CreateView(Statement):
    name: QualifiedName
    query: Query
    materialized: bool = False
    in_cluster: str | None = None
    if_not_exists: bool = False
    # CREATE VIEW v (x, y) AS ...: names for the query's columns.
    column_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class CreateIndex(Statement):
    # None: the adapter picks a name.
    name: str | None
    on: QualifiedName
    columns: tuple[str, ...]
    in_cluster: str | None = None
    if_not_exists: bool = False


@dataclass(frozen=True)
class CreateCluster(Statement):
    name: str
    # Options as written (lower-case names): SIZE 'x', REPLICATION FACTOR 2, anything else.
    options: tuple[tuple[str, str], ...] = ()
    if_not_exists: bool = False

    @property
    def size(self) -> str | None:
        return dict(self.options).get("size")

    @property
    def replication_factor(self) -> int | None:
        value = dict(self.options).get("replication_factor")
        return int(value) if value is not None else None


@dataclass(frozen=True)
class CreateDatabase(Statement):
    name: str
    if_not_exists: bool = False


@dataclass(frozen=True)
class CreateSchema(Statement):
    # (schema,) or (database, schema).
    name: QualifiedName
    if_not_exists: bool = False


@dataclass(frozen=True)
class Drop(Statement):
    kind: ObjectKind
    names: tuple[QualifiedName, ...]
    if_exists: bool = False
    cascade: bool = False


@dataclass(frozen=True)
class Insert(Statement):
    table: QualifiedName
    # None: every column, in order.
    columns: tuple[str, ...] | None
    # VALUES (...) or a query; None for DEFAULT VALUES (or literal rows).
    source: Query | None
    # VALUES rows of plain literals, read without a syntax tree (see literal_insert).
    literal_rows: LiteralRows | None = None


@dataclass(frozen=True)
class CopyOption:
    """``name [value]`` of a COPY's options, the name case-folded; ``value`` None when left
    out (``HEADER`` alone)."""

    name: str
    value: str | None
    position: int


@dataclass(frozen=True)
class CopyFrom(Statement):
    """COPY table [(columns)] FROM STDIN | 'path or URL' [WITH] (options)."""

    table: QualifiedName
    columns: tuple[str, ...] | None
    # None: the data comes from the client (FROM STDIN).
    location: str | None
    options: tuple[CopyOption, ...]


@dataclass(frozen=True)
class CopyTo(Statement):
    """COPY table [(columns)] | (query) TO STDOUT [WITH] (options): the query's rows."""

    query: Query
    options: tuple[CopyOption, ...]


@dataclass(frozen=True)
class Assignment:
    column: str
    value: exp.Expr
    position: int


@dataclass(frozen=True)
class Update(Statement):
    table: QualifiedName
    alias: str | None
    assignments: tuple[Assignment, ...]
    where: exp.Expr | None


@dataclass(frozen=True)
class Delete(Statement):
    table: QualifiedName
    alias: str | None
    where: exp.Expr | None


@dataclass(frozen=True)
class Select(Statement):
    query: Query
    # AS OF <t>: the data timestamp (u64 ms) to read at.
    as_of: int | None = None


@dataclass(frozen=True)
class Subscribe(Statement):
    # SUBSCRIBE TO v reads as SELECT * FROM v; ``target`` keeps the name.
    query: Query
    as_of: int | None = None
    target: QualifiedName | None = None


@dataclass(frozen=True)
class ShowObjects(Statement):
    kind: ShowKind
    # FROM/IN schema (or database for SHOW SCHEMAS).
    within: QualifiedName | None = None
    # SHOW INDEXES ON relation, SHOW SUBSOURCES ON source.
    on: QualifiedName | None = None
    # ... IN CLUSTER c.
    in_cluster: str | None = None


@dataclass(frozen=True)
class ShowColumns(Statement):
    relation: QualifiedName


@dataclass(frozen=True)
class ShowSetting(Statement):
    # Lower case; "all" for SHOW ALL.
    name: str


@dataclass(frozen=True)
class RebuildMaterializedView(Statement):
    """``ALTER MATERIALIZED VIEW name REBUILD``: start the view's stored history afresh and
    recompute its contents from its inputs."""

    name: QualifiedName


@dataclass(frozen=True)
class Explain(Statement):
    query: Query
    # EXPLAIN RAW PLAN: the plan as planned, before the optimizer.
    raw: bool = False


@dataclass(frozen=True)
class SetVariable(Statement):
    # Lower case, e.g. "search_path", "cluster", "transaction_isolation".
    name: str
    # The value as text (several values joined with ", "); None for DEFAULT and RESET.
    value: str | None
    local: bool = False


@dataclass(frozen=True)
class Begin(Statement):
    # Transaction modes as written (lower case), e.g. ("isolation level serializable",).
    modes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Commit(Statement):
    pass


@dataclass(frozen=True)
class Rollback(Statement):
    pass


AnyStatement: TypeAlias = (
    CreateTable
    | CreateSource
    | CreateSecret
    | CreateConnection
    | CreatePostgresSource
    | CreateView
    | CreateIndex
    | CreateCluster
    | CreateDatabase
    | CreateSchema
    | Drop
    | RebuildMaterializedView
    | CreateRole
    | AlterRole
    | Grant
    | GrantRole
    | AlterOwner
    | Insert
    | CopyFrom
    | CopyTo
    | Update
    | Delete
    | Select
    | Subscribe
    | ShowObjects
    | ShowColumns
    | ShowSetting
    | Explain
    | SetVariable
    | Begin
    | Commit
    | Rollback
)
