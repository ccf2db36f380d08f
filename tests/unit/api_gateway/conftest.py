"""Fixtures of the gateway tests: fake gRPC backends on ephemeral ports, the app, tokens.

The fakes are real ``grpc.aio`` servers (with the shared auth interceptor,
health and reflection) whose servicers answer canned protos, record every
call with its metadata, and can be told to fail a method with a rich
:class:`AppError` (``errors``) or a bare gRPC status (``raw_errors``), or to
answer a method only after some seconds (``delays``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
import httpx
import jwt
import pytest
from fastapi import FastAPI
from google.protobuf import struct_pb2

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.grpc_server import GrpcServer
from airuntime_common.timeutil import to_timestamp
from api_gateway.app import create_app
from api_gateway.backends import Backends as GatewayBackends
from api_gateway.settings import GatewaySettings
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.credential.v1 import message_pb2 as cred_msg
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.credential.v1 import service_pb2 as cred_service
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2 as job_service
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc
from zhixi.airuntime.worker.v1 import request_response_pb2 as worker_rr
from zhixi.airuntime.worker.v1 import service_pb2 as worker_service
from zhixi.airuntime.worker.v1 import service_pb2_grpc as worker_grpc

SERVICE_TOKEN = "svc-token-0123456789abcdef"
JWT_SECRET = "jwt-secret-for-tests-0123456789abcdef"
OWNER = "u1"
OTHER = "u2"
ADMIN = "admin1"
JOB_ID = "job-1"
T0 = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


# ------------------------------------------------------------------ tokens


def make_token(
    sub: str = OWNER,
    role: str = "user",
    *,
    exp_in: int = 3600,
    secret: str = JWT_SECRET,
    **claims: Any,
) -> str:
    """An HS256 JWT with ``sub``, ``role`` and ``exp`` (``exp_in`` seconds from now)."""
    payload: dict[str, Any] = {"sub": sub, "role": role, "exp": int(time.time()) + exp_in}
    payload.update(claims)
    return jwt.encode(payload, secret, algorithm="HS256")


def none_alg_token(sub: str = ADMIN, role: str = "admin") -> str:
    """An unsigned ``alg=none`` token."""

    def b64(data: dict[str, Any]) -> str:
        raw = json.dumps(data).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return (
        b64({"alg": "none", "typ": "JWT"})
        + "."
        + b64({"sub": sub, "role": role, "exp": int(time.time()) + 3600})
        + "."
    )


def bearer(token: str) -> dict[str, str]:
    """Authorization header for ``token``."""
    return {"Authorization": f"Bearer {token}"}


def runtime_headers(
    instance: str | None = "worker-a", token: str = SERVICE_TOKEN
) -> dict[str, str]:
    """Shim headers."""
    h = {"x-internal-api-key": token}
    if instance is not None:
        h["X-Runtime-Instance-Id"] = instance
    return h


# ------------------------------------------------------------------ canned protos


def full_job(**overrides: Any) -> msg.Job:
    """A job with every field set."""
    params = struct_pb2.Struct()
    params.update({"count": 5, "difficulty": "medium", "questionTypes": ["single_choice"]})
    job = msg.Job(
        job_id=JOB_ID,
        user_id=OWNER,
        job_type=common_pb2.JOB_TYPE_QUIZ_GENERATION,
        target_type=common_pb2.TARGET_TYPE_MATERIAL,
        target_id="m1",
        snapshot_id="snap-1",
        status=common_pb2.JOB_STATUS_RUNNING,
        priority=0,
        params=params,
        api_key_mode=common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY,
        credential_id="cred-1",
        model_provider="deepseek",
        model_name="deepseek-chat",
        prompt_version="quiz_generation.v1",
        output_schema_version="v1",
        attempt_no=1,
        retry_count=0,
        max_retry_count=3,
        timeout_seconds=120,
        locked_by="worker-a",
        lock_until=to_timestamp(T0),
        available_at=to_timestamp(T0),
        cancel_requested=False,
        error_code="MODEL_TIMEOUT",
        error_message="slow",
        retried_from_job_id="job-0",
        created_at=to_timestamp(T0),
        updated_at=to_timestamp(T0),
        started_at=to_timestamp(T0),
        finished_at=to_timestamp(T0),
    )
    for k, v in overrides.items():
        setattr(job, k, v)
    return job


def sparse_job() -> msg.Job:
    """A freshly created job: optional fields unset."""
    return msg.Job(
        job_id=JOB_ID,
        user_id=OWNER,
        job_type=common_pb2.JOB_TYPE_LEARNING_STATE_ANALYSIS,
        target_type=common_pb2.TARGET_TYPE_USER,
        target_id=OWNER,
        status=common_pb2.JOB_STATUS_PENDING,
        api_key_mode=common_pb2.API_KEY_MODE_PLATFORM_KEY,
        model_provider="deepseek",
        model_name="deepseek-chat",
        max_retry_count=3,
        timeout_seconds=120,
        available_at=to_timestamp(T0),
        created_at=to_timestamp(T0),
        updated_at=to_timestamp(T0),
    )


def parent_job() -> msg.Job:
    """A batch's parent (reference §10.3): three children, one leased."""
    job = sparse_job()
    job.job_id = "parent-1"
    job.status = common_pb2.JOB_STATUS_RUNNING
    job.batch.CopyFrom(msg.JobBatch(total=3, pending=2, running=1, min_success_ratio=0.5))
    return job


