"""Authentication and authorization come before anything of the request is read
(reference §3.1, §4; case N4): on every route of the app, a caller who is not let in learns
nothing about how its request would be validated.

The routes are the app's own (every API route, iterated), the access each needs is
the OpenAPI document's ``security`` of the operation (the admin role by the
``/admin`` prefix), and each is sent requests that are wrong in every way the
gateway checks — a body that is no JSON, holds a NUL, nests too deep, is not UTF-8,
is too large or is sent as a form; query and header parameters out of their
schemas — with missing or wrong credentials (401) and with a user token on an
admin route (403). With the right credentials the same requests are refused for
what is wrong with them (400, 413), so the test proves the order, not a blind spot.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.routing import APIRoute, iter_route_contexts

from api_gateway.app import create_app
from api_gateway.deps import UserPrincipal, user_principal
from api_gateway.gate import GatedRoute, check_routes
from api_gateway.headers import BEARER_SCHEME, SERVICE_TOKEN_SCHEME

from .conftest import (
    JWT_SECRET,
    OWNER,
    SERVICE_TOKEN,
    Backends,
    bearer,
    make_token,
    runtime_headers,
    settings,
)

#: A small body limit, so "too large" needs few bytes.
MAX_BODY = 1000
#: Routes outside the document that need no caller: the docs pages and the console
#: page (static; it asks for an admin token itself). Any other hidden route must say
#: who may call it.
PUBLIC_HIDDEN = {"/docs", "/docs/oauth2-redirect", "/redoc", "/admin/console"}
#: Areas whose every route needs a caller.
GUARDED_AREAS = ("/v1/", "/admin/", "/internal/")

JSON = {"Content-Type": "application/json"}
#: Bodies wrong in each way the gateway checks (headers sent with them).
BAD_BODIES: dict[str, tuple[bytes, dict[str, str]]] = {
    "not-json": (b'{"title": "t", "content": ', JSON),
    "nul-in-a-string": (b'{"title": "a\\u0000", "content": "x", "attemptNo": 1}', JSON),
    "raw-nul": (b'{"title": "a\x00"}', JSON),
    "too-deep": (b"[" * 200 + b"]" * 200, JSON),
    "not-utf-8": (b'{"title": "\xff\xfe"}', JSON),
    "too-large": (b'{"title": "' + b"x" * (2 * MAX_BODY) + b'"}', JSON),
    "a-form": (b"title=t&content=x", {"Content-Type": "application/x-www-form-urlencoded"}),
    "wrong-shape": (b'{"unknown": [1, 2, 3], "attemptNo": "one", "events": 7}', JSON),
}


@dataclass(frozen=True)
class Operation:
    """One method of one route, with what the document says of it."""

    method: str
    template: str
    access: str  # "user", "admin" or "runtime"
    query: tuple[str, ...]
    headers: tuple[str, ...]
    has_body: bool
    closed_body: bool  # a model that refuses unknown keys (not a free JSON object)

    @property
    def path(self) -> str:
        return re.sub(r"\{[^}]+\}", "x", self.template)

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


def _access(template: str, operation: dict[str, Any]) -> str:
    schemes = {name for requirement in operation.get("security", []) for name in requirement}
    if schemes == {SERVICE_TOKEN_SCHEME}:
        return "runtime"
    assert schemes == {BEARER_SCHEME}, (template, schemes)
    return "admin" if template.startswith("/admin/") else "user"


def _closed_body(document: dict[str, Any], operation: dict[str, Any]) -> bool:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema", {})
    for option in [schema, *schema.get("anyOf", [])]:
        ref = option.get("$ref")
        if ref:
            name = ref.rsplit("/", 1)[-1]
            return document["components"]["schemas"][name].get("additionalProperties") is False
    return False


def operations(app: FastAPI) -> list[Operation]:
    """Every API route of ``app`` that needs a caller, as the document describes it.

    Fails when a route of a guarded area declares no security, or a route outside
    the document is not one of :data:`PUBLIC_HIDDEN`.
    """
    document = app.openapi()
    found: list[Operation] = []
    for context in iter_route_contexts(app.routes):
        if not isinstance(context.original_route, APIRoute):
            continue
        template = str(context.path)
        for method in sorted(context.methods or ()):
            operation = document["paths"].get(template, {}).get(method.lower())
            if operation is None:
                assert template in PUBLIC_HIDDEN, f"{method} {template} is not documented"
                continue
            if not operation.get("security"):
                assert not template.startswith(GUARDED_AREAS), f"{method} {template}: no security"
                continue
            params = operation.get("parameters", [])
            found.append(
                Operation(
                    method=method,
                    template=template,
                    access=_access(template, operation),
                    query=tuple(p["name"] for p in params if p["in"] == "query"),
                    headers=tuple(p["name"] for p in params if p["in"] == "header"),
                    has_body="requestBody" in operation,
                    closed_body=_closed_body(document, operation),
                )
            )
    return found


def _bad_params(op: Operation) -> tuple[dict[str, str], dict[str, str]]:
    """Query and header values outside any schema of the gateway: not a number, over
    every length limit, not an event id, with surrounding spaces."""
    junk = " " + "x" * 5000 + " "
    return {name: junk for name in op.query}, {name: junk for name in op.headers}


def _refused(op: Operation) -> dict[str, dict[str, str]]:
    """Credentials that must not get in: name → headers."""
    expired = make_token(OWNER, "admin", exp_in=-3600)
    forged = make_token(OWNER, "admin", secret=JWT_SECRET + "x")
    if op.access == "runtime":
        return {
            "no-key": {"X-Runtime-Instance-Id": "worker-a"},
            "wrong-key": runtime_headers(token=SERVICE_TOKEN + "x"),
            "a-user-token-as-key": runtime_headers(token=make_token()),
            "a-bearer-instead": {**bearer(make_token(role="admin")), "X-Runtime-Instance-Id": "w"},
        }
    return {
        "no-token": {},
        "expired": bearer(expired),
        "forged": bearer(forged),
        "the-service-token": bearer(SERVICE_TOKEN),
        "not-a-jwt": bearer("not.a.jwt"),
    }


def _admitted(op: Operation) -> dict[str, str]:
    if op.access == "runtime":
        return runtime_headers()
    return bearer(make_token(role="admin" if op.access == "admin" else "user"))


@pytest.fixture
async def gateway(backends: Backends) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        settings(MAX_BODY_BYTES=MAX_BODY),
        job_channel=grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}"),
        credential_channel=grpc.aio.insecure_channel(
            f"127.0.0.1:{backends.credential_server.port}"
        ),
    )
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


def _app(client: httpx.AsyncClient) -> FastAPI:
    app: FastAPI = client.app  # type: ignore[attr-defined]
    return app


def test_the_app_has_routes_of_every_kind_of_access() -> None:
    """The iteration below covers the whole API, not a corner of it."""
    ops = operations(create_app(settings()))
    by_access = {
        access: [op for op in ops if op.access == access] for access in ("user", "admin", "runtime")
    }
    assert len(by_access["user"]) >= 25
    assert len(by_access["admin"]) >= 9
    assert len(by_access["runtime"]) >= 12
    assert any(op.has_body for op in by_access["admin"])
    assert any(op.headers for op in by_access["runtime"])


async def _send(
    client: httpx.AsyncClient,
    op: Operation,
    headers: dict[str, str],
    body: bytes | None = None,
    body_headers: dict[str, str] | None = None,
    *,
    bad_params: bool = False,
) -> httpx.Response:
    query, param_headers = _bad_params(op) if bad_params else ({}, {})
    return await client.request(
        op.method,
        op.path,
        params=query,
        content=body,
        headers={**(body_headers or {}), **headers, **param_headers},
    )


def _assert_refused(resp: httpx.Response, status: int, what: str) -> None:
    assert resp.status_code == status, f"{what}: {resp.status_code} {resp.text[:300]}"
    body = resp.json()
    assert body["code"] == ("UNAUTHENTICATED" if status == 401 else "PERMISSION_DENIED"), what
    assert "fields" not in body["details"], what  # nothing about validation


async def test_no_route_validates_a_request_before_its_caller_is_known(
    gateway: httpx.AsyncClient, backends: Backends
) -> None:
    """401 for missing or wrong credentials, whatever is wrong with the request."""
    for op in operations(_app(gateway)):
        for who, headers in _refused(op).items():
            for kind, (body, body_headers) in BAD_BODIES.items():
                resp = await _send(gateway, op, headers, body, body_headers)
                _assert_refused(resp, 401, f"{op} {who} {kind}")
            resp = await _send(gateway, op, headers, bad_params=True)
            _assert_refused(resp, 401, f"{op} {who} bad-params")
    assert not backends.job.calls and not backends.credential.calls


async def test_a_user_token_on_an_admin_route_is_403_whatever_the_request(
    gateway: httpx.AsyncClient, backends: Backends
) -> None:
    """``POST /admin/ai/jobs`` with a user token and a NUL in ``params`` is 403, not a
    400 naming the field; so is every admin route with any malformed request."""
    user = bearer(make_token(role="user"))
    admin_ops = [op for op in operations(_app(gateway)) if op.access == "admin"]
    for op in admin_ops:
        for kind, (body, body_headers) in BAD_BODIES.items():
            resp = await _send(gateway, op, user, body, body_headers)
            _assert_refused(resp, 403, f"{op} user-token {kind}")
        _assert_refused(await _send(gateway, op, user, bad_params=True), 403, f"{op} params")
    nul_params = await gateway.post(
        "/admin/ai/jobs",
        json={
            "userId": OWNER,
            "jobType": "quiz_generation",
            "targetType": "user",
            "params": {"difficulty": "a\x00"},
        },
        headers=user,
    )
    _assert_refused(nul_params, 403, "POST /admin/ai/jobs with a NUL in params")
    assert not backends.job.calls


async def test_with_the_right_credentials_the_same_requests_are_refused_for_their_faults(
    gateway: httpx.AsyncClient, backends: Backends
) -> None:
    """The requests above are really malformed: let in, each is 400 (or 413 when too
    large) naming no caller problem."""
    for op in operations(_app(gateway)):
        admitted = _admitted(op)
        resp = await _send(gateway, op, admitted, bad_params=True)
        if op.query or op.headers:
            assert resp.status_code == 400, f"{op} bad-params: {resp.text[:300]}"
        if not op.has_body:
            continue
        for kind, (body, body_headers) in BAD_BODIES.items():
            if kind == "wrong-shape" and not op.closed_body:
                continue  # a free JSON object (the lock's {}) takes any keys
            resp = await _send(gateway, op, admitted, body, body_headers)
            expected = 413 if kind == "too-large" else 400
            assert resp.status_code == expected, f"{op} {kind}: {resp.text[:300]}"


def test_an_app_with_an_ungated_route_that_needs_a_caller_is_refused() -> None:
    """A route a future change might add on a router without the gate, or whose
    access comes with its inclusion (which the gate does not see): no app is built."""
    plain = APIRouter()

    @plain.post("/v1/sneaky")
    async def sneaky(principal: UserPrincipal, body: dict[str, Any]) -> None:
        """Needs a caller, on a plain router."""

    app = FastAPI()
    app.include_router(plain)
    with pytest.raises(RuntimeError, match="/v1/sneaky needs a caller but is not a GatedRoute"):
        check_routes(app.routes)

    gated = APIRouter(route_class=GatedRoute)

    @gated.get("/v1/inherits")
    async def inherits() -> None:
        """Its access comes from the inclusion."""

    app = FastAPI()
    app.include_router(gated, dependencies=[Depends(user_principal)])
    with pytest.raises(RuntimeError, match="takes an access dependency from its router"):
        check_routes(app.routes)
    app = FastAPI()
    app.include_router(gated)
    check_routes(app.routes)  # a route that needs no caller may be anything
