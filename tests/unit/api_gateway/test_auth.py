"""The authorization matrix: every route × every kind of credential (reference §3, §3.1)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import pytest

from .conftest import (
    ADMIN,
    JWT_SECRET,
    OTHER,
    OWNER,
    SERVICE_TOKEN,
    Backends,
    bearer,
    make_token,
    none_alg_token,
    runtime_headers,
    settings,
)

J = "/v1/ai/jobs/job-1"
R = "/internal/runtime/jobs/job-1"

# (method, path, body, success status, owner-only job route)
V1: list[tuple[str, str, Any, int, bool]] = [
    ("POST", "/v1/materials", {"title": "t", "content": "hello"}, 201, False),
    ("GET", "/v1/materials/m1", None, 200, False),
    (
        "POST",
        "/v1/knowledge-points",
        {"materialId": "m1", "name": "k", "blockIds": ["b1"]},
        201,
        False,
    ),
    (
        "POST",
        "/v1/learning-events",
        {"events": [{"eventId": "e1", "type": "reading", "blockId": "b1", "dwellSeconds": 3}]},
        202,
        False,
    ),
    (
        "POST",
        "/v1/ai/jobs",
        {"jobType": "quiz_generation", "targetType": "material", "targetId": "m1"},
        201,
        False,
    ),
    ("GET", "/v1/ai/jobs", None, 200, False),
    ("GET", J, None, 200, True),
    ("POST", f"{J}/cancel", None, 200, True),
    ("GET", f"{J}/result", None, 200, True),
    ("GET", "/v1/ai/results/questions", None, 200, False),
    (
        "PUT",
        "/v1/me/model-credential",
        {"provider": "deepseek", "apiKey": "sk-abcdef123456"},
        200,
        False,
    ),
    ("GET", "/v1/me/model-credential", None, 200, False),
    ("DELETE", "/v1/me/model-credential", None, 204, False),
    ("GET", "/v1/me/ai-authorization", None, 200, False),
    ("PUT", "/v1/me/ai-authorization", {"granted": True}, 200, False),
    ("POST", "/v1/me/ai-authorization/revoke", None, 200, False),
]

ADMIN_ROUTES: list[tuple[str, str, Any, int]] = [
    (
        "POST",
        "/admin/ai/jobs",
        {
            "userId": OWNER,
            "jobType": "learning_state_analysis",
            "targetType": "user",
            "priority": 1,
            "maxRetryCount": 2,
            "timeoutSeconds": 60,
        },
        201,
    ),
    ("GET", "/admin/ai/jobs?userId=u1", None, 200),
    ("GET", "/admin/ai/jobs/job-1", None, 200),
    ("POST", "/admin/ai/jobs/job-1/rerun", {"rebuildSnapshot": False}, 201),
    ("POST", "/admin/ai/jobs/job-1/cancel", None, 200),
    ("GET", "/admin/ai/costs?from=2026-11-01&to=2026-11-30&groupBy=day", None, 200),
    ("GET", "/admin/ai/circuit-breaker", None, 200),
    ("POST", "/admin/ai/circuit-breaker/reset", None, 200),
    ("GET", "/admin/ai/runtime", None, 200),
]

INTERNAL: list[tuple[str, str, Any, int]] = [
    ("POST", "/internal/runtime/jobs/poll", {"capabilities": ["quiz_generation"], "limit": 5}, 200),
    (
        "POST",
        "/internal/runtime/jobs/claim",
        {"capabilities": ["quiz_generation"], "limit": 5},
        200,
    ),
    ("POST", f"{R}/lock", {}, 200),
    ("POST", f"{R}/start", {"attemptNo": 1}, 200),
    ("POST", f"{R}/heartbeat", {"attemptNo": 1}, 204),
    (
        "POST",
        "/internal/runtime/leases/heartbeat",
        {"leases": [{"jobId": "job-1", "attemptNo": 1}]},
        200,
    ),
    ("GET", f"{R}/snapshot?attemptNo=1", None, 200),
    (
        "POST",
        "/internal/runtime/model-credentials/resolve",
        {"jobId": "job-1", "attemptNo": 1},
        200,
    ),
    (
        "POST",
        f"{R}/result",
        {
            "attemptNo": 1,
            "promptVersion": "p",
            "outputSchemaVersion": "v1",
            "output": {"items": []},
        },
        200,
    ),
    ("POST", f"{R}/fail", {"attemptNo": 1, "errorCode": "MODEL_TIMEOUT", "errorMessage": "x"}, 200),
    (
        "POST",
        "/internal/runtime/invocation-logs",
        {
            "jobId": "job-1",
            "attemptNo": 1,
            "modelProvider": "deepseek",
            "modelName": "deepseek-chat",
            "apiKeyMode": "platform_key",
            "promptTokens": 1,
            "completionTokens": 2,
            "cacheHitTokens": 0,
            "latencyMs": 5,
            "outcome": "succeeded",
        },
        201,
    ),
    ("GET", "/internal/runtime/health", None, 200),
]

BAD_TOKENS = {
    "none": None,
    "expired": lambda: make_token(OWNER, "admin", exp_in=-60),
    "wrong-signature": lambda: make_token(OWNER, "admin", secret=JWT_SECRET + "x"),
    "alg-none": lambda: none_alg_token(),
    "service-token": lambda: SERVICE_TOKEN,
    "garbage": lambda: "not.a.jwt",
    "no-role": lambda: _no_role(),
    "no-exp": lambda: _no_exp(),
}


def _no_role() -> str:
    import jwt as pyjwt

    return pyjwt.encode({"sub": OWNER, "exp": 9999999999}, JWT_SECRET, algorithm="HS256")


def _no_exp() -> str:
    import jwt as pyjwt

    return pyjwt.encode({"sub": OWNER, "role": "admin"}, JWT_SECRET, algorithm="HS256")


def _headers(kind: str) -> dict[str, str]:
    factory = BAD_TOKENS[kind]
    return {} if factory is None else bearer(factory())


async def _send(
    client: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    return await client.request(method, path, json=body, headers=headers)


def _assert_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == code
    assert set(body) == {"code", "message", "details"}


@pytest.mark.parametrize("kind", list(BAD_TOKENS))
async def test_bad_credentials_are_401_on_every_public_and_admin_route(
    client: httpx.AsyncClient, backends: Backends, kind: str
) -> None:
    routes = [(m, p, b) for m, p, b, *_ in V1] + [(m, p, b) for m, p, b, _ in ADMIN_ROUTES]
    for method, path, body in routes:
        resp = await _send(client, method, path, body, _headers(kind))
        _assert_error(resp, 401, "UNAUTHENTICATED")
    assert backends.job.calls == [] and backends.credential.calls == []


async def test_user_reaches_v1_and_only_its_own_jobs(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    for who, is_owner in ((OWNER, True), (OTHER, False)):
        backends.job.calls.clear()
        backends.credential.calls.clear()
        token = make_token(who, "user")
        for method, path, body, ok, owner_only in V1:
            resp = await _send(client, method, path, body, bearer(token))
            if owner_only and not is_owner:
                _assert_error(resp, 404, "JOB_NOT_FOUND")
            else:
                assert resp.status_code == ok, (who, method, path, resp.text)
        # every backend call was made on behalf of the caller: never without, never another
        calls = backends.job.calls + backends.credential.calls
        assert len(calls) == len(V1)
        for call in calls:
            assert call.request.user_id == who, call.method


async def test_user_token_on_admin_routes_is_403(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    for method, path, body, _ in ADMIN_ROUTES:
        resp = await _send(client, method, path, body, bearer(make_token(OWNER, "user")))
        _assert_error(resp, 403, "PERMISSION_DENIED")
    assert backends.job.calls == []


async def test_admin_reaches_admin_and_v1(client: httpx.AsyncClient) -> None:
    token = bearer(make_token(ADMIN, "admin"))
    for method, path, body, ok in ADMIN_ROUTES:
        resp = await _send(client, method, path, body, token)
        assert resp.status_code == ok, (method, path, resp.text)
    resp = await client.get("/v1/me/ai-authorization", headers=token)
    assert resp.status_code == 200


@pytest.mark.parametrize(
    "kind",
    ["no-token", "wrong-token", "user-jwt-as-bearer", "admin-jwt-as-key", "service-as-bearer"],
)
async def test_shim_refuses_everything_but_the_service_token(
    client: httpx.AsyncClient, backends: Backends, kind: str
) -> None:
    headers: dict[str, str] = {"X-Runtime-Instance-Id": "worker-a"}
    if kind == "wrong-token":
        headers["x-internal-api-key"] = SERVICE_TOKEN + "x"
    elif kind == "user-jwt-as-bearer":
        headers.update(bearer(make_token(OWNER, "user")))
    elif kind == "admin-jwt-as-key":
        headers["x-internal-api-key"] = make_token(ADMIN, "admin")
    elif kind == "service-as-bearer":
        headers.update(bearer(SERVICE_TOKEN))
    for method, path, body, _ in INTERNAL:
        resp = await _send(client, method, path, body, headers)
        _assert_error(resp, 401, "UNAUTHENTICATED")
    assert backends.job.calls == [] and backends.credential.calls == []


async def test_shim_accepts_the_service_token_and_forwards_the_instance_id(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    for method, path, body, ok in INTERNAL:
        resp = await _send(client, method, path, body, runtime_headers("worker-7"))
        assert resp.status_code == ok, (method, path, resp.text)
    assert backends.job.calls and backends.credential.calls
    for call in backends.job.calls + backends.credential.calls:
        assert call.metadata["x-internal-api-key"] == SERVICE_TOKEN
        assert call.metadata["x-runtime-instance-id"] == "worker-7"


async def test_shim_without_instance_id_is_400_except_health(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    for method, path, body, ok in INTERNAL:
        resp = await _send(client, method, path, body, runtime_headers(None))
        if path.endswith("/health"):
            assert resp.status_code == ok
        else:
            _assert_error(resp, 400, "INVALID_ARGUMENT")
    assert [c.method for c in backends.job.calls] == ["GetRuntimeHealth"]


async def test_service_token_never_reaches_public_routes_even_as_key(
    client: httpx.AsyncClient,
) -> None:
    resp = await client.get("/v1/ai/jobs", headers=runtime_headers())
    _assert_error(resp, 401, "UNAUTHENTICATED")


async def test_issuer_checked_when_configured(backends: Backends) -> None:
    import grpc

    from api_gateway.app import create_app

    app = create_app(
        settings(JWT_ISSUER="https://issuer.example"),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as c:
        no_iss = await c.get("/v1/me/ai-authorization", headers=bearer(make_token()))
        wrong = await c.get(
            "/v1/me/ai-authorization", headers=bearer(make_token(iss="https://evil"))
        )
        right = await c.get(
            "/v1/me/ai-authorization", headers=bearer(make_token(iss="https://issuer.example"))
        )
    assert no_iss.status_code == 401
    assert wrong.status_code == 401
    assert right.status_code == 200


async def test_token_signed_with_another_algorithm_is_refused(client: httpx.AsyncClient) -> None:
    import jwt as pyjwt

    token = pyjwt.encode(
        {"sub": ADMIN, "role": "admin", "exp": 9999999999}, JWT_SECRET, algorithm="HS512"
    )
    resp = await client.get("/admin/ai/circuit-breaker", headers=bearer(token))
    _assert_error(resp, 401, "UNAUTHENTICATED")


async def test_unknown_role_is_refused(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/ai/jobs", headers=bearer(make_token(OWNER, "superuser")))
    _assert_error(resp, 401, "UNAUTHENTICATED")


async def test_a_token_equal_to_the_service_token_is_refused_even_if_it_is_a_valid_jwt(
    backends: Backends,
) -> None:
    import grpc

    from api_gateway.app import create_app

    valid_admin_jwt = make_token(ADMIN, "admin")
    app = create_app(
        settings(RUNTIME_SERVICE_TOKEN=valid_admin_jwt),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        for path in ("/v1/ai/jobs", "/admin/ai/jobs"):
            resp = await c.get(path, headers=bearer(valid_admin_jwt))
            _assert_error(resp, 401, "UNAUTHENTICATED")
    assert backends.job.calls == []


# ---------------------------------------------------------------- stricter claims (reference §9.3)

_DROP = object()
_FAR = int(time.time()) + 86400


def _claims(**overrides: Any) -> dict[str, Any]:
    # Built when the tests are collected: the expiry must outlast the whole suite.
    claims: dict[str, Any] = {"sub": OWNER, "role": "user", "exp": _FAR}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not _DROP}


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param(_claims(exp=str(_FAR)), id="exp-numeric-text"),
        pytest.param(_claims(exp="tomorrow"), id="exp-text"),
        pytest.param(_claims(exp=True), id="exp-true"),
        pytest.param(_claims(exp=[_FAR]), id="exp-list"),
        pytest.param(_claims(exp=None), id="exp-null"),
        pytest.param(_claims(exp=float("inf")), id="exp-infinity"),
        pytest.param(_claims(exp=_DROP), id="exp-missing"),
        pytest.param(_claims(nbf=str(int(time.time()) - 10)), id="nbf-text"),
        pytest.param(_claims(iat=str(int(time.time()))), id="iat-text"),
        pytest.param(_claims(sub=""), id="sub-empty"),
        pytest.param(_claims(sub="u" * 129), id="sub-129-chars"),
        pytest.param(_claims(sub="u\x00"), id="sub-nul"),
        pytest.param(_claims(sub="u\n1"), id="sub-newline"),
        pytest.param(_claims(sub="u\t1"), id="sub-tab"),
        pytest.param(_claims(sub="u\x7f"), id="sub-del"),
        pytest.param(_claims(sub="u\x85"), id="sub-c1-control"),
        pytest.param(_claims(sub="u\u202e1"), id="sub-bidi-override"),
        pytest.param(_claims(sub="u\u2028"), id="sub-line-separator"),
        pytest.param(_claims(sub="\ud800"), id="sub-lone-surrogate"),
        pytest.param(_claims(sub=42), id="sub-number"),
    ],
)
async def test_malformed_claims_are_401(
    client: httpx.AsyncClient, backends: Backends, claims: dict[str, Any]
) -> None:
    """PyJWT checks the signature and expiry; a token it would take with ``exp`` as
    the text ``"…"`` or a ``sub`` no user id can be is refused as well."""
    token = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    for path in ("/v1/me/ai-authorization", "/admin/ai/circuit-breaker"):
        resp = await client.get(path, headers=bearer(token))
        _assert_error(resp, 401, "UNAUTHENTICATED")
    assert not backends.job.calls


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param(_claims(sub="u" * 128), id="sub-128-chars"),
        pytest.param(_claims(sub="学习者 é-1"), id="sub-unicode-with-space"),
        pytest.param(_claims(exp=float(_FAR) + 0.5), id="exp-float"),
        pytest.param(_claims(nbf=int(time.time()) - 10, iat=int(time.time())), id="nbf-iat"),
    ],
)
async def test_well_formed_claims_pass(
    client: httpx.AsyncClient, backends: Backends, claims: dict[str, Any]
) -> None:
    token = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    resp = await client.get("/v1/me/ai-authorization", headers=bearer(token))
    assert resp.status_code == 200, resp.text
    assert backends.job.last("GetAiAuthorization").request.user_id == claims["sub"]


# ---------------------------------------------------------------- clock skew (reference §9.3)


def _skewed(**offsets: int) -> str:
    """A user token whose ``exp``/``nbf``/``iat`` are now + the given seconds (``exp``
    an hour ahead unless given)."""
    now = int(time.time())
    claims: dict[str, Any] = {"sub": OWNER, "role": "user", "exp": now + 3600}
    claims.update({name: now + offset for name, offset in offsets.items()})
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


@pytest.mark.parametrize(
    "offsets",
    [
        pytest.param({"iat": 5}, id="iat-5s-ahead"),
        pytest.param({"nbf": 5, "iat": 5}, id="nbf-and-iat-5s-ahead"),
        pytest.param({"iat": 20}, id="iat-20s-ahead"),
        pytest.param({"exp": -10}, id="exp-10s-ago"),
    ],
)
async def test_a_token_within_the_leeway_of_clock_skew_is_taken(
    client: httpx.AsyncClient, backends: Backends, offsets: dict[str, int]
) -> None:
    """An issuer whose clock runs a few seconds ahead (or a token that expired a few
    seconds ago by the gateway's clock) is within ``JWT_LEEWAY_SECONDS`` (30; case N8)."""
    resp = await client.get("/v1/me/ai-authorization", headers=bearer(_skewed(**offsets)))
    assert resp.status_code == 200, resp.text
    assert backends.job.last("GetAiAuthorization").request.user_id == OWNER


@pytest.mark.parametrize(
    "offsets",
    [
        pytest.param({"iat": 90}, id="iat-90s-ahead"),
        pytest.param({"nbf": 90}, id="nbf-90s-ahead"),
        pytest.param({"exp": -90}, id="exp-90s-ago"),
    ],
)
async def test_a_token_beyond_the_leeway_is_401(
    client: httpx.AsyncClient, backends: Backends, offsets: dict[str, int]
) -> None:
    resp = await client.get("/v1/me/ai-authorization", headers=bearer(_skewed(**offsets)))
    _assert_error(resp, 401, "UNAUTHENTICATED")
    assert not backends.job.calls


async def test_the_leeway_is_a_setting(backends: Backends) -> None:
    """``JWT_LEEWAY_SECONDS=0``: no skew is forgiven; 120: two minutes are."""
    import grpc

    from api_gateway.app import create_app

    async def status(leeway: int, token: str) -> int:
        app = create_app(
            settings(JWT_LEEWAY_SECONDS=leeway),
            job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
            credential_channel=grpc.aio.insecure_channel(
                f"127.0.0.1:{backends.credential_server.port}"
            ),
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://g") as c:
            return (await c.get("/v1/me/ai-authorization", headers=bearer(token))).status_code

    assert await status(0, _skewed(iat=20)) == 401
    assert await status(0, _skewed(exp=-5)) == 401
    assert await status(120, _skewed(iat=90)) == 200
    assert await status(120, _skewed(exp=-90)) == 200


@pytest.mark.parametrize("value", [-1, 301])
def test_the_leeway_has_bounds(value: int) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="JWT_LEEWAY_SECONDS"):
        settings(JWT_LEEWAY_SECONDS=value)
