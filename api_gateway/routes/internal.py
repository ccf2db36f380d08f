"""The runtime REST shim under ``/internal/runtime`` (reference §3 table).

Same semantics as the gRPC runtime contract: each route forwards to
job_service / credential_service with ``x-runtime-instance-id`` from the
``X-Runtime-Instance-Id`` header, so the lease holder's fencing token
``(jobId, instance id, attemptNo)`` is checked by the backend.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response

from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, TARGET_TYPE
from api_gateway import convert
from api_gateway.convert import pb_enum
from api_gateway.deps import RuntimeCaller, RuntimeHealthCaller
from api_gateway.gate import GatedRoute
from api_gateway.routes.public import ERRORS
from api_gateway.schemas import INT32_MAX, RuntimeHealthOut
from api_gateway.shim_schemas import (
    AttemptBody,
    ClaimBody,
    ClaimedJobs,
    CreatedId,
    FailBody,
    FailOut,
    InvocationBody,
    LeasesBody,
    LeasesOut,
    LockOut,
    PollBody,
    PolledJobs,
    ResolveBody,
    ResolvedCredential,
    ResultBody,
    ResultOut,
    SnapshotOut,
    StartOut,
)
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

router = APIRouter(
    prefix="/internal/runtime", tags=["runtime"], responses=ERRORS, route_class=GatedRoute
)

#: Opaque: an unknown id of any length is 404 ``JOB_NOT_FOUND`` from the backend, never 400.
JobId = Annotated[str, Path(min_length=1)]
#: Extra seconds of deadline on top of a long poll's ``waitMs``.
LONG_POLL_SLACK_SECONDS = 10.0


def _poll_timeout(call: Any, wait_ms: int) -> float:
    settings = call.backends.settings
    return float(settings.GRPC_TIMEOUT_SECONDS) + wait_ms / 1000.0 + LONG_POLL_SLACK_SECONDS


def _poll_fields(body: PollBody) -> dict[str, Any]:
    return {
        "capabilities": convert.job_types(list(body.capabilities)),
        "limit": body.limit,
        "wait_ms": body.waitMs,
        "status_address": body.statusAddress or "",
    }


@router.post("/jobs/poll", response_model=PolledJobs)
async def poll_jobs(call: RuntimeCaller, body: PollBody) -> dict[str, Any]:
    """Pending jobs the capabilities cover, best first (not locked)."""
    resp = await call(
        call.job.PollJobs,
        rr.PollJobsRequest(**_poll_fields(body)),
        deadline=_poll_timeout(call, body.waitMs),
    )
    return {"jobs": [convert.job_json(j) for j in resp.jobs]}


@router.post("/jobs/claim", response_model=ClaimedJobs, response_model_exclude_unset=True)
async def claim_jobs(call: RuntimeCaller, body: ClaimBody) -> dict[str, Any]:
    """Poll + lock of up to ``limit`` jobs in one transaction; each is locked to the caller.

    With ``withSnapshots``, each is also started and the answer carries the snapshots
    (``{"jobs","snapshots":{jobId: snapshot}}``); without it the answer is ``{"jobs"}``.
    """
    resp = await call(
        call.job.ClaimJobs,
        rr.ClaimJobsRequest(**_poll_fields(body), with_snapshots=body.withSnapshots),
        deadline=_poll_timeout(call, body.waitMs),
    )
    out: dict[str, Any] = {"jobs": [convert.job_json(j) for j in resp.jobs]}
    if body.withSnapshots:
        out["snapshots"] = {job_id: _snapshot_json(snap) for job_id, snap in resp.snapshots.items()}
    return out


@router.post("/jobs/{jobId}/lock", response_model=LockOut)
async def lock_job(
    call: RuntimeCaller,
    jobId: JobId,
    body: Annotated[dict[str, Any] | None, Body()] = None,
) -> dict[str, Any]:
    """Lock one pending job (409 ``JOB_ALREADY_LOCKED`` / ``INVALID_JOB_STATE``)."""
    resp = await call(call.job.LockJob, rr.LockJobRequest(job_id=jobId))
    return {
        "jobId": resp.job_id,
        "status": JOB_STATUS.to_str_or_none(resp.status),
        "lockedBy": resp.locked_by,
        "lockUntil": convert.ts(resp, "lock_until"),
        "attemptNo": resp.attempt_no,
    }


@router.post("/jobs/{jobId}/start", response_model=StartOut)
async def start_job(call: RuntimeCaller, jobId: JobId, body: AttemptBody) -> dict[str, Any]:
    """Mark the held attempt running (a repeat answers the same ``startedAt``)."""
    resp = await call(
        call.job.StartJob, rr.StartJobRequest(job_id=jobId, attempt_no=body.attemptNo)
    )
    return {
        "status": JOB_STATUS.to_str_or_none(resp.status),
        "startedAt": convert.ts(resp, "started_at"),
    }


@router.post(
    "/jobs/{jobId}/heartbeat",
    status_code=204,
    response_class=Response,
    responses={
        204: {
            "description": "lease renewed",
            "headers": {
                "X-Lock-Until": {"schema": {"type": "string"}},
                "X-Cancel-Requested": {"schema": {"type": "string", "enum": ["true", "false"]}},
            },
        }
    },
)
async def heartbeat(call: RuntimeCaller, jobId: JobId, body: AttemptBody) -> Response:
    """Renew the lease: 204 with ``X-Lock-Until`` and ``X-Cancel-Requested``."""
    resp = await call(
        call.job.Heartbeat, rr.HeartbeatRequest(job_id=jobId, attempt_no=body.attemptNo)
    )
    headers = {"X-Cancel-Requested": "true" if resp.cancel_requested else "false"}
    lock_until = convert.ts(resp, "lock_until")
    if lock_until:
        headers["X-Lock-Until"] = lock_until
    return Response(status_code=204, headers=headers)


@router.post("/leases/heartbeat", response_model=LeasesOut)
async def heartbeat_leases(call: RuntimeCaller, body: LeasesBody) -> dict[str, Any]:
    """Renew up to 500 leases; one answer per lease, in order."""
    resp = await call(
        call.job.HeartbeatLeases,
        rr.HeartbeatLeasesRequest(
            leases=[
                msg.LeaseRef(job_id=lease.jobId, attempt_no=lease.attemptNo)
                for lease in body.leases
            ]
        ),
    )
    return {
        "leases": [
            {
                "jobId": s.job_id,
                "attemptNo": s.attempt_no,
                "held": s.held,
                "lockUntil": convert.ts(s, "lock_until"),
                "cancelRequested": s.cancel_requested,
            }
            for s in resp.leases
        ]
    }


@router.get("/jobs/{jobId}/snapshot", response_model=SnapshotOut)
async def get_snapshot(
    call: RuntimeCaller,
    jobId: JobId,
    attemptNo: Annotated[int, Query(ge=1, le=INT32_MAX)],
) -> dict[str, Any]:
    """The job's immutable snapshot, for the lease holder only."""
    resp = await call(
        call.job.GetSnapshot, rr.GetSnapshotRequest(job_id=jobId, attempt_no=attemptNo)
    )
    return _snapshot_json(resp)


