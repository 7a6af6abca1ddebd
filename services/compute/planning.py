"""Checking a dataflow's plan against the collections it names, before anything runs.

Plans may leave a Get's schema out (the collection knows it); the engine lowers Gets from
their own schema, so the host fills every missing one in from storage first and then checks
the plan exactly as the engine will run it.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidemark.columnar import RelationSchema
from tidemark.errors import InvalidArgument
from tidemark.plan import check_plan
from tidemark.plan.walk import relations
from tidemark.v1 import plan_pb2


def with_input_schemas(plan: plan_pb2.Plan, schemas: Mapping[str, RelationSchema]) -> plan_pb2.Plan:
    """A copy of ``plan`` whose Gets all carry their collection's schema."""
    filled = plan_pb2.Plan()
    filled.CopyFrom(plan)
    for node in relations(filled.root):
        if node.HasField("get") and not node.get.schema.columns:
            known = schemas.get(node.get.collection_id)
            if known is not None:
                node.get.schema.CopyFrom(known.to_proto())
    return filled


def checked_plan(
    plan: plan_pb2.Plan, schemas: Mapping[str, RelationSchema]
) -> tuple[plan_pb2.Plan, RelationSchema]:
    """The plan with its Gets' schemas filled in, and its output schema. Raises
    ``InvalidArgument`` for a plan the engine would refuse (ill-typed, nondeterministic, a
    Get whose schema differs from its collection's)."""
    if not plan.HasField("root"):
        raise InvalidArgument("the plan has no root")
    filled = with_input_schemas(plan, schemas)
    return filled, check_plan(filled, schemas)


def rename_collections(plan: plan_pb2.Plan, names: Mapping[str, str]) -> plan_pb2.Plan:
    """A copy of ``plan`` whose Gets read ``names[old]`` instead of ``old`` (others unchanged)."""
    renamed = plan_pb2.Plan()
    renamed.CopyFrom(plan)
    for node in relations(renamed.root):
        if node.HasField("get") and node.get.collection_id in names:
            node.get.collection_id = names[node.get.collection_id]
    return renamed
