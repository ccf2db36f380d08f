"""JobService RPCs of the admin views (reference §3, §3.1, §9.5): costs, the breaker, runtime
health, jobs per minute. Proto ↔ domain translation only."""

from __future__ import annotations

from typing import Any

from airuntime_common.enums import BREAKER_STATE
from airuntime_common.timeutil import to_timestamp
from job_service.maintenance.breaker import BreakerView
from job_service.rpc.common import Ctx, rpc
from job_service.rpc.convert import _enum, worker_to_proto
from job_service.services.domain import JobDomain
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr


def _times(out: Any, view: BreakerView) -> None:
    for name in ("opened_at", "half_open_at"):
        ts = to_timestamp(getattr(view, name))
        if ts is not None:
            getattr(out, name).CopyFrom(ts)


def _breaker(views: list[BreakerView]) -> msg.CircuitBreaker:
    """The first provider's fields, and every provider's in ``providers`` (reference §9.4)."""
    first = views[0]
    out = msg.CircuitBreaker(
        state=_enum(BREAKER_STATE.to_proto(first.state)),
        consecutive_failures=first.consecutive_failures,
    )
    _times(out, first)
    for view in views:
        one = out.providers.add(
            name=view.provider,
            state=_enum(BREAKER_STATE.to_proto(view.state)),
            consecutive_failures=view.consecutive_failures,
        )
        _times(one, view)
    return out


class AdminRpcs:
    """``GetCosts, GetCircuitBreaker, ResetCircuitBreaker, GetJobThroughput,
    GetRuntimeHealth``."""

    domain: JobDomain

    @rpc
    async def GetCosts(self, request: rr.GetCostsRequest, context: Ctx) -> rr.GetCostsResponse:
        rows = await self.domain.costs(
            request.from_date, request.to_date, request.group_by or "day"
        )
        return rr.GetCostsResponse(
            rows=[
                msg.CostRow(
                    key=r["key"],
                    calls=r["calls"],
                    prompt_tokens=r["promptTokens"],
                    completion_tokens=r["completionTokens"],
                    cache_hit_tokens=r["cacheHitTokens"],
                    cost_usd=r["costUsd"],
                )
                for r in rows
            ]
        )

    @rpc
    async def GetCircuitBreaker(
        self, request: rr.GetCircuitBreakerRequest, context: Ctx
    ) -> rr.GetCircuitBreakerResponse:
        return rr.GetCircuitBreakerResponse(breaker=_breaker(await self.domain.breaker_views()))

    @rpc
    async def ResetCircuitBreaker(
        self, request: rr.ResetCircuitBreakerRequest, context: Ctx
    ) -> rr.ResetCircuitBreakerResponse:
        provider = request.provider if request.HasField("provider") else None
        await self.domain.breaker_reset(provider)
        return rr.ResetCircuitBreakerResponse(breaker=_breaker(await self.domain.breaker_views()))

    @rpc
    async def ListProviders(
        self, request: rr.ListProvidersRequest, context: Ctx
    ) -> rr.ListProvidersResponse:
        out = rr.ListProvidersResponse()
        for view in await self.domain.provider_states():
            one = out.providers.add(
                name=view.name,
                requests_last_minute=view.requests_last_minute,
                tokens_last_minute=view.tokens_last_minute,
                in_flight=view.in_flight,
            )
            limits = view.limits
            if limits.requestsPerMinute is not None:
                one.requests_per_minute = limits.requestsPerMinute
            if limits.tokensPerMinute is not None:
                one.tokens_per_minute = limits.tokensPerMinute
            if limits.maxConcurrent is not None:
                one.max_concurrent = limits.maxConcurrent
            paused = to_timestamp(view.paused_until)
            if paused is not None:
                one.paused_until.CopyFrom(paused)
            b = view.breaker
            one.breaker.name = b.provider
            one.breaker.state = _enum(BREAKER_STATE.to_proto(b.state))
            one.breaker.consecutive_failures = b.consecutive_failures
            _times(one.breaker, b)
        return out

    @rpc
    async def GetJobThroughput(
        self, request: rr.GetJobThroughputRequest, context: Ctx
    ) -> rr.GetJobThroughputResponse:
        view = await self.domain.throughput(request.hours)
        out = rr.GetJobThroughputResponse(
            minutes=[
                msg.ThroughputMinute(
                    minute=to_timestamp(at), succeeded=ok, failed=bad, cancelled=off
                )
                for at, ok, bad, off in view.minutes
            ],
            succeeded=view.succeeded,
            failed=view.failed,
            cancelled=view.cancelled,
        )
        for name, at in (("from_time", view.since), ("to_time", view.until)):
            ts = to_timestamp(at)
            if ts is not None:
                getattr(out, name).CopyFrom(ts)
        if view.failure_rate is not None:
            out.failure_rate = view.failure_rate
        return out

    # ---- runtime contract

    @rpc
    async def GetRuntimeHealth(
        self, request: rr.GetRuntimeHealthRequest, context: Ctx
    ) -> rr.GetRuntimeHealthResponse:
        serving, found = await self.domain.health()
        return rr.GetRuntimeHealthResponse(
            status="SERVING" if serving else "NOT_SERVING",
            workers=[worker_to_proto(w) for w in found],
        )
