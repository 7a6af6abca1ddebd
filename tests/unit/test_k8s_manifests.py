"""The Kubernetes manifests under deploy/k8s and the image they run, checked offline.

Every kustomization is rendered (tests/support/kustomize.py) and every object validated
against the Kubernetes API schemas in strict mode; then the deployment as a whole is checked
for what a schema cannot see: that each address a process is given names a Service that
exists, on the right port, in front of the right process; that ports agree between
containers, probes and Services; and that every workload is probed, sized and locked down.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import fields
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import prometheus_client
import pytest

from tests.support.kustomize import KustomizeError, Resource, all_containers, render
from tidemark.config import ServiceConfig, env_var
from tidemark.rpc.server import LIVENESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "tenant-example"
# gRPC probes are stable since 1.27; 1.30 is the oldest release the manifests promise to run on.
KUBERNETES_VERSION = "1.30.0"

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
SHARED_NAMESPACE = "tidemark"
TENANT_CLUSTER = "tenant_example"
TENANT_PREFIX = "tenant-example-"
TENANT_NAMESPACE = "tidemark-tenant-example"

# Settings each process cannot run without (beyond the listen address every one has).
REQUIRED_SETTINGS = {
    "services.oracle": {"consensus_url"},
    "services.storage": {"consensus_url", "blob_url"},
    "services.catalog": {"oracle", "storage"},
    "services.sources": {"oracle", "storage", "catalog"},
    "services.compute": {"cluster", "storage", "catalog", "spark_master"},
    "services.adapter": {"oracle", "storage", "catalog", "compute"},
}
MONITORING = K8S / "monitoring"
DASHBOARD = MONITORING / "tidemark-dashboard.json"
# API groups of custom resources (the Prometheus Operator's), which kubernetes-validate has no
# schemas for.
CUSTOM_RESOURCE_GROUPS = frozenset({"monitoring.coreos.com"})

# Read by the S3 blob store from the environment rather than declared as settings.
S3_CREDENTIAL_VARIABLES = {"TIDEMARK_S3_ACCESS_KEY", "TIDEMARK_S3_SECRET_KEY"}


def load_script(name: str) -> ModuleType:
    """A module of ``scripts/`` (not a package), registered before it runs as dataclasses
    need."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


k8s_secrets = load_script("k8s_secrets")


def kustomization_dirs() -> list[Path]:
    return sorted(path.parent for path in K8S.rglob("kustomization.yaml"))


@pytest.fixture(scope="module")
def objects() -> list[Resource]:
    return render(OVERLAY)


# Lookups over rendered objects -------------------------------------------------------------


def of_kind(objects: list[Resource], *kinds: str) -> list[Resource]:
    return [obj for obj in objects if obj["kind"] in kinds]


def namespace_of(obj: Resource) -> str:
    namespace: str = obj["metadata"].get("namespace", "")
    return namespace