def _owned(request: Any, job: msg.Job) -> None:
    if request.HasField("user_id") and request.user_id != job.user_id:
        raise AppError(ErrorCode.JOB_NOT_FOUND, "job not found")


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def job_defaults() -> dict[str, Any]:
    """Canned answers of every JobService method."""
    breaker = msg.CircuitBreaker(state=msg.BREAKER_STATE_CLOSED, consecutive_failures=0)
    material = msg.Material(
        material_id="m1",
        user_id=OWNER,
        title="t",
        blocks=[msg.Block(block_id="b1", ordinal=0, text="hello")],
        created_at=to_timestamp(T0),
    )

    def get_job(req: Any) -> Any:
        job = full_job()
        _owned(req, job)
        resp = rr.GetJobResponse(job=job)
        if req.include_history:
            resp.events.append(
                msg.JobEvent(
                    job_id=JOB_ID,
                    to_status=common_pb2.JOB_STATUS_PENDING,
                    actor="user:u1",
                    at=to_timestamp(T0),
                )
            )
            resp.events.append(
                msg.JobEvent(
                    job_id=JOB_ID,
                    from_status=common_pb2.JOB_STATUS_PENDING,
                    to_status=common_pb2.JOB_STATUS_LOCKED,
                    actor="runtime:worker-a",
                    attempt_no=1,
                    at=to_timestamp(T0),
                    model_provider="deepseek",
                )
            )
            resp.invocations.append(
                msg.Invocation(
                    id="inv-1",
                    job_id=JOB_ID,
                    attempt_no=1,
                    model_provider="deepseek",
                    model_name="deepseek-chat",
                    api_key_mode=common_pb2.API_KEY_MODE_PLATFORM_KEY,
                    prompt_tokens=10,
                    completion_tokens=5,
                    outcome="succeeded",
                    cost_usd=0.0012,
                    created_at=to_timestamp(T0),
                )
            )
        return resp

    def cancel(req: Any) -> Any:
        job = full_job()
        _owned(req, job)
        return rr.CancelJobResponse(job=full_job(cancel_requested=True))

    def result(req: Any) -> Any:
        _owned(req, full_job())
        return rr.GetJobResultResponse(
            job_id=JOB_ID,
            job_type=common_pb2.JOB_TYPE_FLASHCARD_GENERATION,
            output_schema_version="v1",
            items=[_struct({"front": "f", "back": "b", "sourceBlockIds": ["b1"]})],
        )

    return {
        "CreateJob": lambda req: rr.CreateJobResponse(job=sparse_job(), replayed=False),
        "CreateJobBatch": lambda req: rr.CreateJobBatchResponse(job=parent_job(), replayed=False),
        "GetJob": get_job,
        "ListJobs": rr.ListJobsResponse(jobs=[full_job(), sparse_job()], next_page_token=""),
        "CancelJob": cancel,
        "RerunJob": rr.RerunJobResponse(job=full_job(job_id="job-2", retried_from_job_id=JOB_ID)),
        "GetJobResult": result,
        "ListResultItems": rr.ListResultItemsResponse(
            items=[_struct({"stem": "q", "count": 3})], next_page_token="tok-2"
        ),
        "GetAiAuthorization": rr.GetAiAuthorizationResponse(granted=True),
        "SetAiAuthorization": lambda req: rr.SetAiAuthorizationResponse(
            granted=req.granted,
            changed_at=to_timestamp(T0),
            cancelled=0 if req.granted else 2,
            cancel_requested=0 if req.granted else 1,
        ),
        "CreateMaterial": rr.CreateMaterialResponse(material=material),
        "GetMaterial": rr.GetMaterialResponse(material=material),
        "CreateKnowledgePoint": rr.CreateKnowledgePointResponse(
            knowledge_point=msg.KnowledgePoint(
                knowledge_point_id="kp1",
                user_id=OWNER,
                material_id="m1",
                name="kp",
                block_ids=["b1"],
            )
        ),
        "RecordLearningEvents": lambda req: rr.RecordLearningEventsResponse(
            accepted=len(req.events), duplicates=0
        ),
        "GetCosts": rr.GetCostsResponse(
            rows=[msg.CostRow(key="2026-11-30", calls=2, prompt_tokens=100, cost_usd=0.25)]
        ),
        "GetCircuitBreaker": rr.GetCircuitBreakerResponse(breaker=breaker),
        "ResetCircuitBreaker": rr.ResetCircuitBreakerResponse(breaker=breaker),
        "GetJobThroughput": rr.GetJobThroughputResponse(),
        "PollJobs": rr.PollJobsResponse(jobs=[sparse_job()]),
        "ClaimJobs": rr.ClaimJobsResponse(jobs=[full_job()]),
        "LockJob": rr.LockJobResponse(
            job_id=JOB_ID,
            status=common_pb2.JOB_STATUS_LOCKED,
            locked_by="worker-a",
            lock_until=to_timestamp(T0),
            attempt_no=1,
        ),
        "StartJob": rr.StartJobResponse(
            status=common_pb2.JOB_STATUS_RUNNING, started_at=to_timestamp(T0)
        ),
        "Heartbeat": rr.HeartbeatResponse(lock_until=to_timestamp(T0), cancel_requested=True),
        "HeartbeatLeases": lambda req: rr.HeartbeatLeasesResponse(
            leases=[
                msg.LeaseState(
                    job_id=lease.job_id,
                    attempt_no=lease.attempt_no,
                    held=i == 0,
                    lock_until=to_timestamp(T0) if i == 0 else None,
                )
                for i, lease in enumerate(req.leases)
            ]
        ),
        "GetSnapshot": rr.GetSnapshotResponse(
            snapshot_id="snap-1",
            schema_version="v1",
            target_type=common_pb2.TARGET_TYPE_MATERIAL,
            target_id="m1",
            payload=_struct({"jobType": "quiz_generation", "blocks": [{"ordinal": 0}]}),
            content_hash="abc",
        ),
        "SubmitResult": rr.SubmitResultResponse(
            job_id=JOB_ID,
            status=common_pb2.JOB_STATUS_SUCCEEDED,
            result_id="res-1",
            output_hash="h",
            replayed=False,
        ),
        "FailJob": rr.FailJobResponse(
            job_id=JOB_ID, status=common_pb2.JOB_STATUS_PENDING, retry_count=1
        ),
        "RecordInvocation": rr.RecordInvocationResponse(id="inv-9"),
        "GetRuntimeHealth": rr.GetRuntimeHealthResponse(
            status="SERVING",
            workers=[
                msg.RuntimeWorker(
                    instance_id="worker-a",
                    capabilities=[common_pb2.JOB_TYPE_QUIZ_GENERATION],
                    in_flight=1,
                    last_seen_at=to_timestamp(T0),
                    status="alive",
                )
            ],
        ),
        "VerifyLease": rr.VerifyLeaseResponse(),
    }


