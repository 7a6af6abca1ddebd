"""mTLS on the resident sockets: a driver and a shard host talk over TLS with certificates on
both sides; a peer of another CA, of another identity or in plaintext is refused; and a
dataflow runs on resident Spark tasks over TLS."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from services.compute.dataflow import Dataflow
from services.compute.spark import ResidentCluster, SparkDataflow
from services.compute.spark import requests as rq
from services.compute.spark.liveness import Channel, Liveness, collect
from services.compute.spark.secure import (
    PeerRefused,
    accept_secure,
    connect_secure,
    own_identity,
    server_context,
)
from services.compute.spark.shard_host import ShardHost
from services.compute.spark.wire import (
    TOKEN_BYTES,
    ConnectionLost,
    Hello,
    authenticate,
    receive_message,
    send_hello,
    send_message,
)
from tests.spark.test_liveness import SlowStats
from tests.spark.test_spark_dataflow import drive, history, orders_by_region
from tests.support.tls_certs import CertificateSet, KeyPair
from tidemark.columnar import ColumnType as T
from tidemark.columnar import RelationSchema
from tidemark.plan import builders as pb
from tidemark.rpc.identity import Identity, compute_identity
from tidemark.rpc.tls import TlsSettings
from tidemark.security.certs import file_stem, write_certificates

TOKEN = b"t" * TOKEN_BYTES
VALUES = RelationSchema.of(("k", T.INT64), ("x", T.FLOAT64))


def settings(pair: KeyPair, ca: Path) -> TlsSettings:
    return TlsSettings(str(pair.cert), str(pair.key), str(ca))


class Driver:
    """The driver's end of ``ResidentCluster``: accept, secure, authenticate."""

    def __init__(self, tls: TlsSettings) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.context = server_context(tls)
        self.identity = own_identity(tls)
        self.address = self.listener.getsockname()

    def accept(self) -> tuple[socket.socket | None, Hello | None]:
        accepted, _ = self.listener.accept()
        sock = accept_secure(accepted, self.context, self.identity)
        if sock is None:
            return None, None
        return sock, authenticate(sock, TOKEN)

    def close(self) -> None:
        self.listener.close()


def run_task(address: tuple[str, int], tls: TlsSettings | None, errors: list[Exception]) -> None:
    """A resident task's body without Spark (``task.resident_task``)."""
    try:
        with connect_secure(socket.create_connection(address, timeout=10), tls) as sock:
            sock.settimeout(None)
            send_hello(sock, TOKEN, 0, os.getpid())
            ShardHost(0, 1).serve(sock)
    except ConnectionLost as error:
        errors.append(error)


def test_driver_and_shard_host_talk_over_mutual_tls(tmp_path: Path) -> None:
    certs = CertificateSet.create(tmp_path)
    driver = Driver(settings(certs.server, certs.ca_file))
    errors: list[Exception] = []
    task = threading.Thread(
        target=run_task, args=(driver.address, settings(certs.client, certs.ca_file), errors)
    )
    task.start()
    sock, hello = driver.accept()
    assert sock is not None and hello == Hello(shard=0, pid=os.getpid())
    with sock:
        assert sock.version() == "TLSv1.3"
        plan = pb.get("values", VALUES)
        exchanges = [
            rq.Install("v", plan.SerializeToString(), True, index_key_columns=(0,)),
            rq.ApplyIndex("v", [((1, 0.5), 0, 1), ((2, float("nan")), 0, 2)], 1),
            rq.Peek("v", 0),
            rq.Stop(),
        ]
        replies = []
        for request in exchanges:
            send_message(sock, request)
            replies.append(receive_message(sock))
    task.join(10)
    driver.close()
    assert not errors and not task.is_alive()
    assert [reply.error_class for reply in replies] == [None] * 4
    assert repr(replies[2].value) == "{(1, 0.5): 1, (2, nan): 2}"


def test_a_task_with_a_certificate_of_another_ca_is_refused(tmp_path: Path) -> None:
    ours = CertificateSet.create(tmp_path / "ours", "ours")
    theirs = CertificateSet.create(tmp_path / "theirs", "theirs")
    driver = Driver(settings(ours.server, ours.ca_file))
    # It trusts our CA, so it would accept the driver; the driver does not accept it.
    stranger = TlsSettings(str(theirs.client.cert), str(theirs.client.key), str(ours.ca_file))
    errors: list[Exception] = []
    task = threading.Thread(target=run_task, args=(driver.address, stranger, errors))
    task.start()
    assert driver.accept() == (None, None)
    task.join(10)
    driver.close()
    assert len(errors) == 1 and isinstance(errors[0], ConnectionLost)


