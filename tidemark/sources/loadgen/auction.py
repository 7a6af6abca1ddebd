"""AUCTION: an auction house, as Materialize's generator has it.

Subsources: ``organizations (id, name)``, ``users (id, org_id, name)``, ``accounts (id,
org_id, balance)``, ``auctions (id, seller, item, end_time)`` and ``bids (id, buyer,
auction_id, amount, bid_time)``. Tick 0 makes the organizations, users and accounts; every
later tick ``k`` opens auction ``k`` (ending 10 to 19 ticks later) and places up to four bids
on auctions still open, at the tick's time. Everything is drawn from a random generator
seeded by the tick, so a tick always makes the same rows.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Mapping

from tidemark.columnar import Column, ColumnType, RelationSchema, Row
from tidemark.sources.loadgen.base import Generator

ORGANIZATIONS = 10
USERS = 100
MAX_BIDS_PER_TICK = 4
OPEN_TICKS = 10
ITEMS = (
    "Signed Memorabilia",
    "City Bar Crawl",
    "Best Pizza in Town",
    "Gift Basket",
    "Custom Art",
    "Vintage Watch",
    "Concert Tickets",
    "Antique Lamp",
)
_FIRST = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ida", "Jo")
_LAST = ("Ames", "Bell", "Cole", "Dunn", "Eads", "Ford", "Gray", "Hart", "Ives", "Judd")


def _bigint(name: str) -> Column:
    return Column(name, ColumnType.INT64, nullable=False)


def _text(name: str) -> Column:
    return Column(name, ColumnType.TEXT, nullable=False)


def _timestamp(name: str) -> Column:
    return Column(name, ColumnType.TIMESTAMP, nullable=False)


AUCTION_SCHEMAS: dict[str, RelationSchema] = {
    "organizations": RelationSchema([_bigint("id"), _text("name")]),
    "users": RelationSchema([_bigint("id"), _bigint("org_id"), _text("name")]),
    "accounts": RelationSchema([_bigint("id"), _bigint("org_id"), _bigint("balance")]),
    "auctions": RelationSchema(
        [_bigint("id"), _bigint("seller"), _text("item"), _timestamp("end_time")]
    ),
    "bids": RelationSchema(
        [
            _bigint("id"),
            _bigint("buyer"),
            _bigint("auction_id"),
            _bigint("amount"),
            _timestamp("bid_time"),
        ]
    ),
}


class Auction(Generator):
    def schemas(self) -> Mapping[str, RelationSchema]:
        return AUCTION_SCHEMAS

    def tick(self, tick: int) -> dict[str, list[tuple[Row, int]]]:
        rng = random.Random(f"auction:{tick}")
        if tick == 0:
            return self._initial(rng)
        now = self.spec.tick_time(tick)
        end = now + datetime.timedelta(
            milliseconds=self.spec.tick_interval_ms * (OPEN_TICKS + rng.randrange(OPEN_TICKS))
        )
        auction: Row = (tick, rng.randrange(1, USERS + 1), rng.choice(ITEMS), end)
        bids: list[tuple[Row, int]] = []
        for number in range(rng.randrange(MAX_BIDS_PER_TICK + 1)):
            target = rng.randrange(max(1, tick - OPEN_TICKS + 1), tick + 1)
            bid: Row = (
                tick * MAX_BIDS_PER_TICK + number,
                rng.randrange(1, USERS + 1),
                target,
                rng.randrange(1, 100),
                now,
            )
            bids.append((bid, 1))
        return {"auctions": [(auction, 1)], "bids": bids}

    def _initial(self, rng: random.Random) -> dict[str, list[tuple[Row, int]]]:
        organizations = [((i, f"Organization {i}"), 1) for i in range(1, ORGANIZATIONS + 1)]
        users: list[tuple[Row, int]] = []
        for i in range(1, USERS + 1):
            name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
            users.append(((i, rng.randrange(1, ORGANIZATIONS + 1), name), 1))
        accounts = [((i, i, rng.randrange(1_000, 100_000)), 1) for i in range(1, ORGANIZATIONS + 1)]
        return {"organizations": organizations, "users": users, "accounts": accounts}