def credential_defaults() -> dict[str, Any]:
    """Canned answers of every CredentialService method."""
    cred = cred_msg.Credential(
        credential_id="cred-1",
        user_id=OWNER,
        provider="deepseek",
        masked_key="sk-****1234",
        status=cred_msg.CREDENTIAL_STATUS_VALID,
        created_at=to_timestamp(T0),
    )
    return {
        "PutCredential": cred_rr.PutCredentialResponse(credential=cred),
        "GetCredential": cred_rr.GetCredentialResponse(credential=cred),
        "DeleteCredential": cred_rr.DeleteCredentialResponse(),
        "ResolveCredential": cred_rr.ResolveCredentialResponse(
            api_key_mode=common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY,
            credential_id="cred-1",
            api_key="sk-live-secret-1234",
            model_provider="deepseek",
            model_name="deepseek-chat",
            base_url="http://127.0.0.1:9/v1",
        ),
        "MarkCredentialInvalid": cred_rr.MarkCredentialInvalidResponse(),
        "RotateKeys": cred_rr.RotateKeysResponse(),
        "CheckCredential": cred_rr.CheckCredentialResponse(usable=True),
    }


# ------------------------------------------------------------------ fake servers


@dataclass
class Call:
    """One recorded RPC."""

    method: str
    request: Any
    metadata: dict[str, str]


