"""Public REST under ``/v1`` (reference §3.1): learning data, jobs, results, key, AI authorization.

Every route needs a user or admin JWT and acts on the caller's own rows only;
another user's job is 404 ``JOB_NOT_FOUND``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response

from airuntime_common.enums import JOB_STATUS, JOB_TYPE, LEARNING_EVENT_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.timeutil import to_timestamp, utcnow
from api_gateway import convert, waiting
from api_gateway.convert import pb_enum
from api_gateway.deps import Backend, Hub, Settings, UserPrincipal
from api_gateway.gate import GatedRoute
from api_gateway.headers import IdempotencyKeyHeader, IfNoneMatchHeader, LastEventIdHeader
from api_gateway.jobs import create_job, created_or_replayed
from api_gateway.prompt_schemas import FeedbackIn
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
    KnowledgePointList,
    KnowledgePointOut,
    LearningEventsCreate,
    MaterialCreate,
    MaterialList,
    MaterialOut,
    RerunBody,
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
#: The create's answer to a repeat of its ``Idempotency-Key`` (reference §2.5).
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

#: The job's ETag on its GET answers (reference §9.1).
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
#: The event streams' answers besides the errors (reference §9.1). Their routes' response
#: class is the bare ``Response`` (no media type of its own), so only the 200 is
#: ``text/event-stream`` and the errors stay ``application/json`` as they are sent
#: (a route's media type is what FastAPI declares every ``model`` response under).
STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "text/event-stream: `event: job`, `id: <id>`, `data: <Job JSON>` per "
        "change, and a `: ping` comment at least every 15 s",
        # each event, as FastAPI declares its own event streams (``itemSchema``)
        "content": {
            "text/event-stream": {
                "itemSchema": {
                    "type": "object",
                    "required": ["event", "id", "data"],
                    "properties": {
                        "event": {"const": "job"},
                        "id": {"type": "string", "pattern": "^[0-9]+$"},
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/JobOut"},
                        },
                    },
                }
            }
        },
    },
}
JOB_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    **STREAM_RESPONSES,
    204: {
        "description": "Last-Event-ID is at or after the job's terminal event: stop reconnecting"
    },
}


router = APIRouter(prefix="/v1", tags=["public"], responses=ERRORS, route_class=GatedRoute)

JobId = Annotated[str, Path(min_length=1)]
PageSize = Annotated[int, Query(ge=1, le=100)]
PageToken = Annotated[str | None, Query(max_length=1024)]
#: ``GET /v1/ai/jobs?ids=``: at most this many ids, and this many characters in all.
MAX_IDS = 100
MAX_IDS_QUERY = 100 * 129

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


@router.get("/materials", response_model=MaterialList)
async def list_materials(
    principal: UserPrincipal,
    call: Backend,
    pageSize: PageSize = 20,
    pageToken: PageToken = None,
) -> dict[str, Any]:
    """The caller's materials, newest first, paged (reference §9.2; no blocks, their count)."""
    resp = await call(
        call.job.ListMaterials,
        rr.ListMaterialsRequest(
            user_id=principal.user_id, page_size=pageSize, page_token=pageToken or ""
        ),
    )
    return {
        "materials": [convert.material_summary_json(m) for m in resp.materials],
        "nextPageToken": resp.next_page_token or None,
    }


@router.get("/materials/{materialId}", response_model=MaterialOut)
async def get_material(
    principal: UserPrincipal,
    call: Backend,
    materialId: Annotated[str, Path(min_length=1)],
    blocksPageSize: Annotated[int | None, Query(ge=1, le=1000)] = None,
    blocksPageToken: PageToken = None,
) -> dict[str, Any]:
    """One of the caller's materials with its blocks (another's → 404 ``NOT_FOUND``).

    With ``blocksPageSize`` (1..1000) the blocks come a page at a time, in order,
    with ``nextBlocksPageToken`` (reference §9.2); without it, every block.
    """
    if blocksPageToken and blocksPageSize is None:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "blocksPageToken needs blocksPageSize",
            {"field": "blocksPageSize"},
        )
    resp = await call(
        call.job.GetMaterial,
        rr.GetMaterialRequest(
            user_id=principal.user_id,
            material_id=materialId,
            blocks_page_size=blocksPageSize or 0,
            blocks_page_token=blocksPageToken or "",
        ),
    )
    return convert.material_json(resp.material, resp.next_blocks_page_token)


@router.delete("/materials/{materialId}", status_code=204)
async def delete_material(
    principal: UserPrincipal,
    call: Backend,
    materialId: Annotated[str, Path(min_length=1)],
) -> Response:
    """Delete one of the caller's materials (reference §9.2): its blocks, knowledge points,
    the learning events on it, every snapshot built from it and every business row
    citing it go; its pending jobs are cancelled, leased ones asked to cancel (a
    result still sent for them writes nothing). Job rows stay. Another's → 404."""
    await call(
        call.job.DeleteMaterial,
        rr.DeleteMaterialRequest(user_id=principal.user_id, material_id=materialId),
    )
    return Response(status_code=204)


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


