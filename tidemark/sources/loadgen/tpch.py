"""TPCH: the eight TPC-H tables at a scale factor, then a steady trickle of order changes.

Tick 0 makes the tables with the TPC-H cardinalities (``region`` 5, ``nation`` 25,
``supplier`` 10,000 * SF, ``customer`` 150,000 * SF, ``part`` 200,000 * SF, ``partsupp`` four
per part, ``orders`` 1,500,000 * SF, ``lineitem`` one to seven per order) and the TPC-H
column types and value domains. Each later tick ``k`` replaces one order and its line items
with a new version (as Materialize's generator keeps updating orders): the order at index
``k * STRIDE mod orders``, whose previous version is the one made at tick ``k - orders`` (or
at tick 0), so every tick is a pure function of ``k``. The data is made here in Python, not
by dbgen: the values follow the specification's domains but are not dbgen's values.
"""

from __future__ import annotations

import datetime
import math
import random
from collections.abc import Mapping
from decimal import Decimal

from tidemark.columnar import Column, ColumnType, RelationSchema, Row
from tidemark.sources.loadgen.base import Generator

STRIDE = 7919
"""A prime: successive ticks touch orders spread over the table."""

_REGIONS = ("AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST")
_NATIONS = (
    ("ALGERIA", 0), ("ARGENTINA", 1), ("BRAZIL", 1), ("CANADA", 1), ("EGYPT", 4),
    ("ETHIOPIA", 0), ("FRANCE", 3), ("GERMANY", 3), ("INDIA", 2), ("INDONESIA", 2),
    ("IRAN", 4), ("IRAQ", 4), ("JAPAN", 2), ("JORDAN", 4), ("KENYA", 0), ("MOROCCO", 0),
    ("MOZAMBIQUE", 0), ("PERU", 1), ("CHINA", 2), ("ROMANIA", 3), ("SAUDI ARABIA", 4),
    ("VIETNAM", 2), ("RUSSIA", 3), ("UNITED KINGDOM", 3), ("UNITED STATES", 1),
)  # fmt: skip
_SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY")
_PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
_INSTRUCTIONS = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
_MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
_CONTAINERS_1 = ("SM", "LG", "MED", "JUMBO", "WRAP")
_CONTAINERS_2 = ("CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM")
_TYPES_1 = ("STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO")
_TYPES_2 = ("ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED")
_TYPES_3 = ("TIN", "NICKEL", "BRASS", "STEEL", "COPPER")
_COLORS = (
    "almond", "antique", "aquamarine", "azure", "beige", "bisque", "black", "blanched",
    "blue", "blush", "brown", "burlywood", "burnished", "chartreuse", "chiffon", "chocolate",
    "coral", "cornflower", "cornsilk", "cream", "cyan", "dark", "deep", "dim", "dodger",
    "drab", "firebrick", "floral", "forest", "frosted", "gainsboro", "ghost", "goldenrod",
    "green", "grey", "honeydew", "hot", "indian", "ivory", "khaki", "lace", "lavender",
)  # fmt: skip
_WORDS = (
    "furiously", "quickly", "carefully", "blithely", "slyly", "final", "regular", "pending",
    "express", "ironic", "special", "bold", "even", "silent", "unusual", "deposits",
    "requests", "accounts", "packages", "theodolites", "foxes", "pinto", "beans", "ideas",
)  # fmt: skip
_START = datetime.date(1992, 1, 1)
_ORDER_DAYS = (datetime.date(1998, 8, 2) - _START).days - 151
_CURRENT = datetime.date(1995, 6, 17)


def _int(name: str) -> Column:
    return Column(name, ColumnType.INT64, nullable=False)


def _text(name: str) -> Column:
    return Column(name, ColumnType.TEXT, nullable=False)


def _money(name: str) -> Column:
    return Column(name, ColumnType.DECIMAL, nullable=False, precision=15, scale=2)


def _date(name: str) -> Column:
    return Column(name, ColumnType.DATE, nullable=False)


