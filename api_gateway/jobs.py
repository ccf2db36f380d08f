"""Job creation shared by ``/v1/ai/jobs`` and ``/admin/ai/jobs`` (SPEC §2.1, §2.5, §3.1)."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel, Field, ValidationError

from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from api_gateway.backends import Caller
from api_gateway.convert import dict_to_struct, job_json, pb_enum
from api_gateway.errors import validation_details
from api_gateway.schemas import JobCreate, QuestionType
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

IDEMPOTENCY_KEY_MAX = 200


_DEFAULT_QUESTION_TYPES: tuple[QuestionType, ...] = ("single_choice",)


class QuizParams(BaseModel):
    """``quiz_generation`` params: count 1..20, difficulty, question types (defaults per SPEC §3.1)."""

    count: int = Field(default=5, ge=1, le=20)
    difficulty: str = Field(default="medium", pattern="^(easy|medium|hard)$")
    questionTypes: list[QuestionType] = Field(
        default_factory=lambda: list(_DEFAULT_QUESTION_TYPES), min_length=1, max_length=4
    )


class FlashcardParams(BaseModel):
    """``flashcard_generation`` params: count 1..50 (default 5)."""

    count: int = Field(default=5, ge=1, le=50)


_PARAM_MODELS: dict[str, type[BaseModel]] = {
    "quiz_generation": QuizParams,
    "flashcard_generation": FlashcardParams,
}


def normalize_params(job_type: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Validate a job's params and fill the defaults.

    Returns:
        The params for generation jobs with defaults applied; other types' params as given.

    Raises:
        AppError: 400 ``INVALID_ARGUMENT`` with the offending ``params.*`` fields.
    """
    model = _PARAM_MODELS.get(job_type)
    if model is None:
        return dict(params or {})
    try:
        parsed = model.model_validate(params or {})
    except ValidationError as exc:
        details = validation_details(
            [{**e, "loc": ("body", "params", *e.get("loc", ()))} for e in exc.errors()]
        )
        raise AppError(ErrorCode.INVALID_ARGUMENT, "invalid params", details) from None
    extra = {k: v for k, v in (params or {}).items() if k not in model.model_fields}
    return {**extra, **parsed.model_dump()}


def check_idempotency_key(key: str | None) -> str | None:
    """An ``Idempotency-Key`` header value, validated (1..200 printable characters)."""
    if key is None:
        return None
    key = key.strip()
    if not key or len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable():
        raise invalid_argument(
            f"Idempotency-Key must be 1..{IDEMPOTENCY_KEY_MAX} printable characters",
            field="Idempotency-Key",
        )
    return key


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
            whatever job_service refuses with (SPEC §3.1, §6).
    """
    target_id = body.targetId
    if body.targetType == "user":
        if target_id is not None and target_id != user_id:
            raise AppError(ErrorCode.NOT_FOUND, "target not found", {"targetId": target_id})
        target_id = user_id
    elif not target_id:
        raise invalid_argument("targetId is required for this targetType", field="targetId")
    params = normalize_params(body.jobType, body.params)
    req = rr.CreateJobRequest(
        user_id=user_id,
        job_type=pb_enum(JOB_TYPE, body.jobType),
        target_type=pb_enum(TARGET_TYPE, body.targetType),
        target_id=target_id,
        params=dict_to_struct(params),
        api_key_mode=pb_enum(API_KEY_MODE, body.apiKeyMode),
        actor=actor,
    )
    key = check_idempotency_key(idempotency_key)
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
    if resp.replayed:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    else:
        response.status_code = 201
    return job_json(resp.job)
