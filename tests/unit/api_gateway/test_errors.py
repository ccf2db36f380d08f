"""Error mapping and request hygiene (reference §4): every refusal is ``{"code","message","details"}``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from airuntime_common.errors import TRANSPORT, AppError, ErrorCode
from api_gateway.app import create_app

from .conftest import OWNER, Backends, bearer, make_token, runtime_headers, settings

USER = bearer(make_token(OWNER, "user", exp_in=86400))  # made at import: outlives the suite


@pytest.mark.parametrize("code", sorted(c for c in TRANSPORT if c not in ("UNAUTHENTICATED",)))
async def test_backend_error_codes_map_to_their_http_status(
    client: httpx.AsyncClient, backends: Backends, code: str
) -> None:
    backends.job.errors["GetJob"] = AppError(code, f"refused: {code}", {"jobId": "job-1", "n": 1})
    resp = await client.get("/v1/ai/jobs/job-1", headers=USER)
    assert resp.status_code == TRANSPORT[code][0]
    body = resp.json()
    assert body["code"] == code
    if code not in ("INTERNAL", "UNAVAILABLE"):
        assert body == {
            "code": code,
            "message": f"refused: {code}",
            "details": {"jobId": "job-1", "n": 1},
        }


@pytest.mark.parametrize(
    ("route", "method", "payload", "rpc", "code", "status"),
    [
        ("/internal/runtime/jobs/job-1/lock", "POST", {}, "LockJob", "JOB_ALREADY_LOCKED", 409),
        ("/internal/runtime/jobs/job-1/lock", "POST", {}, "LockJob", "JOB_NOT_FOUND", 404),
        (
            "/internal/runtime/jobs/job-1/start",
            "POST",
            {"attemptNo": 1},
            "StartJob",
            "LOCK_NOT_HELD",
            409,
        ),
        (
            "/internal/runtime/jobs/job-1/heartbeat",
            "POST",
            {"attemptNo": 1},
            "Heartbeat",
            "LOCK_NOT_HELD",
            409,
        ),
        (
            "/internal/runtime/jobs/job-1/result",
            "POST",
            {"attemptNo": 1, "output": {"items": []}},
            "SubmitResult",
            "RESULT_ALREADY_EXISTS",
            409,
        ),
        (
            "/internal/runtime/jobs/job-1/result",
            "POST",
            {"attemptNo": 1, "output": {"items": []}},
            "SubmitResult",
            "INVALID_SCHEMA",
            422,
        ),
        (
            "/internal/runtime/jobs/job-1/fail",
            "POST",
            {"attemptNo": 1, "errorCode": "X"},
            "FailJob",
            "LOCK_NOT_HELD",
            409,
        ),
        (
            "/internal/runtime/jobs/poll",
            "POST",
            {"capabilities": ["quiz_generation"]},
            "PollJobs",
            "INVALID_ARGUMENT",
            400,
        ),
    ],
)
async def test_shim_error_mapping(
    client: httpx.AsyncClient,
    backends: Backends,
    route: str,
    method: str,
    payload: dict[str, object],
    rpc: str,
    code: str,
    status: int,
) -> None:
    backends.job.errors[rpc] = AppError(code, "no")
    resp = await client.request(method, route, json=payload, headers=runtime_headers())
    assert resp.status_code == status
    assert resp.json()["code"] == code


async def test_resolve_invalid_credential_is_422_and_no_store(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.credential.errors["ResolveCredential"] = AppError(ErrorCode.INVALID_CREDENTIAL, "bad")
    resp = await client.post(
        "/internal/runtime/model-credentials/resolve",
        json={"jobId": "job-1", "attemptNo": 1},
        headers=runtime_headers(),
    )
    assert resp.status_code == 422
    assert resp.json()["code"] == "INVALID_CREDENTIAL"
    assert resp.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    ("status", "code", "http"),
    [
        (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE", 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "UNAVAILABLE", 503),
        (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", 404),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", 400),
        (grpc.StatusCode.UNKNOWN, "INTERNAL", 500),
        (grpc.StatusCode.UNIMPLEMENTED, "INTERNAL", 500),
    ],
)
async def test_bare_grpc_statuses_map_by_status(
    client: httpx.AsyncClient, backends: Backends, status: grpc.StatusCode, code: str, http: int
) -> None:
    backends.job.raw_errors["GetJob"] = status
    resp = await client.get("/v1/ai/jobs/job-1", headers=USER)
    assert resp.status_code == http
    assert resp.json()["code"] == code
    assert "Traceback" not in resp.text


async def test_backend_refusing_our_token_is_internal_not_401(backends: Backends) -> None:
    app = create_app(
        settings(RUNTIME_SERVICE_TOKEN="not-the-backends-token"),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        resp = await c.get("/v1/ai/jobs", headers=USER)
    assert resp.status_code == 500
    assert resp.json()["code"] == "INTERNAL"


@pytest.fixture
async def down_client() -> AsyncIterator[httpx.AsyncClient]:
    """A gateway whose backends are not listening."""
    job = grpc.aio.insecure_channel("127.0.0.1:1")
    cred = grpc.aio.insecure_channel("127.0.0.1:1")
    app = create_app(settings(GRPC_TIMEOUT_SECONDS=1.0), job_channel=job, credential_channel=cred)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://g"
    ) as c:
        yield c
    await job.close()
    await cred.close()


async def test_backend_down_is_503(down_client: httpx.AsyncClient) -> None:
    resp = await down_client.get("/v1/ai/jobs", headers=USER)
    assert resp.status_code == 503
    assert resp.json()["code"] == "UNAVAILABLE"
    shim = await down_client.post(
        "/internal/runtime/jobs/job-1/heartbeat", json={"attemptNo": 1}, headers=runtime_headers()
    )
    assert shim.status_code == 503
    ready = await down_client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["code"] == "UNAVAILABLE"


async def test_unexpected_exception_is_500_without_trace(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api_gateway import convert

    def boom(_job: object) -> dict[str, object]:
        raise RuntimeError("secret internals sk-abcdef123456")

    monkeypatch.setattr(convert, "job_json", boom)
    resp = await client.get("/v1/ai/jobs/job-1", headers=USER)
    assert resp.status_code == 500
    assert resp.json() == {"code": "INTERNAL", "message": "internal error", "details": {}}
    assert "secret" not in resp.text and "Traceback" not in resp.text


async def test_body_over_limit_by_content_length_is_413(backends: Backends) -> None:
    app = create_app(
        settings(MAX_BODY_BYTES=1000),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        big = {"title": "t", "content": "x" * 2000}
        resp = await c.post("/v1/materials", json=big, headers=USER)
        assert resp.status_code == 413
        assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"

        async def stream() -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"x" * 300

        # no Content-Length: chunked upload counted as it streams
        streamed = await c.post(
            "/v1/materials", content=stream(), headers={**USER, "Content-Type": "application/json"}
        )
        assert streamed.status_code == 413
        assert streamed.json()["code"] == "PAYLOAD_TOO_LARGE"
        small = await c.post("/v1/materials", json={"title": "t", "content": "ok"}, headers=USER)
        assert small.status_code == 201
    assert [c.method for c in backends.job.calls] == ["CreateMaterial"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"title": "t", "content": ',  # truncated
        b"not json at all",
        b'{"title": "t", "content": "\xff\xfe"}',  # invalid UTF-8
        b"[" * 5000 + b"]" * 5000,  # deep nesting
        b'{"title": "t", "content": "x", "extra": ' + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}",
    ],
)
async def test_malformed_bodies_are_400(
    client: httpx.AsyncClient, backends: Backends, raw: bytes
) -> None:
    resp = await client.post(
        "/v1/materials", content=raw, headers={**USER, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_ARGUMENT"
    assert not backends.job.calls


async def test_lone_surrogate_is_400(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.post(
        "/v1/materials",
        content=b'{"title": "t", "content": "\\ud800"}',
        headers={**USER, "Content-Type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["code"] == "INVALID_ARGUMENT"


async def test_a_nul_character_is_refused_naming_its_fields(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    """reference §3.1: the offending fields in ``details``, as validation names them; the
    body spelled as every other error's."""
    resp = await client.post(
        "/v1/learning-events",
        content=b'{"events": [{"eventId": "ok"}, {"eventId": "e\\u0000", "k\\u0000": 1}]}',
        headers={**USER, "Content-Type": "application/json"},
    )
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "INVALID_ARGUMENT"
    assert [f["field"] for f in body["details"]["fields"]] == ["events.1", "events.1.eventId"]
    assert {f["in"] for f in body["details"]["fields"]} == {"body"}
    assert resp.text.startswith('{"code":"INVALID_ARGUMENT","message":')
    raw = await client.post(
        "/v1/materials",
        content=b'{"title": "a\x00", "content": "x"}',
        headers={**USER, "Content-Type": "application/json"},
    )
    assert raw.status_code == 400 and raw.json()["details"] == {"fields": []}
    assert not backends.job.calls


