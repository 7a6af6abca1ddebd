"""Renders the kustomizations under ``deploy/k8s/`` without a ``kustomize`` binary.

Only the part of kustomize the manifests use is implemented, with kustomize's semantics for
it; any other field in a ``kustomization.yaml`` is an error rather than silently ignored:

- ``resources``: YAML files (several documents each) and directories holding a
  kustomization, rendered first;
- ``patches`` with ``path``: strategic-merge patches naming their target by kind and name.
  Maps merge key by key; lists of maps that all carry ``name`` (containers, env, ports,
  volumes) merge element by element on it, patch elements first as kustomize orders them;
  other lists and scalars are replaced;
- ``namespace``: set on every namespaced object; a Namespace object is renamed to it, and a
  RoleBinding subject naming a ServiceAccount of the same kustomization follows that
  account into it (kustomize's name-reference fix-up; a subject that names another namespace
  is left alone);
- ``namePrefix``: prepended to every name, and to the references that name a renamed
  object (a pod's ServiceAccount, ConfigMaps and Secrets, volume claims, a StatefulSet's
  Service, a RoleBinding's role and subjects);
- ``labels`` with ``pairs`` and ``includeSelectors`` / ``includeTemplates``; like kustomize,
  ``includeSelectors`` also adds the labels to a NetworkPolicy's existing pod selectors (its
  own and those of its peers), which is why policies live where no selector labels are added;
- ``images`` with ``name``, ``newName``, ``newTag``.

Transformers run in kustomize's order: patches, namespace, prefix, labels, images.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KUSTOMIZATION_FILE = "kustomization.yaml"
SUPPORTED_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "patches", "namespace", "namePrefix", "labels", "images"}
)
CLUSTER_SCOPED_KINDS = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
)
POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
SELECTOR_KINDS = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "PodDisruptionBudget"}
)


class KustomizeError(Exception):
    """A kustomization this renderer cannot render (or kustomize would reject)."""


def render(directory: Path) -> list[Resource]:
    """The objects the kustomization in ``directory`` produces, in a stable order."""
    path = directory / KUSTOMIZATION_FILE
    if not path.is_file():
        raise KustomizeError(f"{directory} has no {KUSTOMIZATION_FILE}")
    spec = yaml.safe_load(path.read_text()) or {}
    unsupported = set(spec) - SUPPORTED_FIELDS
    if unsupported:
        raise KustomizeError(f"{path}: fields not supported here: {sorted(unsupported)}")

    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        resources.extend(render(target) if target.is_dir() else load_documents(target))
    check_unique(resources, path)

    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{path}: only patches given by `path` are supported")
        for document in load_documents(directory / patch["path"]):
            apply_patch(resources, document, path)
    if "namespace" in spec:
        set_namespace(resources, spec["namespace"])
    if "namePrefix" in spec:
        add_name_prefix(resources, spec["namePrefix"])
    for label_set in spec.get("labels", []):
        add_labels(resources, label_set, path)
    for image in spec.get("images", []):
        set_image(resources, image)
    check_unique(resources, path)
    return resources


def load_documents(path: Path) -> list[Resource]:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    for doc in documents:
        if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
            raise KustomizeError(f"{path}: a document without kind and metadata")
    return documents


def resource_id(resource: Resource) -> tuple[str, str, str]:
    metadata = resource["metadata"]
    return resource["kind"], metadata.get("namespace", ""), metadata["name"]


def check_unique(resources: list[Resource], where: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for resource in resources:
        key = resource_id(resource)
        if key in seen:
            raise KustomizeError(f"{where}: {key} is defined twice")
        seen.add(key)


# Patches ------------------------------------------------------------------------------------


def apply_patch(resources: list[Resource], patch: Resource, where: Path) -> None:
    matches = [
        resource
        for resource in resources
        if resource["kind"] == patch["kind"]
        and resource["metadata"]["name"] == patch["metadata"]["name"]
    ]
    if len(matches) != 1:
        raise KustomizeError(
            f"{where}: patch for {patch['kind']}/{patch['metadata']['name']} matches "
            f"{len(matches)} objects"
        )
    merged = merge(matches[0], patch)
    matches[0].clear()
    matches[0].update(merged)


def merge(original: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` into ``original`` (see the module docs for the subset)."""
    if isinstance(original, dict) and isinstance(patch, dict):
        if any(key.startswith("$") for key in patch):
            raise KustomizeError(f"patch directives are not supported: {sorted(patch)}")
        result = copy.deepcopy(original)
        for key, value in patch.items():
            result[key] = merge(original[key], value) if key in original else copy.deepcopy(value)
        return result
    if isinstance(original, list) and isinstance(patch, list) and _named(original + patch):
        by_name = {item["name"]: item for item in original}
        patched_names = {item["name"] for item in patch}
        merged = [
            merge(by_name[item["name"]], item) if item["name"] in by_name else copy.deepcopy(item)
            for item in patch
        ]
        return merged + [
            copy.deepcopy(item) for item in original if item["name"] not in patched_names
        ]
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)


# Namespace and names ------------------------------------------------------------------------


