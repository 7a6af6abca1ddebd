"""COUNTER: one relation, ``counter bigint``; tick ``k`` inserts ``k + 1``. With MAX
CARDINALITY ``m`` it keeps the newest ``m`` values: inserting ``v > m`` retracts ``v - m``."""

from __future__ import annotations

from collections.abc import Mapping

from tidemark.columnar import Column, ColumnType, RelationSchema, Row
from tidemark.sources.loadgen.base import Generator

COUNTER_SCHEMA = RelationSchema([Column("counter", ColumnType.INT64, nullable=False)])


class Counter(Generator):
    def schemas(self) -> Mapping[str, RelationSchema]:
        return {"counter": COUNTER_SCHEMA}

    def tick(self, tick: int) -> dict[str, list[tuple[Row, int]]]:
        value = tick + 1
        changes: list[tuple[Row, int]] = [((value,), 1)]
        limit = self.spec.max_cardinality
        if limit and value > limit:
            changes.append(((value - limit,), -1))
        return {"counter": changes}
