"""Public REST under ``/v1`` (SPEC §3.1): learning data, jobs, results, key, AI authorization.

Every route needs a user or admin JWT and acts on the caller's own rows only;
another user's job is 404 ``JOB_NOT_FOUND``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from airuntime_common.enums import JOB_STATUS, JOB_TYPE, LEARNING_EVENT_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.timeutil import to_timestamp, utcnow
from api_gateway import convert, waiting
from api_gateway.convert import pb_enum
from api_gateway.deps import Backend, Hub, Settings, UserPrincipal
from api_gateway.headers import IdempotencyKeyHeader, IfNoneMatchHeader, LastEventIdHeader
from api_gateway.jobs import create_job
from api_gateway.retry_after import RETRY_AFTER_HEADER
from api_gateway.schemas import (
    AuthorizationOut,
    AuthorizationPut,
    CredentialOut,
    CredentialPut,
    ErrorBody,
    EventsAccepted,
    JobCreate,
    JobList,
    JobOut,
    JobResultOut,
    JobStatus,
    JobType,
    KnowledgePointCreate,
    KnowledgePointOut,
    LearningEventsCreate,
    MaterialCreate,
    MaterialOut,
    ResultItems,
    ResultKind,
    RevokeOut,
)
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

MAX_MATERIAL_BYTES = 1024 * 1024

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, **({"headers": RETRY_AFTER_HEADER} if code in (429, 503) else {})}
    for code in (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)
}
#: The create's answer to a repeat of its ``Idempotency-Key`` (SPEC §2.5).
REPLAYED: dict[int | str, dict[str, Any]] = {
    200: {
        "model": JobOut,
        "description": "idempotent replay: the original job",
        "headers": {
            "Idempotent-Replayed": {
                "description": "Always true: this is the job the key first created.",
                "required": True,
                "schema": {"type": "string", "enum": ["true"]},
            }
        },
    }
}

#: The job's ETag on its GET answers (SPEC §9.1).
ETAG_HEADER: dict[str, Any] = {
    "ETag": {
        "description": 'The job\'s version in double quotes (e.g. "7"); it changes on every '
        "change of the job. Send it back as If-None-Match.",
        "required": True,
        "schema": {"type": "string"},
    }
}
#: ``GET /v1/ai/jobs/{jobId}``'s answers besides the errors.
JOB_GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the job as it is now", "headers": ETAG_HEADER},
    304: {
        "description": "If-None-Match names the current ETag (after waitSeconds, if given, "
        "without a change; at once for a terminal job). No body.",
        "headers": ETAG_HEADER,
    },
}
#: The event streams' answers besides the errors (SPEC §9.1).
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "text/event-stream: `event: job`, `id: <id>`, `data: <Job JSON>` per "
        "change, and a `: ping` comment at least every 15 s",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
}
JOB_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    **STREAM_RESPONSES,
    204: {
        "description": "Last-Event-ID is at or after the job's terminal event: stop reconnecting"
    },
}


class EventStream(Response):
    """The media type of the event streams, for the OpenAPI document."""

    media_type = "text/event-stream"


router = APIRouter(prefix="/v1", tags=["public"], responses=ERRORS)

JobId = Annotated[str, Path(min_length=1)]
PageSize = Annotated[int, Query(ge=1, le=100)]
PageToken = Annotated[str | None, Query(max_length=1024)]

_RESULT_KINDS = {
    "analyses": rr.RESULT_KIND_ANALYSES,
    "weak-points": rr.RESULT_KIND_WEAK_POINTS,
    "recommendations": rr.RESULT_KIND_RECOMMENDATIONS,
    "questions": rr.RESULT_KIND_QUESTIONS,
    "flashcards": rr.RESULT_KIND_FLASHCARDS,
}


# ------------------------------------------------------------------ learning data


@router.post("/materials", status_code=201, response_model=MaterialOut)
async def create_material(
    principal: UserPrincipal, call: Backend, body: MaterialCreate
) -> dict[str, Any]:
    """Store a material (plain text or Markdown, ≤ 1 MiB) split into ordered blocks."""
    if len(body.content.encode("utf-8", "surrogatepass")) > MAX_MATERIAL_BYTES:
        raise AppError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            "material content exceeds 1 MiB",
            {"field": "content", "maxBytes": MAX_MATERIAL_BYTES},
        )
    resp = await call(
        call.job.CreateMaterial,
        rr.CreateMaterialRequest(user_id=principal.user_id, title=body.title, content=body.content),
    )
    return convert.material_json(resp.material)


@router.get("/materials/{materialId}", response_model=MaterialOut)
async def get_material(
    principal: UserPrincipal,
    call: Backend,
    materialId: Annotated[str, Path(min_length=1)],
) -> dict[str, Any]:
    """One of the caller's materials with its blocks (another's → 404 ``NOT_FOUND``)."""
    resp = await call(
        call.job.GetMaterial,
        rr.GetMaterialRequest(user_id=principal.user_id, material_id=materialId),
    )
    return convert.material_json(resp.material)


@router.post("/knowledge-points", status_code=201, response_model=KnowledgePointOut)
async def create_knowledge_point(
    principal: UserPrincipal, call: Backend, body: KnowledgePointCreate
) -> dict[str, Any]:
    """Define a knowledge point over blocks of one of the caller's materials."""
    resp = await call(
        call.job.CreateKnowledgePoint,
        rr.CreateKnowledgePointRequest(
            user_id=principal.user_id,
            material_id=body.materialId,
            name=body.name,
            block_ids=body.blockIds,
        ),
    )
    return convert.knowledge_point_json(resp.knowledge_point)