def _snapshot_json(resp: rr.GetSnapshotResponse) -> dict[str, Any]:
    return {
        "snapshotId": resp.snapshot_id,
        "schemaVersion": resp.schema_version,
        "targetType": TARGET_TYPE.to_str_or_none(resp.target_type),
        "targetId": resp.target_id,
        "payload": convert.struct_to_dict(resp.payload),
        "contentHash": resp.content_hash,
    }


@router.post("/model-credentials/resolve", response_model=ResolvedCredential)
async def resolve_credential(
    call: RuntimeCaller, body: ResolveBody, response: Response
) -> dict[str, Any]:
    """The key for a leased job, for its holder only; never cached (``no-store``)."""
    response.headers["Cache-Control"] = "no-store"
    response.headers["Pragma"] = "no-cache"
    resp = await call(
        call.credential.ResolveCredential,
        cred_rr.ResolveCredentialRequest(job_id=body.jobId, attempt_no=body.attemptNo),
    )
    return {
        "apiKeyMode": API_KEY_MODE.to_str_or_none(resp.api_key_mode),
        "credentialId": resp.credential_id or None,
        "apiKey": resp.api_key,
        "modelProvider": resp.model_provider,
        "modelName": resp.model_name,
        "baseUrl": resp.base_url,
        "userBaseUrl": resp.user_base_url,
    }


