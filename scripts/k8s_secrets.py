"""Creates the Secrets a Tidemark deployment's pods need, each only when it is missing.

    python scripts/k8s_secrets.py deploy/k8s/overlays/tenant-example [--certs DIR] [--dry-run]

The Secrets are kept out of the kustomizations on purpose: ``kubectl apply -k`` would write a
Secret it renders over the one in the cluster on every run, and there is no annotation that
makes plain ``kubectl apply`` create an object only when it is absent. So the overlay is
rendered (``kubectl kustomize``), every Secret its pods mount or read is listed, and each one
that ``kubectl get`` does not find is created with ``kubectl create``, which never replaces an
existing object. Running it again, or after adding a tenant, creates only what is new.

- ``s3-credentials``: a random access key and secret key (MinIO's root user, storage's
  credentials). Replace it with credentials of your own by deleting and recreating it.
- ``tidemark-tls-<workload>``: ``tls.crt``, ``tls.key`` and ``ca.crt`` for the workload's
  service identity (``tidemark://storage``, ``tidemark://compute/<tenant>/<cluster>``, ...),
  naming as DNS names the Services in front of it (``storage``, ``storage.tidemark``, ...,
  ``tenant-acme-compute.tidemark-tenant-acme.svc.cluster.local``: the host names its callers
  dial and verify), issued with ``tidemark certs`` by the CA kept in ``--certs`` (made there on
  first use; keep that directory safe, it signs every identity).
- ``session-keys``: one random key (``keys``: an ``id:base64key`` line) the adapters sign gRPC
  sessions with; to rotate, put a new line first, roll the adapters, then drop the old line.
- ``tidemark-superuser``: a random ``password`` for the bootstrap superuser ``tidemark``
  (``kubectl get secret tidemark-superuser -o jsonpath='{.data.password}' | base64 -d``).
- Secrets a pod mounts as ``optional`` (``pgwire-passwords``) are the operator's to create.

A namespace that does not exist yet (a new tenant's) is created first; ``kubectl apply`` then
adds its labels.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
MakeCertificate = Callable[[str, Sequence[str]], tuple[bytes, bytes, bytes]]

TLS_PREFIX = "tidemark-tls-"
S3_SECRET = "s3-credentials"
S3_KEYS = ("access-key", "secret-key")
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")
SESSION_SECRET = "session-keys"
SUPERUSER_SECRET = "tidemark-superuser"
# Secrets of random bytes: name -> key.
RANDOM_SECRETS = {SESSION_SECRET: "keys", SUPERUSER_SECRET: "password"}
# The tenant of the clusters in the shared namespace: the database every catalog starts with.
SHARED_TENANT = "tidemark"
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})


@dataclass(frozen=True)
class PlannedSecret:
    """A Secret the pods need: ``identity`` is the certificate's URI for a TLS Secret."""

    namespace: str
    name: str
    keys: tuple[str, ...]
    identity: str | None = None
    dns_names: tuple[str, ...] = ()
    users: tuple[str, ...] = field(default=(), compare=False)


def pod_spec(resource: Resource) -> dict[str, Any] | None:
    if resource["kind"] not in WORKLOAD_KINDS:
        return None
    spec: dict[str, Any] = resource["spec"]["template"]["spec"]
    return spec


