"""CREATE SOURCE ... FROM LOAD GENERATOR, as Materialize spells it."""

from __future__ import annotations

import pytest

from services.adapter.sql import SqlError, parse
from services.adapter.sql import statements as st


def source(sql: str) -> st.CreateSource:
    (statement,) = parse(sql)
    assert isinstance(statement, st.CreateSource)
    return statement


def test_counter_with_options() -> None:
    made = source(
        "CREATE SOURCE IF NOT EXISTS db.s.c FROM LOAD GENERATOR COUNTER "
        "(TICK INTERVAL '250ms', MAX CARDINALITY = 10, UP TO 99)"
    )
    assert made.name == ("db", "s", "c") and made.if_not_exists and not made.columns
    assert made.format == "LOAD GENERATOR" and not made.for_all_tables
    assert made.load_generator == st.LoadGeneratorOptions(
        "COUNTER", tick_interval_ms=250, max_cardinality=10, up_to=99
    )


@pytest.mark.parametrize(
    ("interval", "ms"),
    [("1s", 1000), ("2 seconds", 2000), ("100 ms", 100), ("1.5s", 1500), ("1 minute", 60_000)],
)
def test_tick_intervals(interval: str, ms: int) -> None:
    made = source(f"CREATE SOURCE c FROM LOAD GENERATOR COUNTER (TICK INTERVAL '{interval}')")
    assert made.load_generator is not None and made.load_generator.tick_interval_ms == ms


def test_multi_table_generators_with_progress_name() -> None:
    made = source(
        "create source t in cluster ingest from load generator tpch "
        "(scale factor 0.1, tick interval '1s') for all tables expose progress as t_prog"
    )
    assert made.for_all_tables and made.progress_name == "t_prog" and made.in_cluster == "ingest"
    assert made.load_generator == st.LoadGeneratorOptions(
        "TPCH", tick_interval_ms=1000, scale_factor=0.1
    )
    auction = source("CREATE SOURCE a FROM LOAD GENERATOR AUCTION FOR ALL TABLES")
    assert auction.load_generator == st.LoadGeneratorOptions("AUCTION")


@pytest.mark.parametrize(
    ("sql", "code", "at"),
    [
        ("CREATE SOURCE c FROM LOAD GENERATOR MARKETING", "0A000", "MARKETING"),
        ("CREATE SOURCE c FROM LOAD GENERATOR COUNTER (KEYS 5)", "0A000", "KEYS"),
        ("CREATE SOURCE c FROM LOAD GENERATOR COUNTER (TICK INTERVAL 'soon')", "42601", "'soon'"),
        ("CREATE SOURCE c FROM LOAD GENERATOR COUNTER (TICK INTERVAL 5)", "42601", "5"),
        ("CREATE SOURCE c FROM LOAD GENERATOR COUNTER (MAX CARDINALITY -1)", "42601", "-"),
        ("CREATE SOURCE c FROM LOAD GENERATOR TPCH (SCALE FACTOR 0)", "42601", "0"),
        ("CREATE SOURCE c (a int) FROM LOAD GENERATOR COUNTER", "42601", "LOAD"),
        ("CREATE SOURCE c FROM CDCV2", "42601", "CDCV2"),
        ("CREATE SOURCE c FROM LOAD GENERATOR COUNTER FOR SOME TABLES", "42601", "FOR"),
    ],
)
def test_errors(sql: str, code: str, at: str) -> None:
    with pytest.raises(SqlError) as caught:
        parse(sql)
    assert caught.value.code == code, caught.value
    assert caught.value.position == sql.rindex(at) + 1, caught.value


def test_show_subsources() -> None:
    (on,) = parse("SHOW SUBSOURCES ON house")
    assert isinstance(on, st.ShowObjects) and on.kind == "subsources" and on.on == ("house",)
    (within,) = parse("SHOW SUBSOURCES FROM s")
    assert isinstance(within, st.ShowObjects) and within.within == ("s",) and within.on is None
