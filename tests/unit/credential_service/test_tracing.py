"""credential_service's spans (reference §9.5): a server span per call joined to the
caller's trace, its lease check a client span of it, the final status right,
and no key (nor the service token) in any span.

The fake job_service plays job_service in this process: it is set up first, as
the process's tracing, which servers made without an explicit one use.
"""

from __future__ import annotations

import secrets

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import SpanKind, StatusCode

from airuntime_common import metadata, tracing
from tests.tracing_support import Capture, capture, leaks, new_traceparent, service_of
from tests.unit.credential_service.conftest import INSTANCE, TOKEN, Lease, StartFn
from zhixi.airuntime.credential.v1 import request_response_pb2 as rr

__all__ = ["capture"]

CANARY_KEY = "sk-canary-" + secrets.token_hex(12)
RESOLVE = "/zhixi.airuntime.credential.v1.CredentialService/ResolveCredential"


async def test_resolve_joins_the_workers_trace_and_no_key_is_recorded(
    start_env: StartFn, capture: Capture
) -> None:
    capture.setup("job_service")  # the fake job_service's servers take the process's
    capture.setup("credential_service")
    env = await start_env()
    put = await env.stub.PutCredential(
        rr.PutCredentialRequest(user_id="u1", provider="deepseek", api_key=CANARY_KEY),
        metadata=env.md(None),
    )
    env.fake.hold("job-1", INSTANCE, 1, Lease("u1", credential_id=put.credential.credential_id))
    trace_parent, trace_id, worker_span = new_traceparent()
    answer = await env.stub.ResolveCredential(
        rr.ResolveCredentialRequest(job_id="job-1", attempt_no=1),
        metadata=(*env.md(), (tracing.TRACEPARENT, trace_parent)),
    )
    assert answer.api_key == CANARY_KEY  # the key really went through
    health = health_pb2_grpc.HealthStub(env.channel)
    await health.Check(health_pb2.HealthCheckRequest(service=""))

    await capture.ended("/zhixi.airuntime.job.v1.JobService/VerifyLease")
    (server,) = await capture.ended(RESOLVE)
    assert server.kind is SpanKind.SERVER and service_of(server) == "credential_service"
    assert server.context is not None and server.context.trace_id == trace_id
    assert server.parent is not None and server.parent.span_id == worker_span
    assert (server.attributes or {})["rpc.grpc.status_code"] == 0
    # its lease check: client spans of the resolve, each answered by job_service's span
    checks = [
        s
        for s in capture.spans()
        if s.kind is SpanKind.CLIENT and s.parent and s.parent.span_id == server.context.span_id
    ]
    assert checks and all(service_of(s) == "credential_service" for s in checks)
    answered = [
        s
        for s in capture.spans()
        if s.kind is SpanKind.SERVER
        and s.name == "/zhixi.airuntime.job.v1.JobService/VerifyLease"
        and s.parent is not None
        and s.parent.span_id in {c.context.span_id for c in checks if c.context is not None}
    ]
    assert answered and service_of(answered[0]) == "job_service"
    assert answered[0].context is not None and answered[0].context.trace_id == trace_id

    assert capture.one("/zhixi.airuntime.credential.v1.CredentialService/PutCredential")
    assert not [s for s in capture.spans() if "grpc.health" in s.name]
    found = leaks(capture.spans(), [CANARY_KEY, TOKEN])
    assert not found, found


@pytest.mark.parametrize(
    ("token", "code", "reason"),
    [
        (TOKEN, grpc.StatusCode.FAILED_PRECONDITION, "LOCK_NOT_HELD"),
        ("not-the-token-0123456789", grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    ],
)
async def test_a_refused_call_is_recorded_with_its_status_and_code(
    start_env: StartFn, capture: Capture, token: str, code: grpc.StatusCode, reason: str
) -> None:
    capture.setup("credential_service")
    env = await start_env()
    env.fake.hold("job-1", "someone-else", 1, Lease("u1"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await env.stub.ResolveCredential(
            rr.ResolveCredentialRequest(job_id="job-1", attempt_no=1),
            metadata=metadata.outgoing(token, INSTANCE),
        )
    assert refused.value.code() is code

    (server,) = await capture.ended(RESOLVE)
    attributes = server.attributes or {}
    assert attributes["rpc.grpc.status_code"] == code.value[0]
    assert attributes["error.type"] == reason
    # the caller's mistake, not the server's: no error status (semantic conventions)
    assert server.status.status_code is not StatusCode.ERROR
    assert not leaks(capture.spans(), [token])