def _secret_references(pod: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(Secret name, key or None for a whole-Secret volume) for each required reference."""
    for volume in pod.get("volumes", []):
        source = volume.get("secret")
        if source is not None and not source.get("optional", False):
            yield source["secretName"], None
    for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        for variable in container.get("env", []):
            reference = variable.get("valueFrom", {}).get("secretKeyRef")
            if reference is not None and not reference.get("optional", False):
                yield reference["name"], reference["key"]


def identity_of(resource: Resource, tenants: dict[str, str]) -> str:
    """The service identity of a Tidemark workload: its process, and for a compute process
    the tenant (by its namespace) and the cluster it serves."""
    (container,) = [
        c for c in resource["spec"]["template"]["spec"]["containers"] if _module(c) is not None
    ]
    service = str(_module(container)).removeprefix("services.")
    if service != "compute":
        return f"tidemark://{service}"
    namespace = resource["metadata"]["namespace"]
    cluster = {v["name"]: v.get("value") for v in container.get("env", [])}["TIDEMARK_CLUSTER"]
    return f"tidemark://compute/{tenants.get(namespace, SHARED_TENANT)}/{cluster}"


def service_dns_names(resource: Resource, objects: list[Resource]) -> tuple[str, ...]:
    """The names the Services selecting ``resource``'s pods answer to, short and qualified."""
    namespace = resource["metadata"]["namespace"]
    labels = resource["spec"]["template"]["metadata"].get("labels", {})
    names = []
    for service in objects:
        selector = service.get("spec", {}).get("selector") or {}
        if (
            service["kind"] == "Service"
            and service["metadata"].get("namespace") == namespace
            and selector
            and all(labels.get(key) == value for key, value in selector.items())
        ):
            host = service["metadata"]["name"]
            qualified = f"{host}.{namespace}"
            names += [host, qualified, f"{qualified}.svc", f"{qualified}.svc.cluster.local"]
    return tuple(names)


def _module(container: dict[str, Any]) -> str | None:
    command = [*container.get("command", []), *container.get("args", [])]
    if command[:2] == ["python", "-m"] and len(command) > 2 and command[2].startswith("services."):
        return str(command[2])
    return None


def plan(objects: list[Resource]) -> list[PlannedSecret]:
    """Every Secret the rendered ``objects`` need and do not carry, one entry per namespace
    and name; ValueError for a reference this script does not know how to fill."""
    tenants = {
        obj["metadata"]["name"]: obj["metadata"]["labels"]["tidemark.dev/tenant"]
        for obj in objects
        if obj["kind"] == "Namespace" and "tidemark.dev/tenant" in obj["metadata"].get("labels", {})
    }
    rendered = {
        (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        for obj in objects
        if obj["kind"] == "Secret"
    }
    planned: dict[tuple[str, str], PlannedSecret] = {}
    for obj in objects:
        pod = pod_spec(obj)
        if pod is None:
            continue
        namespace = obj["metadata"]["namespace"]
        user = f"{obj['kind']}/{obj['metadata']['name']}"
        for name, key in _secret_references(pod):
            if (namespace, name) in rendered:
                continue
            if name.startswith(TLS_PREFIX) and key is None:
                identity = identity_of(obj, tenants)
                dns = service_dns_names(obj, objects)
                entry = PlannedSecret(namespace, name, TLS_KEYS, identity, dns)
            elif name == S3_SECRET and key in (*S3_KEYS, None):
                entry = PlannedSecret(namespace, name, S3_KEYS)
            elif name in RANDOM_SECRETS and key in (RANDOM_SECRETS[name], None):
                entry = PlannedSecret(namespace, name, (RANDOM_SECRETS[name],))
            else:
                raise ValueError(f"{user} needs Secret {name!r}, which this script cannot make")
            earlier = planned.get((namespace, name))
            if earlier is not None and earlier != entry:
                raise ValueError(f"Secret {namespace}/{name} is used for two identities")
            users = tuple(dict.fromkeys((*(earlier.users if earlier else ()), user)))
            planned[(namespace, name)] = PlannedSecret(
                entry.namespace, entry.name, entry.keys, entry.identity, entry.dns_names, users
            )
    return sorted(planned.values(), key=lambda entry: (entry.namespace, entry.name))


def tidemark_certificate(certs: Path, tidemark: str) -> MakeCertificate:
    """Issues certificates with ``tidemark certs`` from the CA in ``certs`` (made there on first
    use): each identity is issued in a scratch directory holding a copy of the CA, so the one
    certificate it writes there besides the CA's is the identity's."""

    def make(identity: str, dns_names: Sequence[str]) -> tuple[bytes, bytes, bytes]:
        certs.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            for name in ("ca.crt", "ca.key"):
                if (certs / name).exists():
                    shutil.copy2(certs / name, work / name)
            command = [tidemark, "certs", str(work), "--identity", identity]
            command += [option for name in dns_names for option in ("--dns", name)]
            subprocess.run(command, check=True)
            for name in ("ca.crt", "ca.key"):
                if not (certs / name).exists():
                    shutil.copy2(work / name, certs / name)
            (issued,) = [path for path in work.glob("*.crt") if path.name != "ca.crt"]
            key = issued.with_suffix(".key")
            return issued.read_bytes(), key.read_bytes(), (certs / "ca.crt").read_bytes()

    return make


def create_missing(
    planned: Sequence[PlannedSecret],
    run: Run,
    make_certificate: MakeCertificate,
    *,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> list[PlannedSecret]:
    """Creates each planned Secret that ``kubectl get`` does not find; returns those created
    (or, with ``dry_run``, those that would be)."""
    created = []
    namespaces_seen: set[str] = set()
    for entry in planned:
        where = f"{entry.namespace}/{entry.name}"
        if run(["kubectl", "-n", entry.namespace, "get", "secret", entry.name]).returncode == 0:
            say(f"kept    {where}")
            continue
        created.append(entry)
        say(f"{'missing' if dry_run else 'created'} {where}" + _for(entry))
        if dry_run:
            continue
        if entry.namespace not in namespaces_seen:
            namespaces_seen.add(entry.namespace)
            if run(["kubectl", "get", "namespace", entry.namespace]).returncode != 0:
                _check(run(["kubectl", "create", "namespace", entry.namespace]))
        with tempfile.TemporaryDirectory() as scratch:
            files = _contents(entry, make_certificate)
            arguments = []
            for key, data in files.items():
                path = Path(scratch) / key
                path.write_bytes(data)
                path.chmod(0o600)
                arguments.append(f"--from-file={key}={path}")
            command = ["kubectl", "-n", entry.namespace, "create", "secret", "generic"]
            _check(run([*command, entry.name, *arguments]))
    return created


def _for(entry: PlannedSecret) -> str:
    return f" ({entry.identity})" if entry.identity else ""


def _contents(entry: PlannedSecret, make_certificate: MakeCertificate) -> dict[str, bytes]:
    if entry.identity is not None:
        cert, key, ca = make_certificate(entry.identity, entry.dns_names)
        return {"tls.crt": cert, "tls.key": key, "ca.crt": ca}
    if entry.name == SESSION_SECRET:
        line = "k1:" + base64.b64encode(secrets.token_bytes(32)).decode()
        return {"keys": (line + "\n").encode()}
    if entry.name == SUPERUSER_SECRET:
        return {"password": secrets.token_urlsafe(24).encode()}
    return {
        "access-key": ("tidemark-" + secrets.token_hex(6)).encode(),
        "secret-key": secrets.token_urlsafe(32).encode(),
    }


def _check(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(result.args)} failed: {result.stderr.strip()}")


def run_kubectl(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def render(overlay: Path, run: Run) -> list[Resource]:
    result = run(["kubectl", "kustomize", str(overlay)])
    _check(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overlay", type=Path, help="the kustomization that gets applied")
    parser.add_argument(
        "--certs",
        type=Path,
        default=Path("deploy/k8s/.certs"),
        help="directory of the CA that issues the certificates (default: %(default)s)",
    )
    parser.add_argument("--tidemark", default="tidemark", help="the tidemark command")
    parser.add_argument("--dry-run", action="store_true", help="only say what is missing")
    options = parser.parse_args(argv)
    planned = plan(render(options.overlay, run_kubectl))
    make = tidemark_certificate(options.certs, options.tidemark)
    create_missing(planned, run_kubectl, make, dry_run=options.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
