"""JobService RPCs of the prompt registry (reference §10.4): versions, routings, stats,
feedback. Proto ↔ domain translation only."""

from __future__ import annotations

from airuntime_common.enums import JOB_TYPE
from airuntime_common.timeutil import to_timestamp
from job_service.prompts.registry import VersionView
from job_service.prompts.routing import Routing
from job_service.prompts.stats import VersionStats
from job_service.rpc.common import Ctx, rpc
from job_service.rpc.learning import _kind
from job_service.services.domain import JobDomain
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

#: The stats window when a request names none (hours).
DEFAULT_HOURS = 24


def version_to_proto(view: VersionView) -> msg.PromptVersion:
    """A version as a ``PromptVersion`` message."""
    out = msg.PromptVersion(version=view.version, template=view.template, builtin=view.builtin)
    if view.description is not None:
        out.description = view.description
    ts = to_timestamp(view.created_at)
    if ts is not None:
        out.created_at.CopyFrom(ts)
    return out


def routing_to_proto(routing: Routing) -> msg.PromptRouting:
    """A routing as a ``PromptRouting`` message."""
    out = msg.PromptRouting(
        variants=[msg.PromptVariant(version=v.version, weight=v.weight) for v in routing.variants],
        guard=msg.PromptGuard(
            max_invalid_schema_increase=routing.guard.max_invalid_schema_increase,
            min_attempts=routing.guard.min_attempts,
        ),
    )
    for name, value in (("rolled_back_at", routing.rolled_back_at),
                        ("started_at", routing.started_at)):  # fmt: skip
        ts = to_timestamp(value)
        if ts is not None:
            getattr(out, name).CopyFrom(ts)
    if routing.rollback_reason is not None:
        out.rollback_reason = routing.rollback_reason
    return out


def stats_to_proto(stats: VersionStats) -> msg.PromptVersionStats:
    """One version's stats as a ``PromptVersionStats`` message (None → unset)."""
    c = stats.counts
    out = msg.PromptVersionStats(
        version=stats.version,
        attempts=c.attempts,
        succeeded=c.succeeded,
        feedback_positive=stats.feedback_positive,
        feedback_negative=stats.feedback_negative,
    )
    optional = {
        "invalid_schema_rate": c.invalid_schema_rate,
        "mean_prompt_tokens": stats.mean_prompt_tokens,
        "mean_completion_tokens": stats.mean_completion_tokens,
        "p50_latency_ms": stats.p50_latency_ms,
        "p95_latency_ms": stats.p95_latency_ms,
        "cost_per_succeeded_usd": stats.cost_per_succeeded_usd,
    }
    for name, value in optional.items():
        if value is not None:
            setattr(out, name, value)
    return out


class PromptRpcs:
    """``PutPromptVersion, GetPromptVersion, GetPrompts, PutPromptRouting,
    SetResultFeedback``."""

    domain: JobDomain

    @rpc
    async def PutPromptVersion(
        self, request: rr.PutPromptVersionRequest, context: Ctx
    ) -> rr.PutPromptVersionResponse:
        view, created = await self.domain.prompts.put_version(
            JOB_TYPE.to_str(request.job_type),
            request.version,
            request.template,
            request.description if request.HasField("description") else None,
            request.actor,
        )
        return rr.PutPromptVersionResponse(version=version_to_proto(view), created=created)

    @rpc
    async def GetPromptVersion(
        self, request: rr.GetPromptVersionRequest, context: Ctx
    ) -> rr.GetPromptVersionResponse:
        view = await self.domain.prompts.get_version(
            JOB_TYPE.to_str(request.job_type), request.version
        )
        return rr.GetPromptVersionResponse(version=version_to_proto(view))

    @rpc
    async def GetPrompts(
        self, request: rr.GetPromptsRequest, context: Ctx
    ) -> rr.GetPromptsResponse:
        found = await self.domain.prompts.overview(
            JOB_TYPE.to_str(request.job_type), request.hours or DEFAULT_HOURS
        )
        out = rr.GetPromptsResponse(
            versions=[version_to_proto(v) for v in found.versions],
            stats=[stats_to_proto(s) for s in found.stats],
        )
        if found.routing is not None:
            out.routing.CopyFrom(routing_to_proto(found.routing))
        return out

    @rpc
    async def PutPromptRouting(
        self, request: rr.PutPromptRoutingRequest, context: Ctx
    ) -> rr.PutPromptRoutingResponse:
        routing = await self.domain.prompts.put_routing(
            JOB_TYPE.to_str(request.job_type),
            [(v.version, v.weight) for v in request.variants],
            request.max_invalid_schema_increase
            if request.HasField("max_invalid_schema_increase")
            else None,
            request.min_attempts if request.HasField("min_attempts") else None,
            request.actor,
        )
        return rr.PutPromptRoutingResponse(routing=routing_to_proto(routing))

    @rpc
    async def SetResultFeedback(
        self, request: rr.SetResultFeedbackRequest, context: Ctx
    ) -> rr.SetResultFeedbackResponse:
        await self.domain.prompts.set_feedback(
            request.user_id, _kind(request.kind), request.item_id, request.rating
        )
        return rr.SetResultFeedbackResponse()
