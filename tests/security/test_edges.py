"""Edges of the public surface (reference §3.1, §4, §9.3): JWT pinning and issuer, error bodies
without internals, CORS off by default, body limits.

Most run against the real system; the issuer and CORS variants run the gateway
app in-process with other settings but the system's REAL backends.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import jwt
import pytest
import pytest_asyncio

from airuntime_common.grpc_server import insecure_or_tls_channel
from api_gateway.app import create_app
from api_gateway.routes import public
from api_gateway.settings import GatewaySettings
from tests.security.conftest import System, other_alg_token, user_id

pytestmark = pytest.mark.e2e
package_loop = pytest.mark.asyncio(loop_scope="package")

#: What must never show in an error body: Python internals, paths, exception reprs.
INTERNALS = ("Traceback", 'File "', "/work/", "site-packages", "Error(", "Exception", ".py")


def assert_clean_error(resp: httpx.Response, status: int, code: str) -> None:
    """reference §4 shape, the expected code, and nothing internal in it."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"code", "message", "details"}, body
    assert body["code"] == code, body
    for marker in INTERNALS:
        assert marker not in resp.text, (marker, resp.text)


def _claims(sub: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"sub": sub, "role": role, "exp": int(time.time()) + 600, **extra}


# ------------------------------------------------------------------ JWT


@package_loop
async def test_only_hs256_with_the_secret_is_accepted(system: System) -> None:
    me = user_id("jwt")
    secret = system.env["JWT_SECRET"]
    refused = {
        "HS384": other_alg_token(system, "HS384", me, "user"),
        "HS512": other_alg_token(system, "HS512", me, "user"),
        "RS256": other_alg_token(system, "RS256", me, "user"),
        "none": jwt.encode(_claims(me), "", algorithm="none"),
        "none-no-dot": jwt.encode(_claims(me), "", algorithm="none").rstrip("."),
        "not-yet-valid": jwt.encode(_claims(me, nbf=int(time.time()) + 600), secret, "HS256"),
        "no-sub": jwt.encode({"role": "user", "exp": int(time.time()) + 60}, secret, "HS256"),
        "bad-role": jwt.encode(_claims(me, role="root"), secret, "HS256"),
        "exp-as-text": jwt.encode({**_claims(me), "exp": "tomorrow"}, secret, "HS256"),
        "garbage": "eyJhbGciOiJIUzI1NiJ9.not-json.sig",
    }
    async with system.client() as c:
        for label, token in refused.items():
            for path in ("/v1/me/ai-authorization", "/admin/ai/circuit-breaker"):
                resp = await c.get(path, headers={"Authorization": f"Bearer {token}"})
                assert resp.status_code == 401, (label, path, resp.text)
                assert_clean_error(resp, 401, "UNAUTHENTICATED")
        for scheme in ("Basic", "Token", "bearer"):
            resp = await c.get(
                "/v1/me/ai-authorization",
                headers={"Authorization": f"{scheme} {system.token(me)}"},
            )
            want = 200 if scheme.lower() == "bearer" else 401
            assert resp.status_code == want, (scheme, resp.text)
        ok = await c.get(
            "/v1/me/ai-authorization",
            headers={"Authorization": f"Bearer {jwt.encode(_claims(me), secret, 'HS256')}"},
        )
        assert ok.status_code == 200, ok.text


@pytest_asyncio.fixture(loop_scope="package")
async def real_channels(system: System) -> AsyncIterator[tuple[grpc.aio.Channel, grpc.aio.Channel]]:
    job = insecure_or_tls_channel(system.env["JOB_SERVICE_ADDR"])
    cred = insecure_or_tls_channel(system.env["CREDENTIAL_SERVICE_ADDR"])
    try:
        yield job, cred
    finally:
        await job.close()
        await cred.close()


def _gateway(
    system: System, channels: tuple[grpc.aio.Channel, grpc.aio.Channel], **env: str
) -> Any:
    settings = GatewaySettings.model_validate(
        {
            "RUNTIME_SERVICE_TOKEN": system.service_token,
            "JWT_SECRET": system.env["JWT_SECRET"],
            **env,
        }
    )
    return create_app(settings, job_channel=channels[0], credential_channel=channels[1])


