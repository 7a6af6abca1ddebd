"""The resident cluster's life: tasks that die are reported clearly, and stopping a cluster
gives its task slots back to Spark."""

from __future__ import annotations

import os
import re
import signal
import socket

import pytest
from pyspark.sql import SparkSession

from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark import requests as rq
from services.compute.spark.resident import Hello, authenticate
from services.compute.spark.session import local_slots
from services.compute.spark.wire import TOKEN_BYTES, send_hello, send_message
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.errors import FailedPrecondition, Unavailable
from tidemark.plan import builders as pb
from tidemark.v1 import plan_pb2

pytestmark = pytest.mark.spark

NUMBERS = RelationSchema.of(("n", T.INT64))


def counted() -> plan_pb2.Relation:
    return pb.reduce(pb.get("numbers", NUMBERS), [0], [pb.aggregate("count")])


def slots(spark: SparkSession) -> int:
    match = re.fullmatch(r"local\[(\d+)\]", spark.sparkContext.master or "")
    assert match, "these tests run on a local[N] session"
    return int(match.group(1))


def test_a_killed_task_is_reported_and_stopping_frees_the_slots(
    spark: SparkSession, cluster: ResidentCluster
) -> None:
    doomed = ResidentCluster(spark, 2)
    doomed.start()
    dataflow = SparkDataflow(counted(), as_of=0, cluster=doomed)
    out, _ = dataflow.hydrate({"numbers": [((1,), 0, 1), ((2,), 0, 1), ((2,), 0, 1)]})
    assert out == [((1, 1), 0, 1), ((2, 2), 0, 1)]
    victim = doomed.task_pids[1]
    assert victim != os.getpid() and len(set(doomed.task_pids)) == 2

    os.kill(victim, signal.SIGKILL)
    with pytest.raises(Unavailable, match="resident task of shard 1 is gone"):
        dataflow.step({"numbers": [((3,), 1, 1)]}, 2)
    with pytest.raises(Unavailable, match="shard 1 is gone"):  # and it stays failed
        doomed.stats(dataflow.dataflow_id)
    assert doomed.failure is not None
    doomed.stop()

    # A barrier job needs all its slots at once: one as wide as every slot not held by the
    # shared cluster only starts if the dead cluster's slots came back.
    with ResidentCluster(spark, slots(spark) - cluster.shards, connect_timeout=60) as wide:
        flow = SparkDataflow(counted(), as_of=0, cluster=wide)
        numbers = [((n,), 0, 1) for n in range(20)]
        assert flow.hydrate({"numbers": numbers})[0] == [((n, 1), 0, 1) for n in range(20)]
        assert flow.key_count() == 20
    assert spark.range(10).count() == 10


def test_a_stopped_cluster_refuses_requests(spark: SparkSession) -> None:
    with ResidentCluster(spark, 2) as resident:
        SparkDataflow(counted(), as_of=0, cluster=resident, dataflow_id="kept")
        assert resident.stats("kept")[0] == 0
    with pytest.raises(FailedPrecondition, match="not running"):
        resident.stats("kept")
    resident.stop()  # a second stop does nothing


def test_a_cluster_wider_than_the_session_is_refused(spark: SparkSession) -> None:
    too_wide = ResidentCluster(spark, slots(spark) + 1)
    with pytest.raises(FailedPrecondition, match=f"{slots(spark) + 1} resident tasks cannot run"):
        too_wide.start()


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", 1),
        ("local[3]", 3),
        ("local[4, 2]", 4),
        ("local[*]", os.cpu_count()),
        ("spark://host:7077", None),
        ("k8s://https://api:6443", None),
    ],
)
def test_slots_of_a_master(master: str, expected: int | None) -> None:
    assert local_slots(master) == expected


def test_only_a_task_with_the_token_is_accepted() -> None:
    right, wrong = b"r" * TOKEN_BYTES, b"w" * TOKEN_BYTES
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for token, expected in [(wrong, None), (right, Hello(shard=1, pid=42))]:
            with socket.create_connection(listener.getsockname()) as client:
                server, _ = listener.accept()
                with server:
                    send_hello(client, token, 1, 42)
                    assert authenticate(server, right) == expected
        # Anything else (here: a request frame, which is never decoded) is refused too.
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                send_message(client, rq.Drop("hello"))
                assert authenticate(server, right) is None
