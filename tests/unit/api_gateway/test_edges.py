"""The gateway's edges (reference §9.3) and a newcomer's rough edges, over the real app.

503 ``UNAVAILABLE`` for a backend that is down or slow, ``Retry-After`` on every
429 and 503, 405 ``METHOD_NOT_ALLOWED`` with ``Allow`` on every path, no redirect
for a trailing slash, a clear word for a body that is not sent as JSON or is
not JSON, and error answers that echo at most 128 characters of an id.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from airuntime_common.errors import TRANSPORT, AppError, ErrorCode
from api_gateway.app import create_app
from api_gateway.retry_after import retry_after_seconds, seconds_until_next_utc_midnight

from .conftest import (
    ADMIN,
    OWNER,
    Backends,
    bearer,
    connect,
    make_token,
    runtime_headers,
    settings,
)

USER = bearer(make_token(OWNER, "user", exp_in=86400))  # made at import: outlives the suite
ADMIN_H = bearer(make_token(ADMIN, "admin", exp_in=86400))
CREATE = {"jobType": "learning_state_analysis", "targetType": "user"}


def _midnight_bounds(before: datetime, after: datetime) -> tuple[int, int]:
    """The Retry-After a quota refusal may carry when answered between the two times."""
    return seconds_until_next_utc_midnight(after), seconds_until_next_utc_midnight(before)


# ---------------------------------------------------------------- 503 UNAVAILABLE


@pytest.fixture
async def down_job_service(backends: Backends) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway whose job_service is not listening; credential_service is the fake."""
    job = grpc.aio.insecure_channel("127.0.0.1:1")
    cred = grpc.aio.insecure_channel(f"127.0.0.1:{backends.credential_server.port}")
    app = create_app(settings(GRPC_TIMEOUT_SECONDS=2.0), job_channel=job, credential_channel=cred)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as c:
        yield c
    await job.close()
    await cred.close()


async def test_a_backend_that_is_down_is_503_with_retry_after(
    down_job_service: httpx.AsyncClient, backends: Backends
) -> None:
    """reference §9.3: gRPC UNAVAILABLE → 503 ``UNAVAILABLE``, ``Retry-After`` a few seconds;
    the other backend's routes keep working."""
    for method, path, body, headers in (
        ("GET", "/v1/ai/jobs", None, USER),
        ("POST", "/v1/ai/jobs", CREATE, USER),
        ("GET", "/admin/ai/circuit-breaker", None, ADMIN_H),
        ("POST", "/internal/runtime/jobs/poll", {"capabilities": ["quiz_generation"]}, None),
    ):
        resp = await down_job_service.request(
            method, path, json=body, headers=headers or runtime_headers()
        )
        assert resp.status_code == 503, (path, resp.text)
        assert resp.json()["code"] == "UNAVAILABLE"
        assert resp.json()["message"] == "a backend service is unavailable; try again shortly"
        assert resp.headers["Retry-After"] == "5"
    key = await down_job_service.get("/v1/me/model-credential", headers=USER)
    assert key.status_code == 200, key.text
    assert [c.method for c in backends.credential.calls] == ["GetCredential"]


async def test_credential_service_down_is_503_too(backends: Backends) -> None:
    await backends.credential_server.stop(0)
    app = create_app(settings())
    gateway_backends = connect(app, backends)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            resp = await c.put(
                "/v1/me/model-credential",
                json={"provider": "deepseek", "apiKey": "sk-abcdefgh12345678"},
                headers=USER,
            )
            assert resp.status_code == 503, resp.text
            assert (resp.json()["code"], resp.headers["Retry-After"]) == ("UNAVAILABLE", "5")
            assert "sk-abcdefgh" not in resp.text
            jobs = await c.get("/v1/ai/jobs", headers=USER)
            assert jobs.status_code == 200
            # readiness keeps its meaning: not ready while a backend is down
            ready = await c.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["details"]["checks"]["jobService"] == "SERVING"
            assert ready.json()["details"]["checks"]["credentialService"].startswith("UNREACHABLE")
            assert ready.headers["Retry-After"] == "5"
    finally:
        await gateway_backends.aclose()


