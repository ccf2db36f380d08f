"""The gateway's spans (reference §9.5): one server span per request, its backend calls
as client spans carrying the trace on, probes untraced, and no key, prompt text,
JWT or service token in any span, even with every header captured."""

from __future__ import annotations

import secrets

import httpx
import pytest
from opentelemetry.trace import SpanKind

from airuntime_common import tracing
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_server import insecure_or_tls_channel
from api_gateway.app import create_app
from tests.tracing_support import Capture, capture, leaks, new_traceparent, service_of
from tests.unit.api_gateway.conftest import (
    SERVICE_TOKEN,
    Backends,
    bearer,
    make_token,
    runtime_headers,
    settings,
)

__all__ = ["capture"]

CANARY_KEY = "sk-canary-" + secrets.token_hex(12)
CANARY_SENTENCE = "Purple herons of the canary marsh nest only in the winter rain."
CREATE = "/zhixi.airuntime.job.v1.JobService/CreateJob"


async def test_requests_are_server_spans_whose_backend_calls_carry_the_trace(
    backends: Backends, capture: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE", ".*")
    monkeypatch.delenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS", raising=False)
    traced = capture.setup("api_gateway")
    app = create_app(
        settings(),
        job_channel=insecure_or_tls_channel(
            f"127.0.0.1:{backends.job_server.port}", tracing=traced
        ),
        credential_channel=insecure_or_tls_channel(
            f"127.0.0.1:{backends.credential_server.port}", tracing=traced
        ),
    )
    jwt = make_token()
    user = bearer(jwt)
    client_trace, client_trace_id, client_span = new_traceparent()
    backends.job.errors["GetJob"] = AppError(ErrorCode.JOB_NOT_FOUND, "no such job")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        made = await c.post(
            "/v1/materials", json={"title": "Herons", "content": CANARY_SENTENCE}, headers=user
        )
        assert made.status_code == 201
        stored = await c.put(
            "/v1/me/model-credential",
            json={"provider": "deepseek", "apiKey": CANARY_KEY},
            headers=user,
        )
        assert stored.status_code == 200
        created = await c.post(
            "/v1/ai/jobs",
            json={"jobType": "quiz_generation", "targetType": "material", "targetId": "m1"},
            headers={**user, "traceparent": client_trace},
        )
        assert created.status_code == 201
        claimed = await c.post(
            "/internal/runtime/jobs/claim",
            json={"capabilities": ["quiz_generation"], "limit": 1},
            headers=runtime_headers(),
        )
        assert claimed.status_code == 200
        missing = await c.get("/v1/ai/jobs/job-1", headers=user)
        assert missing.status_code == 404
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
    await app.state.backends.job_channel.close()
    await app.state.backends.credential_channel.close()

    server = capture.one("POST /v1/ai/jobs")
    assert server.kind is SpanKind.SERVER and service_of(server) == "api_gateway"
    attributes = server.attributes or {}
    assert attributes["http.route"] == "/v1/ai/jobs"
    assert attributes["http.request.header.authorization"] == ("[REDACTED]",)
    # a client's own trace context is honoured: the request joins it
    assert server.context is not None and server.context.trace_id == client_trace_id
    assert server.parent is not None and server.parent.span_id == client_span
    call = capture.one(CREATE)
    assert call.kind is SpanKind.CLIENT and call.parent is not None
    assert call.parent.span_id == server.context.span_id
    assert call.context is not None
    sent = backends.job.last("CreateJob").metadata[tracing.TRACEPARENT]
    assert sent == f"00-{client_trace_id:032x}-{call.context.span_id:016x}-01"

    shim = capture.one("POST /internal/runtime/jobs/claim")
    assert (shim.attributes or {})["http.request.header.x_internal_api_key"] == ("[REDACTED]",)
    refused = capture.one("/zhixi.airuntime.job.v1.JobService/GetJob")
    assert (refused.attributes or {})["rpc.grpc.status_code"] == 5  # NOT_FOUND
    assert refused.status.description == "NOT_FOUND"  # the code, not the backend's message
    names = capture.names()
    assert not [n for n in names if "healthz" in n or "readyz" in n or "grpc.health" in n]
    assert not [n for n in names if n.endswith((" http send", " http receive"))]

    found = leaks(capture.spans(), [CANARY_KEY, CANARY_SENTENCE, SERVICE_TOKEN, jwt])
    assert not found, found
