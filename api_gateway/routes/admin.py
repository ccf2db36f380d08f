"""Admin REST under ``/admin`` (reference §3.1) and the operator console page.

Every route except ``GET /admin/console`` needs an admin JWT (a user token →
403 ``PERMISSION_DENIED``).
"""

from __future__ import annotations

import asyncio
import re
from datetime import date, timedelta
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from fastapi.responses import HTMLResponse
from pydantic import BeforeValidator

from airuntime_common.enums import JOB_STATUS, JOB_TYPE
from airuntime_common.errors import invalid_argument
from airuntime_common.timeutil import utcnow
from api_gateway import convert
from api_gateway.backends import Caller
from api_gateway.convert import pb_enum
from api_gateway.deps import AdminPrincipal, Backend, Settings
from api_gateway.gate import GatedRoute
from api_gateway.headers import IdempotencyKeyHeader
from api_gateway.jobs import create_job
from api_gateway.provider_schemas import ProvidersOut, provider_json
from api_gateway.routes.public import ERRORS, REPLAYED
from api_gateway.schemas import (
    AdminJobCreate,
    AdminJobDetailOut,
    AdminJobList,
    AdminRuntimeOut,
    BreakerOut,
    CostsOut,
    GroupBy,
    JobOut,
    JobStatus,
    JobType,
    RerunBody,
    Rfc3339,
    ThroughputOut,
)
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.worker.v1 import request_response_pb2 as worker_rr

router = APIRouter(prefix="/admin", tags=["admin"], responses=ERRORS, route_class=GatedRoute)

#: The console's files: ``index.html`` at ``/admin/console``, the rest (ES modules, the
#: stylesheet) under :data:`CONSOLE_ASSETS_PATH`; nothing is fetched from elsewhere.
CONSOLE_DIR = FsPath(__file__).resolve().parent.parent / "static" / "console"
CONSOLE_FILE = CONSOLE_DIR / "index.html"
CONSOLE_ASSETS_PATH = "/admin/console/static"
#: The page runs only its own scripts and styles and talks only to this origin.
CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _iso_date_only(value: Any) -> Any:
    """Accept only ``YYYY-MM-DD`` text for a date (no timestamps, no numbers)."""
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be a date YYYY-MM-DD")
    return value


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
IsoDate = Annotated[date, BeforeValidator(_iso_date_only)]

JobId = Annotated[str, Path(min_length=1)]


