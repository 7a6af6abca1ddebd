"""The list-append checker finds each anomaly class on hand-made histories and accepts
serializable ones (including random serial executions)."""

from __future__ import annotations

import random

from tests.support.elle import Append, Read, Transaction, check


def txn(
    tid: int, *ops: Append | Read, outcome: str = "ok", at: tuple[float, float] | None = None
) -> Transaction:
    invoked, completed = at if at is not None else (None, None)
    return Transaction(tid, tuple(ops), outcome, invoked, completed)  # type: ignore[arg-type]


def a(key: str, value: int) -> Append:
    return Append(key, value)


def r(key: str, *values: int) -> Read:
    return Read(key, tuple(values))


def test_serial_history_is_valid() -> None:
    history = [
        txn(1, r("x"), a("x", 1)),
        txn(2, r("x", 1), a("x", 2), a("y", 1)),
        txn(3, r("x", 1, 2), r("y", 1)),
    ]
    result = check(history, realtime=True)
    assert result.valid, result.anomalies
    assert result.edges > 0


def test_g0_write_cycle() -> None:
    # x's order says T1 before T2, y's says T2 before T1.
    history = [
        txn(1, a("x", 1), a("y", 2)),
        txn(2, a("x", 2), a("y", 1)),
        txn(3, r("x", 1, 2), r("y", 1, 2)),
    ]
    assert check(history).kinds() == {"G0"}


def test_g1c_circular_information_flow() -> None:
    # T1 saw T2's append to y and T2 saw T1's append to x.
    history = [
        txn(1, a("x", 1), r("y", 1)),
        txn(2, a("y", 1), r("x", 1)),
    ]
    assert check(history).kinds() == {"G1c"}


def test_g_single_read_skew() -> None:
    # T1 read x before T2's append, but y after it.
    history = [
        txn(1, r("x"), r("y", 1)),
        txn(2, a("x", 1), a("y", 1)),
        txn(3, r("x", 1)),
    ]
    assert check(history).kinds() == {"G-single"}


def test_g2_write_skew() -> None:
    # Each read the other's key empty, then appended to its own: two anti-dependencies.
    history = [
        txn(1, r("x"), r("y"), a("x", 1)),
        txn(2, r("x"), r("y"), a("y", 1)),
        txn(3, r("x", 1), r("y", 1)),
    ]
    assert check(history).kinds() == {"G2"}


def test_unseen_append_still_orders_after_empty_reads() -> None:
    # No read ever shows x=1, but T2 committed it: T1 (which read y's later value)...
    history = [
        txn(1, r("x"), r("y"), a("y", 1)),
        txn(2, r("y"), r("x"), a("x", 1)),
    ]
    assert check(history).kinds() == {"G2"}


def test_aborted_and_intermediate_reads() -> None:
    history = [
        txn(1, a("x", 1), outcome="fail"),
        txn(2, r("x", 1)),
        txn(3, a("y", 1), a("y", 2)),
        txn(4, r("y", 1)),
    ]
    assert {"G1a", "G1b"} <= check(history).kinds()


def test_incompatible_orders_and_duplicates() -> None:
    history = [
        txn(1, a("x", 1)),
        txn(2, a("x", 2)),
        txn(3, r("x", 1, 2)),
        txn(4, r("x", 2, 1)),
        txn(5, r("x", 1, 1)),
    ]
    kinds = check(history).kinds()
    assert "incompatible-order" in kinds and "duplicate-elements" in kinds


def test_unknown_outcomes_may_or_may_not_have_committed() -> None:
    history = [
        txn(1, a("x", 1), outcome="info"),
        txn(2, a("x", 2), outcome="info"),
        txn(3, r("x", 1)),
    ]
    assert check(history).valid


def test_realtime_order_is_checked_only_when_asked() -> None:
    # T2 began after T1 had committed, yet read x without T1's append: a stale read.
    history = [
        txn(1, a("x", 1), at=(0.0, 1.0)),
        txn(2, r("x"), at=(2.0, 3.0)),
        txn(3, r("x", 1), at=(4.0, 5.0)),
    ]
    assert check(history).valid
    assert check(history, realtime=True).kinds() == {"G-single-realtime"}


def test_random_serial_executions_are_valid() -> None:
    rng = random.Random(19)
    for _ in range(30):
        lists: dict[str, list[int]] = {k: [] for k in "abcd"}
        history = []
        clock = 0.0
        for tid in range(40):
            ops: list[Append | Read] = []
            for _ in range(rng.randint(1, 4)):
                key = rng.choice("abcd")
                if rng.random() < 0.5:
                    ops.append(Read(key, tuple(lists[key])))
                else:
                    value = tid * 10 + len(ops)
                    lists[key].append(value)
                    ops.append(Append(key, value))
            history.append(txn(tid, *ops, at=(clock, clock + 0.5)))
            clock += 1.0
        result = check(history, realtime=True)
        assert result.valid, result.anomalies