@dataclass
class Fake:
    """A fake servicer: canned answers, injectable failures, recorded calls."""

    responses: dict[str, Any]
    errors: dict[str, AppError] = field(default_factory=dict)
    raw_errors: dict[str, grpc.StatusCode] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def last(self, method: str) -> Call:
        """The most recent call of ``method``."""
        for c in reversed(self.calls):
            if c.method == method:
                return c
        raise AssertionError(f"{method} was not called; calls: {[c.method for c in self.calls]}")

    def handler(self, name: str) -> Callable[..., Any]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            md = {m.key: m.value for m in context.invocation_metadata() or ()}
            self.calls.append(Call(name, request, md))
            if name in self.delays:
                await asyncio.sleep(self.delays[name])
            if name in self.errors:
                await abort(context, self.errors[name])
            if name in self.raw_errors:
                await context.abort(self.raw_errors[name], "raw failure")
            answer = self.responses[name]
            try:
                return answer(request) if callable(answer) else answer
            except AppError as err:
                await abort(context, err)

        return handle


def _servicer(base: type, service_descriptor: Any, fake: Fake) -> Any:
    servicer = base()
    for method in service_descriptor.methods:
        setattr(servicer, method.name, fake.handler(method.name))
    return servicer


@dataclass
class Backends:
    """The running fakes."""

    job: Fake
    credential: Fake
    job_server: GrpcServer
    credential_server: GrpcServer


async def start_fake(
    base: type, descriptor: Any, add: Callable[[Any, Any], None], fake: Fake
) -> GrpcServer:
    """Serve ``fake`` as ``descriptor``'s service on an ephemeral port."""
    servicer = _servicer(base, descriptor, fake)
    server = GrpcServer(
        token=SERVICE_TOKEN,
        address="127.0.0.1:0",
        service_names=[descriptor.full_name],
        register=lambda s: add(servicer, s),
    )
    await server.start()
    return server


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    """Fake job_service and credential_service."""
    job = Fake(job_defaults())
    cred = Fake(credential_defaults())
    job_server = await start_fake(
        job_grpc.JobServiceServicer,
        job_service.DESCRIPTOR.services_by_name["JobService"],
        job_grpc.add_JobServiceServicer_to_server,
        job,
    )
    cred_server = await start_fake(
        cred_grpc.CredentialServiceServicer,
        cred_service.DESCRIPTOR.services_by_name["CredentialService"],
        cred_grpc.add_CredentialServiceServicer_to_server,
        cred,
    )
    yield Backends(job, cred, job_server, cred_server)
    await job_server.stop(0)
    await cred_server.stop(0)


def settings(**overrides: Any) -> GatewaySettings:
    """Gateway settings for tests."""
    values: dict[str, Any] = {
        "RUNTIME_SERVICE_TOKEN": SERVICE_TOKEN,
        "JWT_SECRET": JWT_SECRET,
        "GRPC_TIMEOUT_SECONDS": 3.0,
    }
    values.update(overrides)
    return GatewaySettings(**values)


@pytest.fixture(scope="session")
def shared_app() -> FastAPI:
    """One app for the whole session (FastAPI prepares each route on its first request
    per app, which is slow); each test plugs its own fake backends into it."""
    return create_app(settings())


def connect(app: FastAPI, backends: Backends) -> GatewayBackends:
    """Point ``app`` at the fakes (channels owned by the returned object's caller)."""
    job_channel = grpc.aio.insecure_channel(f"127.0.0.1:{backends.job_server.port}")
    cred_channel = grpc.aio.insecure_channel(f"127.0.0.1:{backends.credential_server.port}")
    gateway_backends = GatewayBackends(
        app.state.settings, job_channel, cred_channel, owns_channels=True
    )
    app.state.backends = gateway_backends
    return gateway_backends


@pytest.fixture
async def client(backends: Backends, shared_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the shared app, wired to this test's fakes."""
    gateway_backends = connect(shared_app, backends)
    transport = httpx.ASGITransport(app=shared_app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            c.app = shared_app  # type: ignore[attr-defined]
            yield c
    finally:
        shared_app.state.backends = None
        await gateway_backends.aclose()


class FakeWorker(worker_grpc.WorkerStatusServiceServicer):  # type: ignore[misc]
    """A worker status service answering a fixed status."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id

    async def GetStatus(self, request: Any, context: Any) -> Any:
        return worker_rr.GetStatusResponse(
            instance_id=self.instance_id,
            version="1.2.3",
            capabilities=[common_pb2.JOB_TYPE_QUIZ_GENERATION],
            counters={"succeeded": 4},
            concurrency=8,
            started_at=to_timestamp(T0),
        )


async def start_worker(instance_id: str) -> GrpcServer:
    """A fake worker status server on an ephemeral port."""
    servicer = FakeWorker(instance_id)
    server = GrpcServer(
        token=SERVICE_TOKEN,
        address="127.0.0.1:0",
        service_names=[worker_service.DESCRIPTOR.services_by_name["WorkerStatusService"].full_name],
        register=lambda s: worker_grpc.add_WorkerStatusServiceServicer_to_server(servicer, s),
    )
    await server.start()
    return server
