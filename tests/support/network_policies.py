"""Whether rendered NetworkPolicies let one endpoint reach another, by the Kubernetes rules.

A pod is isolated in a direction once any policy of its namespace selects it with that
direction in ``policyTypes``; it then takes only the traffic some such policy's rules allow.
Traffic passes when the source's egress and the destination's ingress both allow it. Peers
are matched as the API defines them (``podSelector`` alone: pods of the policy's namespace;
``namespaceSelector``: pods of the namespaces it selects; ``ipBlock``: addresses outside the
cluster's pods, as an external endpoint here). Only numeric ports are supported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Resource = dict[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """A pod (``namespace`` set, with its labels and its namespace's) or, with ``namespace``
    None, an address outside the cluster."""

    namespace: str | None
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)


EXTERNAL = Endpoint(None)


def pod(namespace: Resource | str, labels: dict[str, str]) -> Endpoint:
    """A pod with ``labels`` in ``namespace`` (a Namespace object, or a name for one that is not
    rendered, such as kube-system); every namespace carries its name as a label."""
    if isinstance(namespace, str):
        name, own = namespace, {}
    else:
        name, own = namespace["metadata"]["name"], namespace["metadata"].get("labels", {})
    return Endpoint(name, dict(labels), {**own, "kubernetes.io/metadata.name": name})


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def _policy_types(policy: Resource) -> list[str]:
    spec = policy["spec"]
    if "policyTypes" in spec:
        types: list[str] = spec["policyTypes"]
        return types
    return ["Ingress", *(["Egress"] if "egress" in spec else [])]


def _peer_matches(peer: dict[str, Any], policy_namespace: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        return other.namespace is None
    if other.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector", {}), other.labels)


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports") or []
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        if "port" not in entry:
            return True
        assert isinstance(entry["port"], int), f"named port {entry['port']!r} not supported"
        if entry["port"] <= port <= entry.get("endPort", entry["port"]):
            return True
    return False


def _side_allows(
    policies: list[Resource],
    subject: Endpoint,
    other: Endpoint,
    port: int,
    protocol: str,
    direction: str,
) -> bool:
    """Whether ``subject``'s policies of ``direction`` (Ingress or Egress) allow traffic with
    ``other``; an external endpoint has no policies."""
    if subject.namespace is None:
        return True
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    isolating = [
        policy
        for policy in policies
        if policy["metadata"]["namespace"] == subject.namespace
        and direction in _policy_types(policy)
        and selector_matches(policy["spec"]["podSelector"], subject.labels)
    ]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get(rules_key, []):
            peers = rule.get(peers_key) or []
            namespace = policy["metadata"]["namespace"]
            if peers and not any(_peer_matches(peer, namespace, other) for peer in peers):
                continue
            if _port_matches(rule, port, protocol):
                return True
    return False


def allowed(
    objects: list[Resource],
    source: Endpoint,
    destination: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether ``source`` may open a connection to ``destination`` on ``port``."""
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy"]
    return _side_allows(policies, source, destination, port, protocol, "Egress") and _side_allows(
        policies, destination, source, port, protocol, "Ingress"
    )