@router.get("/knowledge-points", response_model=KnowledgePointList)
async def list_knowledge_points(
    principal: UserPrincipal,
    call: Backend,
    materialId: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    pageSize: PageSize = 20,
    pageToken: PageToken = None,
) -> dict[str, Any]:
    """The caller's knowledge points, newest first, paged; with ``materialId`` only that
    material's (another user's material → 404 ``NOT_FOUND``)."""
    req = rr.ListKnowledgePointsRequest(
        user_id=principal.user_id, page_size=pageSize, page_token=pageToken or ""
    )
    if materialId is not None:
        req.material_id = materialId
    resp = await call(call.job.ListKnowledgePoints, req)
    return {
        "knowledgePoints": [convert.knowledge_point_json(k) for k in resp.knowledge_points],
        "nextPageToken": resp.next_page_token or None,
    }


@router.delete("/knowledge-points/{knowledgePointId}", status_code=204)
async def delete_knowledge_point(
    principal: UserPrincipal,
    call: Backend,
    knowledgePointId: Annotated[str, Path(min_length=1)],
) -> Response:
    """Delete one of the caller's knowledge points (reference §9.2): the items that named it
    keep their text with ``knowledgePointId`` null; another's → 404 ``NOT_FOUND``."""
    await call(
        call.job.DeleteKnowledgePoint,
        rr.DeleteKnowledgePointRequest(
            user_id=principal.user_id, knowledge_point_id=knowledgePointId
        ),
    )
    return Response(status_code=204)


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
    ids: Annotated[
        str | None,
        Query(
            max_length=MAX_IDS_QUERY,
            description="Comma-separated job ids (at most 100): those of the caller's jobs,"
            " in the order asked; unknown and other users' ids are left out (reference §9.2)."
            " Not combinable with status, jobType or pageToken.",
        ),
    ] = None,
    parentJobId: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=128,
            description="Only the children of this batch (reference §10.3), newest first.",
        ),
    ] = None,
) -> dict[str, Any]:
    """The caller's jobs, newest first, paged (``nextPageToken`` null on the last page);
    with ``ids``, just those jobs in that order (one page, ``nextPageToken`` null); with
    ``parentJobId``, the children of one of the caller's batches."""
    if ids is not None:
        others = status or jobType or pageToken or parentJobId
        return await _jobs_by_ids(principal.user_id, call, ids, others)
    req = rr.ListJobsRequest(user_id=principal.user_id, page_size=pageSize)
    if parentJobId:
        req.parent_job_id = parentJobId
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


