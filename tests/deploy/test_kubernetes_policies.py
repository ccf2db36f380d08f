"""What the Kubernetes guard rails in ``deploy/k8s/`` mean (reference §9.5): the NetworkPolicies
read as a reachability graph (``tests/deploy/netpol.py``) that must equal the
intended one exactly, the workers' HorizontalPodAutoscaler, a PodDisruptionBudget per
multi-replica Deployment, and metrics ports that match the services' settings.
Schema validity is ``test_deploy_files.py::test_kubernetes_manifests_validate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from credential_service.settings import CredentialSettings
from job_service.settings import JobServiceSettings
from runtime_worker.settings import WorkerSettings
from tests.deploy.netpol import Endpoint, Policies, Port, pods_of, selector_matches

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "ai-runtime"
NS_LABELS = {"kubernetes.io/metadata.name": NAMESPACE}


def outside(name: str, namespace: str, labels: dict[str, str], *ports: Port) -> Endpoint:
    return Endpoint(
        name,
        namespace,
        labels,
        {"kubernetes.io/metadata.name": namespace},
        ports,
    )


def address(name: str, ip: str, *ports: Port) -> Endpoint:
    return Endpoint(name, ip=ip, ports=ports)


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


@pytest.fixture(scope="module")
def policies(docs: list[dict[str, Any]]) -> Policies:
    return Policies(d for d in docs if d["kind"] == "NetworkPolicy")


@pytest.fixture(scope="module")
def world(docs: list[dict[str, Any]]) -> dict[str, Endpoint]:
    """The manifests' pods plus what surrounds them: the database (two Galera nodes
    labelled ``app: mysql``), cluster DNS, Prometheus and an OTLP collector in
    ``monitoring``, a pod of another namespace that wears the gateway's labels, a
    client on the internet, the model provider, the cloud metadata address and a
    private address."""
    pods = {p.name: p for p in pods_of(docs)}
    mysql_port = Port(3306, "TCP", "mysql")
    galera = (Port(4444), Port(4567), Port(4567, "UDP"), Port(4568))
    for name in ("mysql-0", "mysql-1"):
        pods[name] = Endpoint(name, NAMESPACE, {"app": "mysql"}, NS_LABELS, (mysql_port, *galera))
    others = [
        outside("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, Port(53, "UDP"), Port(53)),
        outside("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}, Port(9090)),
        outside(
            "otel-collector",
            "monitoring",
            {"app.kubernetes.io/name": "opentelemetry-collector"},
            Port(4317),
            Port(4318),
        ),
        outside("impostor", "default", {"app": "api-gateway"}, Port(3000, "TCP", "http")),
        address("client", "198.51.100.9"),
        address("model-provider", "203.0.113.7", Port(443), Port(80)),
        address("model-provider-v6", "2001:db8::7", Port(443)),
        address("cloud-metadata", "169.254.169.254", Port(80), Port(443)),
        address("private-host", "10.20.30.40", Port(443), Port(3306)),
    ]
    return pods | {e.name: e for e in others}


def reachable(policies: Policies, world: dict[str, Endpoint]) -> set[tuple[str, str, str]]:
    """``(source, destination, "port/PROTO")`` for every connection the policies allow."""
    out = set()
    for src in world.values():
        for dst in world.values():
            if src.name == dst.name:
                continue
            for port in dst.ports:
                if policies.allows(src, dst, port):
                    out.add((src.name, dst.name, f"{port.number}/{port.protocol}"))
    return out


IN_NAMESPACE = (
    "api-gateway",
    "job-service",
    "credential-service",
    "runtime-worker",
    "ai-runtime-migrate",
    "mysql-0",
    "mysql-1",
)
SERVICES = ("api-gateway", "job-service", "credential-service", "runtime-worker")
OUTSIDE = ("kube-dns", "prometheus", "otel-collector", "impostor", "client", "model-provider",
           "model-provider-v6", "cloud-metadata", "private-host")  # fmt: skip


def intended() -> set[tuple[str, str, str]]:
    edges = {
        # the gateway: the one way in from outside the namespace
        *((src, "api-gateway", "3000/TCP") for src in OUTSIDE),
        ("api-gateway", "job-service", "50051/TCP"),
        ("api-gateway", "credential-service", "50052/TCP"),
        ("api-gateway", "runtime-worker", "50053/TCP"),
        ("runtime-worker", "job-service", "50051/TCP"),
        ("runtime-worker", "credential-service", "50052/TCP"),
        ("credential-service", "job-service", "50051/TCP"),
        ("job-service", "credential-service", "50052/TCP"),
        # the model provider: workers only, HTTPS only, public addresses only
        ("runtime-worker", "model-provider", "443/TCP"),
        ("runtime-worker", "model-provider-v6", "443/TCP"),
        # the database: its two owners and their migrations
        *(
            (src, db, "3306/TCP")
            for src in ("job-service", "credential-service", "ai-runtime-migrate")
            for db in ("mysql-0", "mysql-1")
        ),
        # Galera nodes among themselves
        *(
            (a, b, port)
            for a, b in (("mysql-0", "mysql-1"), ("mysql-1", "mysql-0"))
            for port in ("3306/TCP", "4444/TCP", "4567/TCP", "4567/UDP", "4568/TCP")
        ),
        # Prometheus scrapes the metrics ports
        ("prometheus", "job-service", "9101/TCP"),
        ("prometheus", "credential-service", "9102/TCP"),
        ("prometheus", "runtime-worker", "9103/TCP"),
        # traces to the OTLP collector
        *((src, "otel-collector", port) for src in SERVICES for port in ("4317/TCP", "4318/TCP")),
        # cluster DNS for every pod
        *((src, "kube-dns", port) for src in IN_NAMESPACE for port in ("53/UDP", "53/TCP")),
    }
    # Between endpoints outside the namespace these policies decide nothing.
    for src in OUTSIDE:
        for dst in OUTSIDE:
            if src != dst:
                edges |= {(src, dst, p) for p in _ports_of(dst)}
    return edges


def _ports_of(name: str) -> tuple[str, ...]:
    return {
        "kube-dns": ("53/UDP", "53/TCP"),
        "prometheus": ("9090/TCP",),
        "otel-collector": ("4317/TCP", "4318/TCP"),
        "impostor": ("3000/TCP",),
        "client": (),
        "model-provider": ("443/TCP", "80/TCP"),
        "model-provider-v6": ("443/TCP",),
        "cloud-metadata": ("80/TCP", "443/TCP"),
        "private-host": ("443/TCP", "3306/TCP"),
    }[name]


def test_reachability_is_exactly_the_intended_graph(
    policies: Policies, world: dict[str, Endpoint]
) -> None:
    got, want = reachable(policies, world), intended()
    assert sorted(got - want) == [], "allowed but not intended"
    assert sorted(want - got) == [], "intended but denied"


def test_every_pod_of_the_namespace_is_isolated_both_ways(
    policies: Policies, world: dict[str, Endpoint]
) -> None:
    for name in IN_NAMESPACE:
        for direction in ("Ingress", "Egress"):
            assert policies.selecting(world[name], direction), (name, direction)
    # and a pod added later without a policy of its own is denied too
    newcomer = Endpoint("newcomer", NAMESPACE, {"app": "newcomer"}, NS_LABELS, (Port(8080),))
    for peer in world.values():
        if peer.name != "kube-dns":
            assert not policies.allows(newcomer, peer, (peer.ports or (Port(1),))[0]), peer.name
        assert not policies.allows(peer, newcomer, Port(8080)), peer.name


def test_named_ports_of_the_policies_exist_on_the_pods_they_name(
    docs: list[dict[str, Any]], world: dict[str, Endpoint]
) -> None:
    """A named port no container declares matches nothing: the rule silently allows
    nothing. Ingress names refer to the selected pods, egress names to the peers."""
    pods = [world[n] for n in IN_NAMESPACE]
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        selected = [p for p in pods if selector_matches(spec["podSelector"], p.labels)]
        for rule in spec.get("ingress") or []:
            for port in rule.get("ports") or []:
                if isinstance(port.get("port"), str):
                    for pod in selected:
                        names = {p.name for p in pod.ports}
                        assert port["port"] in names, (policy["metadata"]["name"], pod.name)
        for rule in spec.get("egress") or []:
            assert not any(isinstance(p.get("port"), str) for p in rule.get("ports") or []), (
                "egress rules name ports by number",
                policy["metadata"]["name"],
            )


def test_only_the_worker_reaches_the_internet(
    policies: Policies, world: dict[str, Endpoint]
) -> None:
    for name in IN_NAMESPACE:
        allowed = policies.allows(world[name], world["model-provider"], Port(443))
        assert allowed == (name == "runtime-worker"), name
    worker = world["runtime-worker"]
    for target, port in (("model-provider", 80), ("cloud-metadata", 443), ("private-host", 443)):
        assert not policies.allows(worker, world[target], Port(port)), target


# ---------------------------------------------------------------- the reader itself


def _policy(spec: dict[str, Any], namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec}


A = Endpoint("a", NAMESPACE, {"app": "a"}, NS_LABELS, (Port(80, "TCP", "http"),))
B = Endpoint("b", NAMESPACE, {"app": "b", "tier": "x"}, NS_LABELS, (Port(80, "TCP", "http"),))
C = Endpoint("c", "other", {"app": "b"}, {"kubernetes.io/metadata.name": "other"}, ())
NET = Endpoint("net", ip="192.0.2.1")
SELECT_A = {"matchLabels": {"app": "a"}}


@pytest.mark.parametrize(
    ("spec", "src", "allowed"),
    [
        ({"podSelector": {"matchLabels": {"app": "z"}}}, B, True),  # a not selected
        ({"podSelector": SELECT_A}, B, False),  # Ingress implied, no rules
        ({"podSelector": SELECT_A, "ingress": [{}]}, C, True),  # empty rule: everyone
        ({"podSelector": SELECT_A, "ingress": [{"from": [{"podSelector": {}}]}]}, C, False),
        ({"podSelector": SELECT_A, "ingress": [{"from": [{"podSelector": {}}]}]}, B, True),
        (
            {"podSelector": SELECT_A, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b"}}}]}]},
            C,
            True,
        ),
        (
            {"podSelector": SELECT_A, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}]}]},
            B,
            True,
        ),
        (
            {"podSelector": SELECT_A, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["b"]}]}}]}]},
            B,
            False,
        ),
        ({"podSelector": SELECT_A, "ingress": [{"ports": [{"port": "http"}]}]}, B, True),
        ({"podSelector": SELECT_A, "ingress": [{"ports": [{"port": "grpc"}]}]}, B, False),
        ({"podSelector": SELECT_A, "ingress": [{"ports": [{"port": 70, "endPort": 90}]}]}, B, True),
        ({"podSelector": SELECT_A, "ingress": [{"ports": [{"port": 80, "protocol": "UDP"}]}]}, B, False),
        ({"podSelector": SELECT_A, "ingress": [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]}, NET, True),
        ({"podSelector": SELECT_A, "ingress": [{"from": [{"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.0/28"]}}]}]}, NET, False),
        ({"podSelector": SELECT_A, "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}, B, False),
        ({"podSelector": SELECT_A, "egress": [], "ingress": [{}]}, B, True),  # Egress-only isolation of a
    ],
)  # fmt: skip
def test_the_reader_follows_networkpolicy_semantics(
    spec: dict[str, Any], src: Endpoint, allowed: bool
) -> None:
    assert Policies([_policy(spec)]).allows(src, A, Port(80, "TCP", "http")) is allowed


def test_the_reader_needs_both_ends_to_agree() -> None:
    deny_egress_of_b = _policy(
        {"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Egress"]}
    )
    assert not Policies([deny_egress_of_b]).allows(B, A, Port(80, "TCP", "http"))
    other_namespace = _policy({"podSelector": {}, "policyTypes": ["Ingress"]}, namespace="other")
    assert Policies([other_namespace]).allows(B, A, Port(80, "TCP", "http"))


# ---------------------------------------------------------------- scaling and disruption


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}


def hpas(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """HorizontalPodAutoscalers by the Deployment they scale."""
    return {
        d["spec"]["scaleTargetRef"]["name"]: d
        for d in docs
        if d["kind"] == "HorizontalPodAutoscaler"
    }


def min_replicas(docs: list[dict[str, Any]], name: str) -> int:
    hpa = hpas(docs).get(name)
    if hpa is not None:
        return int(hpa["spec"].get("minReplicas", 1))
    return int(deployments(docs)[name]["spec"].get("replicas", 1))


def test_the_workers_scale_on_cpu_with_autoscaling_v2(docs: list[dict[str, Any]]) -> None:
    hpa = hpas(docs)["runtime-worker"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "runtime-worker",
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    cpu = [m for m in hpa["spec"]["metrics"] if m["type"] == "Resource"]
    assert cpu[0]["resource"]["name"] == "cpu"
    assert cpu[0]["resource"]["target"]["type"] == "Utilization"
    assert 0 < cpu[0]["resource"]["target"]["averageUtilization"] <= 100
    worker = deployments(docs)["runtime-worker"]
    # a fixed count would fight the autoscaler on every `kubectl apply`
    assert "replicas" not in worker["spec"]
    # Utilization is a share of the request: without one the HPA cannot compute it
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"]


def test_worker_scale_down_is_gradual(docs: list[dict[str, Any]]) -> None:
    """A removed worker drains for up to its grace period: remove one at a time, no
    faster than one grace period, after a calm of at least five minutes."""
    down = hpas(docs)["runtime-worker"]["spec"]["behavior"]["scaleDown"]
    grace = deployments(docs)["runtime-worker"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert down["stabilizationWindowSeconds"] >= 300
    for policy in down["policies"]:
        assert policy["type"] == "Pods" and policy["value"] == 1
        assert policy["periodSeconds"] >= grace


def test_every_multi_replica_deployment_has_a_disruption_budget_that_lets_drains_through(
    docs: list[dict[str, Any]],
) -> None:
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    multi = [n for n in deployments(docs) if min_replicas(docs, n) > 1]
    assert set(multi) == {"api-gateway", "job-service", "credential-service", "runtime-worker"}
    for name in multi:
        labels = deployments(docs)[name]["spec"]["template"]["metadata"]["labels"]
        mine = [
            b
            for b in budgets
            if b["metadata"]["namespace"] == NAMESPACE
            and selector_matches(b["spec"]["selector"], labels)
        ]
        assert len(mine) == 1, name
        spec = mine[0]["spec"]
        replicas = min_replicas(docs, name)
        if "minAvailable" in spec:
            assert 1 <= int(spec["minAvailable"]) < replicas, name
        else:
            assert 1 <= int(spec["maxUnavailable"]) < replicas, name
        assert spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow", name


# ---------------------------------------------------------------- metrics ports


@pytest.mark.parametrize(
    ("deployment", "default_port"),
    [
        ("job-service", JobServiceSettings.model_fields["JOB_SERVICE_METRICS_PORT"].default),
        (
            "credential-service",
            CredentialSettings.model_fields["CREDENTIAL_SERVICE_METRICS_PORT"].default,
        ),
        ("runtime-worker", WorkerSettings.model_fields["WORKER_METRICS_PORT"].default),
        ("api-gateway", 3000),
    ],
)
def test_pods_announce_the_metrics_port_the_service_serves(
    docs: list[dict[str, Any]], deployment: str, default_port: int
) -> None:
    template = deployments(docs)[deployment]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == default_port
    container = template["spec"]["containers"][0]
    ports = {p["containerPort"]: p.get("name") for p in container["ports"]}
    assert default_port in ports
    if deployment != "api-gateway":  # the gateway serves /metrics on its http port
        assert ports[default_port] == "metrics"
