"""etcd over TLS (tidemark/consensus/etcd_tls.py): the URL's ``ca``, ``cert`` and ``key``
options, and a TLS etcd with ``--client-cert-auth`` refusing plaintext clients, clients without
a certificate and clients that do not trust its CA. The consensus contract itself runs over TLS
in test_consensus_contract.py (backend ``etcd-tls``)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.support.etcd import EtcdServer
from tests.support.tls_certs import CertificateSet
from tidemark.consensus import Committed, open_consensus
from tidemark.consensus.etcd import EtcdConsensus
from tidemark.errors import InvalidArgument, Unavailable

WAIT_S = 30.0


def test_tls_options_are_read_from_the_url(tmp_path: Path) -> None:
    certs = CertificateSet.create(tmp_path)
    client = certs.client
    store = open_consensus(
        f"etcd://h1:2379,h2?ca={certs.ca_file}&cert={client.cert}&key={client.key}&timeout=2"
    )
    assert isinstance(store, EtcdConsensus)
    tls = store._kv.tls
    assert tls is not None
    assert tls.ca == certs.ca_file.read_bytes()
    assert tls.cert == client.cert.read_bytes()
    assert tls.key == client.key.read_bytes()
    assert "PRIVATE KEY" not in repr(tls)
    only_ca = open_consensus(f"etcd://h?ca={certs.ca_file}")
    assert isinstance(only_ca, EtcdConsensus) and only_ca._kv.tls is not None
    assert only_ca._kv.tls.cert is None
    system_roots = open_consensus("etcd://h?tls=true")
    assert isinstance(system_roots, EtcdConsensus) and system_roots._kv.tls is not None
    assert system_roots._kv.tls.ca is None
    plain = open_consensus("etcd://h?tls=false")
    assert isinstance(plain, EtcdConsensus) and plain._kv.tls is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("cert={cert}", "give both cert= and key="),
        ("key={key}", "give both cert= and key="),
        ("ca={dir}/missing.crt", "cannot read ca=.*missing.crt"),
        ("tls=maybe", "tls must be true or false"),
        ("tls=false&ca={ca}", "tls=false with ca"),
    ],
)
def test_bad_tls_options_are_refused(tmp_path: Path, options: str, message: str) -> None:
    certs = CertificateSet.create(tmp_path)
    filled = options.format(
        cert=certs.client.cert, key=certs.client.key, ca=certs.ca_file, dir=tmp_path
    )
    with pytest.raises(InvalidArgument, match=message):
        open_consensus(f"etcd://h:2379?{filled}")


async def refused(url: str) -> str:
    """The error a head call gets from ``url``'s store."""
    store = open_consensus(url)
    try:
        with pytest.raises(Unavailable) as failure:
            async with asyncio.timeout(WAIT_S):
                await store.head(f"test/{uuid.uuid4().hex}")
        return failure.value.message
    finally:
        await store.close()


@pytest.mark.etcd
async def test_a_tls_etcd_works_and_refuses_what_it_should(
    tls_etcd_server: EtcdServer, tmp_path: Path
) -> None:
    server = tls_etcd_server
    assert server.tls is not None
    store = open_consensus(f"{server.url}&timeout=2")
    key = f"test/{uuid.uuid4().hex}/k"
    try:
        assert isinstance(await store.compare_and_set(key, None, b"over tls"), Committed)
        found = await store.head(key)
        assert found is not None and found.data == b"over tls"
    finally:
        await store.close()

    plaintext = await refused(f"{server.plaintext_url}?timeout=2")
    assert f"etcd {server.endpoint}" in plaintext
    no_client_cert = await refused(f"{server.plaintext_url}?ca={server.tls.ca_file}&timeout=2")
    assert f"etcd {server.endpoint}" in no_client_cert
    other = CertificateSet.create(tmp_path, "other")
    client = server.tls.client
    wrong_ca = await refused(
        f"{server.plaintext_url}?ca={other.ca_file}&cert={client.cert}&key={client.key}&timeout=2"
    )
    assert f"etcd {server.endpoint}" in wrong_ca
    assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca
    assert "check the consensus URL's ca, cert and key" in wrong_ca
