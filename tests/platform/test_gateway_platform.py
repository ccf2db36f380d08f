"""Platform protection and observability through the public REST API (reference §3.1, §4, §6).

The gateway app, job_service and credential_service run in-process on SQLite
(the contract suite's stack): cost rollups checked to the cent-fraction,
breaker and quota refusals as HTTP answers, the request id followed from
``X-Request-Id`` into job_service's and credential_service's JSON log lines,
and the Prometheus metrics every service exposes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import jwt
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy import update

from airuntime_common.logs import JsonFormatter, RedactionFilter
from job_service.store.tables import invocations
from tests.contract.conftest import (
    JWT_SECRET,
    TOKEN,
    RuntimeStack,
    Templates,
    make_templates,
    start_stack,
    stop_stack,
)

PRICES = {
    "deepseek-chat": {"cacheHitInput": 0.07, "cacheMissInput": 0.27, "output": 1.1},
    "deepseek-reasoner": {"cacheHitInput": 0.14, "cacheMissInput": 0.55, "output": 2.19},
}
USER_KEY = "sk-user-secret-key-987654321"


def bearer(sub: str, role: str = "user", **claims: Any) -> dict[str, str]:
    """A bearer header valid for a day: ADMIN is made at import, and the whole suite
    can run for more than the ten minutes these tokens once had."""
    payload = {"sub": sub, "role": role, "exp": int(time.time()) + 86400, **claims}
    return {"Authorization": f"Bearer {jwt.encode(payload, JWT_SECRET, algorithm='HS256')}"}


ADMIN = bearer("root", "admin")


def shim(instance: str, request_id: str | None = None) -> dict[str, str]:
    headers = {"x-internal-api-key": TOKEN, "X-Runtime-Instance-Id": instance}
    if request_id:
        headers["X-Request-Id"] = request_id
    return headers


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    import asyncio

    return asyncio.run(make_templates(tmp_path_factory.mktemp("platform-templates")))


@pytest.fixture
async def stack(
    request: pytest.FixtureRequest, templates: Templates, tmp_path: Path
) -> AsyncIterator[RuntimeStack]:
    marker = request.node.get_closest_marker("stack_settings")
    overrides = dict(marker.kwargs) if marker else {}
    started = await start_stack(
        tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}", templates, **overrides
    )
    try:
        yield started
    finally:
        await stop_stack(started)


async def create(stack: RuntimeStack, user: str, mode: str = "platform_key", **headers: str) -> Any:
    return await stack.http.post(
        "/v1/ai/jobs",
        json={
            "jobType": "learning_state_analysis",
            "targetType": "user",
            "targetId": user,
            "apiKeyMode": mode,
        },
        headers={
            **bearer(user, **({"plan": headers.pop("plan")} if "plan" in headers else {})),
            **headers,
        },
    )


async def claim_and_fail(stack: RuntimeStack, code: str, instance: str = "w1") -> dict[str, Any]:
    got = await stack.http.post(
        "/internal/runtime/jobs/claim",
        json={"capabilities": ["learning_state_analysis"], "limit": 1},
        headers=shim(instance),
    )
    [job] = got.json()["jobs"]
    failed = await stack.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/fail",
        json={"attemptNo": job["attemptNo"], "errorCode": code, "errorMessage": "x"},
        headers=shim(instance),
    )
    assert failed.status_code == 200, failed.text
    return dict(job)


# ---------------------------------------------------------------------- costs


@pytest.mark.stack_settings(MODEL_PRICES=PRICES)
async def test_cost_rollups_exact(stack: RuntimeStack) -> None:
    domain = stack.jobs.domain
    a = await stack.create(job_type="learning_state_analysis")
    await stack.put_key(USER_KEY)
    b = await stack.create(job_type="weak_point_analysis", api_key_mode="user_deepseek_key")
    got = await stack.http.post(  # the calls below are of each job's first attempt
        "/internal/runtime/jobs/claim",
        json={"capabilities": ["learning_state_analysis", "weak_point_analysis"], "limit": 2},
        headers=shim("w1"),
    )
    assert len(got.json()["jobs"]) == 2, got.text
    # (job, model, mode, prompt, completion, cache hit, day)
    calls = [
        (a, "deepseek-chat", "platform_key", 1_000_000, 200_000, 400_000, "2026-11-01"),
        (a, "deepseek-chat", "platform_key", 12_345, 6_789, 1_000, "2026-11-01"),
        (a, "deepseek-reasoner", "platform_key", 50_000, 70_000, 0, "2026-11-02"),
        (b, "deepseek-chat", "user_deepseek_key", 3_000, 500, 3_000, "2026-11-03"),
        (b, "deepseek-chat", "user_deepseek_key", 999, 1, 0, "2026-11-04"),  # outside the range
        (b, "mystery-model", "user_deepseek_key", 10_000, 10_000, 0, "2026-11-02"),  # no price
    ]

    def cost(model: str, prompt: int, completion: int, hit: int) -> Decimal:
        p = PRICES.get(model)
        if p is None:
            return Decimal(0)
        total = (
            Decimal(str(p["cacheHitInput"])) * hit
            + Decimal(str(p["cacheMissInput"])) * (prompt - hit)
            + Decimal(str(p["output"])) * completion
        ) / 1_000_000
        return total.quantize(Decimal("0.00000001"))

    for job, model, mode, prompt, completion, hit, day in calls:
        log_id = await domain.record_invocation(
            job_id=job["jobId"],
            attempt_no=1,
            model_provider="deepseek",
            model_name=model,
            api_key_mode=mode,
            credential_id=None,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cache_hit_tokens=hit,
            latency_ms=10,
            outcome="succeeded",
            error_code=None,
            provider_request_id=None,
        )
        async with domain.sessions() as session, session.begin():
            await session.execute(
                update(invocations)
                .where(invocations.c.id == log_id)
                .values(created_at=datetime.fromisoformat(f"{day} 23:59:59.999000"))
            )

    def expected(key_of: Any) -> list[dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for job, model, mode, prompt, completion, hit, day in calls:
            if day > "2026-11-03":
                continue
            key = key_of(job, model, mode, day)
            row = rows.setdefault(
                key,
                {
                    "key": key,
                    "calls": 0,
                    "promptTokens": 0,
                    "completionTokens": 0,
                    "cacheHitTokens": 0,
                    "costUsd": Decimal(0),
                },
            )
            row["calls"] += 1
            row["promptTokens"] += prompt
            row["completionTokens"] += completion
            row["cacheHitTokens"] += hit
            row["costUsd"] += cost(model, prompt, completion, hit)
        return [{**r, "costUsd": float(r["costUsd"])} for _, r in sorted(rows.items())]

    keys = {
        "day": lambda job, model, mode, day: day,
        "jobType": lambda job, model, mode, day: job["jobType"],
        "modelName": lambda job, model, mode, day: model,
        "apiKeyMode": lambda job, model, mode, day: mode,
    }
    for group_by, key_of in keys.items():
        got = await stack.http.get(
            "/admin/ai/costs",
            params={"from": "2026-11-01", "to": "2026-11-03", "groupBy": group_by},
            headers=ADMIN,
        )
        assert got.status_code == 200, got.text
        rows = got.json()["rows"]
        assert rows == expected(key_of), group_by
        assert all(isinstance(r["costUsd"], float) for r in rows)  # a JSON number
    # The first day alone, by hand: 0.07×0.4 + 0.27×0.6 + 1.1×0.2 and the small call.
    got = await stack.http.get(
        "/admin/ai/costs",
        params={"from": "2026-11-01", "to": "2026-11-01", "groupBy": "day"},
        headers=ADMIN,
    )
    small = Decimal("0.07") * 1_000 + Decimal("0.27") * 11_345 + Decimal("1.1") * 6_789
    first = Decimal("0.028") + Decimal("0.162") + Decimal("0.22") + small / 1_000_000
    assert got.json()["rows"][0]["costUsd"] == float(first.quantize(Decimal("0.00000001")))
    bad = await stack.http.get(
        "/admin/ai/costs",
        params={"from": "2026-11-01", "to": "2026-11-03", "groupBy": "userId"},
        headers=ADMIN,
    )
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_ARGUMENT"


# ------------------------------------------------------------ breaker, quota


@pytest.mark.stack_settings(BREAKER_FAILURE_THRESHOLD=2, MAX_RETRY_COUNT=0, USER_DAILY_JOB_QUOTA=0)
async def test_breaker_over_rest(stack: RuntimeStack) -> None:
    assert (await create(stack, "u1")).status_code == 201
    first = await claim_and_fail(stack, "MODEL_BAD_REQUEST")  # neutral
    assert (await create(stack, "u1")).status_code == 201
    await claim_and_fail(stack, "MODEL_TIMEOUT")
    assert (await create(stack, "u1")).status_code == 201
    await claim_and_fail(stack, "NETWORK_ERROR")
    refused = await create(stack, "u1")
    assert refused.status_code == 503 and refused.json()["code"] == "PLATFORM_CIRCUIT_OPEN"
    rerun = await stack.http.post(
        f"/admin/ai/jobs/{first['jobId']}/rerun", json={"rebuildSnapshot": False}, headers=ADMIN
    )
    assert rerun.status_code == 503 and rerun.json()["code"] == "PLATFORM_CIRCUIT_OPEN"
    view = (await stack.http.get("/admin/ai/circuit-breaker", headers=ADMIN)).json()
    assert view["state"] == "open" and view["consecutiveFailures"] == 2
    assert view["openedAt"].endswith("Z") and view["halfOpenAt"] is None
    # User-key jobs are not affected.
    put = await stack.http.put(
        "/v1/me/model-credential",
        json={"provider": "deepseek", "apiKey": USER_KEY},
        headers=bearer("u1"),
    )
    assert put.status_code == 200
    assert (await create(stack, "u1", "user_deepseek_key")).status_code == 201
    # reference §9.4: the same fields, and every provider's breaker (here the default one)
    assert [(p["name"], p["state"], p["consecutiveFailures"]) for p in view["providers"]] == [
        ("deepseek", "open", 2)
    ]
    unknown = await stack.http.post("/admin/ai/circuit-breaker/reset?provider=nope", headers=ADMIN)
    assert unknown.status_code == 400 and unknown.json()["code"] == "INVALID_ARGUMENT"
    assert unknown.json()["details"]["field"] == "provider"
    still = (await stack.http.get("/admin/ai/circuit-breaker", headers=ADMIN)).json()
    assert still["state"] == "open"  # a refused reset changes nothing
    reset = await stack.http.post("/admin/ai/circuit-breaker/reset", headers=ADMIN)
    closed = {"state": "closed", "consecutiveFailures": 0, "openedAt": None, "halfOpenAt": None}
    assert reset.json() == {**closed, "providers": [{"name": "deepseek", **closed}]}
    assert (await create(stack, "u1")).status_code == 201


@pytest.mark.stack_settings(USER_DAILY_JOB_QUOTA=2, PLAN_DAILY_JOB_QUOTAS={"pro": 3})
async def test_quota_over_rest_by_plan(stack: RuntimeStack) -> None:
    for _ in range(2):
        assert (await create(stack, "u1")).status_code == 201
    over = await create(stack, "u1")
    assert over.status_code == 429 and over.json()["code"] == "QUOTA_EXCEEDED"
    assert (await create(stack, "u1", plan="pro")).status_code == 201
    assert (await create(stack, "u1", plan="pro")).status_code == 429


async def test_unknown_ids_of_any_length_in_bodies_are_404(stack: RuntimeStack) -> None:
    """reference §3: "Ids are opaque strings: any unknown id → 404 ... never 400", in a body
    too, whatever its length (no stored id is that long, so none can be found)."""
    user = bearer("u1")
    made = await stack.http.post(
        "/v1/materials", json={"title": "T", "content": "One. Two."}, headers=user
    )
    assert made.status_code == 201, made.text
    block = made.json()["blocks"][0]["blockId"]
    for long_id in ("x" * 65, "x" * 129, "x" * 5000):
        reading = {"eventId": "e1", "type": "reading"}
        quiz = {"eventId": "e1", "type": "quiz_attempt", "correct": True}
        cases = [
            ("/v1/knowledge-points", {"materialId": long_id, "name": "n", "blockIds": [block]}),
            ("/v1/learning-events", {"events": [{**reading, "blockId": long_id}]}),
            ("/v1/learning-events", {"events": [{**reading, "materialId": long_id}]}),
            ("/v1/learning-events", {"events": [{**quiz, "knowledgePointId": long_id}]}),
            (
                "/v1/ai/jobs",
                {"jobType": "quiz_generation", "targetType": "material", "targetId": long_id},
            ),
        ]
        for path, body in cases:
            got = await stack.http.post(path, json=body, headers=user)
            assert (got.status_code, got.json()["code"]) == (404, "NOT_FOUND"), (path, got.text)


# -------------------------------------------------------------- observability


class Captured(logging.Handler):
    """Formats every record as the services do (JSON line, redacted) and keeps the lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter("test"))
        self.addFilter(RedactionFilter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.lines:
            assert "\n" not in line
            out.append(json.loads(line))  # one JSON object per line
        return out


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def lines_of(captured: Captured, service: str, msg: str) -> list[dict[str, Any]]:
    return [r for r in captured.records() if r["logger"].startswith(service) and r["msg"] == msg]


async def test_request_id_reaches_job_and_credential_logs(
    stack: RuntimeStack, captured: Captured
) -> None:
    put = await stack.http.put(
        "/v1/me/model-credential",
        json={"provider": "deepseek", "apiKey": USER_KEY},
        headers={**bearer("u1"), "X-Request-Id": "req-put-1"},
    )
    assert put.status_code == 200 and put.headers["x-request-id"] == "req-put-1"
    [stored] = lines_of(captured, "credential_service", "credential stored")
    assert stored["requestId"] == "req-put-1"

    made = await create(stack, "u1", "user_deepseek_key", **{"X-Request-Id": "req-create-7"})
    assert made.status_code == 201 and made.headers["x-request-id"] == "req-create-7"
    job_id = made.json()["jobId"]
    [created] = lines_of(captured, "job_service", "job created")
    assert created["requestId"] == "req-create-7" and created["jobId"] == job_id
    [checked] = lines_of(captured, "credential_service", "credential checked")
    assert checked["requestId"] == "req-create-7"  # forwarded by job_service
    [gateway] = [
        r
        for r in captured.records()
        if r["logger"].startswith("api_gateway") and r.get("route") == "/v1/ai/jobs"
    ]
    assert gateway["requestId"] == "req-create-7" and gateway["status"] == 201

    # Runtime calls through the shim: jobId, attemptNo and runtimeInstanceId too.
    got = await stack.http.post(
        "/internal/runtime/jobs/claim",
        json={"capabilities": ["learning_state_analysis"], "limit": 1},
        headers=shim("worker-9", "req-claim-3"),
    )
    [job] = got.json()["jobs"]
    resolved = await stack.http.post(
        "/internal/runtime/model-credentials/resolve",
        json={"jobId": job_id, "attemptNo": job["attemptNo"]},
        headers=shim("worker-9", "req-resolve-4"),
    )
    assert resolved.status_code == 200 and resolved.json()["apiKey"] == USER_KEY
    failed = await stack.http.post(
        f"/internal/runtime/jobs/{job_id}/fail",
        json={"attemptNo": 1, "errorCode": "INVALID_SCHEMA", "errorMessage": "bad"},
        headers=shim("worker-9", "req-fail-5"),
    )
    assert failed.status_code == 200
    [ended] = lines_of(captured, "job_service", "attempt failed")
    assert ended["requestId"] == "req-fail-5"
    assert (ended["jobId"], ended["attemptNo"], ended["runtimeInstanceId"]) == (
        job_id,
        1,
        "worker-9",
    )
    resolve_lines = [
        r
        for r in captured.records()
        if r["logger"].startswith("credential_service") and r.get("requestId") == "req-resolve-4"
    ]
    assert resolve_lines and all(r.get("jobId") == job_id for r in resolve_lines)
    # No line anywhere carries the key.
    assert not [line for line in captured.lines if USER_KEY in line]


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.stack_settings(MAX_RETRY_COUNT=0)
async def test_metrics_of_every_service(stack: RuntimeStack) -> None:
    before = generate_latest(REGISTRY).decode()
    lsa = {"job_type": "learning_state_analysis"}
    made = await create(stack, "u1")
    assert made.status_code == 201
    await stack.jobs.domain.refresh_gauges()
    text = generate_latest(REGISTRY).decode()
    assert sample(text, "airt_jobs_queue_depth", state="pending", **lsa) == 1
    assert (
        sample(text, "airt_jobs_created_total", **lsa)
        == sample(before, "airt_jobs_created_total", **lsa) + 1
    )
    # Lock, start, and a late heartbeat from someone else: a lease loss.
    got = await stack.http.post(
        "/internal/runtime/jobs/claim",
        json={"capabilities": ["learning_state_analysis"], "limit": 1},
        headers=shim("w1"),
    )
    [job] = got.json()["jobs"]
    await stack.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/start", json={"attemptNo": 1}, headers=shim("w1")
    )
    stolen = await stack.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/heartbeat",
        json={"attemptNo": 1},
        headers=shim("w2"),
    )
    assert stolen.status_code == 409
    resolved = await stack.http.post(
        "/internal/runtime/model-credentials/resolve",
        json={"jobId": job["jobId"], "attemptNo": 1},
        headers=shim("w1"),
    )
    assert resolved.status_code == 200
    await stack.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/fail",
        json={"attemptNo": 1, "errorCode": "TEMPORARY_PROVIDER_ERROR", "errorMessage": "503"},
        headers=shim("w1"),
    )
    await stack.jobs.domain.refresh_gauges()
    text = generate_latest(REGISTRY).decode()
    for name, labels in [
        ("airt_jobs_finished_total", {**lsa, "outcome": "failed"}),
        ("airt_job_pickup_latency_seconds_count", lsa),
        ("airt_job_run_seconds_count", {**lsa, "outcome": "failed"}),
        ("airt_lease_losses_total", {"where": "heartbeat"}),
        ("credential_resolves_total", {"api_key_mode": "platform_key", "outcome": "ok"}),
    ]:
        assert sample(text, name, **labels) > sample(before, name, **labels), name
    assert sample(text, "airt_jobs_queue_depth", state="pending", **lsa) == 0
    assert sample(text, "airt_platform_breaker_state", state="closed") == 1
    assert sample(text, "airt_platform_breaker_consecutive_failures") == 1
    # The gateway's own registry on /metrics.
    gw = (await stack.http.get("/metrics")).text
    assert sample(gw, "gateway_http_requests_total", route="/v1/ai/jobs", status="201") >= 1
    # The worker's registry: attempts plus model latency and tokens.
    from runtime_worker import metrics as worker_metrics

    registry = CollectorRegistry()
    registry.register(worker_metrics.MODEL_LATENCY)
    registry.register(worker_metrics.MODEL_TOKENS)
    worker_metrics.observe_model_call("deepseek-chat", "platform_key", "succeeded", 1500, 7, 3, 2)
    wtext = generate_latest(registry).decode()
    assert sample(wtext, "airt_model_call_latency_seconds_count", model_name="deepseek-chat") >= 1
    assert sample(wtext, "airt_model_tokens_total", model_name="deepseek-chat", kind="prompt") >= 7