def named(
    objects: list[Resource], kind: str, name: str, namespace: str = SHARED_NAMESPACE
) -> Resource:
    found = [
        obj
        for obj in of_kind(objects, kind)
        if obj["metadata"]["name"] == name
        and (kind == "Namespace" or namespace_of(obj) == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} {namespace}/{name!r}, found {len(found)}"
    return found[0]


def pod_labels(workload: Resource) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def selected_workloads(
    objects: list[Resource], selector: dict[str, str], namespace: str
) -> list[Resource]:
    return [
        workload
        for workload in of_kind(objects, *WORKLOAD_KINDS, "Job")
        if namespace_of(workload) == namespace and selects(selector, pod_labels(workload))
    ]


def service_workload(objects: list[Resource], service: Resource) -> Resource:
    found = selected_workloads(objects, service["spec"]["selector"], namespace_of(service))
    name = service["metadata"]["name"]
    assert len(found) == 1, f"Service {name} selects {len(found)} workloads"
    return found[0]


def tidemark_module(container: dict[str, Any]) -> str | None:
    """``services.<name>`` for a Tidemark process (``python -m services.<name> ...``)."""
    command = [*container.get("command", []), *container.get("args", [])]
    if len(command) > 2 and command[:2] == ["python", "-m"] and command[2].startswith("services."):
        module: str = command[2]
        return module
    return None


def tidemark_containers(
    objects: list[Resource],
) -> Iterator[tuple[Resource, dict[str, Any], str]]:
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            module = tidemark_module(container)
            if module is not None:
                yield workload, container, module


def container_port(container: dict[str, Any], name: str) -> int:
    ports = [port["containerPort"] for port in container["ports"] if port.get("name") == name]
    assert len(ports) == 1, f"container {container['name']} has no single port named {name!r}"
    return int(ports[0])


def config_map_data(objects: list[Resource], name: str, namespace: str) -> dict[str, str]:
    data: dict[str, str] = named(objects, "ConfigMap", name, namespace).get("data", {})
    return data


def container_namespace(objects: list[Resource], container: dict[str, Any]) -> str:
    """The namespace of the workload ``container`` belongs to."""
    for workload in of_kind(objects, *WORKLOAD_KINDS, "Job"):
        if any(c is container for c in all_containers(workload["spec"]["template"]["spec"])):
            return namespace_of(workload)
    raise AssertionError(f"container {container['name']} belongs to no workload")


def effective_environment(objects: list[Resource], container: dict[str, Any]) -> dict[str, str]:
    """The literal variables the container starts with: ConfigMaps first, then ``env``."""
    namespace = container_namespace(objects, container)
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        environment.update(config_map_data(objects, source["configMapRef"]["name"], namespace))
    for variable in container.get("env", []):
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
    return environment


def effective_settings(objects: list[Resource], container: dict[str, Any]) -> dict[str, str]:
    """The process's settings as `tidemark.config` reads them: TIDEMARK_* variables, then
    ``--flag value`` / ``--flag=value`` arguments after the module, which win."""
    settings = {
        name.removeprefix("TIDEMARK_").lower(): value
        for name, value in effective_environment(objects, container).items()
        if name.startswith("TIDEMARK_")
    }
    arguments = [*container.get("command", []), *container.get("args", [])][3:]
    while arguments:
        flag = arguments.pop(0)
        assert flag.startswith("--"), f"unexpected argument {flag!r}"
        name, equals, value = flag[2:].partition("=")
        settings[name.replace("-", "_")] = value if equals else arguments.pop(0)
    return settings


def resolve_address(
    objects: list[Resource], address: str, namespace: str = SHARED_NAMESPACE
) -> tuple[Resource, Resource]:
    """The Service and the workload behind ``host:port`` as seen from ``namespace`` (a host
    ``name.other`` names a Service of namespace ``other``); the port must be the Service's."""
    host, _, port = address.rpartition(":")
    name, _, qualified = host.partition(".")
    if qualified:
        namespace = qualified.removesuffix(".svc.cluster.local").removesuffix(".svc")
    service = named(objects, "Service", name, namespace)
    service_ports = [entry["port"] for entry in service["spec"]["ports"]]
    assert int(port) in service_ports, f"{address}: Service {host} serves {service_ports}"
    return service, service_workload(objects, service)


def module_at(objects: list[Resource], address: str, namespace: str) -> str | None:
    _, workload = resolve_address(objects, address, namespace)
    modules = {tidemark_module(c) for c in workload["spec"]["template"]["spec"]["containers"]}
    assert len(modules) == 1
    return modules.pop()


def declared_settings(module: str) -> set[str]:
    """The settings ``python -m <module>`` reads: the fields of the ServiceConfig subclass in
    its ``__main__.py`` plus the common ones. Read from the source rather than imported, so
    checking names does not start Spark's imports or depend on the rest of the package."""
    source = ROOT / Path(*module.split(".")) / "__main__.py"
    tree = ast.parse(source.read_text())
    configs = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id == "ServiceConfig" for base in node.bases)
    ]
    assert len(configs) == 1, f"{source} declares {len(configs)} configuration classes"
    own = {
        statement.target.id
        for statement in configs[0].body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    }
    return own | {field.name for field in fields(ServiceConfig)}


