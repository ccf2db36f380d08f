"""The prompt registry's admin REST under ``/admin/ai/prompts`` (reference §10.4).

Every route needs an admin JWT (a user token → 403 ``PERMISSION_DENIED``). Errors
map as every route's (``PROMPT_VERSION_EXISTS`` 409, ``INVALID_PROMPT_TEMPLATE``
422 naming the template line, ``INVALID_ARGUMENT`` 400).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from airuntime_common.enums import JOB_TYPE
from api_gateway import convert
from api_gateway.convert import pb_enum
from api_gateway.deps import AdminPrincipal, Backend
from api_gateway.gate import GatedRoute
from api_gateway.prompt_schemas import (
    VERSION_PATTERN,
    PromptRoutingIn,
    PromptRoutingOut,
    PromptsOut,
    PromptVersionIn,
    PromptVersionOut,
)
from api_gateway.routes.public import ERRORS
from api_gateway.schemas import JobType
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

router = APIRouter(
    prefix="/admin/ai/prompts", tags=["admin"], responses=ERRORS, route_class=GatedRoute
)

VersionPath = Annotated[str, Path(pattern=VERSION_PATTERN)]
#: The stats' window when none is asked for (hours).
DEFAULT_HOURS = 24
#: What a job type with no routing does: every new job gets ``v1`` (reference §10.4).
DEFAULT_GUARD = {"maxInvalidSchemaIncrease": 0.10, "minAttempts": 50}


def version_json(v: Any) -> dict[str, Any]:
    """A ``PromptVersion`` message → JSON (every key present)."""
    return {
        "version": v.version,
        "template": v.template,
        "description": convert.opt(v, "description"),
        "createdAt": convert.ts(v, "created_at"),
        "builtin": v.builtin,
    }


def routing_json(r: Any | None) -> dict[str, Any]:
    """A ``PromptRouting`` message → JSON; None → the routing of a type that has none."""
    if r is None:
        return {
            "variants": [{"version": "v1", "weight": 1.0}],
            "guard": DEFAULT_GUARD,
            "rolledBackAt": None,
            "rollbackReason": None,
            "startedAt": None,
        }
    return {
        "variants": [{"version": v.version, "weight": v.weight} for v in r.variants],
        "guard": {
            "maxInvalidSchemaIncrease": r.guard.max_invalid_schema_increase,
            "minAttempts": r.guard.min_attempts,
        },
        "rolledBackAt": convert.ts(r, "rolled_back_at"),
        "rollbackReason": convert.opt(r, "rollback_reason"),
        "startedAt": convert.ts(r, "started_at"),
    }


def stats_json(s: Any) -> dict[str, Any]:
    """A ``PromptVersionStats`` message → JSON (unset figures null)."""
    return {
        "version": s.version,
        "attempts": s.attempts,
        "succeeded": s.succeeded,
        **{
            name: convert.opt(s, field)
            for name, field in (
                ("invalidSchemaRate", "invalid_schema_rate"),
                ("meanPromptTokens", "mean_prompt_tokens"),
                ("meanCompletionTokens", "mean_completion_tokens"),
                ("p50LatencyMs", "p50_latency_ms"),
                ("p95LatencyMs", "p95_latency_ms"),
                ("costPerSucceededUsd", "cost_per_succeeded_usd"),
            )
        },
        "feedback": {"positive": s.feedback_positive, "negative": s.feedback_negative},
    }


@router.post(
    "/{jobType}/versions",
    status_code=201,
    response_model=PromptVersionOut,
    responses={200: {"model": PromptVersionOut, "description": "the same template, already"}},
)
async def admin_put_prompt_version(
    principal: AdminPrincipal,
    call: Backend,
    jobType: JobType,
    body: PromptVersionIn,
    response: Response,
) -> dict[str, Any]:
    """Upload a new, immutable version of ``jobType``'s prompt: 201; the same version with
    the same template again: 200; with another template (or ``v1``): 409
    ``PROMPT_VERSION_EXISTS``. The template is rendered against a sample snapshot in the
    sandbox first: one that does not render, or renders to more than 1 MiB, is 422
    ``INVALID_PROMPT_TEMPLATE`` naming the line."""
    request = rr.PutPromptVersionRequest(
        job_type=pb_enum(JOB_TYPE, jobType),
        version=body.version,
        template=body.template,
        actor=principal.actor,
    )
    if body.description is not None:
        request.description = body.description
    resp = await call(call.job.PutPromptVersion, request)
    if not resp.created:
        response.status_code = 200
    return version_json(resp.version)


@router.get("/{jobType}/versions/{version}", response_model=PromptVersionOut)
async def admin_get_prompt_version(
    principal: AdminPrincipal, call: Backend, jobType: JobType, version: VersionPath
) -> dict[str, Any]:
    """One version with its whole template (the shipped ``v1`` with its includes inlined,
    to start a new version from); unknown → 404 ``NOT_FOUND``."""
    resp = await call(
        call.job.GetPromptVersion,
        rr.GetPromptVersionRequest(job_type=pb_enum(JOB_TYPE, jobType), version=version),
    )
    return version_json(resp.version)


@router.put("/{jobType}/routing", response_model=PromptRoutingOut)
async def admin_put_prompt_routing(
    principal: AdminPrincipal, call: Backend, jobType: JobType, body: PromptRoutingIn
) -> dict[str, Any]:
    """Set which versions new jobs of ``jobType`` get: each user sticks to one variant
    (a stable hash of the user and this routing), chosen at create and kept for the
    job's every attempt; every replica's next create follows it. The first variant is
    the control the guard rolls back to; a new routing clears a rollback. A version the
    type does not have is 400."""
    request = rr.PutPromptRoutingRequest(
        job_type=pb_enum(JOB_TYPE, jobType),
        variants=[msg.PromptVariant(version=v.version, weight=v.weight) for v in body.variants],
        actor=principal.actor,
    )
    if body.guard is not None:
        if body.guard.maxInvalidSchemaIncrease is not None:
            request.max_invalid_schema_increase = body.guard.maxInvalidSchemaIncrease
        if body.guard.minAttempts is not None:
            request.min_attempts = body.guard.minAttempts
    resp = await call(call.job.PutPromptRouting, request)
    return routing_json(resp.routing)


@router.get("/{jobType}", response_model=PromptsOut)
async def admin_get_prompts(
    principal: AdminPrincipal,
    call: Backend,
    jobType: JobType,
    hours: Annotated[int, Query(ge=1, le=720, description="the stats' window, in hours")] = (
        DEFAULT_HOURS
    ),
) -> dict[str, Any]:
    """``jobType``'s versions, the routing in force and each version's stats over the
    last ``hours``: attempts, successes, ``invalidSchemaRate`` (per attempt), mean tokens
    per model call, p50/p95 model-call latency, cost per succeeded job, feedback."""
    resp = await call(
        call.job.GetPrompts,
        rr.GetPromptsRequest(job_type=pb_enum(JOB_TYPE, jobType), hours=hours),
    )
    return {
        "jobType": jobType,
        "hours": hours,
        "versions": [
            {k: v for k, v in version_json(x).items() if k != "template"} for x in resp.versions
        ],
        "routing": routing_json(resp.routing if resp.HasField("routing") else None),
        "stats": [stats_json(s) for s in resp.stats],
    }


__all__ = ["router"]
