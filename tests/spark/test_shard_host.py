"""A resident task's request loop, driven over a socket pair without Spark."""

from __future__ import annotations

import socket
import threading

from services.compute.dataflow import Dataflow
from services.compute.spark import requests as rq
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.wire import receive_message, send_message
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb

VALUES = RelationSchema.of(("k", T.INT64), ("x", T.FLOAT64))


def test_errors_are_answered_and_the_task_keeps_serving_until_stop() -> None:
    plan = pb.reduce(pb.get("values", VALUES), [1], [pb.aggregate("count")])
    node_id = Dataflow(plan, as_of=0).graph.stateful_nodes()[0].id
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
    reply = ask(rq.Process("v", node_id, ([((1, nan_a), 3, 1), ((2, nan_b), 3, 1)],)))
    assert reply.error_class is None and repr(reply.value) == "[((nan, 2), 3, 1)]"
    assert ask(rq.Peek("v", 3)).error_class == "FailedPrecondition"  # no index installed
    assert ask(rq.Stats("v")).value[0] == 1
    assert ask(rq.Drop("v")) == rq.Reply()
    assert ask(rq.Stop()) == rq.Reply()
    serving.join(5)
    assert not serving.is_alive()
    driver.close()
    task.close()