_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_SCALE = {
    None: Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
}


def quantity(value: str | int) -> Fraction:
    match = _QUANTITY.fullmatch(str(value))
    assert match is not None, f"not a Kubernetes quantity: {value!r}"
    return Fraction(match.group(1)) * _SCALE[match.group(2)]


# The renderer -------------------------------------------------------------------------------


def write_kustomization(directory: Path, text: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(text)


def test_renderer_refuses_kustomize_features_it_does_not_implement(tmp_path: Path) -> None:
    write_kustomization(tmp_path, "resources: []\nreplicas: [{name: adapter, count: 3}]\n")
    with pytest.raises(KustomizeError, match="replicas"):
        render(tmp_path)


def test_renderer_merges_named_lists_and_renames_references(tmp_path: Path) -> None:
    (tmp_path / "app.yaml").write_text(
        """
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      serviceAccountName: runner
      containers:
        - name: main
          image: tidemark:1
          args: [a, b]
          env: [{name: KEEP, value: "1"}, {name: CHANGE, value: old}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: runner}
"""
    )
    (tmp_path / "patch.yaml").write_text(
        """
apiVersion: apps/v1
kind: Deployment
metadata: {name: app}
spec:
  template:
    spec:
      containers:
        - name: main
          args: [c]
          env: [{name: CHANGE, value: new}, {name: ADD, value: "2"}]
"""
    )
    write_kustomization(
        tmp_path,
        """
resources: [app.yaml]
patches: [{path: patch.yaml}]
namespace: ns
namePrefix: t-
labels: [{pairs: {tenant: t}, includeSelectors: true}]
images: [{name: tidemark, newName: registry.example/tidemark, newTag: "2"}]
""",
    )
    deployment, account = render(tmp_path)
    assert deployment["metadata"] == {"name": "t-app", "namespace": "ns", "labels": {"tenant": "t"}}
    assert account["metadata"]["name"] == "t-runner"
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"] == {"app": "x", "tenant": "t"}
    assert spec["template"]["metadata"]["labels"] == {"app": "x", "tenant": "t"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "t-runner"
    (container,) = pod["containers"]
    assert container["args"] == ["c"]
    assert container["env"] == [
        {"name": "CHANGE", "value": "new"},
        {"name": "ADD", "value": "2"},
        {"name": "KEEP", "value": "1"},
    ]
    assert container["image"] == "registry.example/tidemark:2"


def test_renderer_moves_namespaces_and_binding_subjects_as_kustomize_does(
    tmp_path: Path,
) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "objects.yaml").write_text(
        """
apiVersion: v1
kind: Namespace
metadata: {name: placeholder}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: runner}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: run}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: run}
subjects:
  - {kind: ServiceAccount, name: runner}
  - {kind: ServiceAccount, name: runner, namespace: elsewhere}
"""
    )
    write_kustomization(tmp_path / "inner", "resources: [objects.yaml]\n")
    write_kustomization(tmp_path, "resources: [inner]\nnamespace: tenant-a\nnamePrefix: a-\n")
    namespace, account, binding = render(tmp_path)
    assert namespace["metadata"] == {"name": "tenant-a"}
    assert account["metadata"] == {"name": "a-runner", "namespace": "tenant-a"}
    # The subject naming the kustomization's account follows it; the other is left alone.
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "a-runner", "namespace": "tenant-a"},
        {"kind": "ServiceAccount", "name": "runner", "namespace": "elsewhere"},
    ]


