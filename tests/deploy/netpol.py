"""Reads Kubernetes NetworkPolicies and answers "may A open a connection to B on port P?".

A small model of the ``networking.k8s.io/v1`` semantics, enough to test what the
policies in ``deploy/k8s/`` mean rather than how they are spelt:

* a pod is isolated for ingress (egress) when a policy of its namespace selects
  it and lists ``Ingress`` (``Egress``) in ``policyTypes`` (``Ingress`` is implied,
  ``Egress`` implied when the policy has an ``egress`` section);
* an isolated pod accepts (sends) a connection only when a rule of one of the
  policies that select it matches both the peer and the port; rules add up;
* a rule without ``from``/``to`` matches every peer, without ``ports`` every port;
* in one peer, ``podSelector`` and ``namespaceSelector`` must both match; a bare
  ``podSelector`` means the policy's own namespace; ``ipBlock`` matches addresses
  outside the cluster (here: endpoints with an ``ip``), minus its ``except``;
* a named port is the destination container's port of that name;
* a connection happens when the source may send it and the destination accept it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Port:
    """A port an endpoint listens on: number, protocol, optional name."""

    number: int
    protocol: str = "TCP"
    name: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """A pod (``namespace`` set) or an address outside the cluster (``ip`` set)."""

    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()
    ip: str | None = None


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` / ``matchExpressions``) matches ``labels``.

    An empty selector matches everything.

    Raises:
        ValueError: an operator other than In, NotIn, Exists, DoesNotExist.
    """
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {op!r}")
    return True


class Policies:
    """The NetworkPolicies of a set of manifests."""

    def __init__(self, policies: Iterable[Mapping[str, Any]]) -> None:
        self.policies = list(policies)

    def selecting(self, pod: Endpoint, direction: str) -> list[Mapping[str, Any]]:
        """Policies that select ``pod`` for ``direction`` (``"Ingress"`` or ``"Egress"``)."""
        if pod.namespace is None:
            return []
        found = []
        for policy in self.policies:
            spec = policy["spec"]
            if policy["metadata"].get("namespace", "default") != pod.namespace:
                continue
            if not selector_matches(spec.get("podSelector"), pod.labels):
                continue
            types = spec.get("policyTypes") or (
                ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]
            )
            if direction in types:
                found.append(policy)
        return found

    def allows(self, src: Endpoint, dst: Endpoint, port: Port) -> bool:
        """Whether ``src`` may connect to ``dst`` on ``port`` (one of ``dst.ports``)."""
        return self._side(src, dst, port, "Egress") and self._side(dst, src, port, "Ingress")

    def _side(self, pod: Endpoint, peer: Endpoint, port: Port, direction: str) -> bool:
        """Whether ``pod``'s policies let the connection pass in ``direction``."""
        if pod.namespace is None:
            return True  # outside the cluster: no NetworkPolicy applies
        selecting = self.selecting(pod, direction)
        if not selecting:
            return True
        key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for policy in selecting:
            namespace = policy["metadata"].get("namespace", "default")
            for rule in policy["spec"].get(key) or []:
                peers = rule.get(peers_key) or []
                if peers and not any(_peer_matches(p, peer, namespace) for p in peers):
                    continue
                ports = rule.get("ports") or []
                if ports and not any(_port_matches(p, port) for p in ports):
                    continue
                return True
        return False


def _peer_matches(peer: Mapping[str, Any], endpoint: Endpoint, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        if endpoint.ip is None:
            return False
        address = ipaddress.ip_address(endpoint.ip)
        block = peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"])
        if address.version != net.version or address not in net:
            return False
        return not any(
            address.version == ipaddress.ip_network(e).version
            and address in ipaddress.ip_network(e)
            for e in block.get("except") or []
        )
    if endpoint.namespace is None:
        return False  # selectors pick pods, never outside addresses
    if "namespaceSelector" in peer:
        if not selector_matches(peer["namespaceSelector"], endpoint.namespace_labels):
            return False
    elif endpoint.namespace != policy_namespace:
        return False
    return selector_matches(peer.get("podSelector"), endpoint.labels)


def _port_matches(rule_port: Mapping[str, Any], port: Port) -> bool:
    if rule_port.get("protocol", "TCP") != port.protocol:
        return False
    if "port" not in rule_port:
        return True
    wanted = rule_port["port"]
    if isinstance(wanted, str):
        return port.name == wanted
    end = rule_port.get("endPort", wanted)
    return bool(wanted <= port.number <= end)


def pods_of(docs: Iterable[Mapping[str, Any]]) -> list[Endpoint]:
    """One endpoint per workload (Deployment, StatefulSet, Job) of ``docs``, with its
    pod template's labels and container ports."""
    namespaces = {
        d["metadata"]["name"]: d["metadata"].get("labels") or {}
        for d in docs
        if d["kind"] == "Namespace"
    }
    out = []
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            continue
        namespace = doc["metadata"].get("namespace", "default")
        template = doc["spec"]["template"]
        ports = tuple(
            Port(p["containerPort"], p.get("protocol", "TCP"), p.get("name"))
            for c in template["spec"]["containers"]
            for p in c.get("ports") or []
        )
        out.append(
            Endpoint(
                name=doc["metadata"]["name"],
                namespace=namespace,
                labels=(template.get("metadata") or {}).get("labels") or {},
                namespace_labels={
                    **namespaces.get(namespace, {}),
                    "kubernetes.io/metadata.name": namespace,
                },
                ports=ports,
            )
        )
    return out
