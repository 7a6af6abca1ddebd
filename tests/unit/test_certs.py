"""``tidemark certs``: the CA and the certificates it writes verify, and name the identities."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from tidemark.cli import main
from tidemark.rpc.identity import Identity, identity_of_certificate


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _verify(directory: Path, stem: str, server_name: str) -> None:
    """The certificate chains to the CA as a server certificate for ``server_name`` and as
    a client certificate; raises if not."""
    store = Store([_load(directory / "ca.crt")])
    now = datetime.datetime.now(datetime.UTC)
    leaf = _load(directory / f"{stem}.crt")
    builder = PolicyBuilder().store(store).time(now)
    builder.build_server_verifier(x509.DNSName(server_name)).verify(leaf, [])
    builder.build_client_verifier().verify(leaf, [])


def test_default_identities_verify_with_their_san(tmp_path: Path) -> None:
    assert main(["certs", str(tmp_path)]) == 0
    for stem, uri, host in [
        ("storage", "tidemark://storage", "storage.tidemark.svc"),
        ("adapter", "tidemark://adapter", "localhost"),
        ("compute-tidemark-default", "tidemark://compute/tidemark/default", "compute-default"),
        ("client-cli", "tidemark://client/cli", "localhost"),
    ]:
        _verify(tmp_path, stem, host)
        pem = (tmp_path / f"{stem}.crt").read_bytes()
        assert identity_of_certificate(pem) == Identity.parse(uri)
        names = _load(tmp_path / f"{stem}.crt").extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        assert names.value.get_values_for_type(x509.UniformResourceIdentifier) == [uri]
        assert "127.0.0.1" in [str(ip) for ip in names.value.get_values_for_type(x509.IPAddress)]
        assert stat.S_IMODE((tmp_path / f"{stem}.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600


def test_later_identities_are_signed_by_the_same_ca(tmp_path: Path) -> None:
    assert main(["certs", str(tmp_path), "--identity", "tidemark://storage"]) == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    assert main(["certs", str(tmp_path), "--identity", "tidemark://compute/acme/c1"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() == ca
    _verify(tmp_path, "compute-acme-c1", "compute-c1")
    _verify(tmp_path, "storage", "storage")
    assert not (tmp_path / "adapter.crt").exists()


def test_another_ca_does_not_verify(tmp_path: Path) -> None:
    main(["certs", str(tmp_path / "one"), "--identity", "tidemark://storage"])
    main(["certs", str(tmp_path / "two"), "--identity", "tidemark://storage"])
    (tmp_path / "one" / "storage.crt").write_bytes((tmp_path / "two" / "storage.crt").read_bytes())
    with pytest.raises(x509.verification.VerificationError):
        _verify(tmp_path / "one", "storage", "storage")


@pytest.mark.parametrize(
    "uri",
    ["tidemark://bogus", "tidemark://compute/only-tenant", "https://storage", "tidemark://client/"],
)
def test_bad_identities_are_refused(tmp_path: Path, uri: str) -> None:
    assert main(["certs", str(tmp_path), "--identity", uri]) == 2
    assert not (tmp_path / "ca.crt").exists()


def test_extra_dns_names_are_named_by_the_certificate(tmp_path: Path) -> None:
    name = "acme-compute.tidemark-tenant-acme.svc"
    uri = "tidemark://compute/acme/c1"
    assert main(["certs", str(tmp_path), "--identity", uri, "--dns", name]) == 0
    _verify(tmp_path, "compute-acme-c1", name)
    with pytest.raises(Exception):  # noqa: B017 (cryptography's verification error)
        _verify(tmp_path, "compute-acme-c1", "other-compute.tidemark-tenant-acme.svc")