def test_renderer_adds_selector_labels_to_network_policy_peers(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(
        """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p}
spec:
  podSelector: {matchLabels: {app: x}}
  ingress: [{from: [{podSelector: {matchLabels: {app: y}}}, {podSelector: {}}]}]
  egress: [{to: [{namespaceSelector: {}, podSelector: {matchLabels: {app: z}}}]}]
"""
    )
    write_kustomization(
        tmp_path, "resources: [policy.yaml]\nlabels: [{pairs: {c: d}, includeSelectors: true}]\n"
    )
    (policy,) = render(tmp_path)
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app": "x", "c": "d"}}
    assert spec["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"app": "y", "c": "d"}}},
        {"podSelector": {}},
    ]
    assert spec["egress"][0]["to"][0]["podSelector"] == {"matchLabels": {"app": "z", "c": "d"}}


# Schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "directory", kustomization_dirs(), ids=lambda path: str(path.relative_to(K8S))
)
def test_every_kustomization_renders_to_valid_objects(directory: Path) -> None:
    rendered = render(directory)
    assert rendered
    for obj in rendered:
        if obj["apiVersion"].split("/")[0] in CUSTOM_RESOURCE_GROUPS:
            continue  # no schema offline; test_service_monitor_* checks their shape
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_validation_is_strict_enough_to_catch_a_typo(objects: list[Resource]) -> None:
    broken = copy.deepcopy(named(objects, "Deployment", "oracle"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_overlay_contains_the_whole_deployment(objects: list[Resource]) -> None:
    workloads = {obj["metadata"]["name"] for obj in of_kind(objects, *WORKLOAD_KINDS)}
    assert workloads == {
        "etcd",
        "minio",
        "oracle",
        "storage",
        "catalog",
        "sources",
        "adapter",
        "default-compute",
        TENANT_PREFIX + "compute",
    }
    assert named(objects, "StatefulSet", "etcd")["spec"]["replicas"] == 3
    assert named(objects, "Deployment", "oracle")["spec"]["replicas"] >= 2
    assert named(objects, "Deployment", "adapter")["spec"]["replicas"] >= 2
    assert named(objects, "Job", "minio-create-bucket")


# Workload hygiene ---------------------------------------------------------------------------


def test_every_workload_is_probed(objects: list[Resource]) -> None:
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert "readinessProbe" in container, where
            assert "livenessProbe" in container, where


def test_every_container_has_requests_and_limits(objects: list[Resource]) -> None:
    for workload in of_kind(objects, *WORKLOAD_KINDS, "Job"):
        for container in all_containers(workload["spec"]["template"]["spec"]):
            where = f"{workload['metadata']['name']}/{container['name']}"
            requests = container["resources"]["requests"]
            limits = container["resources"]["limits"]
            assert set(requests) == {"cpu", "memory"}, where
            assert set(limits) == {"cpu", "memory"}, where
            for resource in ("cpu", "memory"):
                assert quantity(limits[resource]) >= quantity(requests[resource]), where


def test_every_pod_runs_locked_down(objects: list[Resource]) -> None:
    for workload in of_kind(objects, *WORKLOAD_KINDS, "Job"):
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in all_containers(pod):
            context = container["securityContext"]
            where = f"{name}/{container['name']}"
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            mounts = {mount["name"] for mount in container.get("volumeMounts", [])}
            volumes = {volume["name"] for volume in pod.get("volumes", [])}
            claims = {
                claim["metadata"]["name"]
                for claim in workload["spec"].get("volumeClaimTemplates", [])
            }
            assert mounts <= volumes | claims, where


def test_every_namespace_is_restricted_and_holds_its_own(objects: list[Resource]) -> None:
    namespaces = {ns["metadata"]["name"]: ns for ns in of_kind(objects, "Namespace")}
    assert set(namespaces) == {SHARED_NAMESPACE, TENANT_NAMESPACE}
    for namespace in namespaces.values():
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces[TENANT_NAMESPACE]["metadata"]["labels"]["tidemark.dev/tenant"] == "example"
    assert "tidemark.dev/tenant" not in namespaces[SHARED_NAMESPACE]["metadata"]["labels"]
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert namespace_of(obj) in namespaces, obj["metadata"]["name"]
    # The shared services live in the shared namespace; the tenant's compute in its own.
    shared = {
        w["metadata"]["name"]
        for w in of_kind(objects, *WORKLOAD_KINDS, "Job")
        if namespace_of(w) == SHARED_NAMESPACE
    }
    assert {"etcd", "minio", "oracle", "storage", "catalog", "sources", "adapter"} <= shared
    tenant = {
        w["metadata"]["name"]
        for w in of_kind(objects, *WORKLOAD_KINDS, "Job")
        if namespace_of(w) == TENANT_NAMESPACE
    }
    assert tenant == {TENANT_PREFIX + "compute"}


def test_references_name_objects_and_keys_that_exist(objects: list[Resource]) -> None:
    planned = {(entry.namespace, entry.name): entry for entry in k8s_secrets.plan(objects)}
    for workload in of_kind(objects, *WORKLOAD_KINDS, "Job"):
        namespace = namespace_of(workload)
        pod = workload["spec"]["template"]["spec"]
        for container in all_containers(pod):
            for source in container.get("envFrom", []):
                named(objects, "ConfigMap", source["configMapRef"]["name"], namespace)
            for variable in container.get("env", []):
                reference = variable.get("valueFrom", {}).get("secretKeyRef")
                if reference is not None:
                    # Secrets are made by scripts/k8s_secrets.py, with the keys read here.
                    assert reference["key"] in planned[(namespace, reference["name"])].keys
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                named(objects, "PersistentVolumeClaim", claim, namespace)
            if "configMap" in volume:
                named(objects, "ConfigMap", volume["configMap"]["name"], namespace)
            if "secret" in volume and not volume["secret"].get("optional", False):
                assert (namespace, volume["secret"]["secretName"]) in planned
        if "serviceAccountName" in pod:
            named(objects, "ServiceAccount", pod["serviceAccountName"], namespace)
    for binding in of_kind(objects, "RoleBinding"):
        namespace = namespace_of(binding)
        named(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"], namespace)
        for subject in binding["subjects"]:
            named(objects, subject["kind"], subject["name"], subject["namespace"])


def test_multi_replica_workloads_have_disruption_budgets(objects: list[Resource]) -> None:
    budgets = of_kind(objects, "PodDisruptionBudget")
    covered = {}
    for budget in budgets:
        (workload,) = selected_workloads(
            objects, budget["spec"]["selector"]["matchLabels"], namespace_of(budget)
        )
        covered[workload["metadata"]["name"]] = budget
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        if workload["spec"]["replicas"] > 1:
            assert workload["metadata"]["name"] in covered, workload["metadata"]["name"]
    assert {"etcd", "adapter"} <= set(covered)
    # etcd: voluntary disruptions must leave a quorum of members running.
    assert (
        covered["etcd"]["spec"]["minAvailable"]
        > named(objects, "StatefulSet", "etcd")["spec"]["replicas"] // 2
    )


# Services and ports -------------------------------------------------------------------------


def test_service_names_are_unique(objects: list[Resource]) -> None:
    names = [service["metadata"]["name"] for service in of_kind(objects, "Service")]
    assert len(names) == len(set(names))


def test_each_service_fronts_one_workload_on_its_ports(objects: list[Resource]) -> None:
    for service in of_kind(objects, "Service"):
        workload = service_workload(objects, service)
        containers = workload["spec"]["template"]["spec"]["containers"]
        for entry in service["spec"]["ports"]:
            target = entry["targetPort"]
            matching = [
                port
                for container in containers
                for port in container.get("ports", [])
                if target in (port.get("name"), port["containerPort"])
            ]
            assert len(matching) == 1, f"{service['metadata']['name']}: port {target!r}"
            assert matching[0]["containerPort"] == entry["port"]


def test_tidemark_processes_listen_where_probes_and_services_look(
    objects: list[Resource],
) -> None:
    for workload, container, module in tidemark_containers(objects):
        grpc_port = container_port(container, "grpc")
        metrics_port = container_port(container, "metrics")
        settings = effective_settings(objects, container)
        assert settings["listen"] == f"0.0.0.0:{grpc_port}", module
        assert int(settings["metrics_port"]) == metrics_port, module
        # Readiness is the overall health status, which waits for the process's
        # dependencies; liveness and startup ask only whether the process answers.
        assert container["readinessProbe"]["grpc"] == {"port": grpc_port}, module
        for probe in ("startupProbe", "livenessProbe"):
            expected = {"port": grpc_port, "service": LIVENESS_SERVICE}
            assert container[probe]["grpc"] == expected, f"{module} {probe}"
        services = [
            service
            for service in of_kind(objects, "Service")
            if selects(service["spec"]["selector"], pod_labels(workload))
        ]
        assert len(services) == 1, module
        ports = {entry["name"]: entry["port"] for entry in services[0]["spec"]["ports"]}
        expected = {"grpc": grpc_port, "metrics": metrics_port}
        if module == "services.adapter":
            # The adapter also speaks the PostgreSQL wire protocol, on a port of its own.
            expected["postgres"] = container_port(container, "postgres")
            assert settings["pgwire_listen"] == f"0.0.0.0:{expected['postgres']}"
        assert ports == expected, module


def test_other_probes_use_declared_ports(objects: list[Resource]) -> None:
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container and "httpGet" in container[probe]:
                    port = container[probe]["httpGet"]["port"]
                    declared = {p.get("name") for p in container["ports"]}
                    declared |= {p["containerPort"] for p in container["ports"]}
                    assert port in declared, f"{workload['metadata']['name']} {probe}"


# Wiring between processes -------------------------------------------------------------------


def test_one_image_runs_every_tidemark_process(objects: list[Resource]) -> None:
    images = {container["image"] for _, container, _ in tidemark_containers(objects)}
    modules = {module for _, _, module in tidemark_containers(objects)}
    assert modules == set(REQUIRED_SETTINGS)
    assert len(images) == 1


def test_processes_get_their_settings_and_nothing_misspelt(objects: list[Resource]) -> None:
    for _, container, module in tidemark_containers(objects):
        settings = effective_settings(objects, container)
        missing = REQUIRED_SETTINGS[module] - set(settings)
        assert not missing, f"{module} lacks {missing}"
        # Variables set on the container itself (not the shared ConfigMap) must be settings
        # of that very process: a misspelt name would be silently ignored.
        declared = {env_var(name) for name in declared_settings(module)}
        for variable in container.get("env", []):
            name = variable["name"]
            if name.startswith("TIDEMARK_"):
                assert name in declared | S3_CREDENTIAL_VARIABLES, f"{module}: {name}"


def test_addresses_name_the_services_of_the_right_processes(objects: list[Resource]) -> None:
    for _, container, module in tidemark_containers(objects):
        settings = effective_settings(objects, container)
        for setting in ("oracle", "storage", "catalog"):
            if setting in REQUIRED_SETTINGS[module]:
                namespace = container_namespace(objects, container)
                found = module_at(objects, settings[setting], namespace)
                assert found == f"services.{setting}", module


def test_consensus_url_lists_every_etcd_member(objects: list[Resource]) -> None:
    etcd = named(objects, "StatefulSet", "etcd")
    governing = named(objects, "Service", etcd["spec"]["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    assert service_workload(objects, governing) is etcd
    client_port = next(p["port"] for p in governing["spec"]["ports"] if p["name"] == "client")
    members = {
        f"{etcd['metadata']['name']}-{index}.{governing['metadata']['name']}:{client_port}"
        for index in range(etcd["spec"]["replicas"])
    }
    for _, container, module in tidemark_containers(objects):
        if "consensus_url" in REQUIRED_SETTINGS[module]:
            url = effective_settings(objects, container)["consensus_url"]
            scheme, _, endpoints = url.partition("://")
            assert scheme == "etcd", module
            assert set(endpoints.split(",")) == members, module


def test_blob_url_names_the_bucket_the_job_creates_on_minio(objects: list[Resource]) -> None:
    storage = next(c for _, c, m in tidemark_containers(objects) if m == "services.storage")
    url = urlsplit(effective_settings(objects, storage)["blob_url"])
    query = {key: values[0] for key, values in parse_qs(url.query).items()}
    assert url.scheme == "s3"
    assert query["secure"] == "false"
    _, minio = resolve_address(objects, query["endpoint"])
    assert minio["metadata"]["name"] == "minio"

    job = named(objects, "Job", "minio-create-bucket")
    (mc,) = job["spec"]["template"]["spec"]["containers"]
    arguments = mc["args"]
    alias, _, bucket = arguments[arguments.index("mb") + 2].partition("/")
    assert bucket == url.netloc
    alias_url = urlsplit(effective_environment(objects, mc)[f"MC_HOST_{alias}"])
    assert f"{alias_url.hostname}:{alias_url.port}" == query["endpoint"]

    # Storage signs with the credentials MinIO was given.
    def secret_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
        return {
            variable["name"]: (ref["name"], ref["key"])
            for variable in container["env"]
            if (ref := variable.get("valueFrom", {}).get("secretKeyRef")) is not None
        }

    server = secret_refs(minio["spec"]["template"]["spec"]["containers"][0])
    client = secret_refs(storage)
    assert client["TIDEMARK_S3_ACCESS_KEY"] == server["MINIO_ROOT_USER"]
    assert client["TIDEMARK_S3_SECRET_KEY"] == server["MINIO_ROOT_PASSWORD"]


def test_adapter_compute_mapping_names_every_cluster_service(objects: list[Resource]) -> None:
    adapter = next(c for _, c, m in tidemark_containers(objects) if m == "services.adapter")
    mapping = dict(
        entry.split("=", 1) for entry in effective_settings(objects, adapter)["compute"].split(",")
    )
    assert set(mapping) == {"default", TENANT_CLUSTER}
    assert mapping[TENANT_CLUSTER] == f"{TENANT_PREFIX}compute.{TENANT_NAMESPACE}:6879"
    served = set()
    for cluster, address in mapping.items():
        _, workload = resolve_address(objects, address)
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert tidemark_module(container) == "services.compute"
        assert effective_settings(objects, container)["cluster"] == cluster
        served.add(workload["metadata"]["name"])
    computes = {
        workload["metadata"]["name"]
        for workload, _, module in tidemark_containers(objects)
        if module == "services.compute"
    }
    assert served == computes


def test_tenant_cluster_is_its_own_spark_application(objects: list[Resource]) -> None:
    tenant = named(objects, "Deployment", TENANT_PREFIX + "compute", TENANT_NAMESPACE)
    assert tenant["metadata"]["labels"]["tidemark.dev/tenant"] == "example"
    assert tenant["spec"]["replicas"] == 1
    assert tenant["spec"]["strategy"]["type"] == "Recreate"
    (container,) = tenant["spec"]["template"]["spec"]["containers"]
    assert effective_settings(objects, container)["spark_master"] == "local[*]"
    # Everything in the tenant's namespace is the tenant's, and nothing outside it is.
    for obj in objects:
        is_tenants = obj["metadata"].get("labels", {}).get("tidemark.dev/tenant") == "example"
        in_namespace = TENANT_NAMESPACE in (namespace_of(obj), obj["metadata"]["name"])
        assert in_namespace == is_tenants, obj["metadata"]["name"]


# Monitoring ---------------------------------------------------------------------------------


def tidemark_services(objects: list[Resource]) -> list[Resource]:
    """The Services in front of Tidemark processes."""
    found = []
    for service in of_kind(objects, "Service"):
        workloads = selected_workloads(objects, service["spec"]["selector"], namespace_of(service))
        containers = [c for w in workloads for c in w["spec"]["template"]["spec"]["containers"]]
        if any(tidemark_module(c) is not None for c in containers):
            found.append(service)
    return found


def label_selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``) against labels."""
    for key, wanted in selector.get("matchLabels", {}).items():
        if labels.get(key) != wanted:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression["values"]
        assert operator in ("In", "NotIn"), operator
        if (labels.get(key) in values) != (operator == "In"):
            return False
    return True


def test_service_monitor_scrapes_every_tidemark_service_and_nothing_else(
    objects: list[Resource],
) -> None:
    (monitor,) = render(MONITORING)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["namespace"] == "tidemark"
    spec = monitor["spec"]
    assert set(spec) == {"selector", "endpoints", "namespaceSelector"}
    # Tenants' compute clusters run in namespaces of their own.
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert quantity(endpoint["scrapeTimeout"].rstrip("s")) < quantity(
        endpoint["interval"].rstrip("s")
    )
    selected = {
        service["metadata"]["name"]
        for service in of_kind(objects, "Service")
        if label_selector_matches(spec["selector"], service["metadata"].get("labels", {}))
    }
    expected = {service["metadata"]["name"] for service in tidemark_services(objects)}
    assert expected >= {"oracle", "storage", "catalog", "sources", "adapter", "default-compute"}
    assert TENANT_PREFIX + "compute" in expected
    assert selected == expected
    for service in tidemark_services(objects):
        names = [entry["name"] for entry in service["spec"]["ports"]]
        assert "metrics" in names, service["metadata"]["name"]


METRIC_MODULES = (
    "tidemark.rpc.metrics",
    "services.storage.metrics",
    "services.oracle.oracle",
    "services.compute.metrics",
    "services.adapter.service",
    "services.sources.metrics",
)


def exported_metric_names() -> set[str]:
    """The names of every metric the services export, from the modules that declare them."""
    for module in METRIC_MODULES:
        importlib.import_module(module)
    return {family.name for family in prometheus_client.REGISTRY.collect()}


def test_dashboard_panels_query_metrics_the_services_export() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    exported = exported_metric_names()
    queried = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"tidemark_[a-z_]+", target["expr"]):
                family = re.sub(r"_(bucket|sum|count|total)$", "", name)
                assert family in exported, f"{panel['title']}: {name} is not exported"
                queried.add(family)
    # What the issue asks to watch is on the dashboard.
    assert {
        "tidemark_rpc_requests",
        "tidemark_rpc_duration_seconds",
        "tidemark_storage_upper_lag_seconds",
        "tidemark_compute_step_seconds",
        "tidemark_compute_hydration_input_rows",
        "tidemark_compute_arrangement_keys",
        "tidemark_oracle_batch_size",
        "tidemark_storage_appended_bytes",
        "tidemark_storage_appended_batches",
    } <= queried
    (variable,) = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"


# The image ----------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    instructions = []
    for line in logical.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            instructions.append((keyword.upper(), " ".join(rest.split())))
    return instructions


def test_dockerfile_builds_one_image_with_protos_java_and_a_plain_user() -> None:
    instructions = dockerfile_instructions()
    bases = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert bases and all(base.startswith("python:3.11-slim") for base in bases)

    runs = " && ".join(rest for keyword, rest in instructions if keyword == "RUN")
    generate = runs.index("scripts/generate-protos.sh")
    assert generate < runs.index("pip install .")
    assert re.search(r"apt-get install [^&]*openjdk-17-jre", runs)
    copied = " ".join(rest for keyword, rest in instructions if keyword == "COPY")
    assert "protos/" in copied and "scripts/generate-protos.sh" in copied

    final_stage = instructions[max(i for i, (k, _) in enumerate(instructions) if k == "FROM") :]
    users = [rest for keyword, rest in final_stage if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")

    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored
    assert "tidemark/v1/*_pb2.py" in ignored
