"""The worker's spans (reference §9.5): an attempt joins its job's trace, names and
attributes as documented, and no key, prompt or body in any span.

The worker runs for real (DeepSeek provider over httpx, gRPC clients) against the
fake JobService / CredentialService and a raw HTTP model; the fake's claimed
``Job`` carries ``trace_parent`` as job_service will store it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from airuntime_common import metadata, tracing
from airuntime_common.errors import ErrorCode
from runtime_worker.app import WorkerApp
from runtime_worker.spans import (
    JOB_ATTEMPT,
    JOB_ERROR_CODE,
    JOB_ID,
    JOB_TYPE_ATTR,
    MODEL_PROVIDER,
    PROMPT_VERSION,
)
from tests.tracing_support import Capture, capture, leaks, new_traceparent
from tests.unit.runtime_worker.rw_helpers import (
    QUIZ_OUTPUT,
    FakeBackend,
    envelope,
    make_job,
    snapshot_payload,
    worker_settings,
    write_response,
)

__all__ = ["capture"]

Backend = tuple[FakeBackend, int, int]

CANARY_KEY = "sk-canary-" + secrets.token_hex(12)
CANARY_SENTENCE = "Purple herons of the canary marsh nest only in the winter rain."
ATTEMPT_SPANS = ("attempt", "claim", "resolve", "model call")


@pytest.fixture
async def apps() -> AsyncIterator[list[WorkerApp]]:
    started: list[WorkerApp] = []
    yield started
    for app in started:
        if app.server is not None and not app.worker.draining:
            await app.stop(0.1)


def canary_output() -> dict[str, Any]:
    """A quiz answer quoting the canary sentence, as a model quoting the material would."""
    out = json.loads(json.dumps(QUIZ_OUTPUT))
    out["items"][0]["explanation"] = CANARY_SENTENCE
    return out


def canary_job(job_id: str, attempt_no: int, trace_parent: str | None) -> Any:
    job = make_job(job_id, attempt_no)
    if trace_parent is not None:
        job.trace_parent = trace_parent
    return job


def canary_snapshot() -> dict[str, Any]:
    payload = snapshot_payload()
    payload["blocks"][0]["text"] = CANARY_SENTENCE
    return payload


def record_traceparents(b: FakeBackend) -> dict[str, list[str | None]]:
    """Wrap the fake's call log so it keeps each call's incoming ``traceparent``."""
    seen: dict[str, list[str | None]] = {}
    enter = b.enter

    async def recording(name: str, request: Any, context: Any) -> None:
        seen.setdefault(name, []).append(metadata.get(context, tracing.TRACEPARENT))
        await enter(name, request, context)

    b.enter = recording  # type: ignore[method-assign]
    return seen


async def start_worker(backend: Backend, apps: list[WorkerApp], **overrides: Any) -> WorkerApp:
    _, job_port, cred_port = backend
    app = WorkerApp(worker_settings(job_port, cred_port, **overrides))  # real DeepSeek provider
    await app.start()
    apps.append(app)
    return app


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def job_spans(spans: list[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == trace_id]


async def test_an_attempt_joins_the_jobs_trace_without_key_prompt_or_body(
    backend: Backend,
    apps: list[WorkerApp],
    raw_http: Any,
    capture: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an operator asking for every header must still never see the key
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST", ".*")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE", ".*")
    monkeypatch.delenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS", raising=False)
    b = backend[0]
    b.api_key = CANARY_KEY
    b.answer_snapshots = True  # the claim starts the job and carries its snapshot
    seen = record_traceparents(b)

    async def model(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope(json.dumps(canary_output())))

    http = await raw_http(model)
    b.base_url = http.base_url
    trace_parent, trace_id, create_span_id = new_traceparent()
    b.add_job(canary_job("job-t1", 1, trace_parent), canary_snapshot())
    capture.setup("runtime_worker")
    app = await start_worker(backend, apps)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)
    await app.stop(0.1)

    # the prompt really carried the canary, and the key really went out
    assert CANARY_SENTENCE in json.dumps(http.requests[0]["json"])
    assert http.requests[0]["headers"]["authorization"] == f"Bearer {CANARY_KEY}"

    spans = job_spans(capture.spans(), trace_id)
    attempt = next(s for s in spans if s.name == "attempt")
    assert attempt.parent is not None and attempt.parent.is_remote
    assert attempt.parent.span_id == create_span_id  # the create's span is the parent
    steps = {s.name: s for s in children(spans, attempt)}
    assert set(steps) == {"claim", "resolve", "model call", "result"}
    for span in (attempt, *steps.values()):
        assert span.resource.attributes["service.name"] == "runtime_worker"
        assert span.attributes is not None
        assert span.attributes[JOB_ID] == "job-t1"
        assert span.attributes[JOB_ATTEMPT] == 1
        assert span.attributes[JOB_TYPE_ATTR] == "quiz_generation"
        assert span.attributes[PROMPT_VERSION] == "quiz_generation.v1"
        assert span.attributes[MODEL_PROVIDER] == "deepseek"
        assert span.status.status_code is not StatusCode.ERROR
    assert steps["claim"].start_time is not None and steps["claim"].end_time is not None
    assert steps["claim"].start_time <= steps["claim"].end_time <= steps["resolve"].end_time  # type: ignore[operator]

    # the calls under each step: gRPC client spans, the httpx span of the model call
    (resolve_rpc,) = children(spans, steps["resolve"])
    assert resolve_rpc.name == "/zhixi.airuntime.credential.v1.CredentialService/ResolveCredential"
    assert resolve_rpc.kind is SpanKind.CLIENT
    (http_span,) = children(spans, steps["model call"])
    assert http_span.kind is SpanKind.CLIENT and http_span.name == "POST"
    assert http_span.attributes is not None
    assert http_span.attributes["http.request.header.authorization"] == ("[REDACTED]",)
    model = steps["model call"].attributes
    assert model is not None
    assert model["gen_ai.request.model"] == "deepseek-chat"
    assert model["gen_ai.usage.input_tokens"] == 100
    assert model["gen_ai.usage.output_tokens"] == 20
    (submit_rpc,) = children(spans, steps["result"])
    assert submit_rpc.name == "/zhixi.airuntime.job.v1.JobService/SubmitResult"

    # the next service hears the same trace: each call sent its own span as parent
    assert resolve_rpc.context is not None and submit_rpc.context is not None
    assert seen["ResolveCredential"] == [
        f"00-{trace_id:032x}-{resolve_rpc.context.span_id:016x}-01"
    ]
    assert seen["SubmitResult"] == [f"00-{trace_id:032x}-{submit_rpc.context.span_id:016x}-01"]

    found = leaks(capture.spans(), [CANARY_KEY, CANARY_SENTENCE, json.dumps(canary_output())])
    assert not found, found


async def test_every_attempt_of_a_job_hangs_under_the_create(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, capture: Capture
) -> None:
    """Attempt 1 fails (HTTP 500, retryable), attempt 2 succeeds: one trace, two attempts."""
    b = backend[0]
    answers = [
        (500, b'{"error":{"message":"overloaded"}}'),
        (200, envelope(json.dumps(QUIZ_OUTPUT))),
    ]

    async def model(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        status, body = answers.pop(0)
        await write_response(w, status, body)

    http = await raw_http(model)
    b.base_url = http.base_url
    b.answer_snapshots = False  # an answer with no room for them: each attempt reads its own
    trace_parent, trace_id, create_span_id = new_traceparent()
    b.add_job(canary_job("job-t2", 1, trace_parent))
    b.add_job(canary_job("job-t2", 2, trace_parent))
    capture.setup("runtime_worker")
    app = await start_worker(backend, apps, WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1 and bool(b.fails))
    await app.stop(0.1)

    spans = job_spans(capture.spans(), trace_id)
    attempts = sorted(
        (s for s in spans if s.name == "attempt"),
        key=lambda s: (s.attributes or {})[JOB_ATTEMPT],
    )
    assert [(s.attributes or {})[JOB_ATTEMPT] for s in attempts] == [1, 2]
    for span in attempts:
        assert span.parent is not None and span.parent.span_id == create_span_id
    first = {s.name: s for s in children(spans, attempts[0])}
    second = {s.name: s for s in children(spans, attempts[1])}
    # without a snapshot in the claim's answer, the attempt reads it (a gRPC client span)
    snapshot = "/zhixi.airuntime.job.v1.JobService/GetSnapshot"
    assert set(first) == {"claim", snapshot, "resolve", "model call", "fail"}
    assert set(second) == {"claim", snapshot, "resolve", "model call", "result"}
    code = ErrorCode.TEMPORARY_PROVIDER_ERROR
    assert (first["model call"].attributes or {})["error.type"] == code
    assert first["model call"].status.status_code is StatusCode.ERROR
    assert (first["fail"].attributes or {})[JOB_ERROR_CODE] == code
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert (attempts[0].attributes or {})["error.type"] == code
    assert attempts[1].status.status_code is not StatusCode.ERROR
    # the model's error text is not a span's business
    assert not leaks(capture.spans(), ["overloaded"])


async def test_a_job_stored_without_trace_context_still_gets_one_trace_per_attempt(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, capture: Capture
) -> None:
    b = backend[0]

    async def model(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope(json.dumps(QUIZ_OUTPUT)))

    http = await raw_http(model)
    b.base_url = http.base_url
    b.add_job(canary_job("job-t3", 1, None))
    capture.setup("runtime_worker")
    app = await start_worker(backend, apps)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)
    await app.stop(0.1)

    attempt = capture.one("attempt")
    assert attempt.parent is None  # a root of its own
    assert attempt.context is not None
    in_trace = job_spans(capture.spans(), attempt.context.trace_id)
    assert {s.name for s in in_trace} >= {*ATTEMPT_SPANS, "result", "POST"}


async def test_claim_loop_spans_are_not_a_jobs_and_a_claimed_next_job_starts_its_own(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, capture: Capture
) -> None:
    """A job claimed while the previous job's result reports (its slot handed on) joins
    its own create's trace, not the previous job's."""
    b = backend[0]

    async def model(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope(json.dumps(QUIZ_OUTPUT)))

    http = await raw_http(model)
    b.base_url = http.base_url
    first_tp, first_trace, _ = new_traceparent(0x11111111111111111111111111111111)
    second_tp, second_trace, second_parent = new_traceparent(0x22222222222222222222222222222222)
    b.add_job(canary_job("job-a", 1, first_tp))
    b.add_job(canary_job("job-b", 1, second_tp))
    capture.setup("runtime_worker")
    app = await start_worker(backend, apps, WORKER_CONCURRENCY=1)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 2)
    await app.stop(0.1)

    assert b.names().count("ClaimJobs") >= 2
    b_attempt = next(s for s in capture.named("attempt") if (s.attributes or {})[JOB_ID] == "job-b")
    assert b_attempt.context is not None and b_attempt.context.trace_id == second_trace
    assert b_attempt.parent is not None and b_attempt.parent.span_id == second_parent
    assert all(
        (s.attributes or {}).get(JOB_ID) != "job-b" for s in job_spans(capture.spans(), first_trace)
    )


async def test_tracing_off_installs_nothing_in_the_worker(
    backend: Backend, apps: list[WorkerApp], raw_http: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tracing.reset()
    b = backend[0]
    seen = record_traceparents(b)

    async def model(_req: dict[str, Any], w: asyncio.StreamWriter) -> None:
        await write_response(w, 200, envelope(json.dumps(QUIZ_OUTPUT)))

    http = await raw_http(model)
    b.base_url = http.base_url
    b.add_job(canary_job("job-off", 1, new_traceparent()[0]))
    app = await start_worker(backend, apps)
    await b.wait_for(lambda: app.worker.counters["succeeded"] == 1)
    assert app.tracing is None and tracing.current() is None
    assert app.worker.spans.start(make_job("x"), None) is not None  # the shared no-op
    # no interceptor sent trace context, no hook wrapped the model's client
    assert set(seen["SubmitResult"]) == {None} and set(seen["ResolveCredential"]) == {None}
    assert "traceparent" not in http.requests[0]["headers"]