def set_namespace(resources: list[Resource], namespace: str) -> None:
    accounts = _service_accounts(resources)
    for resource in resources:
        if resource["kind"] == "Namespace":
            resource["metadata"]["name"] = namespace
        elif resource["kind"] not in CLUSTER_SCOPED_KINDS:
            resource["metadata"]["namespace"] = namespace
        if resource["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for subject in resource.get("subjects", []):
            if subject["kind"] != "ServiceAccount":
                continue
            if (subject["name"], subject.get("namespace", "")) in accounts:
                subject["namespace"] = namespace


def add_name_prefix(resources: list[Resource], prefix: str) -> None:
    renamed: dict[tuple[str, str], str] = {}
    accounts = _service_accounts(resources)
    for resource in resources:
        if resource["kind"] == "Namespace":
            continue
        old = resource["metadata"]["name"]
        renamed[(resource["kind"], old)] = prefix + old
        resource["metadata"]["name"] = prefix + old
    for resource in resources:
        for kind, holder, key in name_references(resource):
            if _foreign_subject(resource, holder, accounts):
                continue
            new = renamed.get((kind, holder[key]))
            if new is not None:
                holder[key] = new


def _service_accounts(resources: list[Resource]) -> set[tuple[str, str]]:
    return {
        (obj["metadata"]["name"], obj["metadata"].get("namespace", ""))
        for obj in resources
        if obj["kind"] == "ServiceAccount"
    }


def _foreign_subject(
    resource: Resource, holder: dict[str, Any], accounts: set[tuple[str, str]]
) -> bool:
    """A binding's subject that names a ServiceAccount of another namespace than the one of
    this kustomization's account of that name: kustomize leaves it alone."""
    return (
        any(holder is subject for subject in resource.get("subjects", []))
        and holder["kind"] == "ServiceAccount"
        and (holder["name"], holder.get("namespace", "")) not in accounts
    )


def name_references(resource: Resource) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Every field of ``resource`` that names another object: (that object's kind, the dict
    holding the name, its key)."""
    kind = resource["kind"]
    spec = resource.get("spec", {})
    if kind == "StatefulSet" and "serviceName" in spec:
        yield "Service", spec, "serviceName"
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        yield resource["roleRef"]["kind"], resource["roleRef"], "name"
        for subject in resource.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                yield "ServiceAccount", subject, "name"
    pod = pod_spec(resource)
    if pod is None:
        return
    if "serviceAccountName" in pod:
        yield "ServiceAccount", pod, "serviceAccountName"
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"], "name"
        if "secret" in volume:
            yield "Secret", volume["secret"], "secretName"
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"], "claimName"
    for container in all_containers(pod):
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"], "name"
            if "secretRef" in source:
                yield "Secret", source["secretRef"], "name"
        for variable in container.get("env", []):
            value_from = variable.get("valueFrom", {})
            if "configMapKeyRef" in value_from:
                yield "ConfigMap", value_from["configMapKeyRef"], "name"
            if "secretKeyRef" in value_from:
                yield "Secret", value_from["secretKeyRef"], "name"


def pod_spec(resource: Resource) -> dict[str, Any] | None:
    if resource["kind"] not in POD_TEMPLATE_KINDS:
        return None
    spec: dict[str, Any] = resource["spec"]["template"]["spec"]
    return spec


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


# Labels and images --------------------------------------------------------------------------


def add_labels(resources: list[Resource], label_set: dict[str, Any], where: Path) -> None:
    unsupported = set(label_set) - {"pairs", "includeSelectors", "includeTemplates"}
    if unsupported:
        raise KustomizeError(f"{where}: label fields not supported here: {sorted(unsupported)}")
    pairs: dict[str, str] = label_set["pairs"]
    selectors = bool(label_set.get("includeSelectors", False))
    templates = selectors or bool(label_set.get("includeTemplates", False))

    def add(holder: dict[str, Any], key: str) -> None:
        holder.setdefault(key, {}).update(pairs)

    for resource in resources:
        add(resource["metadata"], "labels")
        kind = resource["kind"]
        if templates and kind in POD_TEMPLATE_KINDS:
            add(resource["spec"]["template"].setdefault("metadata", {}), "labels")
        if templates and kind == "StatefulSet":
            for claim in resource["spec"].get("volumeClaimTemplates", []):
                add(claim.setdefault("metadata", {}), "labels")
        if selectors:
            _add_selector_labels(resource, add)


def _add_selector_labels(resource: Resource, add: Callable[[dict[str, Any], str], None]) -> None:
    kind = resource["kind"]
    if kind == "Service":
        add(resource["spec"], "selector")
    elif kind in SELECTOR_KINDS:
        add(resource["spec"].setdefault("selector", {}), "matchLabels")
    elif kind == "NetworkPolicy":
        spec = resource["spec"]
        selectors = [spec.get("podSelector", {})]
        for direction, peers in (("ingress", "from"), ("egress", "to")):
            for rule in spec.get(direction, []):
                selectors += [
                    peer["podSelector"] for peer in rule.get(peers, []) if "podSelector" in peer
                ]
        for selector in selectors:
            # kustomize only adds to matchLabels that exist (an empty selector stays empty).
            if "matchLabels" in selector:
                add(selector, "matchLabels")


def set_image(resources: list[Resource], image: dict[str, str]) -> None:
    for resource in resources:
        pod = pod_spec(resource)
        if pod is None:
            continue
        for container in all_containers(pod):
            name, tag = split_image(container["image"])
            if name != image["name"]:
                continue
            new_name = image.get("newName", name)
            new_tag = image.get("newTag", tag)
            container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name


def split_image(image: str) -> tuple[str, str]:
    """``registry/name:tag`` as (``registry/name``, ``tag``); a port is not a tag."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, ""
    return name, tag