@router.post(
    "/ai/jobs",
    status_code=201,
    response_model=JobOut,
    responses=REPLAYED,
)
async def admin_create_job(
    principal: AdminPrincipal,
    call: Backend,
    body: AdminJobCreate,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> dict[str, Any]:
    """Create a job for any user, with optional priority, retries and timeout overrides."""
    return await create_job(
        call,
        body,
        user_id=body.userId,
        actor=principal.actor,
        response=response,
        idempotency_key=idempotency_key,
        priority=body.priority,
        max_retry_count=body.maxRetryCount,
        timeout_seconds=body.timeoutSeconds,
    )


@router.get("/ai/jobs", response_model=AdminJobList)
async def admin_list_jobs(
    principal: AdminPrincipal,
    call: Backend,
    status: JobStatus | None = None,
    jobType: JobType | None = None,
    userId: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    createdFrom: Annotated[
        Rfc3339 | None, Query(description="created at or after (RFC 3339)")
    ] = None,
    createdTo: Annotated[Rfc3339 | None, Query(description="created before (RFC 3339)")] = None,
    includeCounts: Annotated[
        bool, Query(description="add `counts`: jobs per state for every filter but status")
    ] = False,
    pageSize: Annotated[int, Query(ge=1, le=100)] = 20,
    pageToken: Annotated[str | None, Query(max_length=1024)] = None,
    parentJobId: Annotated[
        str | None, Query(min_length=1, max_length=128, description="a batch's children")
    ] = None,
) -> dict[str, Any]:
    """All users' jobs, newest first, filtered by status, job type, user, creation
    time ``[createdFrom, createdTo)`` and batch (``parentJobId``, reference §10.3); with
    ``includeCounts`` also the exact number of jobs in each state for the other filters
    (reference §3.1, §9.5 console).

    A bad filter (unknown status or type, a time without an offset, ``createdFrom``
    not before ``createdTo``) is 400 ``INVALID_ARGUMENT``.
    """
    if createdFrom is not None and createdTo is not None and createdFrom >= createdTo:
        raise invalid_argument("createdFrom must be before createdTo", field="createdFrom")
    req = rr.ListJobsRequest(page_size=pageSize, include_counts=includeCounts)
    if userId:
        req.user_id = userId
    if status:
        req.status = pb_enum(JOB_STATUS, status)
    if jobType:
        req.job_type = pb_enum(JOB_TYPE, jobType)
    if pageToken:
        req.page_token = pageToken
    if parentJobId:
        req.parent_job_id = parentJobId
    for name, value in (("created_from", createdFrom), ("created_to", createdTo)):
        if value is not None:
            getattr(req, name).CopyFrom(convert.timestamp_or_none(value))
    resp = await call(call.job.ListJobs, req)
    counts = {JOB_STATUS.to_str_or_none(c.status): c.count for c in resp.counts}
    return {
        "jobs": [convert.job_json(j) for j in resp.jobs],
        "nextPageToken": resp.next_page_token or None,
        "counts": {k: v for k, v in counts.items() if k} if includeCounts else None,
    }


@router.get("/ai/jobs/{jobId}", response_model=AdminJobDetailOut)
async def admin_get_job(principal: AdminPrincipal, call: Backend, jobId: JobId) -> dict[str, Any]:
    """One job with its whole history (events oldest first) and its model calls, the
    same grouped by attempt, and what its snapshot holds (reference §3.1, §9.5 console)."""
    resp = await call(call.job.GetJob, rr.GetJobRequest(job_id=jobId, include_history=True))
    return {
        **convert.job_json(resp.job),
        "events": [convert.event_json(e) for e in resp.events],
        "invocations": [convert.invocation_json(i) for i in resp.invocations],
        "attempts": [convert.attempt_json(a) for a in resp.attempts],
        "snapshot": convert.snapshot_summary_json(resp.snapshot)
        if resp.HasField("snapshot")
        else None,
    }


@router.get("/ai/throughput", response_model=ThroughputOut)
async def admin_throughput(
    principal: AdminPrincipal,
    call: Backend,
    hours: Annotated[int, Query(ge=1, le=168, description="the window, in hours")] = 6,
) -> dict[str, Any]:
    """Jobs ended per minute by outcome (succeeded, failed, cancelled) over the last
    ``hours``, and the window's failure rate, counted by the database (reference §9.5)."""
    resp = await call(call.job.GetJobThroughput, rr.GetJobThroughputRequest(hours=hours))
    return convert.throughput_json(resp, hours)


@router.post("/ai/jobs/{jobId}/rerun", status_code=201, response_model=JobOut)
async def admin_rerun_job(
    principal: AdminPrincipal,
    call: Backend,
    jobId: JobId,
    body: Annotated[RerunBody | None, Body()] = None,
) -> dict[str, Any]:
    """Re-run a failed job as a new job with ``retriedFromJobId`` (else 409).

    The new job is refused as a create of its user would be: 403 AI_NOT_AUTHORIZED,
    422 INVALID_CREDENTIAL (no usable key; it takes the user's current one), 429/503
    for the platform budget and breaker (reference §2.3, §6).
    """
    resp = await call(
        call.job.RerunJob,
        rr.RerunJobRequest(
            job_id=jobId,
            rebuild_snapshot=bool(body and body.rebuildSnapshot),
            actor=principal.actor,
        ),
    )
    return convert.job_json(resp.job)


@router.post("/ai/jobs/{jobId}/cancel", response_model=JobOut)
async def admin_cancel_job(
    principal: AdminPrincipal, call: Backend, jobId: JobId
) -> dict[str, Any]:
    """Cancel any user's job, as the user cancel does."""
    resp = await call(call.job.CancelJob, rr.CancelJobRequest(job_id=jobId, actor=principal.actor))
    return convert.job_json(resp.job)


@router.get("/ai/costs", response_model=CostsOut)
async def admin_costs(
    principal: AdminPrincipal,
    call: Backend,
    from_: Annotated[IsoDate | None, Query(alias="from")] = None,
    to: Annotated[IsoDate | None, Query()] = None,
    groupBy: GroupBy = "day",
) -> dict[str, Any]:
    """Model cost rollup over UTC days, inclusive (default: the 30 days up to ``to``,
    today by default; never before 0001-01-01)."""
    end = to or utcnow().date()
    start = from_ or end - timedelta(days=min(29, (end - date.min).days))
    if start > end:
        raise invalid_argument("from must not be after to", field="from")
    resp = await call(
        call.job.GetCosts,
        rr.GetCostsRequest(from_date=start.isoformat(), to_date=end.isoformat(), group_by=groupBy),
    )
    return {"rows": [convert.cost_row_json(r) for r in resp.rows]}


@router.get("/ai/circuit-breaker", response_model=BreakerOut)
async def admin_breaker(principal: AdminPrincipal, call: Backend) -> dict[str, Any]:
    """The platform circuit breaker."""
    resp = await call(call.job.GetCircuitBreaker, rr.GetCircuitBreakerRequest())
    return convert.breaker_json(resp.breaker)


@router.get("/ai/providers", response_model=ProvidersOut)
async def admin_providers(principal: AdminPrincipal, call: Backend) -> dict[str, Any]:
    """Every model provider: its limits, what the last minute used of them, the
    attempts holding a lease on it, its pause after a 429 and its breaker
    (reference §10.2)."""
    resp = await call(call.job.ListProviders, rr.ListProvidersRequest())
    return {"providers": [provider_json(p) for p in resp.providers]}


@router.post("/ai/circuit-breaker/reset", response_model=BreakerOut)
async def admin_breaker_reset(
    principal: AdminPrincipal,
    call: Backend,
    provider: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> dict[str, Any]:
    """Close the platform circuit breaker of ``provider``, or of every provider without
    it (reference §9.4); a provider not configured is 400 INVALID_ARGUMENT."""
    request = rr.ResetCircuitBreakerRequest()
    if provider is not None:
        request.provider = provider
    resp = await call(call.job.ResetCircuitBreaker, request)
    return convert.breaker_json(resp.breaker)


async def _live_status(call: Caller, address: str, deadline: float) -> tuple[Any, str | None]:
    """``GetStatus`` of one worker, best effort: (status JSON | None, error | None)."""
    stub = call.backends.worker(address)
    try:
        resp = await call(stub.GetStatus, worker_rr.GetStatusRequest(), deadline=deadline)
    except Exception as exc:  # best effort: one bad worker must not fail the page
        code = getattr(exc, "code", None)
        return None, str(code) if isinstance(code, str) else type(exc).__name__
    return convert.worker_status_json(resp), None


@router.get("/ai/runtime", response_model=AdminRuntimeOut)
async def admin_runtime(
    principal: AdminPrincipal, call: Backend, settings: Settings
) -> dict[str, Any]:
    """Runtime health from job_service's registry plus each worker's own status (best effort)."""
    resp = await call(call.job.GetRuntimeHealth, rr.GetRuntimeHealthRequest())
    timeout = settings.WORKER_STATUS_TIMEOUT_SECONDS
    reported = [w.status_address for w in resp.workers if w.status_address]
    configured = [a for a in settings.worker_addrs if a not in reported]
    addresses = list(dict.fromkeys([*reported, *configured]))
    lives = await asyncio.gather(*(_live_status(call, a, timeout) for a in addresses))
    by_address = dict(zip(addresses, lives, strict=True))
    workers = []
    for w in resp.workers:
        live, error = by_address.get(w.status_address, (None, None))
        workers.append(
            {
                **convert.runtime_worker_json(w),
                "statusAddress": w.status_address or None,
                "live": live,
                "liveError": error if w.status_address else "no status address reported",
            }
        )
    return {
        "status": resp.status,
        "workers": workers,
        "configuredWorkers": [
            {"statusAddress": a, "live": by_address[a][0], "liveError": by_address[a][1]}
            for a in configured
        ],
    }


@router.get("/console", response_class=HTMLResponse, include_in_schema=False)
async def admin_console() -> HTMLResponse:
    """The operator's console (static; it asks for an admin token itself, reference §3.1, §9.5):
    job list, job page, charts, workers and breakers, drawn from the admin API."""
    return HTMLResponse(
        CONSOLE_FILE.read_text(encoding="utf-8"),
        headers={
            "Cache-Control": "no-cache",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": CONSOLE_CSP,
            "X-Content-Type-Options": "nosniff",
        },
    )


__all__ = ["router"]