TPCH_SCHEMAS: dict[str, RelationSchema] = {
    "region": RelationSchema([_int("r_regionkey"), _text("r_name"), _text("r_comment")]),
    "nation": RelationSchema(
        [_int("n_nationkey"), _text("n_name"), _int("n_regionkey"), _text("n_comment")]
    ),
    "supplier": RelationSchema(
        [
            _int("s_suppkey"), _text("s_name"), _text("s_address"), _int("s_nationkey"),
            _text("s_phone"), _money("s_acctbal"), _text("s_comment"),
        ]
    ),
    "customer": RelationSchema(
        [
            _int("c_custkey"), _text("c_name"), _text("c_address"), _int("c_nationkey"),
            _text("c_phone"), _money("c_acctbal"), _text("c_mktsegment"), _text("c_comment"),
        ]
    ),
    "part": RelationSchema(
        [
            _int("p_partkey"), _text("p_name"), _text("p_mfgr"), _text("p_brand"),
            _text("p_type"), _int("p_size"), _text("p_container"), _money("p_retailprice"),
            _text("p_comment"),
        ]
    ),
    "partsupp": RelationSchema(
        [
            _int("ps_partkey"), _int("ps_suppkey"), _int("ps_availqty"),
            _money("ps_supplycost"), _text("ps_comment"),
        ]
    ),
    "orders": RelationSchema(
        [
            _int("o_orderkey"), _int("o_custkey"), _text("o_orderstatus"),
            _money("o_totalprice"), _date("o_orderdate"), _text("o_orderpriority"),
            _text("o_clerk"), _int("o_shippriority"), _text("o_comment"),
        ]
    ),
    "lineitem": RelationSchema(
        [
            _int("l_orderkey"), _int("l_partkey"), _int("l_suppkey"), _int("l_linenumber"),
            _money("l_quantity"), _money("l_extendedprice"), _money("l_discount"),
            _money("l_tax"), _text("l_returnflag"), _text("l_linestatus"), _date("l_shipdate"),
            _date("l_commitdate"), _date("l_receiptdate"), _text("l_shipinstruct"),
            _text("l_shipmode"), _text("l_comment"),
        ]
    ),
}  # fmt: skip


def _cents(value: int) -> Decimal:
    """``value`` hundredths, as a two-place decimal."""
    sign = "-" if value < 0 else ""
    value = abs(value)
    return Decimal(f"{sign}{value // 100}.{value % 100:02d}")