@router.post("/learning-events", status_code=202, response_model=EventsAccepted)
async def record_learning_events(
    principal: UserPrincipal, call: Backend, body: LearningEventsCreate
) -> dict[str, Any]:
    """Ingest reading and quiz-attempt events; a repeated ``eventId`` counts as a duplicate."""
    events = []
    for e in body.events:
        event = msg.LearningEvent(
            event_id=e.eventId,
            type=pb_enum(LEARNING_EVENT_TYPE, e.type),
            occurred_at=to_timestamp(e.occurredAt or utcnow()),
        )
        for field, value in (
            ("material_id", e.materialId),
            ("block_id", e.blockId),
            ("knowledge_point_id", e.knowledgePointId),
            ("dwell_seconds", e.dwellSeconds),
            ("correct", e.correct),
        ):
            if value is not None:
                setattr(event, field, value)
        events.append(event)
    resp = await call(
        call.job.RecordLearningEvents,
        rr.RecordLearningEventsRequest(user_id=principal.user_id, events=events),
    )
    return {"accepted": resp.accepted, "duplicates": resp.duplicates}


# ------------------------------------------------------------------ jobs


@router.post(
    "/ai/jobs",
    status_code=201,
    response_model=JobOut,
    responses=REPLAYED,
)
async def create_ai_job(
    principal: UserPrincipal,
    call: Backend,
    body: JobCreate,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    """Create an AI job for the caller (201), or replay one in the idempotency scope (200)."""
    return await create_job(
        call,
        body,
        user_id=principal.user_id,
        actor=principal.actor,
        response=response,
        idempotency_key=idempotency_key,
        plan=principal.plan,
    )


@router.get("/ai/jobs", response_model=JobList)
async def list_ai_jobs(
    principal: UserPrincipal,
    call: Backend,
    status: JobStatus | None = None,
    jobType: JobType | None = None,
    pageSize: PageSize = 20,
    pageToken: PageToken = None,
) -> dict[str, Any]:
    """The caller's jobs, newest first, paged (``nextPageToken`` null on the last page)."""
    req = rr.ListJobsRequest(user_id=principal.user_id, page_size=pageSize)
    if status:
        req.status = pb_enum(JOB_STATUS, status)
    if jobType:
        req.job_type = pb_enum(JOB_TYPE, jobType)
    if pageToken:
        req.page_token = pageToken
    resp = await call(call.job.ListJobs, req)
    return {
        "jobs": [convert.job_json(j) for j in resp.jobs],
        "nextPageToken": resp.next_page_token or None,
    }


@router.get("/ai/jobs/{jobId}", response_model=JobOut, responses=JOB_GET_RESPONSES)
async def get_ai_job(
    principal: UserPrincipal,
    call: Backend,
    hub: Hub,
    jobId: JobId,
    waitSeconds: Annotated[
        int,
        Query(
            ge=0,
            le=60,
            description="Hold the answer up to this many seconds: with If-None-Match until "
            "the job changes (else 304), without it until the job is terminal (SPEC §9.1).",
        ),
    ] = 0,
    if_none_match: IfNoneMatchHeader = None,
) -> Response:
    """One of the caller's jobs with its ``ETag`` (another user's → 404
    ``JOB_NOT_FOUND``); 304 while ``If-None-Match`` is current; ``waitSeconds`` holds
    the answer (SPEC §9.1)."""
    return await waiting.get_job(
        call,
        hub,
        job_id=jobId,
        user_id=principal.user_id,
        wait_seconds=waitSeconds,
        if_none_match=if_none_match,
    )


@router.get(
    "/ai/jobs/{jobId}/events",
    response_class=EventStream,
    responses=JOB_STREAM_RESPONSES,
)
async def ai_job_events(
    principal: UserPrincipal,
    call: Backend,
    hub: Hub,
    settings: Settings,
    jobId: JobId,
    last_event_id: LastEventIdHeader = None,
) -> Response:
    """The job as an event stream: the job as it is, one event per change (``id`` its
    version), the end after a terminal state; ``Last-Event-ID`` resumes (SPEC §9.1)."""
    return await waiting.job_events(
        call,
        hub,
        job_id=jobId,
        user_id=principal.user_id,
        last_event_id=last_event_id,
        ping_seconds=settings.SSE_PING_SECONDS,
    )


@router.get("/ai/events", response_class=EventStream, responses=STREAM_RESPONSES)
async def ai_events(
    principal: UserPrincipal,
    call: Backend,
    hub: Hub,
    settings: Settings,
    last_event_id: LastEventIdHeader = None,
) -> Response:
    """Every change of the caller's jobs as an event stream (``id`` a cursor that
    ``Last-Event-ID`` resumes from); it does not end by itself (SPEC §9.1)."""
    return await waiting.user_events(
        call,
        hub,
        user_id=principal.user_id,
        last_event_id=last_event_id,
        ping_seconds=settings.SSE_PING_SECONDS,
    )


@router.post("/ai/jobs/{jobId}/cancel", response_model=JobOut)
async def cancel_ai_job(principal: UserPrincipal, call: Backend, jobId: JobId) -> dict[str, Any]:
    """Cancel: pending → cancelled; leased → ``cancelRequested``; terminal → 409."""
    resp = await call(
        call.job.CancelJob,
        rr.CancelJobRequest(job_id=jobId, user_id=principal.user_id, actor=principal.actor),
    )
    return convert.job_json(resp.job)


@router.get("/ai/jobs/{jobId}/result", response_model=JobResultOut)
async def get_ai_job_result(
    principal: UserPrincipal, call: Backend, jobId: JobId
) -> dict[str, Any]:
    """The business rows of a succeeded job (409 ``INVALID_JOB_STATE`` before success)."""
    resp = await call(
        call.job.GetJobResult, rr.GetJobResultRequest(job_id=jobId, user_id=principal.user_id)
    )
    return {
        "jobId": resp.job_id,
        "jobType": JOB_TYPE.to_str_or_none(resp.job_type),
        "outputSchemaVersion": resp.output_schema_version,
        "items": [convert.struct_to_dict(i) for i in resp.items],
    }


@router.get("/ai/results/{kind}", response_model=ResultItems)
async def list_results(
    principal: UserPrincipal,
    call: Backend,
    kind: ResultKind,
    pageSize: PageSize = 20,
    pageToken: PageToken = None,
) -> dict[str, Any]:
    """The caller's accumulated business rows of one kind, paged."""
    req = rr.ListResultItemsRequest(
        user_id=principal.user_id, kind=_RESULT_KINDS[kind], page_size=pageSize
    )
    if pageToken:
        req.page_token = pageToken
    resp = await call(call.job.ListResultItems, req)
    return {
        "items": [convert.struct_to_dict(i) for i in resp.items],
        "nextPageToken": resp.next_page_token or None,
    }


# ------------------------------------------------------------------ the caller's settings


@router.put("/me/model-credential", response_model=CredentialOut)
async def put_model_credential(
    principal: UserPrincipal, call: Backend, body: CredentialPut
) -> dict[str, Any]:
    """Store (or replace) the caller's key for a configured provider (SPEC §9.4);
    answers the masked view only."""
    resp = await call(
        call.credential.PutCredential,
        cred_rr.PutCredentialRequest(
            user_id=principal.user_id, provider=body.provider or "", api_key=body.apiKey
        ),
    )
    return convert.credential_json(resp.credential)


@router.get("/me/model-credential", response_model=CredentialOut)
async def get_model_credential(principal: UserPrincipal, call: Backend) -> dict[str, Any]:
    """The masked view of the caller's key (none → 404 ``NOT_FOUND``)."""
    resp = await call(
        call.credential.GetCredential, cred_rr.GetCredentialRequest(user_id=principal.user_id)
    )
    return convert.credential_json(resp.credential)


@router.delete("/me/model-credential", status_code=204)
async def delete_model_credential(principal: UserPrincipal, call: Backend) -> Response:
    """Delete the caller's key (none → 404 ``NOT_FOUND``)."""
    await call(
        call.credential.DeleteCredential,
        cred_rr.DeleteCredentialRequest(user_id=principal.user_id),
    )
    return Response(status_code=204)


@router.get("/me/ai-authorization", response_model=AuthorizationOut)
async def get_ai_authorization(principal: UserPrincipal, call: Backend) -> dict[str, Any]:
    """Whether AI is on for the caller (granted by default)."""
    resp = await call(
        call.job.GetAiAuthorization, rr.GetAiAuthorizationRequest(user_id=principal.user_id)
    )
    return {"granted": resp.granted, "changedAt": convert.ts(resp, "changed_at")}


@router.put("/me/ai-authorization", response_model=AuthorizationOut)
async def put_ai_authorization(
    principal: UserPrincipal, call: Backend, body: AuthorizationPut
) -> dict[str, Any]:
    """Grant or revoke AI; revoking cancels the caller's jobs as ``/revoke`` does."""
    resp = await call(
        call.job.SetAiAuthorization,
        rr.SetAiAuthorizationRequest(user_id=principal.user_id, granted=body.granted),
    )
    return {"granted": resp.granted, "changedAt": convert.ts(resp, "changed_at")}


@router.post("/me/ai-authorization/revoke", response_model=RevokeOut)
async def revoke_ai_authorization(principal: UserPrincipal, call: Backend) -> dict[str, Any]:
    """Turn AI off: pending jobs → cancelled, leased ones → ``cancelRequested``."""
    resp = await call(
        call.job.SetAiAuthorization,
        rr.SetAiAuthorizationRequest(user_id=principal.user_id, granted=False),
    )
    return {
        "granted": resp.granted,
        "changedAt": convert.ts(resp, "changed_at"),
        "cancelled": resp.cancelled,
        "cancelRequested": resp.cancel_requested,
    }


__all__ = ["router"]