async def test_int32_overflow_is_400_not_500(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/internal/runtime/jobs/job-1/start", json={"attemptNo": 2**40}, headers=runtime_headers()
    )
    assert resp.status_code == 400


async def test_unknown_route_and_method_use_the_error_body(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/nothing-here", headers=USER)
    assert resp.status_code == 404
    assert resp.json()["code"] == "NOT_FOUND"
    wrong = await client.delete("/v1/ai/jobs", headers=USER)
    assert wrong.status_code == 405
    assert wrong.headers["Allow"] == "GET, POST"
    both = await client.request("PATCH", "/v1/me/model-credential", headers=USER)
    assert both.headers["Allow"] == "DELETE, GET, PUT"
    assert set(wrong.json()) == {"code", "message", "details"}


async def test_validation_details_do_not_echo_secrets(client: httpx.AsyncClient) -> None:
    resp = await client.put(
        "/v1/me/model-credential",
        json={"provider": "no such provider, far too long a name", "apiKey": "sk-topsecret-99"},
        headers=USER,
    )
    assert resp.status_code == 400
    assert "sk-topsecret" not in resp.text


async def test_body_without_content_type_is_still_checked(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.post(
        "/v1/materials", content=b'{"title": "t", "content": "\xff"}', headers=USER
    )
    assert resp.status_code == 400
    assert resp.json()["code"] == "INVALID_ARGUMENT"
    plain = await client.post(
        "/v1/materials",
        content=b'{"title": "t", "content": "ok"}',
        headers={**USER, "Content-Type": "text/plain"},
    )
    assert plain.status_code == 400
    assert not backends.job.calls
