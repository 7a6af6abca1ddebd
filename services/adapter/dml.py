"""INSERT, UPDATE and DELETE.

An INSERT of constant rows is a blind write. Anything that reads first (INSERT ... SELECT,
UPDATE, DELETE) computes its changes from a read at ``r`` and is then a read-then-write: the
write at ``w > r`` is valid only if what the read depended on is unchanged in between
(``writes``). Outside a transaction the write happens at once; inside one it is buffered
until COMMIT (``transactions``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from services.adapter.authentication import Principal
from services.adapter.catalog_cache import CatalogState
from services.adapter.planning import Planner
from services.adapter.privileges import Privileges
from services.adapter.reads import PlanInputs, QueryReader, plan_inputs
from services.adapter.results import Outcome, delete_tag, insert_tag, update_tag
from services.adapter.session import Settings
from services.adapter.sql import statements as ast
from services.adapter.sql.catalog_view import BoundRelation
from services.adapter.sql.errors import NOT_NULL_VIOLATION, SqlError
from services.adapter.sql.planned import PlannedQuery
from services.adapter.timestamps import Timestamps
from services.adapter.transactions import Transaction
from services.adapter.writes import ReadSet, TableWriter
from tidemark.columnar import Row

StateSource = Callable[[], Awaitable[CatalogState]]
ReadTimestamp = Callable[[Transaction | None, int | None, int], Awaitable[int]]


def check_not_null(table: BoundRelation, rows: Sequence[Row], position: int) -> None:
    """23502 if a computed row puts NULL into a NOT NULL column."""
    required = [i for i, c in enumerate(table.schema.columns) if not c.nullable]
    if not required:
        return
    for row in rows:
        for index in required:
            if row[index] is None:
                column = table.schema.columns[index].name
                raise SqlError(
                    NOT_NULL_VIOLATION,
                    f'null value in column "{column}" of relation "{table.name[-1]}" violates '
                    "not-null constraint",
                    position,
                )


def _merge(inputs: Sequence[PlanInputs]) -> PlanInputs:
    return PlanInputs(
        frozenset().union(*(i.collections for i in inputs)),
        frozenset().union(*(i.tables for i in inputs)),
        frozenset().union(*(i.sources for i in inputs)),
    )


class DmlRunner:
    def __init__(
        self,
        catalog_state: StateSource,
        read_timestamp: ReadTimestamp,
        planner: Planner,
        reader: QueryReader,
        writer: TableWriter,
        timestamps: Timestamps,
    ) -> None:
        self.catalog_state = catalog_state
        self.read_timestamp = read_timestamp
        self.planner = planner
        self.reader = reader
        self.writer = writer
        self.timestamps = timestamps

    async def run(
        self,
        statement: ast.Insert | ast.Update | ast.Delete,
        settings: Settings,
        transaction: Transaction | None,
        principal: Principal,
    ) -> Outcome:
        state = await self.catalog_state()
        privileges = Privileges.of(state, principal)
        position = statement.position
        if isinstance(statement, ast.Insert):
            plan = self.planner.insert(statement, state, settings)
            table = plan.table
            privileges.require_usage_of_container(table.item, position)
            privileges.require(table.item, "INSERT", position)
            if plan.query is not None:
                privileges.require_read(plan.query.depends_on, position)
                privileges.require_cluster(settings.cluster, "USAGE", position)
            if plan.rows is not None:
                changes = [(row, 1) for row in plan.rows]
                return await self._finish(
                    statement, table, changes, insert_tag(len(changes)), transaction, None
                )
            assert plan.query is not None
            reads, (rows,) = await self._read(statement, state, settings, transaction, [plan.query])
            check_not_null(table, rows, statement.position)
            changes = [(row, 1) for row in rows]
            return await self._finish(
                statement, table, changes, insert_tag(len(changes)), transaction, reads
            )
        change = (
            self.planner.update(statement, state, settings)
            if isinstance(statement, ast.Update)
            else self.planner.delete(statement, state, settings)
        )
        privileges.require_usage_of_container(change.table.item, position)
        privileges.require(
            change.table.item, "UPDATE" if isinstance(statement, ast.Update) else "DELETE", position
        )
        # As in PostgreSQL: reading the target's rows (a WHERE) needs SELECT on it too.
        read = set(change.depends_on)
        if statement.where is None:
            read.discard(change.table.id)
        privileges.require_read(read, position)
        privileges.require_cluster(settings.cluster, "USAGE", position)
        queries = [change.retract] + ([change.insert] if change.insert is not None else [])
        reads, results = await self._read(statement, state, settings, transaction, queries)
        old_rows = results[0]
        new_rows = results[1] if len(results) > 1 else []
        check_not_null(change.table, new_rows, statement.position)
        changes = [(row, -1) for row in old_rows] + [(row, 1) for row in new_rows]
        tag = (
            update_tag(len(old_rows))
            if isinstance(statement, ast.Update)
            else delete_tag(len(old_rows))
        )
        return await self._finish(statement, change.table, changes, tag, transaction, reads)

    async def _read(
        self,
        statement: ast.Statement,
        state: CatalogState,
        settings: Settings,
        transaction: Transaction | None,
        queries: Sequence[PlannedQuery],
    ) -> tuple[ReadSet, list[list[Row]]]:
        """The queries' rows (repeated by multiplicity), all read at one time."""
        timestamp = await self.read_timestamp(transaction, None, statement.position)
        inputs = [plan_inputs(q.plan, state) for q in queries]
        results = await asyncio.gather(
            *(
                self.reader.read(
                    q.plan,
                    state,
                    timestamp,
                    settings.cluster,
                    inputs=i,
                    match=q.unoptimized,
                    memory_budget_bytes=settings.statement_memory_bytes,
                )
                for q, i in zip(queries, inputs, strict=True)
            )
        )
        rows = []
        for result in results:
            expanded: list[Row] = []
            for row, count in result.rows:
                if count < 0:
                    raise SqlError(
                        "XX000", f"internal error: a write's read produced {count} x {row}"
                    )
                expanded.extend([row] * count)
            rows.append(expanded)
        merged = _merge(inputs)
        if transaction is not None:
            transaction.read_ts = timestamp
            transaction.reads |= merged.tables
            transaction.read_sources |= merged.sources
        return ReadSet(timestamp, merged.tables, merged.sources), rows

    async def _finish(
        self,
        statement: ast.Statement,
        table: BoundRelation,
        changes: list[tuple[Row, int]],
        tag: str,
        transaction: Transaction | None,
        reads: ReadSet | None,
    ) -> Outcome:
        if transaction is not None:
            if changes:
                transaction.add_write(
                    table.collection_id or table.id,
                    table.name[-1],
                    table.schema,
                    changes,
                    statement.position,
                )
            return Outcome(tag, timestamp=reads.read_ts if reads is not None else 0)
        if not changes:
            return Outcome(tag, timestamp=reads.read_ts if reads is not None else 0)
        collection_id = table.collection_id or table.id
        if reads is not None and not reads.collections:
            reads = None  # nothing was read from storage: a blind write
        w = await self.writer.write(collection_id, table.schema, changes, reads)
        return Outcome(tag, timestamp=w)
