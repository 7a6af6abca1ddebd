"""Which reader ingests a source of each format."""

from __future__ import annotations

from collections.abc import Callable

from tidemark.columnar import RelationSchema
from tidemark.sources.loadgen import LoadGeneratorReader, generator_for, spec_from_proto
from tidemark.sources.plan import SourcePlan
from tidemark.sources.postgres.reader import PostgresReader
from tidemark.sources.postgres.upstream import ConnectionParams, UpstreamColumn, UpstreamTable
from tidemark.sources.reader import SourceReader
from tidemark.v1 import catalog_pb2

ReaderFactory = Callable[[SourcePlan], SourceReader]


def load_generator_reader(plan: SourcePlan) -> SourceReader:
    spec = spec_from_proto(plan.primary.source.load_generator)
    return LoadGeneratorReader(generator_for(spec))


def postgres_reader(plan: SourcePlan) -> SourceReader:
    spec = plan.primary.source.postgres
    dependencies = {item.id: item for item in plan.dependencies}
    connection = dependencies.get(spec.connection_id)
    if connection is None:
        raise ValueError(f"source {plan.name()}: its connection {spec.connection_id} is gone")
    postgres = connection.connection.postgres
    secret = dependencies.get(postgres.password_secret_id)
    params = ConnectionParams(
        postgres.host,
        postgres.port,
        postgres.user,
        secret.secret.value.decode() if secret is not None else "",
        postgres.database,
    )
    subsources = {item.source.upstream_name: item for item in plan.subsources()}
    tables = []
    for table in spec.tables:
        key = f"{table.upstream_schema}.{table.upstream_name}"
        item = subsources[key]
        schema = RelationSchema.from_proto(item.source.schema)
        tables.append(
            UpstreamTable(
                table.upstream_oid,
                table.upstream_schema,
                table.upstream_name,
                tuple(UpstreamColumn(column, 0) for column in schema.columns),
            )
        )
    return PostgresReader(params, spec.publication, spec.slot, tables)


READERS: dict[int, ReaderFactory] = {
    catalog_pb2.SOURCE_FORMAT_LOAD_GENERATOR: load_generator_reader,
    catalog_pb2.SOURCE_FORMAT_POSTGRES: postgres_reader,
}
"""The formats the sources process ingests; a new kind of source registers its reader here."""
