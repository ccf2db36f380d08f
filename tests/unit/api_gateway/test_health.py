"""Liveness, readiness, metrics, request ids, CORS and start-up refusal (reference §3.1, §7)."""

from __future__ import annotations

import subprocess
import sys

import grpc
import httpx
import pytest

from airuntime_common.settings import MissingSetting
from api_gateway.app import create_app
from api_gateway.settings import GatewaySettings

from .conftest import OWNER, Backends, bearer, connect, make_token, settings


async def test_healthz(client: httpx.AsyncClient) -> None:
    resp = await client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


async def test_readyz_follows_backend_health(client: httpx.AsyncClient, backends: Backends) -> None:
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"jobService": "SERVING", "credentialService": "SERVING"}
    await backends.credential_server.set_serving(False)
    not_ready = await client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["details"]["checks"]["credentialService"] == "NOT_SERVING"


async def test_metrics_count_by_route_template_and_status(backends: Backends) -> None:
    app = create_app(settings())
    gateway_backends = connect(app, backends)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        await _metrics_scenario(c)
    await gateway_backends.aclose()


async def _metrics_scenario(client: httpx.AsyncClient) -> None:
    user = bearer(make_token(OWNER, "user"))
    await client.get("/v1/ai/jobs/job-1", headers=user)
    await client.get("/v1/ai/jobs/job-2", headers=user)
    await client.get("/v1/ai/jobs/job-3")
    text = (await client.get("/metrics")).text
    assert (
        'gateway_http_requests_total{method="GET",route="/v1/ai/jobs/{jobId}",status="200"} 2.0'
        in text
    )
    assert (
        'gateway_http_requests_total{method="GET",route="/v1/ai/jobs/{jobId}",status="401"} 1.0'
        in text
    )
    assert "gateway_http_request_duration_seconds_bucket" in text
    assert "job-2" not in text  # ids never become label values


async def test_request_id_generated_and_echoed(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.get("/v1/ai/jobs", headers=bearer(make_token()))
    rid = resp.headers["X-Request-Id"]
    assert len(rid) == 32
    assert backends.job.last("ListJobs").metadata["x-request-id"] == rid
    bad = await client.get("/healthz", headers={"X-Request-Id": "bad id with spaces\t"})
    assert bad.headers["X-Request-Id"] != "bad id with spaces\t"


def test_refuses_to_start_without_secrets() -> None:
    with pytest.raises(MissingSetting, match="JWT_SECRET"):
        create_app(GatewaySettings(RUNTIME_SERVICE_TOKEN="t", JWT_SECRET=""))
    with pytest.raises(MissingSetting, match="RUNTIME_SERVICE_TOKEN"):
        create_app(GatewaySettings(RUNTIME_SERVICE_TOKEN="", JWT_SECRET="s"))


def test_module_entry_point_names_the_missing_variable() -> None:
    env = {"PATH": "/usr/bin:/bin", "RUNTIME_SERVICE_TOKEN": "t"}
    proc = subprocess.run(
        [sys.executable, "-m", "api_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode != 0
    assert "JWT_SECRET" in proc.stderr


async def test_cors_only_when_configured(backends: Backends) -> None:
    app = create_app(
        settings(CORS_ORIGINS="https://app.example"),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        pre = await c.options(
            "/v1/ai/jobs",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        other = await c.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


async def test_no_cors_by_default(client: httpx.AsyncClient) -> None:
    resp = await client.get("/healthz", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in resp.headers


async def test_lifespan_connects_and_closes(backends: Backends) -> None:
    app = create_app(
        settings(
            JOB_SERVICE_ADDR=f"127.0.0.1:{backends.job_server.port}",
            CREDENTIAL_SERVICE_ADDR=f"127.0.0.1:{backends.credential_server.port}",
        )
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c,
    ):
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/v1/ai/jobs", headers=bearer(make_token()))).status_code == 200