async def test_a_backend_that_times_out_is_503(backends: Backends) -> None:
    """gRPC DEADLINE_EXCEEDED (a backend slower than ``GRPC_TIMEOUT_SECONDS``) → 503."""
    backends.job.delays["GetJob"] = 2.0
    app = create_app(settings(GRPC_TIMEOUT_SECONDS=0.3))
    gateway_backends = connect(app, backends)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            resp = await c.get("/v1/ai/jobs/job-1", headers=USER)
            assert resp.status_code == 503, resp.text
            body = resp.json()
            assert body["code"] == "UNAVAILABLE"
            assert body["message"] == "a backend service did not answer in time; try again shortly"
            assert resp.headers["Retry-After"] == "5"
            assert (await c.get("/v1/ai/jobs", headers=USER)).status_code == 200
    finally:
        await gateway_backends.aclose()


async def test_readyz_is_200_when_both_serve(client: httpx.AsyncClient) -> None:
    resp = await client.get("/readyz")
    assert resp.status_code == 200 and "retry-after" not in resp.headers


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("code", ["QUOTA_EXCEEDED", "PLATFORM_BUDGET_EXCEEDED"])
async def test_quota_and_budget_wait_until_the_next_utc_midnight(
    client: httpx.AsyncClient, backends: Backends, code: str
) -> None:
    backends.job.errors["CreateJob"] = AppError(code, "no more today", {"quota": 2, "used": 2})
    before = datetime.now(UTC)
    resp = await client.post("/v1/ai/jobs", json=CREATE, headers=USER)
    after = datetime.now(UTC)
    assert (resp.status_code, resp.json()["code"]) == (429, code)
    low, high = _midnight_bounds(before, after)
    assert low <= int(resp.headers["Retry-After"]) <= high


@pytest.mark.parametrize(
    ("details", "expected"),
    [
        ({"state": "open", "retryAfterSeconds": 17.2}, "18"),  # rounded up
        ({"state": "open", "retryAfterSeconds": 0}, "0"),
        ({"state": "open", "retryAfterSeconds": 10**9}, "86400"),  # at most a day
        ({"state": "open"}, "60"),  # no hint: the default cool-down
        ({"retryAfterSeconds": -3}, "60"),
        ({"retryAfterSeconds": "7"}, "60"),
        ({"retryAfterSeconds": True}, "60"),
        ({"retryAfterSeconds": None}, "60"),
        (None, "60"),
    ],
)
async def test_an_open_breaker_waits_for_its_half_open(
    client: httpx.AsyncClient,
    backends: Backends,
    details: dict[str, Any] | None,
    expected: str,
) -> None:
    """``details.retryAfterSeconds`` (seconds until half-open, from job_service) when it
    is a number ≥ 0, else 60; on the admin re-run as on the create."""
    err = AppError(ErrorCode.PLATFORM_CIRCUIT_OPEN, "the platform key is failing", details)
    backends.job.errors["CreateJob"] = err
    backends.job.errors["RerunJob"] = err
    for resp in (
        await client.post("/v1/ai/jobs", json=CREATE, headers=USER),
        await client.post("/admin/ai/jobs/job-1/rerun", json={}, headers=ADMIN_H),
    ):
        assert (resp.status_code, resp.json()["code"]) == (503, "PLATFORM_CIRCUIT_OPEN")
        assert resp.headers["Retry-After"] == expected


async def test_a_nan_hint_falls_back(client: httpx.AsyncClient, backends: Backends) -> None:
    """JSON ``NaN`` parses in Python; it is no number of seconds."""
    backends.job.errors["CreateJob"] = AppError(
        ErrorCode.PLATFORM_CIRCUIT_OPEN, "open", {"retryAfterSeconds": math.nan}
    )
    resp = await client.post("/v1/ai/jobs", json=CREATE, headers=USER)
    assert resp.headers["Retry-After"] == "60"