def _comment(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _phone(rng: random.Random, nation: int) -> str:
    return (
        f"{nation + 10}-{rng.randrange(100, 1000)}-{rng.randrange(100, 1000)}-"
        f"{rng.randrange(1000, 10000)}"
    )


def _retail_price(partkey: int) -> int:
    """The specification's formula, in cents."""
    return 90000 + (partkey // 10) % 20001 + 100 * (partkey % 1000)


class Tpch(Generator):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        scale = self.spec.scale_factor or 0.01
        self.suppliers = max(1, math.floor(10_000 * scale))
        self.customers = max(1, math.floor(150_000 * scale))
        self.parts = max(1, math.floor(200_000 * scale))
        self.orders = max(1, math.floor(1_500_000 * scale))
        self.clerks = max(1, math.floor(1_000 * scale))
        # Successive ticks must visit every order once per round.
        self.stride = STRIDE if math.gcd(STRIDE, self.orders) == 1 else 1

    def schemas(self) -> Mapping[str, RelationSchema]:
        return TPCH_SCHEMAS

    def tick(self, tick: int) -> dict[str, list[tuple[Row, int]]]:
        if tick == 0:
            return self._initial()
        index = (tick * self.stride) % self.orders
        # The version made last: at the previous tick touching this order, else tick 0.
        previous = tick - self.orders if tick > self.orders else 0
        old_order, old_items = self._order(index, previous)
        new_order, new_items = self._order(index, tick)
        return {
            "orders": [(old_order, -1), (new_order, 1)],
            "lineitem": [(r, -1) for r in old_items] + [(r, 1) for r in new_items],
        }

    # -- the initial tables ---------------------------------------------------------------

    def _initial(self) -> dict[str, list[tuple[Row, int]]]:
        rng = random.Random("tpch:0")
        out: dict[str, list[tuple[Row, int]]] = {
            "region": [((i, name, _comment(rng, 6)), 1) for i, name in enumerate(_REGIONS)],
            "nation": [
                ((i, name, region, _comment(rng, 8)), 1)
                for i, (name, region) in enumerate(_NATIONS)
            ],
            "supplier": [(self._supplier(rng, k), 1) for k in range(1, self.suppliers + 1)],
            "customer": [(self._customer(rng, k), 1) for k in range(1, self.customers + 1)],
        }
        parts: list[tuple[Row, int]] = []
        partsupps: list[tuple[Row, int]] = []
        for key in range(1, self.parts + 1):
            parts.append((self._part(rng, key), 1))
            for j in range(4):
                partsupps.append((self._partsupp(rng, key, j), 1))
        out["part"] = parts
        out["partsupp"] = partsupps
        orders: list[tuple[Row, int]] = []
        items: list[tuple[Row, int]] = []
        for index in range(self.orders):
            order, lines = self._order(index, 0)
            orders.append((order, 1))
            items.extend((line, 1) for line in lines)
        out["orders"] = orders
        out["lineitem"] = items
        return out

    def _supplier(self, rng: random.Random, key: int) -> Row:
        nation = rng.randrange(25)
        return (
            key,
            f"Supplier#{key:09d}",
            _comment(rng, 2),
            nation,
            _phone(rng, nation),
            _cents(rng.randrange(-99999, 999999)),
            _comment(rng, 7),
        )

    def _customer(self, rng: random.Random, key: int) -> Row:
        nation = rng.randrange(25)
        return (
            key,
            f"Customer#{key:09d}",
            _comment(rng, 2),
            nation,
            _phone(rng, nation),
            _cents(rng.randrange(-99999, 999999)),
            rng.choice(_SEGMENTS),
            _comment(rng, 7),
        )

    def _part(self, rng: random.Random, key: int) -> Row:
        manufacturer = rng.randrange(1, 6)
        return (
            key,
            " ".join(rng.sample(_COLORS, 5)),
            f"Manufacturer#{manufacturer}",
            f"Brand#{manufacturer}{rng.randrange(1, 6)}",
            f"{rng.choice(_TYPES_1)} {rng.choice(_TYPES_2)} {rng.choice(_TYPES_3)}",
            rng.randrange(1, 51),
            f"{rng.choice(_CONTAINERS_1)} {rng.choice(_CONTAINERS_2)}",
            _cents(_retail_price(key)),
            _comment(rng, 3),
        )

    def _supplier_of(self, partkey: int, j: int) -> int:
        """The specification's formula for the j-th supplier of a part."""
        s = self.suppliers
        return (partkey + (j * ((s // 4) + (partkey - 1) // s))) % s + 1

    def _partsupp(self, rng: random.Random, partkey: int, j: int) -> Row:
        return (
            partkey,
            self._supplier_of(partkey, j),
            rng.randrange(1, 10000),
            _cents(rng.randrange(100, 100001)),
            _comment(rng, 10),
        )

    # -- orders ---------------------------------------------------------------------------

    def _order(self, index: int, version: int) -> tuple[Row, list[Row]]:
        """Order ``index``'s row and line items as made at tick ``version``."""
        rng = random.Random(f"tpch:order:{index}:{version}")
        # Sparse keys as in the specification: the first 8 of every 32.
        key = (index // 8) * 32 + index % 8 + 1
        customer = rng.randrange(1, self.customers + 1)
        ordered = _START + datetime.timedelta(days=rng.randrange(_ORDER_DAYS + 1))
        lines: list[Row] = []
        total = 0
        statuses = set()
        for number in range(1, rng.randrange(1, 8) + 1):
            part = rng.randrange(1, self.parts + 1)
            supplier = self._supplier_of(part, rng.randrange(4))
            quantity = rng.randrange(1, 51)
            price = quantity * _retail_price(part)
            discount = rng.randrange(0, 11)
            tax = rng.randrange(0, 9)
            shipped = ordered + datetime.timedelta(days=rng.randrange(1, 122))
            committed = ordered + datetime.timedelta(days=rng.randrange(30, 91))
            received = shipped + datetime.timedelta(days=rng.randrange(1, 31))
            returned = ("R" if rng.random() < 0.5 else "A") if received <= _CURRENT else "N"
            status = "O" if shipped > _CURRENT else "F"
            statuses.add(status)
            total += price * (100 + tax) * (100 - discount) // 10000
            lines.append(
                (
                    key,
                    part,
                    supplier,
                    number,
                    _cents(quantity * 100),
                    _cents(price),
                    _cents(discount),
                    _cents(tax),
                    returned,
                    status,
                    shipped,
                    committed,
                    received,
                    rng.choice(_INSTRUCTIONS),
                    rng.choice(_MODES),
                    _comment(rng, 4),
                )
            )
        order_status = statuses.pop() if len(statuses) == 1 else "P"
        order: Row = (
            key,
            customer,
            order_status,
            _cents(total),
            ordered,
            rng.choice(_PRIORITIES),
            f"Clerk#{rng.randrange(1, self.clerks + 1):09d}",
            0,
            _comment(rng, 6),
        )
        return order, lines
