"""The compose file, the Dockerfile and the Kubernetes manifests are valid and keep
the properties operators rely on (issue: operations). No Docker engine runs here,
so the compose file is checked against the Compose specification's JSON schema.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
APP_SERVICES = ("job_service", "credential_service", "runtime_worker", "api_gateway")
GRPC_PORTS = {"job_service": 50051, "credential_service": 50052, "runtime_worker": 50053}

#: Every variable of reference §7.
SPEC_ENV = {
    "DATABASE_URL", "CREDENTIAL_DATABASE_URL", "RUNTIME_SERVICE_TOKEN", "JWT_SECRET", "JWT_ISSUER",
    "CREDENTIAL_ENCRYPTION_KEYS", "DEEPSEEK_API_KEY", "DEEPSEEK_BASE_URL", "LOCK_LEASE_SECONDS",
    "REAPER_INTERVAL_SECONDS", "POLL_INTERVAL_MS", "WORKER_CONCURRENCY", "HEARTBEAT_INTERVAL_SECONDS",
    "RETRY_BACKOFF_BASE_SECONDS", "RETRY_BACKOFF_MAX_SECONDS", "MAX_RETRY_COUNT", "JOB_TIMEOUT_SECONDS",
    "JOB_SERVICE_ADDR", "CREDENTIAL_SERVICE_ADDR", "RUNTIME_WORKER_ADDR", "BREAKER_FAILURE_THRESHOLD",
    "BREAKER_COOLDOWN_SECONDS", "BREAKER_HALF_OPEN_PROBES", "PLATFORM_DAILY_BUDGET_USD",
    "USER_DAILY_JOB_QUOTA", "PLAN_DAILY_JOB_QUOTAS", "MODEL_PRICES",
}  # fmt: skip
#: Variables reference §9 adds (the second release).
SPEC_ENV_9 = {"CORS_ORIGINS", "JWT_LEEWAY_SECONDS"}
SECRETS = {"RUNTIME_SERVICE_TOKEN", "JWT_SECRET", "CREDENTIAL_ENCRYPTION_KEYS", "DEEPSEEK_API_KEY"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def env_example() -> dict[str, str]:
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value
    return out


def test_compose_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    schema_text = (
        resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    ).read_text()
    jsonschema.validate(compose, json.loads(schema_text))


def test_compose_rejects_a_broken_file_too() -> None:
    """The schema check is real: a misspelt key is refused."""
    schema = json.loads(
        (
            resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
        ).read_text()
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"services": {"x": {"imagee": "y"}}}, schema)


def test_only_the_gateway_publishes_a_port(compose: dict[str, Any]) -> None:
    published = {name for name, svc in compose["services"].items() if svc.get("ports")}
    assert published == {"api_gateway"}
    assert compose["services"]["api_gateway"]["ports"] == ["3000:3000"]


def test_every_service_has_a_health_check(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "healthcheck" in services["mysql"]
    for name, port in GRPC_PORTS.items():
        test = services[name]["healthcheck"]["test"]
        assert test[-3:] == ["airuntime_common.healthcheck", "grpc", f"localhost:{port}"], name
    assert "/healthz" in services["api_gateway"]["healthcheck"]["test"][-1]


def test_services_sit_on_the_internal_network(compose: dict[str, Any]) -> None:
    assert compose["networks"]["internal"]["internal"] is True
    for name in APP_SERVICES:
        assert "internal" in compose["services"][name]["networks"], name
    # Only the gateway is reachable from outside, only the worker reaches out.
    assert "public" in compose["services"]["api_gateway"]["networks"]
    assert "egress" in compose["services"]["runtime_worker"]["networks"]
    for name in ("job_service", "credential_service", "mysql"):
        assert compose["services"][name]["networks"] == ["internal"], name


def test_migrations_run_before_the_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "migrate" in " ".join(services["migrate"]["command"])
    for name in ("job_service", "credential_service"):
        assert (
            services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )


def test_the_worker_scales(compose: dict[str, Any]) -> None:
    worker = compose["services"]["runtime_worker"]
    assert "container_name" not in worker and "ports" not in worker


def test_secrets_come_from_env_file_and_names_match_the_spec(compose: dict[str, Any]) -> None:
    for name in APP_SERVICES:
        assert compose["services"][name]["env_file"] == ".env"
        for key in compose["services"][name].get("environment", {}):
            assert key in SPEC_ENV or key.endswith("_LISTEN") or key == "GATEWAY_PORT", key
    example = env_example()
    compose_only = {k for k in example if k.startswith("MYSQL_")}
    assert set(example) - compose_only <= SPEC_ENV | SPEC_ENV_9
    assert set(example) >= SECRETS
    # Every reference §7 variable is either in .env.example or set per service in the compose file.
    set_in_compose = {k for s in compose["services"].values() for k in s.get("environment", {})}
    missing = SPEC_ENV - set(example) - set_in_compose - {"MODEL_PRICES", "RUNTIME_WORKER_ADDR"}
    assert not missing


def test_dockerfile_is_multi_stage_non_root_and_builds_stubs() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    assert re.search(r"^USER app$", text, re.M)
    assert "gen_protos.py" in text
    assert ".[dev]" not in text
    runtime_stage = text.split("AS runtime", 1)[1]
    assert "grpcio-tools" not in runtime_stage


def test_the_model_stand_in_is_a_dev_tool_outside_the_image() -> None:
    """The stand-in (``model_standin/``) serves tests, the demo and the dev launcher:
    no service imports it and the production image copies only the services."""
    services = ("airuntime_common", "api_gateway", "job_service", "credential_service",
                "runtime_worker")  # fmt: skip
    for service in services:
        for path in (ROOT / service).rglob("*.py"):
            assert "model_standin" not in path.read_text(), path
    copied = re.findall(r"^COPY (?!--from)(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert "model_standin" not in " ".join(copied)
    assert {"job_service", "runtime_worker"} <= {c.rstrip("/") for c in copied}


def test_kubernetes_manifests_validate() -> None:
    files = sorted(str(p) for p in (ROOT / "deploy" / "k8s").glob("*.yaml"))
    proc = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", *files],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kubernetes_has_probes_and_a_service_per_grpc_server() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/ai-runtime.yaml").read_text()) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for name, port in (
        ("job-service", 50051),
        ("credential-service", 50052),
        ("runtime-worker", 50053),
    ):
        container = deployments[name]["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["grpc"]["port"] == port
        assert container["livenessProbe"]["grpc"]["port"] == port
        assert services[name]["spec"]["ports"][0]["port"] == port
    gateway = deployments["api-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