def test_a_task_refuses_a_driver_of_another_ca(tmp_path: Path) -> None:
    ours = CertificateSet.create(tmp_path / "ours", "ours")
    theirs = CertificateSet.create(tmp_path / "theirs", "theirs")
    # The driver trusts our tasks but presents a certificate of another CA.
    impostor = Driver(
        TlsSettings(str(theirs.server.cert), str(theirs.server.key), str(ours.ca_file))
    )
    errors: list[Exception] = []
    task = threading.Thread(
        target=run_task, args=(impostor.address, settings(ours.client, ours.ca_file), errors)
    )
    task.start()
    assert impostor.accept() == (None, None)
    task.join(10)
    impostor.close()
    assert len(errors) == 1 and isinstance(errors[0], PeerRefused)
    assert "certificate verify failed" in str(errors[0])


def test_a_certificate_of_another_service_from_the_same_ca_is_refused(tmp_path: Path) -> None:
    compute, storage = compute_identity("db", "default"), Identity("storage")
    write_certificates(tmp_path, [compute, storage])

    def files(identity: Identity) -> TlsSettings:
        stem = tmp_path / file_stem(identity)
        return TlsSettings(f"{stem}.crt", f"{stem}.key", str(tmp_path / "ca.crt"))

    driver = Driver(files(compute))
    assert driver.identity == compute
    errors: list[Exception] = []
    task = threading.Thread(target=run_task, args=(driver.address, files(storage), errors))
    task.start()
    assert driver.accept() == (None, None)
    task.join(10)
    assert len(errors) == 1 and isinstance(errors[0], PeerRefused)
    assert "tidemark://compute/db/default" in str(errors[0])  # the task refused the driver
    # The compute's own certificate on both ends is accepted.
    task = threading.Thread(target=run_task, args=(driver.address, files(compute), errors))
    task.start()
    sock, hello = driver.accept()
    assert sock is not None and hello is not None
    with sock:
        send_message(sock, rq.Stop())
        assert receive_message(sock) == rq.Reply()
    task.join(10)
    driver.close()
    assert len(errors) == 1


def test_plaintext_is_refused_when_tls_is_on(tmp_path: Path) -> None:
    certs = CertificateSet.create(tmp_path)
    driver = Driver(settings(certs.server, certs.ca_file))
    with socket.create_connection(driver.address) as client:
        send_hello(client, TOKEN, 0, 1)
        assert driver.accept() == (None, None)
        try:
            rest = client.recv(100)
        except ConnectionResetError:
            rest = b""
        assert rest[:1] in (b"", b"\x15")  # closed, perhaps after a TLS alert record
    driver.close()


@pytest.mark.spark
def test_a_dataflow_runs_on_resident_tasks_over_tls(spark: SparkSession, tmp_path: Path) -> None:
    compute = compute_identity("db", "default")
    write_certificates(tmp_path, [compute])
    stem = tmp_path / file_stem(compute)
    tls = TlsSettings(f"{stem}.crt", f"{stem}.key", str(tmp_path / "ca.crt"))
    updates = history(seed=5, times=8)
    expected = drive(Dataflow(orders_by_region(), as_of=1), updates, 1, [4, 8])
    # The driver refuses plaintext with TLS on (above): these tasks connected over mTLS.
    with ResidentCluster(spark, 2, tls=tls) as cluster:
        on_spark = SparkDataflow(orders_by_region(), as_of=1, cluster=cluster)
        try:
            got = drive(on_spark, updates, 1, [4, 8])
            assert repr(got) == repr(expected) and sum(len(step) for step in got) > 10
        finally:
            on_spark.drop()


def test_heartbeats_pings_and_a_long_request_share_one_tls_connection(tmp_path: Path) -> None:
    """Both ends write from a second thread (the task's heartbeats, the driver's pings) while
    the first one reads: over TLS those must take turns, and the exchange must stay intact."""
    certs = CertificateSet.create(tmp_path)
    driver = Driver(settings(certs.server, certs.ca_file))
    liveness = Liveness(heartbeat_s=0.05, deadline_s=1.0)
    host = SlowStats(seconds=1.5)  # longer than the deadline: only the heartbeats carry it
    errors: list[BaseException] = []

    def task() -> None:
        tls = settings(certs.client, certs.ca_file)
        try:
            with connect_secure(socket.create_connection(driver.address, timeout=10), tls) as sock:
                sock.settimeout(None)
                send_hello(sock, TOKEN, 0, os.getpid())
                host.serve(sock, liveness)
        except BaseException as error:
            errors.append(error)

    serving = threading.Thread(target=task, daemon=True)
    serving.start()
    sock, hello = driver.accept()
    assert sock is not None and hello is not None
    channel = Channel(sock, liveness.deadline_s)
    stop = threading.Event()

    def pings() -> None:
        while not stop.wait(liveness.heartbeat_s):
            channel.send(rq.Ping())

    pinging = threading.Thread(target=pings, daemon=True)
    pinging.start()
    try:
        for _ in range(2):
            channel.send(rq.Stats("v"))
            assert collect([channel]) == [rq.Reply("done")]
    finally:
        stop.set()
        pinging.join(5)
    channel.send(rq.Stop())
    assert collect([channel]) == [rq.Reply()]
    serving.join(10)
    sock.close()
    driver.close()
    assert not errors and not serving.is_alive()
