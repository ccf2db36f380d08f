"""Every gRPC listener of the running system refuses calls without the service token (reference §1).

job_service, credential_service and runtime_worker, as real processes: no
``x-internal-api-key``, a wrong one, or a user's JWT in its place →
UNAUTHENTICATED (ErrorInfo reason ``UNAUTHENTICATED``), and the refused call
changed nothing; health and reflection answer without any token. Plus a code
check that every service-token comparison is constant time.
"""

from __future__ import annotations

import hmac
from typing import Any

import grpc
import httpx
import pytest

from airuntime_common import grpc_server
from airuntime_common.metadata import outgoing
from api_gateway import deps
from tests.security.conftest import System
from tests.security.grpc_probe import (
    SERVICES,
    SERVING,
    _credential,
    _job,
    _worker,
    expect_code,
    health,
    reflected_services,
)

pytestmark = pytest.mark.e2e
package_loop = pytest.mark.asyncio(loop_scope="package")


def _bad_metadata(sys_: System) -> dict[str, tuple[tuple[str, str], ...]]:
    token = sys_.service_token
    return {
        "none": (),
        "empty": (("x-internal-api-key", ""),),
        "wrong": (("x-internal-api-key", token + "x"),),
        "prefix": (("x-internal-api-key", token[:-1]),),
        "user-jwt": (("x-internal-api-key", sys_.token("u1", "admin")),),
        "as-bearer": (("authorization", f"Bearer {token}"),),
        "wrong-with-instance": (
            ("x-internal-api-key", "nope"),
            ("x-runtime-instance-id", "intruder-instance"),
        ),
    }


@package_loop
@pytest.mark.parametrize("service", list(SERVICES))
async def test_listener_refuses_missing_or_wrong_token(system: System, service: str) -> None:
    addr_var, full_name, calls, mutating = SERVICES[service]
    channel = grpc.aio.insecure_channel(system.env[addr_var])
    try:
        for label, md in _bad_metadata(system).items():
            for call in [*calls, mutating]:
                code, reason = await expect_code(call(channel, md))
                assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"), (
                    label,
                    call.__name__,
                )
        # health and reflection stay open: no metadata at all
        assert await health(channel) == SERVING
        assert await health(channel, full_name) == SERVING
        names = await reflected_services(channel)
        assert {full_name, "grpc.health.v1.Health"} <= names
        # positive control: the right token passes the interceptor
        good = outgoing(system.service_token, "sec-probe")
        for call in calls:
            if call is _credential:
                code, reason = await expect_code(call(channel, good))
                assert reason == "NOT_FOUND"  # reached the servicer: nothing stored
            else:
                await call(channel, good)
        # the refused calls changed nothing
        if service == "runtime_worker":
            status = await _worker(channel, good)
            assert not status.draining
        if service == "job_service":
            seen = await _job(channel, good)
            assert "intruder-instance" not in {w.instance_id for w in seen.workers}
    finally:
        await channel.close()


@package_loop
async def test_shim_and_gateway_never_take_a_wrong_service_token(system: System) -> None:
    """The REST shim is the same contract: wrong/missing key → 401 and no instance registered."""
    async with system.client() as client:
        for headers in (
            {"X-Runtime-Instance-Id": "intruder-rest"},
            {"x-internal-api-key": "nope", "X-Runtime-Instance-Id": "intruder-rest"},
            {
                "Authorization": f"Bearer {system.service_token}",
                "X-Runtime-Instance-Id": "intruder-rest",
            },
        ):
            resp = await client.post(
                "/internal/runtime/jobs/poll",
                json={"capabilities": ["quiz_generation"], "limit": 1},
                headers=headers,
            )
            assert resp.status_code == 401 and resp.json()["code"] == "UNAUTHENTICATED"
        health_resp = await client.get(
            "/internal/runtime/health", headers={"x-internal-api-key": system.service_token}
        )
        assert health_resp.status_code == 200
        assert "intruder-rest" not in {w["instanceId"] for w in health_resp.json()["workers"]}


# ------------------------------------------------------------------ constant-time comparison


class _Spy:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []
        self.real = hmac.compare_digest

    def __call__(self, a: Any, b: Any) -> bool:
        self.calls.append((a, b))
        return self.real(a, b)


async def test_grpc_interceptor_compares_the_token_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Code review made executable: the interceptor's only comparison is ``hmac.compare_digest``."""
    spy = _Spy()
    monkeypatch.setattr(hmac, "compare_digest", spy)
    server = grpc_server.GrpcServer(
        token="the-service-token",
        address="127.0.0.1:0",
        service_names=[],
        register=lambda s: None,
    )
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        code, _ = await expect_code(_job(channel, (("x-internal-api-key", "guess"),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        # the right token passes auth and then finds no such method
        code, _ = await expect_code(_job(channel, (("x-internal-api-key", "the-service-token"),)))
        assert code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await channel.close()
        await server.stop(0)
    assert (b"guess", b"the-service-token") in spy.calls
    assert (b"the-service-token", b"the-service-token") in spy.calls


def test_no_service_token_comparison_uses_equality() -> None:
    """No ``==``/``!=`` against the token anywhere it is checked (timing side channel)."""
    import inspect
    import re

    for module in (grpc_server, deps):
        source = inspect.getsource(module)
        assert "compare_digest" in source, module.__name__
        for line in source.splitlines():
            if re.search(r"(token|_token|RUNTIME_SERVICE_TOKEN|key)\b\s*[!=]=", line) or re.search(
                r"[!=]=\s*(self\._token|settings\.RUNTIME_SERVICE_TOKEN)", line
            ):
                raise AssertionError(f"{module.__name__}: non-constant-time compare: {line!r}")


async def test_gateway_shim_compares_the_token_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from api_gateway.app import create_app
    from api_gateway.settings import GatewaySettings

    spy = _Spy()
    monkeypatch.setattr(hmac, "compare_digest", spy)
    settings = GatewaySettings(RUNTIME_SERVICE_TOKEN="svc-token-123", JWT_SECRET="j" * 32)
    job = grpc.aio.insecure_channel("127.0.0.1:9")
    cred = grpc.aio.insecure_channel("127.0.0.1:9")
    app = create_app(settings, job_channel=job, credential_channel=cred)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            resp = await c.get(
                "/internal/runtime/health", headers={"x-internal-api-key": "svc-token-12X"}
            )
            assert resp.status_code == 401
            resp = await c.get("/v1/ai/jobs", headers={"Authorization": "Bearer svc-token-123"})
            assert resp.status_code == 401
    finally:
        await job.close()
        await cred.close()
    assert (b"svc-token-12X", b"svc-token-123") in spy.calls
    assert (b"svc-token-123", b"svc-token-123") in spy.calls
