"""Job creation shared by ``/v1/ai/jobs`` and ``/admin/ai/jobs`` (reference §2.1, §2.5, §3.1)."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.params import normalize_params
from api_gateway.backends import Caller
from api_gateway.convert import dict_to_struct, job_json, pb_enum
from api_gateway.schemas import JobCreate
from zhixi.airuntime.job.v1 import request_response_pb2 as rr


async def create_job(
    call: Caller,
    body: JobCreate,
    *,
    user_id: str,
    actor: str,
    response: Response,
    idempotency_key: str | None,
    plan: str | None = None,
    priority: int | None = None,
    max_retry_count: int | None = None,
    timeout_seconds: int | None = None,
) -> dict[str, Any]:
    """Create (or replay) a job and set the answer's status and replay header.

    ``targetType=user`` targets the job's own user: an omitted ``targetId`` means
    that user, another id is 404 ``NOT_FOUND``. Other targets need a ``targetId``.

    Returns:
        The ``Job`` JSON; ``response`` is 201, or 200 with ``Idempotent-Replayed: true``.

    Raises:
        AppError: 400 for bad params/target, 404 for a foreign user target, and
            whatever job_service refuses with (reference §3.1, §6).
    """
    target_id = body.targetId
    if body.targetType == "user":
        if target_id is not None and target_id != user_id:
            raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": target_id})
        target_id = user_id
    elif not target_id:
        raise invalid_argument("targetId is required for this targetType", field="targetId")
    key = idempotency_key
    try:
        params = normalize_params(body.jobType, body.params)
    except AppError:
        if key is None:
            raise
        # a repeat returns the original whatever its params (reference §2.5): job_service
        # looks for it first, and refuses these params the same way when there is none
        params = body.params or {}
    req = rr.CreateJobRequest(
        user_id=user_id,
        job_type=pb_enum(JOB_TYPE, body.jobType),
        target_type=pb_enum(TARGET_TYPE, body.targetType),
        target_id=target_id,
        params=dict_to_struct(params),
        api_key_mode=pb_enum(API_KEY_MODE, body.apiKeyMode),
        actor=actor,
    )
    if key is not None:
        req.idempotency_key = key
    if plan:
        req.plan = plan
    if priority is not None:
        req.priority = priority
    if max_retry_count is not None:
        req.max_retry_count = max_retry_count
    if timeout_seconds is not None:
        req.timeout_seconds = timeout_seconds
    resp = await call(call.job.CreateJob, req)
    return created_or_replayed(response, resp.job, resp.replayed)


def created_or_replayed(response: Response, job: Any, replayed: bool) -> dict[str, Any]:
    """A create's answer (reference §2.5): ``job`` as JSON, 201, or 200 with
    ``Idempotent-Replayed: true`` when the idempotency key gave back an earlier job."""
    if replayed:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    else:
        response.status_code = 201
    return job_json(job)
