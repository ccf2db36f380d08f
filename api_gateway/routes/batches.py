"""Public REST of batches (reference §10.3): ``POST /v1/ai/job-batches``.

A batch is a parent job and one child per target; the parent is an ordinary ``Job``
of the ``/v1/ai/jobs`` routes (read, wait, stream, cancel, retry, result), with
``batch`` counts; its children are listed by ``GET /v1/ai/jobs?parentJobId=``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError
from airuntime_common.params import normalize_params
from api_gateway import convert
from api_gateway.convert import pb_enum
from api_gateway.deps import Backend, UserPrincipal
from api_gateway.gate import GatedRoute
from api_gateway.headers import IdempotencyKeyHeader
from api_gateway.jobs import created_or_replayed
from api_gateway.routes.public import ERRORS, REPLAYED
from api_gateway.schemas import JobBatchCreate, JobOut
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

router = APIRouter(prefix="/v1", tags=["public"], responses=ERRORS, route_class=GatedRoute)


@router.post("/ai/job-batches", status_code=201, response_model=JobOut, responses=REPLAYED)
async def create_ai_job_batch(
    principal: UserPrincipal,
    call: Backend,
    body: JobBatchCreate,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    """Create a batch for the caller (201: its parent ``Job``), or replay one in the
    idempotency scope of its parent (200 + ``Idempotent-Replayed``).

    One child per target (``targets``, or ``targetsOf``: every material, or every
    knowledge point of the caller (of ``materialId``), oldest first), each an
    ordinary job inheriting the parent's type, params, key mode and priority, all
    made in one transaction with every check of a create applied to the whole batch:
    the daily quota counts each child and refuses the batch whole (429
    ``QUOTA_EXCEEDED``); a target not the caller's is 404 and nothing is made.
    """
    key = idempotency_key  # checked by its header's type
    try:
        params = normalize_params(body.jobType, body.params)
    except AppError:
        if key is None:
            raise
        params = body.params or {}  # a repeat answers the original whatever it asks
    req = rr.CreateJobBatchRequest(
        user_id=principal.user_id,
        job_type=pb_enum(JOB_TYPE, body.jobType),
        params=convert.dict_to_struct(params),
        api_key_mode=pb_enum(API_KEY_MODE, body.apiKeyMode),
        actor=principal.actor,
    )
    for target in body.targets or []:
        req.targets.append(
            msg.BatchTarget(
                target_type=pb_enum(TARGET_TYPE, target.targetType), target_id=target.targetId
            )
        )
    if body.targetsOf is not None:
        req.targets_of.target_type = pb_enum(TARGET_TYPE, body.targetsOf.targetType)
        if body.targetsOf.materialId is not None:
            req.targets_of.material_id = body.targetsOf.materialId
    if body.minSuccessRatio is not None:
        req.min_success_ratio = body.minSuccessRatio
    if key is not None:
        req.idempotency_key = key
    if principal.plan:
        req.plan = principal.plan
    resp = await call(call.job.CreateJobBatch, req)
    return created_or_replayed(response, resp.job, resp.replayed)


__all__ = ["router"]
