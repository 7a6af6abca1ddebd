"""Evaluating a plan once, at one time, in this process: one-shot peeks over storage
snapshots and ``finishing`` plans over index contents. No Spark job runs: the in-process
engine hydrates at the peek's time and its hydration output is the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pyarrow as pa

from services.compute.dataflow import Dataflow, Row
from tidemark.columnar import RelationSchema, table_from_updates
from tidemark.v1 import plan_pb2


def _evaluate(
    plan: plan_pb2.Plan, timestamp: int, inputs: Mapping[str, Mapping[Row, int]]
) -> dict[Row, int]:
    dataflow = Dataflow(plan, as_of=timestamp)
    snapshots = {
        collection_id: [(row, timestamp, count) for row, count in contents.items()]
        for collection_id, contents in inputs.items()
    }
    output, _ = dataflow.hydrate(snapshots)
    return {row: diff for row, _, diff in output}


async def evaluate_at(
    plan: plan_pb2.Plan, timestamp: int, inputs: Mapping[str, Mapping[Row, int]]
) -> dict[Row, int]:
    """The plan's output over ``inputs`` (each input's contents at ``timestamp``)."""
    return await asyncio.to_thread(_evaluate, plan, timestamp, inputs)


def result_table(schema: RelationSchema, contents: Mapping[Row, int], timestamp: int) -> pa.Table:
    """A peek's answer: the rows, ``time`` = ``timestamp`` and ``diff`` = multiplicity."""
    return table_from_updates(
        schema, [(row, timestamp, count) for row, count in contents.items() if count]
    )
