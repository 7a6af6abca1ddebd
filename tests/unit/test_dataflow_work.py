"""The work of a step grows with the keys it touches, not with the size of the collections.

Counted, not timed: arrangements count the keys they look up and the arranged rows they read.
"""

from __future__ import annotations

import random
from decimal import Decimal

from services.compute.dataflow import Dataflow, Update
from tidemark.columnar import Column, RelationSchema
from tidemark.columnar import ColumnType as T
from tidemark.plan import builders as pb

ORDERS = RelationSchema(
    [Column("o", T.INT64, False), Column("cust", T.INT64, False), Column("amount", T.INT64, False)]
)
CUSTOMERS = RelationSchema([Column("cust", T.INT64, False), Column("region", T.TEXT, False)])
ROWS = 100_000
CUSTOMER_COUNT = 1_000


def test_a_one_row_change_to_a_large_joined_and_aggregated_view_touches_few_keys() -> None:
    plan = pb.plan(
        pb.reduce(
            pb.join(pb.get("orders", ORDERS), pb.get("customers", CUSTOMERS), [1], [0]),
            [4],
            [pb.aggregate("count"), pb.aggregate("sum", 2), pb.aggregate("max", 2)],
        )
    )
    rng = random.Random(5)
    orders = [(o, rng.randrange(CUSTOMER_COUNT), rng.randrange(1, 100)) for o in range(ROWS)]
    customers = [(c, f"region{c % 10}") for c in range(CUSTOMER_COUNT)]
    dataflow = Dataflow(plan, as_of=0)
    out, upper = dataflow.hydrate(
        {"orders": [(r, 0, 1) for r in orders], "customers": [(r, 0, 1) for r in customers]}
    )
    assert len(out) == 10
    hydration = dataflow.work()
    assert hydration.key_lookups >= CUSTOMER_COUNT  # every join key was arranged once

    # One order changes its amount: one join key and one group.
    before = dataflow.work()
    old = orders[123]
    new = (old[0], old[1], old[2] + 1000)
    changes: list[Update] = [(old, upper, -1), (new, upper, 1)]
    out, upper = dataflow.step({"orders": changes}, upper + 1)
    after = dataflow.work()
    region = f"region{old[1] % 10}"
    assert [(row[0], diff) for row, _, diff in out] == [(region, -1), (region, 1)]
    assert out[1][0][2] == out[0][0][2] + Decimal(1000)  # the sum
    assert out[1][0][3] == new[2]  # the new maximum
    assert after.key_lookups - before.key_lookups == 2  # join key + group
    assert after.rows_visited - before.rows_visited <= 4  # the one matching customer, twice

    # A customer moving region touches its own orders (about 100) and two groups, not 10^5.
    customer = customers[7]
    moved = (customer[0], "elsewhere")
    own_orders = sum(1 for o in orders if o[1] == customer[0])
    before = dataflow.work()
    out, upper = dataflow.step({"customers": [(customer, upper, -1), (moved, upper, 1)]}, upper + 1)
    after = dataflow.work()
    assert {row[0] for row, _, _ in out} == {"region7", "elsewhere"}
    assert after.key_lookups - before.key_lookups == 3  # one join key, two groups
    assert after.rows_visited - before.rows_visited <= 2 * own_orders
    assert own_orders < 200
