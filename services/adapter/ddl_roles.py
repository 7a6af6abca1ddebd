"""What CREATE ROLE, ALTER ROLE and DROP ROLE draft: global catalog items holding whether the
role may log in, whether it is a superuser, and its password as a SCRAM-SHA-256 verifier (the
password itself is never stored). The PostgreSQL wire protocol authenticates against them."""

from __future__ import annotations

from services.adapter.ddl import Build, CatalogDraft, CollectionMaker, DdlOutcome
from services.adapter.sql import statements as ast
from services.adapter.sql.errors import SqlError
from tidemark.catalog_items import role_named
from tidemark.scram import ScramVerifier
from tidemark.v1 import catalog_pb2

DUPLICATE_OBJECT = "42710"
UNDEFINED_OBJECT = "42704"
RESERVED_NAME = "42939"


def create_role(statement: ast.CreateRole, draft: CatalogDraft) -> DdlOutcome:
    tag = "CREATE ROLE"
    # "system" owns the default objects; PUBLIC (any case) is every role in a grant.
    if statement.name.startswith("pg_") or statement.name.lower() in ("public", "none", "system"):
        raise SqlError(
            RESERVED_NAME, f'role name "{statement.name}" is reserved', statement.position
        )
    if role_named(draft.state, statement.name) is not None:
        raise SqlError(
            DUPLICATE_OBJECT, f'role "{statement.name}" already exists', statement.position
        )
    options = statement.options
    role = catalog_pb2.Role(
        login=statement.user if options.login is None else options.login,
        superuser=bool(options.superuser),
        createrole=bool(options.createrole),
    )
    _set_password(role, options.password)
    draft.create(
        catalog_pb2.CatalogItem(
            id=draft.allocate(),
            name=catalog_pb2.QualifiedName(item=statement.name),
            owner=draft.owner,
            role=role,
        )
    )
    return DdlOutcome(tag)


def alter_role(statement: ast.AlterRole, draft: CatalogDraft) -> DdlOutcome:
    current = role_named(draft.state, statement.name)
    if current is None:
        raise SqlError(
            UNDEFINED_OBJECT, f'role "{statement.name}" does not exist', statement.position
        )
    changed = catalog_pb2.CatalogItem()
    changed.CopyFrom(current)
    options = statement.options
    if options.login is not None:
        changed.role.login = options.login
    if options.superuser is not None:
        changed.role.superuser = options.superuser
    if options.createrole is not None:
        changed.role.createrole = options.createrole
    _set_password(changed.role, options.password)
    if changed != current:
        draft.drop(current)
        draft.create(changed)
    return DdlOutcome("ALTER ROLE")


def _set_password(role: catalog_pb2.Role, password: str | None) -> None:
    if password is None:
        return
    if password == "":
        role.ClearField("password")
    else:
        role.password.CopyFrom(ScramVerifier.from_password(password).to_proto())


def bootstrap_superuser(name: str, password: str) -> Build:
    """Creates the superuser ``name`` (LOGIN, with ``password`` if given) unless a role of
    that name exists: every adapter runs it at start, and whichever appends first makes it."""

    async def build(draft: CatalogDraft, maker: CollectionMaker) -> DdlOutcome:
        if role_named(draft.state, name) is None:
            role = catalog_pb2.Role(login=True, superuser=True)
            _set_password(role, password or None)
            draft.create(
                catalog_pb2.CatalogItem(
                    id=draft.allocate(),
                    name=catalog_pb2.QualifiedName(item=name),
                    owner=name,
                    role=role,
                )
            )
        return DdlOutcome("CREATE ROLE")

    return build