@pytest.mark.parametrize(
    "code", sorted(c for c, (status, _) in TRANSPORT.items() if status in (429, 503))
)
async def test_every_429_and_503_code_carries_retry_after(
    client: httpx.AsyncClient, backends: Backends, code: str
) -> None:
    """Every code answered 429 or 503, ``TOO_MANY_STREAMS`` (reference §9.1) included, and
    the hint wins for any of them."""
    backends.job.errors["ListJobs"] = AppError(code, "wait", None)
    resp = await client.get("/v1/ai/jobs", headers=USER)
    assert resp.status_code == TRANSPORT[code][0]
    assert re.fullmatch(r"\d+", resp.headers["Retry-After"]), resp.headers
    backends.job.errors["ListJobs"] = AppError(code, "wait", {"retryAfterSeconds": 3})
    hinted = await client.get("/v1/ai/jobs", headers=USER)
    assert hinted.headers["Retry-After"] == "3"


async def test_no_retry_after_on_other_statuses(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.errors["ListJobs"] = AppError(
        ErrorCode.INVALID_ARGUMENT, "bad", {"retryAfterSeconds": 3}
    )
    resp = await client.get("/v1/ai/jobs", headers=USER)
    assert resp.status_code == 400 and "retry-after" not in resp.headers


async def test_any_429_or_503_leaving_a_handler_gets_the_default() -> None:
    """The mechanism is general: an answer built without an ``AppError`` (a future
    stream refusal, a plain response) still carries ``Retry-After``; one that set
    its own keeps it."""
    app = create_app(settings())

    @app.get("/probe/plain-503")
    async def plain() -> JSONResponse:
        return JSONResponse({"code": "UNAVAILABLE"}, status_code=503)

    @app.get("/probe/own-429")
    async def own() -> JSONResponse:
        return JSONResponse({}, status_code=429, headers={"Retry-After": "42"})

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        assert (await c.get("/probe/plain-503")).headers["Retry-After"] == "5"
        assert (await c.get("/probe/own-429")).headers.get_list("Retry-After") == ["42"]


@pytest.mark.parametrize(
    ("now", "seconds"),
    [
        (datetime(2026, 11, 30, 0, 0, 0, tzinfo=UTC), 86400),
        (datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC), 43200),
        (datetime(2026, 11, 30, 23, 59, 59, 200000, tzinfo=UTC), 1),
        (datetime(2026, 12, 31, 23, 0, 0, tzinfo=UTC), 3600),  # over a year's end
        (datetime(2026, 11, 30, 20, 0, 0, tzinfo=UTC).astimezone(), 4 * 3600),  # any zone
    ],
)
def test_seconds_until_the_next_utc_midnight(now: datetime, seconds: int) -> None:
    assert seconds_until_next_utc_midnight(now) == seconds
    assert retry_after_seconds("QUOTA_EXCEEDED", 429, {"quota": 1}, now=now) == seconds
    assert retry_after_seconds("QUOTA_EXCEEDED", 400, now=now) is None


def test_a_midnight_rounds_up_from_within_its_last_second() -> None:
    now = datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC)
    assert seconds_until_next_utc_midnight(now) == 1
    assert seconds_until_next_utc_midnight(now + timedelta(microseconds=1)) == 86400


# ---------------------------------------------------------------- 405 METHOD_NOT_ALLOWED

_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def _sample(template: str) -> str:
    """A concrete path for an OpenAPI path template (every parameter ``x``)."""
    return re.sub(r"\{[^}]+\}", "x", template)


def _documented(app: FastAPI) -> dict[str, set[str]]:
    return {
        template: {m.upper() for m in operations}
        for template, operations in app.openapi()["paths"].items()
    }