@package_loop
async def test_issuer_is_checked_when_configured(
    system: System, real_channels: tuple[grpc.aio.Channel, grpc.aio.Channel]
) -> None:
    app = _gateway(system, real_channels, JWT_ISSUER="https://id.example")
    secret = system.env["JWT_SECRET"]
    me = user_id("iss")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        for claims in (_claims(me), _claims(me, iss="https://evil.example"), _claims(me, iss="")):
            resp = await c.get(
                "/v1/me/ai-authorization",
                headers={"Authorization": f"Bearer {jwt.encode(claims, secret, 'HS256')}"},
            )
            assert_clean_error(resp, 401, "UNAUTHENTICATED")
        good = jwt.encode(_claims(me, iss="https://id.example"), secret, "HS256")
        resp = await c.get("/v1/me/ai-authorization", headers={"Authorization": f"Bearer {good}"})
        assert resp.status_code == 200 and resp.json()["granted"] is True, resp.text
    # without JWT_ISSUER any iss (or none) is fine on the real gateway
    async with system.client() as c:
        resp = await c.get(
            "/v1/me/ai-authorization",
            headers={
                "Authorization": f"Bearer {jwt.encode(_claims(me, iss='x'), secret, 'HS256')}"
            },
        )
        assert resp.status_code == 200


# ------------------------------------------------------------------ no internals in errors


