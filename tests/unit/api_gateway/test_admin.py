"""Admin routes, runtime aggregation and the console (reference §3.1)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from airuntime_common.grpc_server import GrpcServer
from airuntime_common.timeutil import to_timestamp
from api_gateway.app import create_app
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import ADMIN, OWNER, T0, Backends, bearer, make_token, settings, start_worker

A = bearer(make_token(ADMIN, "admin", exp_in=86400))  # made at import: outlives the suite


async def test_admin_create_with_overrides(client: httpx.AsyncClient, backends: Backends) -> None:
    body = {
        "userId": "u9",
        "jobType": "flashcard_generation",
        "targetType": "material",
        "targetId": "m1",
        "params": {"count": 12},
        "apiKeyMode": "user_deepseek_key",
        "priority": 2,
        "maxRetryCount": 0,
        "timeoutSeconds": 3600,
    }
    resp = await client.post("/admin/ai/jobs", json=body, headers={**A, "Idempotency-Key": "ik"})
    assert resp.status_code == 201
    req = backends.job.last("CreateJob").request
    assert (req.user_id, req.priority, req.max_retry_count, req.timeout_seconds) == (
        "u9",
        2,
        0,
        3600,
    )
    assert req.actor == "admin:admin1"
    assert req.params["count"] == 12
    assert req.idempotency_key == "ik"
    assert not req.HasField("plan")


@pytest.mark.parametrize(
    "override",
    [
        {"maxRetryCount": 11},
        {"maxRetryCount": -1},
        {"timeoutSeconds": 9},
        {"timeoutSeconds": 3601},
        {"priority": -1},
        {"userId": ""},
    ],
)
async def test_admin_create_bounds(
    client: httpx.AsyncClient, backends: Backends, override: dict[str, object]
) -> None:
    body = {"userId": "u9", "jobType": "learning_state_analysis", "targetType": "user", **override}
    resp = await client.post("/admin/ai/jobs", json=body, headers=A)
    assert resp.status_code == 400
    assert resp.json()["details"]["fields"][0]["field"] == next(iter(override))
    assert not backends.job.calls


async def test_admin_user_target_defaults_to_user_id(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    body = {"userId": "u9", "jobType": "learning_state_analysis", "targetType": "user"}
    assert (await client.post("/admin/ai/jobs", json=body, headers=A)).status_code == 201
    assert backends.job.last("CreateJob").request.target_id == "u9"
    mismatch = await client.post("/admin/ai/jobs", json={**body, "targetId": "u8"}, headers=A)
    assert mismatch.status_code == 404


async def test_admin_job_view_has_events_and_invocations(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.get("/admin/ai/jobs/job-1", headers=A)
    body = resp.json()
    assert backends.job.last("GetJob").request.include_history is True
    assert not backends.job.last("GetJob").request.HasField("user_id")
    assert [(e["fromStatus"], e["toStatus"]) for e in body["events"]] == [
        (None, "pending"),
        ("pending", "locked"),
    ]
    assert body["events"][0]["at"] == "2026-11-30T12:00:00.123Z"
    # the provider a lease grant gave the attempt, on its locked event only (reference §9.4)
    assert [e["modelProvider"] for e in body["events"]] == [None, "deepseek"]
    inv = body["invocations"][0]
    assert inv["costUsd"] == pytest.approx(0.0012)
    assert inv["credentialId"] is None and inv["apiKeyMode"] == "platform_key"
    assert body["jobId"] == "job-1" and body["status"] == "running"


async def test_admin_list_filters(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.get(
        "/admin/ai/jobs?status=failed&jobType=quiz_generation&userId=u3&pageSize=100", headers=A
    )
    assert resp.status_code == 200
    req = backends.job.last("ListJobs").request
    assert (req.user_id, req.status, req.job_type, req.page_size) == (
        "u3",
        common_pb2.JOB_STATUS_FAILED,
        common_pb2.JOB_TYPE_QUIZ_GENERATION,
        100,
    )
    await client.get("/admin/ai/jobs", headers=A)
    assert not backends.job.last("ListJobs").request.HasField("user_id")


async def test_rerun_and_cancel(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.post(
        "/admin/ai/jobs/job-1/rerun", json={"rebuildSnapshot": True}, headers=A
    )
    assert resp.status_code == 201
    assert resp.json()["retriedFromJobId"] == "job-1"
    assert backends.job.last("RerunJob").request.rebuild_snapshot is True
    no_body = await client.post("/admin/ai/jobs/job-1/rerun", headers=A)
    assert no_body.status_code == 201
    assert backends.job.last("RerunJob").request.rebuild_snapshot is False
    cancel = await client.post("/admin/ai/jobs/job-1/cancel", headers=A)
    assert cancel.status_code == 200
    assert not backends.job.last("CancelJob").request.HasField("user_id")


async def test_costs(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.get(
        "/admin/ai/costs?from=2026-11-01&to=2026-11-30&groupBy=modelName", headers=A
    )
    assert resp.json() == {
        "rows": [
            {
                "key": "2026-11-30",
                "calls": 2,
                "promptTokens": 100,
                "completionTokens": 0,
                "cacheHitTokens": 0,
                "costUsd": 0.25,
            }
        ]
    }
    req = backends.job.last("GetCosts").request
    assert (req.from_date, req.to_date, req.group_by) == ("2026-11-01", "2026-11-30", "modelName")
    for bad in (
        "from=2026-11-31",
        "from=2026-12-02&to=2026-12-01",
        "groupBy=user",
        "from=yesterday",
        "to=0",
        "from=1700000000",
    ):
        r = await client.get(f"/admin/ai/costs?{bad}", headers=A)
        assert r.status_code == 400, bad


@pytest.mark.parametrize(
    ("query", "window"),
    [
        ("to=0001-01-01", ("0001-01-01", "0001-01-01")),
        ("to=0001-01-10", ("0001-01-01", "0001-01-10")),
        ("to=0001-02-15", ("0001-01-17", "0001-02-15")),
        ("from=9999-12-01&to=9999-12-31", ("9999-12-01", "9999-12-31")),
    ],
)
async def test_costs_default_window_stays_in_the_calendar(
    client: httpx.AsyncClient, backends: Backends, query: str, window: tuple[str, str]
) -> None:
    """The default 30 days before a ``to`` near year 1 start at 0001-01-01 (it was a 500:
    the date arithmetic overflowed)."""
    resp = await client.get(f"/admin/ai/costs?{query}", headers=A)
    assert resp.status_code == 200, resp.text
    req = backends.job.last("GetCosts").request
    assert (req.from_date, req.to_date) == window


async def test_breaker(client: httpx.AsyncClient, backends: Backends) -> None:
    backends.job.responses["GetCircuitBreaker"] = rr.GetCircuitBreakerResponse(
        breaker=msg.CircuitBreaker(
            state=msg.BREAKER_STATE_HALF_OPEN,
            consecutive_failures=5,
            opened_at=to_timestamp(T0),
            providers=[
                msg.ProviderBreaker(
                    name="deepseek",
                    state=msg.BREAKER_STATE_HALF_OPEN,
                    consecutive_failures=5,
                    opened_at=to_timestamp(T0),
                ),
                msg.ProviderBreaker(name="backup", state=msg.BREAKER_STATE_CLOSED),
            ],
        )
    )
    resp = await client.get("/admin/ai/circuit-breaker", headers=A)
    assert resp.json() == {
        "state": "half_open",
        "consecutiveFailures": 5,
        "openedAt": "2026-11-30T12:00:00.123Z",
        "halfOpenAt": None,
        "providers": [
            {
                "name": "deepseek",
                "state": "half_open",
                "consecutiveFailures": 5,
                "openedAt": "2026-11-30T12:00:00.123Z",
                "halfOpenAt": None,
            },
            {
                "name": "backup",
                "state": "closed",
                "consecutiveFailures": 0,
                "openedAt": None,
                "halfOpenAt": None,
            },
        ],
    }
    reset = await client.post("/admin/ai/circuit-breaker/reset", headers=A)
    assert reset.json()["state"] == "closed"
    assert not backends.job.last("ResetCircuitBreaker").request.HasField("provider")
    one = await client.post("/admin/ai/circuit-breaker/reset?provider=backup", headers=A)
    assert one.status_code == 200, one.text
    assert backends.job.last("ResetCircuitBreaker").request.provider == "backup"


async def test_costs_group_by_model_provider(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.get("/admin/ai/costs?groupBy=modelProvider", headers=A)
    assert resp.status_code == 200, resp.text
    assert backends.job.last("GetCosts").request.group_by == "modelProvider"


@pytest.fixture
async def worker() -> AsyncIterator[GrpcServer]:
    server = await start_worker("worker-live")
    yield server
    await server.stop(0)


async def test_runtime_aggregates_worker_status_best_effort(
    backends: Backends, worker: GrpcServer
) -> None:
    live_addr = f"127.0.0.1:{worker.port}"
    backends.job.responses["GetRuntimeHealth"] = rr.GetRuntimeHealthResponse(
        status="SERVING",
        workers=[
            msg.RuntimeWorker(
                instance_id="worker-live",
                status="alive",
                status_address=live_addr,
                capabilities=[common_pb2.JOB_TYPE_QUIZ_GENERATION],
            ),
            msg.RuntimeWorker(
                instance_id="worker-dead", status="stale", status_address="127.0.0.1:1"
            ),
            msg.RuntimeWorker(instance_id="worker-silent", status="alive"),
        ],
    )
    app = create_app(
        settings(
            RUNTIME_WORKER_ADDRS=f"{live_addr}, 127.0.0.1:2", WORKER_STATUS_TIMEOUT_SECONDS=0.5
        ),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        resp = await c.get("/admin/ai/runtime", headers=A)
    await app.state.backends.aclose()
    assert resp.status_code == 200
    body = resp.json()
    live, dead, silent = body["workers"]
    assert live["live"]["instanceId"] == "worker-live"
    assert live["live"]["counters"] == {"succeeded": 4}
    assert live["liveError"] is None
    assert dead["live"] is None and dead["liveError"] == "UNAVAILABLE"
    assert silent["live"] is None and silent["statusAddress"] is None
    assert [c["statusAddress"] for c in body["configuredWorkers"]] == ["127.0.0.1:2"]
    assert body["configuredWorkers"][0]["live"] is None


CONSOLE_MODULES = (
    "main.js",
    "api.js",
    "format.js",
    "charts.js",
    "jobs.js",
    "job.js",
    "overview.js",
    "prompts.js",
)


async def test_console_is_static_html_without_token(client: httpx.AsyncClient) -> None:
    resp = await client.get("/admin/console")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    html = resp.text
    assert '<script type="module" src="/admin/console/static/main.js">' in html
    texts = [html]
    for name in (*CONSOLE_MODULES, "console.css"):
        asset = await client.get(f"/admin/console/static/{name}")  # no token needed
        assert asset.status_code == 200, name
        kind = "text/css" if name.endswith(".css") else "javascript"
        assert kind in asset.headers["content-type"], (name, asset.headers["content-type"])
        texts.append(asset.text)
    code = "\n".join(texts)
    assert "sessionStorage" in code and "/admin/ai/jobs" in code and "<svg" in code
    assert "/admin/ai/throughput" in code and "includeCounts" in code and "rerun" in code
    assert "/admin/ai/prompts/" in code
    assert "http://" not in code and "https://" not in code  # no CDN, nothing remote
    assert "style=" not in code  # the CSP allows no inline style
    # every module the page imports is served
    imported = set(re.findall(r'from "\./([a-z]+\.js)"', code))
    assert imported <= set(CONSOLE_MODULES)
    assert (await client.get("/admin/console/static/nope.js")).status_code == 404


async def test_openapi_lists_request_models(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    for name in ("JobCreate", "AdminJobCreate", "PollBody", "ResultBody", "JobOut", "ErrorBody"):
        assert name in schemas
    # each enumeration is one named schema, referenced by every field that takes it
    assert schemas["JobCreate"]["properties"]["jobType"] == {"$ref": "#/components/schemas/JobType"}
    assert schemas["JobType"]["enum"][0] == "learning_state_analysis"
    assert schemas["JobStatus"]["enum"][:3] == ["pending", "locked", "running"]
    for model in ("JobOut", "JobCreate", "AdminJobCreate"):
        for field in ("jobType", "targetType", "apiKeyMode"):
            assert "#/components/schemas/" in json.dumps(schemas[model]["properties"][field])
    assert "/admin/console" not in spec["paths"]
    assert (await client.get("/docs")).status_code == 200
    assert OWNER  # fixtures imported for parity


async def test_worker_channel_cache_is_bounded(client: httpx.AsyncClient) -> None:
    from api_gateway import backends as backends_module

    cache = client.app.state.backends  # type: ignore[attr-defined]
    for i in range(backends_module.MAX_WORKER_CHANNELS + 5):
        cache.worker(f"127.0.0.1:{10000 + i}")
    assert len(cache._worker_channels) == backends_module.MAX_WORKER_CHANNELS
    assert "127.0.0.1:10000" not in cache._worker_channels
    await cache.aclose()
    assert not cache._worker_channels