async def test_every_documented_path_answers_405_with_allow(client: httpx.AsyncClient) -> None:
    """reference §9.3, for every path of the document (public, admin, the shim, health):
    a method it lacks → 405 ``METHOD_NOT_ALLOWED`` with ``Allow`` listing exactly its
    methods, before any authentication."""
    app: FastAPI = client.app  # type: ignore[attr-defined]
    documented = _documented(app)
    areas = {t.split("/")[1] for t in documented}
    assert {"v1", "admin", "internal", "healthz", "readyz", "metrics"} <= areas
    for template, methods in documented.items():
        path = _sample(template)
        for method in sorted(set(_METHODS) - methods):
            resp = await client.request(method, path)
            assert resp.status_code == 405, (method, path, resp.text)
            body = resp.json()
            assert body["code"] == "METHOD_NOT_ALLOWED", body
            assert set(resp.headers["Allow"].split(", ")) == methods, (path, resp.headers)
            assert body["details"] == {"method": method, "allow": sorted(methods)}
            assert method in body["message"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/admin/console"])
async def test_pages_outside_the_document_answer_405_too(
    client: httpx.AsyncClient, path: str
) -> None:
    """``Allow`` is what the page serves: each method it lists is answered, POST is not."""
    resp = await client.post(path, json={})
    assert resp.status_code == 405, resp.text
    assert resp.json()["code"] == "METHOD_NOT_ALLOWED"
    allow = resp.headers["Allow"].split(", ")
    assert "GET" in allow and "POST" not in allow
    for method in allow:
        assert (await client.request(method, path)).status_code == 200, (method, path)


async def test_an_unknown_method_is_405_and_a_known_one_still_works(
    client: httpx.AsyncClient,
) -> None:
    odd = await client.request("PROPFIND", "/v1/ai/jobs", headers=USER)
    assert (odd.status_code, odd.headers["Allow"]) == (405, "GET, POST")
    assert (await client.get("/v1/ai/jobs", headers=USER)).status_code == 200


# ---------------------------------------------------------------- trailing slash


@pytest.mark.parametrize(
    ("method", "path", "hint"),
    [
        ("GET", "/v1/ai/jobs/", "/v1/ai/jobs"),
        ("POST", "/v1/ai/jobs/", "/v1/ai/jobs"),
        ("GET", "/v1/ai/jobs/job-1/", "/v1/ai/jobs/job-1"),
        ("POST", "/internal/runtime/jobs/poll/", "/internal/runtime/jobs/poll"),
        ("GET", "/healthz/", "/healthz"),
        ("GET", "/docs/", "/docs"),
    ],
)
async def test_a_trailing_slash_is_404_with_a_hint_never_a_redirect(
    client: httpx.AsyncClient, backends: Backends, method: str, path: str, hint: str
) -> None:
    """No 307 to an absolute ``http://<Host>`` URL (wrong behind TLS or a proxy, and a
    POST body is lost on the way): 404, naming the path without the slash. ``GET
    /v1/ai/jobs/`` is what a client sends for a job whose id it lost; answering the
    job list there would hide that bug."""
    resp = await client.request(method, path, headers={**USER, **runtime_headers()}, json={})
    assert resp.status_code == 404, resp.text
    assert "location" not in resp.headers
    body = resp.json()
    assert body["code"] == "NOT_FOUND"
    assert f"did you mean {hint}?" in body["message"]
    assert not backends.job.calls


async def test_an_unknown_path_is_a_plain_404(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/nothing/", headers=USER)
    assert resp.status_code == 404
    assert resp.json() == {"code": "NOT_FOUND", "message": "no such path", "details": {}}


# ---------------------------------------------------------------- bodies not sent as JSON


@pytest.mark.parametrize(
    ("content_type", "got"),
    [
        ("application/x-www-form-urlencoded", "got 'application/x-www-form-urlencoded'"),
        ("text/plain", "got 'text/plain'"),
        (None, "no Content-Type was sent"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path", "payload"),
    [
        ("POST", "/v1/materials", {"title": "t", "content": "c"}),
        ("PUT", "/v1/me/model-credential", {"provider": "deepseek", "apiKey": "sk-x1234567"}),
        ("POST", "/v1/ai/jobs", CREATE),
        ("POST", "/admin/ai/jobs/job-1/rerun", {"rebuildSnapshot": True}),
        ("POST", "/internal/runtime/jobs/poll", {"capabilities": ["quiz_generation"]}),
    ],
)
async def test_a_body_not_sent_as_json_says_so(
    client: httpx.AsyncClient,
    backends: Backends,
    content_type: str | None,
    got: str,
    method: str,
    path: str,
    payload: dict[str, Any],
) -> None:
    """``curl -d '{…}'`` sends form encoding: the answer names the content type to use,
    not a field error about a "dictionary"."""
    headers = {**USER, **ADMIN_H} if path.startswith("/admin") else {**USER}
    headers.update(runtime_headers())
    if content_type:
        headers["Content-Type"] = content_type
    resp = await client.request(method, path, content=json.dumps(payload).encode(), headers=headers)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "INVALID_ARGUMENT"
    assert body["message"] == (
        f"the request body must be JSON sent with Content-Type: application/json ({got})"
    )
    assert [(f["field"], f["in"]) for f in body["details"]["fields"]] == [
        ("Content-Type", "header")
    ]
    assert not backends.job.calls and not backends.credential.calls


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON"]
)
async def test_json_content_types_are_taken(
    client: httpx.AsyncClient, backends: Backends, content_type: str
) -> None:
    resp = await client.post(
        "/v1/materials",
        content=b'{"title": "t", "content": "c"}',
        headers={**USER, "Content-Type": content_type},
    )
    assert resp.status_code == 201, resp.text


async def test_a_route_without_a_body_ignores_the_content_type(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/ai/jobs/job-1/cancel", content=b"x", headers={**USER, "Content-Type": "text/plain"}
    )
    assert resp.status_code == 200, resp.text


# ---------------------------------------------------------------- bodies that are not JSON


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"title": "t", "content": }', "Expecting value at line 1, column 27"),
        (
            b'{\n  "title": "t",\n  "content": "c",\n}',
            "Expecting property name enclosed in double quotes at line 4, column 1",
        ),
        (b'{"title": "t"', "Expecting ',' delimiter at line 1, column 14"),
    ],
)
async def test_bad_json_names_no_offset_as_a_field(
    client: httpx.AsyncClient, backends: Backends, raw: bytes, where: str
) -> None:
    """Where the JSON broke is in the message (line and column), never as a field
    such as ``body.17``."""
    resp = await client.post(
        "/v1/materials", content=raw, headers={**USER, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    assert resp.json() == {
        "code": "INVALID_ARGUMENT",
        "message": f"request body is not valid JSON: {where}",
        "details": {"fields": []},
    }
    assert not backends.job.calls


async def test_field_errors_still_name_their_fields(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/learning-events",
        json={"events": [{"eventId": "e1", "type": "reading"}, {"eventId": "e2", "type": "x"}]},
        headers=USER,
    )
    assert resp.status_code == 400
    assert [f["field"] for f in resp.json()["details"]["fields"]] == ["events.1.type"]


# ---------------------------------------------------------------- echoed ids are capped


def _longest_run(text: str, char: str = "x") -> int:
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", text)), default=0)


async def test_a_long_id_is_echoed_at_most_128_characters(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    """A backend refusal that repeats a 6,000-character id in its message and details
    (the gRPC trailers already cut them to 1,024 and 256 characters) reaches the
    client with 128 characters of it in each, and "…" where it was cut."""
    long_id = "x" * 6000
    backends.job.errors["GetMaterial"] = AppError(
        ErrorCode.NOT_FOUND, f"material {long_id!r} not found", {"materialId": long_id}
    )
    resp = await client.get(f"/v1/materials/{long_id}", headers=USER)
    assert resp.status_code == 404
    body = resp.json()
    assert body["message"] == f"material '{'x' * 127}…"
    assert body["details"] == {"materialId": "x" * 128 + "…"}
    assert resp.text.count("x") <= 2 * 128 and len(resp.content) < 600


async def test_the_gateways_own_refusals_are_capped_too(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    """The gateway's own 404 of a foreign user target echoes the target id."""
    body = {"jobType": "learning_state_analysis", "targetType": "user", "targetId": "y" * 6000}
    resp = await client.post("/v1/ai/jobs", json=body, headers=USER)
    assert resp.status_code == 404
    assert resp.json()["details"] == {"targetId": "y" * 128 + "…"}
    assert not backends.job.calls


async def test_short_texts_and_sentences_are_not_cut(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    sentence = " ".join(["word"] * 60)  # 299 characters, no long run
    backends.job.errors["GetJob"] = AppError(
        ErrorCode.INVALID_JOB_STATE, sentence, {"id": "j" * 128}
    )
    resp = await client.get("/v1/ai/jobs/job-1", headers=USER)
    assert resp.json()["message"] == sentence
    assert resp.json()["details"] == {"id": "j" * 128}