async def _jobs_by_ids(user_id: str, call: Backend, ids: str, other_filter: Any) -> dict[str, Any]:
    """``GET /v1/ai/jobs?ids=a,b,…`` (reference §9.2).

    Raises:
        AppError: INVALID_ARGUMENT for no ids, more than 100, or ``ids`` with another filter.
    """
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    if other_filter:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "ids cannot be combined with status, jobType or pageToken",
            {"field": "ids"},
        )
    if not 1 <= len(wanted) <= MAX_IDS:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"ids must name 1..{MAX_IDS} job ids",
            {"field": "ids", "count": len(wanted)},
        )
    resp = await call(call.job.ListJobs, rr.ListJobsRequest(user_id=user_id, job_ids=wanted))
    return {"jobs": [convert.job_json(j) for j in resp.jobs], "nextPageToken": None}


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
            "the job changes (else 304), without it until the job is terminal (reference §9.1).",
        ),
    ] = 0,
    if_none_match: IfNoneMatchHeader = None,
) -> Response:
    """One of the caller's jobs with its ``ETag`` (another user's → 404
    ``JOB_NOT_FOUND``); 304 while ``If-None-Match`` is current; ``waitSeconds`` holds
    the answer (reference §9.1)."""
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
    response_class=Response,
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
    version), the end after a terminal state; ``Last-Event-ID`` resumes (reference §9.1)."""
    return await waiting.job_events(
        call,
        hub,
        job_id=jobId,
        user_id=principal.user_id,
        last_event_id=last_event_id,
        ping_seconds=settings.SSE_PING_SECONDS,
    )


@router.get("/ai/events", response_class=Response, responses=STREAM_RESPONSES)
async def ai_events(
    principal: UserPrincipal,
    call: Backend,
    hub: Hub,
    settings: Settings,
    last_event_id: LastEventIdHeader = None,
) -> Response:
    """Every change of the caller's jobs as an event stream (``id`` a cursor that
    ``Last-Event-ID`` resumes from); it does not end by itself (reference §9.1)."""
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


@router.post(
    "/ai/jobs/{jobId}/retry",
    status_code=201,
    response_model=JobOut,
    responses=REPLAYED,
)
async def retry_ai_job(
    principal: UserPrincipal,
    call: Backend,
    jobId: JobId,
    response: Response,
    body: Annotated[RerunBody | None, Body()] = None,
    idempotency_key: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    """Retry one of the caller's failed jobs as a new job with ``retriedFromJobId``
    (reference §9.2): 201, or 200 + ``Idempotent-Replayed`` on a repeat of the key.

    Only from ``failed`` (else 409 ``INVALID_JOB_STATE``); every check of a create
    applies (403 ``AI_NOT_AUTHORIZED``, 422 ``INVALID_CREDENTIAL``, 429 quota and
    budget, 503 breaker). Another user's job → 404 ``JOB_NOT_FOUND``.
    """
    req = rr.RerunJobRequest(
        job_id=jobId,
        rebuild_snapshot=bool(body and body.rebuildSnapshot),
        actor=principal.actor,
        user_id=principal.user_id,
    )
    if idempotency_key is not None:
        req.idempotency_key = idempotency_key
    if principal.plan:
        req.plan = principal.plan
    resp = await call(call.job.RerunJob, req)
    return created_or_replayed(response, resp.job, resp.replayed)


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


@router.delete("/ai/results/{kind}/{itemId}", status_code=204)
async def delete_result_item(
    principal: UserPrincipal,
    call: Backend,
    kind: ResultKind,
    itemId: Annotated[str, Path(min_length=1)],
) -> Response:
    """Delete one of the caller's business items (its ``itemId``) of ``kind`` (reference §9.2);
    unknown or another user's → 404 ``NOT_FOUND``."""
    await call(
        call.job.DeleteResultItem,
        rr.DeleteResultItemRequest(
            user_id=principal.user_id, kind=_RESULT_KINDS[kind], item_id=itemId
        ),
    )
    return Response(status_code=204)


@router.post("/ai/results/{kind}/{itemId}/feedback", status_code=204)
async def rate_result_item(
    principal: UserPrincipal,
    call: Backend,
    kind: ResultKind,
    itemId: Annotated[str, Path(min_length=1)],
    body: FeedbackIn,
) -> Response:
    """Rate one of the caller's items: ``1`` helpful, ``-1`` not; rating it again
    replaces the rating. Counted under the prompt version of the item's job (reference
    §10.4). Unknown or another user's item → 404 ``NOT_FOUND``."""
    await call(
        call.job.SetResultFeedback,
        rr.SetResultFeedbackRequest(
            user_id=principal.user_id,
            kind=_RESULT_KINDS[kind],
            item_id=itemId,
            rating=body.rating,
        ),
    )
    return Response(status_code=204)


# ------------------------------------------------------------------ the caller's settings


@router.delete("/me", status_code=204)
async def erase_me(principal: UserPrincipal, call: Backend) -> Response:
    """Erase the caller (reference §9.2, the right to erasure): their jobs are ended and
    removed, every row of theirs in both services' databases is deleted (materials,
    blocks, knowledge points, events, snapshots, results, plans, AI switch, model
    key); cost and that day's quota use stay under a one-way pseudonym. 204 once
    erased; idempotent (again → 204). The same token then sees an empty account."""
    await call(call.job.EraseUser, rr.EraseUserRequest(user_id=principal.user_id))
    await call(
        call.credential.EraseUserCredentials,
        cred_rr.EraseUserCredentialsRequest(user_id=principal.user_id),
    )
    return Response(status_code=204)


@router.put(
    "/me/model-credential",
    response_model=CredentialOut,
    responses={
        400: {
            "model": ErrorBody,
            "description": "INVALID_ARGUMENT: a malformed body or provider; a baseUrl "
            "while the deployment has USER_BASE_URLS off",
        },
        422: {
            "model": ErrorBody,
            "description": "INVALID_BASE_URL: the baseUrl broke a rule (details.rule: "
            "syntax, scheme, user_info, query, fragment, port, unresolvable or address); "
            "nothing was stored",
        },
    },
)
async def put_model_credential(
    principal: UserPrincipal, call: Backend, body: CredentialPut
) -> dict[str, Any]:
    """Store (or replace) the caller's key for a configured provider (reference §9.4), with
    the caller's own endpoint when ``baseUrl`` is given (reference §10.5: checked now and
    before every model call); answers the masked view only."""
    resp = await call(
        call.credential.PutCredential,
        cred_rr.PutCredentialRequest(
            user_id=principal.user_id,
            provider=body.provider or "",
            api_key=body.apiKey,
            base_url=body.baseUrl or "",
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
