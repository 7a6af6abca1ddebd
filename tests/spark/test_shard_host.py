"""A resident task's request loop, driven over a socket pair without Spark."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from services.compute.dataflow import Dataflow
from services.compute.spark import requests as rq
from services.compute.spark.part_shares import keyed_sources
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.wire import receive_message, send_message
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema, table_from_updates, to_parquet
from tidemark.errors import FailedPrecondition
from tidemark.plan import builders as pb
from tidemark.plan import derive_schema

VALUES = RelationSchema.of(("k", T.INT64), ("x", T.FLOAT64))


def test_errors_are_answered_and_the_task_keeps_serving_until_stop() -> None:
    plan = pb.reduce(pb.get("values", VALUES), [1], [pb.aggregate("count")])
    source_id = Dataflow(plan, as_of=0).graph.inputs["values"]
    driver, task = socket.socketpair()
    host = ShardHost(shard=0, shards=1)
    serving = threading.Thread(target=host.serve, args=(task,))
    serving.start()

    def ask(request: rq.Request) -> rq.Reply:
        send_message(driver, request)
        reply = receive_message(driver)
        assert isinstance(reply, rq.Reply)
        return reply

    missing = ask(rq.Stats("v"))
    assert (missing.error_class, missing.error_message) == (
        "NotFound",
        "dataflow 'v' is not installed on shard 0",
    )
    assert ask(rq.Install("v", plan.SerializeToString(), is_relation=True)) == rq.Reply()
    assert ask(rq.Install("v", plan.SerializeToString(), is_relation=True)).error_class == (
        "AlreadyExists"
    )
    # Two NaNs that arrive as distinct objects still group together.
    nan_a, nan_b = float("nan"), float("nan")
    reply = ask(rq.Step("v", {source_id: [((1, nan_a), 3, 1), ((2, nan_b), 3, 1)]}, None, 4))
    assert reply.error_class is None and repr(reply.value) == "[((nan, 2), 3, 1)]"
    assert ask(rq.Peek("v", 3)).error_class == "FailedPrecondition"  # no index installed
    assert ask(rq.Stats("v")).value[0] == 1
    assert ask(rq.Drop("v")) == rq.Reply()
    assert ask(rq.Stop()) == rq.Reply()
    serving.join(5)
    assert not serving.is_alive()
    driver.close()
    task.close()


def test_compacting_the_index_shard_keeps_later_contents_and_drops_history() -> None:
    plan = pb.get("values", VALUES)
    host = ShardHost(shard=0, shards=1)
    host.handle(rq.Install("v", plan.SerializeToString(), True, index_key_columns=(0,)))
    # Key 1 changes value at every time; key 2 is written once and retracted at 8.
    for time in range(10):
        updates = [((1, float(time)), time, 1)]
        if time:
            updates.append(((1, float(time - 1)), time, -1))
        if time == 3:
            updates.append(((2, 0.5), time, 1))
        if time == 8:
            updates.append(((2, 0.5), time, -1))
        host.handle(rq.ApplyIndex("v", updates, time + 1))
    index = host.dataflows["v"].index
    assert index is not None
    later = {time: host.handle(rq.Peek("v", time)) for time in range(6, 10)}
    assert later[6] == {(1, 6.0): 1, (2, 0.5): 1} and later[9] == {(1, 9.0): 1}
    history = index.history_size()
    assert history == 20  # every update after the since 0 (times 1..9) is kept apart

    assert host.handle(rq.CompactIndex("v", 6)) is None
    assert index.since == 6
    # Times 1..6 collapse into the base; only the updates at 7, 8 and 9 remain as history.
    assert index.history_size() == 7 < history
    for time, contents in later.items():
        assert host.handle(rq.Peek("v", time)) == contents
    with pytest.raises(FailedPrecondition, match="before the index's since 6"):
        host.handle(rq.Peek("v", 5))
    with pytest.raises(FailedPrecondition, match="cannot move back"):
        host.handle(rq.CompactIndex("v", 4))


def test_a_part_read_by_key_partition_reaches_its_stateful_node_with_the_drivers_rows(
    tmp_path: Path,
) -> None:
    """A step whose source part is dealt by key (``slices`` 0) and whose source also has
    rows from the driver: the part's rows go through the filter and the projection on
    the way to the reduce, skip the routing, and count there with the driver's rows."""
    orders = RelationSchema.of(("o_id", T.INT64), ("cust", T.INT64), ("amount", T.INT64))
    positive = pb.filter(pb.get("orders", orders), pb.call("gt", 2, pb.literal(0, T.INT64)))
    root = pb.reduce(pb.project(positive, 1, 2), [0], [pb.aggregate("sum", 1)])
    plan = pb.plan(root, derive_schema(root))
    local = Dataflow(plan, as_of=0)
    source_id = local.graph.inputs["orders"]
    assert keyed_sources(local.graph) == {source_id: (1,)}
    in_part = [((i, i % 3, i - 2), 1 + i % 4, 1) for i in range(40)]
    from_driver = [((100 + i, i % 5, 7), 2, 1) for i in range(10)]
    (tmp_path / "part").write_bytes(to_parquet(table_from_updates(orders, in_part)))
    host = ShardHost(shard=0, shards=1)
    host.handle(rq.Install("v", plan.SerializeToString(), False))
    io = rq.StepIO(f"file://{tmp_path}", {}, {source_id: [("part", 1, 4, 0, 0)]}, "", b"", True)
    got = host.handle(rq.Step("v", {source_id: from_driver}, None, 4, io))
    window = [update for update in in_part if update[1] < 4]
    local.hydrate({"orders": []})
    want, _ = local.step({"orders": window + from_driver}, 4)
    assert sorted(got) == sorted(want) and want