@package_loop
async def test_an_unexpected_exception_is_a_bare_500(
    system: System,
    real_channels: tuple[grpc.aio.Channel, grpc.aio.Channel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def explode(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("boom at /work/secret/path.py with sk-internal-detail-123456")

    monkeypatch.setattr(public, "create_job", explode)
    app = _gateway(system, real_channels)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as c:
        resp = await c.post(
            "/v1/ai/jobs",
            json={"jobType": "quiz_generation", "targetType": "user", "targetId": "u"},
            headers={"Authorization": f"Bearer {system.token(user_id('boom'))}"},
        )
    assert_clean_error(resp, 500, "INTERNAL")
    assert "boom" not in resp.text and "sk-internal" not in resp.text
    assert resp.headers.get("x-request-id")


@package_loop
async def test_hostile_requests_get_spec_errors_without_internals(system: System) -> None:
    me = system.bearer(user_id("hostile"))
    json_headers = {**me, "Content-Type": "application/json"}
    cases: list[tuple[str, str, dict[str, str], Any, int, str]] = [
        ("POST", "/v1/ai/jobs", json_headers, b"{not json", 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/ai/jobs", json_headers, b"\xff\xfe\x00bad", 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/ai/jobs", json_headers, b"[" * 100 + b"]" * 100, 400, "INVALID_ARGUMENT"),
        ("POST", "/v1/ai/jobs", json_headers, b'{"jobType": "rm -rf"}', 400, "INVALID_ARGUMENT"),
        (
            "POST",
            "/v1/ai/jobs",
            json_headers,
            json.dumps(
                {"jobType": "quiz_generation", "targetType": "user", "params": {"count": 10**30}}
            ).encode(),
            400,
            "INVALID_ARGUMENT",
        ),
        ("GET", "/v1/ai/jobs?pageSize=-1", me, None, 400, "INVALID_ARGUMENT"),
        ("GET", "/v1/ai/jobs?status=all", me, None, 400, "INVALID_ARGUMENT"),
        ("GET", "/v1/ai/jobs?pageToken=%00%01garbage", me, None, 400, "INVALID_ARGUMENT"),
        ("GET", "/v1/ai/jobs/" + "x" * 300, me, None, 404, "JOB_NOT_FOUND"),
        ("GET", "/v1/ai/jobs/..%2F..%2Fetc%2Fpasswd", me, None, 404, "NOT_FOUND"),
        ("GET", "/v1/ai/jobs/%2e%2e", me, None, 404, "JOB_NOT_FOUND"),
        ("GET", "/v1/materials/' OR 1=1 --", me, None, 404, "NOT_FOUND"),
        ("DELETE", "/v1/ai/jobs", me, None, 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/v2/anything", me, None, 404, "NOT_FOUND"),
        (
            "PUT",
            "/v1/me/model-credential",
            json_headers,
            b'{"apiKey": ""}',
            400,
            "INVALID_ARGUMENT",
        ),
    ]
    async with system.client() as c:
        for method, path, headers, body, status, code in cases:
            resp = await c.request(method, path, headers=headers, content=body)
            assert resp.status_code == status, (method, path, resp.text)
            assert_clean_error(resp, status, code)
        # validation errors name the field but never echo the value
        secretish = "sk-echo-canary-" + "9" * 20
        resp = await c.put(
            "/v1/me/model-credential",
            json={"provider": "openai", "apiKey": secretish},
            headers=me,
        )
        assert_clean_error(resp, 400, "INVALID_ARGUMENT")
        assert secretish not in resp.text and "9999999999" not in resp.text
    # nothing the system ever answered in this session carried a stack trace
    for seen in system.seen:
        text = seen.body.decode("utf-8", errors="replace")
        assert "Traceback" not in text and 'File "/' not in text, (seen.method, seen.url)


# ------------------------------------------------------------------ CORS


@package_loop
async def test_cors_is_off_unless_configured(
    system: System, real_channels: tuple[grpc.aio.Channel, grpc.aio.Channel]
) -> None:
    preflight = {
        "Origin": "https://evil.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    async with system.client() as c:  # the real gateway: CORS_ORIGINS unset
        pre = await c.options("/v1/ai/jobs", headers=preflight)
        assert pre.status_code in (400, 405), pre.text
        got = await c.get(
            "/v1/me/ai-authorization",
            headers={**system.bearer(user_id("cors")), "Origin": "https://evil.example"},
        )
        assert got.status_code == 200
        for resp in (pre, got):
            assert not any(h.lower().startswith("access-control-") for h in resp.headers), (
                resp.headers
            )

    app = _gateway(system, real_channels, CORS_ORIGINS="https://app.example")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        ok = await c.options("/v1/ai/jobs", headers={**preflight, "Origin": "https://app.example"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "access-control-allow-credentials" not in ok.headers
        # an unlisted origin is answered as with CORS off: the API's 405, no CORS header
        evil = await c.options("/v1/ai/jobs", headers=preflight)
        assert_clean_error(evil, 405, "METHOD_NOT_ALLOWED")
        assert not any(h.lower().startswith("access-control-") for h in evil.headers)
        simple = await c.get(
            "/v1/me/ai-authorization",
            headers={**system.bearer(user_id("cors")), "Origin": "https://evil.example"},
        )
        assert simple.status_code == 200
        assert "access-control-allow-origin" not in simple.headers


# ------------------------------------------------------------------ body limits


@package_loop
async def test_oversized_bodies_are_413(system: System) -> None:
    me = system.bearer(user_id("big"))
    limit = 2 * 1024 * 1024  # MAX_BODY_BYTES default
    big = json.dumps({"title": "big", "content": "a" * (limit + 10)}).encode()

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for i in range(0, len(big), 64 * 1024):
            yield big[i : i + 64 * 1024]

    async with system.client() as c:
        declared = await c.post(
            "/v1/materials", content=big, headers={**me, "Content-Type": "application/json"}
        )
        assert_clean_error(declared, 413, "PAYLOAD_TOO_LARGE")
        streamed = await c.post(
            "/v1/materials", content=chunks(), headers={**me, "Content-Type": "application/json"}
        )
        assert_clean_error(streamed, 413, "PAYLOAD_TOO_LARGE")
        # under the body limit but over the 1 MiB material limit
        material = await c.post(
            "/v1/materials", json={"title": "m", "content": "b" * (1024 * 1024 + 1)}, headers=me
        )
        assert_clean_error(material, 413, "PAYLOAD_TOO_LARGE")
        # the runtime shim has the same limit, checked once the token is
        shim = await c.post(
            "/internal/runtime/jobs/poll",
            content=big,
            headers={**system.runtime_headers(), "Content-Type": "application/json"},
        )
        assert_clean_error(shim, 413, "PAYLOAD_TOO_LARGE")
        # and a body just under it is processed normally
        fine = await c.post(
            "/v1/materials", json={"title": "ok", "content": "c" * 1000}, headers=me
        )
        assert fine.status_code == 201