@router.post("/jobs/{jobId}/result", response_model=ResultOut)
async def submit_result(call: RuntimeCaller, jobId: JobId, body: ResultBody) -> dict[str, Any]:
    """Submit the attempt's output (idempotent by ``jobId:attemptNo:outputHash``)."""
    resp = await call(
        call.job.SubmitResult,
        rr.SubmitResultRequest(
            job_id=jobId,
            attempt_no=body.attemptNo,
            prompt_version=body.promptVersion,
            output_schema_version=body.outputSchemaVersion,
            output=convert.dict_to_struct(body.output, "output"),
        ),
    )
    return {
        "jobId": resp.job_id,
        "status": JOB_STATUS.to_str_or_none(resp.status),
        "resultId": resp.result_id,
        "outputHash": resp.output_hash,
        "replayed": resp.replayed,
    }


@router.post("/jobs/{jobId}/fail", response_model=FailOut)
async def fail_job(call: RuntimeCaller, jobId: JobId, body: FailBody) -> dict[str, Any]:
    """Report a failed attempt; the server decides retryability from the code."""
    req = rr.FailJobRequest(
        job_id=jobId,
        attempt_no=body.attemptNo,
        error_code=body.errorCode,
        error_message=body.errorMessage,
    )
    if body.retryAfterSeconds is not None:
        req.retry_after_seconds = body.retryAfterSeconds
    resp = await call(call.job.FailJob, req)
    return {
        "jobId": resp.job_id,
        "status": JOB_STATUS.to_str_or_none(resp.status),
        "retryCount": resp.retry_count,
    }


@router.post("/invocation-logs", status_code=201, response_model=CreatedId)
async def record_invocation(call: RuntimeCaller, body: InvocationBody) -> dict[str, Any]:
    """Log one model call (tokens, latency, outcome; never the key or prompt)."""
    req = rr.RecordInvocationRequest(
        job_id=body.jobId,
        attempt_no=body.attemptNo,
        model_provider=body.modelProvider,
        model_name=body.modelName,
        api_key_mode=pb_enum(API_KEY_MODE, body.apiKeyMode),
        prompt_tokens=body.promptTokens,
        completion_tokens=body.completionTokens,
        cache_hit_tokens=body.cacheHitTokens,
        latency_ms=body.latencyMs,
        outcome=body.outcome,
    )
    for field, value in (
        ("credential_id", body.credentialId),
        ("error_code", body.errorCode),
        ("provider_request_id", body.providerRequestId),
    ):
        if value is not None:
            setattr(req, field, value)
    resp = await call(call.job.RecordInvocation, req)
    return {"id": resp.id}


@router.get("/health", response_model=RuntimeHealthOut)
async def runtime_health(call: RuntimeHealthCaller) -> dict[str, Any]:
    """SERVING while a runtime instance was seen recently; the worker registry."""
    resp = await call(call.job.GetRuntimeHealth, rr.GetRuntimeHealthRequest())
    return {
        "status": resp.status,
        "workers": [convert.runtime_worker_json(w) for w in resp.workers],
    }


__all__ = ["router"]
