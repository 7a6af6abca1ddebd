"""The orders ⋈ customers workload of the compute process tests (a kill -9 mid-stream, a
standalone Spark cluster losing an executor): the schemas, the view of totals by region, and
random changes to both inputs."""

from __future__ import annotations

import random
from typing import Any

from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

Row = tuple[Any, ...]
Change = tuple[Row, int, int]
ORDERS = RelationSchema.of(("order", T.INT64), ("customer", T.INT64), ("amount", T.INT64))
CUSTOMERS = RelationSchema.of(("customer", T.INT64), ("region", T.TEXT))
CUSTOMER_COUNT = 6


def totals_by_region(orders: str, customers: str) -> plan_pb2.Plan:
    """Per region: how many orders, their total, and the largest."""
    joined = pb.join(pb.get(orders, ORDERS), pb.get(customers, CUSTOMERS), [1], [0])
    return pb.plan(
        pb.reduce(
            joined,
            [4],
            [pb.aggregate("count"), pb.aggregate("sum", 2), pb.aggregate("max", 2)],
        )
    )


class RandomChanges:
    """Random inserts, deletes and updates of orders, and customers moving region, kept
    consistent with what was changed before (a delete or update names a live order)."""

    def __init__(self, rng: random.Random) -> None:
        self.random = rng
        self.live: dict[int, Row] = {}
        self.regions = {c: "north" if c % 2 else "south" for c in range(CUSTOMER_COUNT)}

    def customers(self, time: int) -> list[Change]:
        """Every customer, inserted at ``time``."""
        return [((c, r), time, 1) for c, r in self.regions.items()]

    def orders_at(self, time: int, count: int) -> list[Change]:
        """About ``count`` changes of orders at ``time``."""
        updates: list[Change] = []
        for _ in range(count):
            choice = self.random.random()
            if self.live and choice < 0.3:
                key = self.random.choice(sorted(self.live))
                updates.append((self.live.pop(key), time, -1))
            elif self.live and choice < 0.5:
                key = self.random.choice(sorted(self.live))
                old = self.live[key]
                new = (key, old[1], self.random.randint(1, 50))
                if new != old:
                    updates += [(old, time, -1), (new, time, 1)]
                    self.live[key] = new
            else:
                key = self.random.randint(0, 10_000)
                if key not in self.live:
                    customer = self.random.randrange(CUSTOMER_COUNT)
                    self.live[key] = (key, customer, self.random.randint(1, 50))
                    updates.append((self.live[key], time, 1))
        return updates

    def customer_moves(self, time: int) -> list[Change]:
        """One customer moving to another region at ``time``."""
        moved = self.random.randrange(CUSTOMER_COUNT)
        old = (moved, self.regions[moved])
        self.regions[moved] = "east" if self.regions[moved] != "east" else "west"
        return [(old, time, -1), ((moved, self.regions[moved]), time, 1)]
