"""JobService RPCs of users and admins on jobs (reference §3.1): create, read, list, cancel,
re-run, and the AI switch. Proto ↔ domain translation only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airuntime_common import tracing
from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.timeutil import from_timestamp, to_timestamp
from job_service.rpc.common import Ctx, job_id_of, rpc
from job_service.rpc.convert import (
    _enum,
    attempt_to_proto,
    event_to_proto,
    from_struct,
    invocation_to_proto,
    job_to_proto,
    snapshot_summary_to_proto,
)
from job_service.services.console import check_created_range
from job_service.services.domain import JobDomain
from job_service.services.inputs import CreateBatchInput, CreateJobInput, RetryInput
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr


def _opt(request: Any, name: str) -> Any:
    """A request's proto3 ``optional`` field, or None when unset."""
    return getattr(request, name) if request.HasField(name) else None


def _naive(request: Any, name: str) -> datetime | None:
    """A request's Timestamp field as a naive UTC datetime (the columns' form), or None."""
    value = from_timestamp(getattr(request, name), request.HasField(name))
    return value.replace(tzinfo=None) if value is not None else None


class JobRpcs:
    """``CreateJob, CreateJobBatch, GetJob, ListJobs, CancelJob, RerunJob,
    GetAiAuthorization, SetAiAuthorization``."""

    domain: JobDomain

    @rpc
    async def CreateJob(self, request: rr.CreateJobRequest, context: Ctx) -> rr.CreateJobResponse:
        req = CreateJobInput(
            user_id=request.user_id,
            job_type=JOB_TYPE.to_str(request.job_type),
            target_type=TARGET_TYPE.to_str(request.target_type),
            target_id=request.target_id,
            params=from_struct(request.params, "params"),
            api_key_mode=API_KEY_MODE.optional(request.api_key_mode) or "platform_key",
            idempotency_key=request.idempotency_key
            if request.HasField("idempotency_key")
            else None,
            priority=request.priority if request.HasField("priority") else None,
            max_retry_count=request.max_retry_count
            if request.HasField("max_retry_count")
            else None,
            timeout_seconds=request.timeout_seconds
            if request.HasField("timeout_seconds")
            else None,
            plan=request.plan if request.HasField("plan") else None,
            actor=request.actor,
            trace_parent=tracing.job_trace_parent(context),
        )
        job, replayed = await self.domain.create(req)
        return rr.CreateJobResponse(job=job_to_proto(job), replayed=replayed)

    @rpc
    async def CreateJobBatch(
        self, request: rr.CreateJobBatchRequest, context: Ctx
    ) -> rr.CreateJobBatchResponse:
        """A batch: its parent and one child per target (reference §10.3)."""
        targets_of = None
        if request.HasField("targets_of"):
            of = request.targets_of
            targets_of = (
                TARGET_TYPE.to_str(of.target_type),
                of.material_id if of.HasField("material_id") else None,
            )
        req = CreateBatchInput(
            user_id=request.user_id,
            job_type=JOB_TYPE.to_str(request.job_type),
            targets=[(TARGET_TYPE.to_str(t.target_type), t.target_id) for t in request.targets]
            if targets_of is None or request.targets
            else None,
            targets_of=targets_of,
            params=from_struct(request.params, "params"),
            api_key_mode=API_KEY_MODE.optional(request.api_key_mode) or "platform_key",
            min_success_ratio=_opt(request, "min_success_ratio"),
            idempotency_key=_opt(request, "idempotency_key"),
            priority=_opt(request, "priority"),
            max_retry_count=_opt(request, "max_retry_count"),
            timeout_seconds=_opt(request, "timeout_seconds"),
            plan=_opt(request, "plan"),
            actor=request.actor,
            trace_parent=tracing.job_trace_parent(context),
        )
        job, replayed = await self.domain.create_batch(req)
        return rr.CreateJobBatchResponse(job=job_to_proto(job), replayed=replayed)

    @rpc
    async def GetJob(self, request: rr.GetJobRequest, context: Ctx) -> rr.GetJobResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        job = await self.domain.get(job_id_of(request.job_id), user_id)
        if not request.include_history:
            return rr.GetJobResponse(job=job_to_proto(job))
        told = await self.domain.explain(job.job_id)
        out = rr.GetJobResponse(
            job=job_to_proto(told.job),
            events=[event_to_proto(e) for e in told.events],
            invocations=[invocation_to_proto(i) for i in told.invocations],
            attempts=[attempt_to_proto(a) for a in told.attempts],
        )
        if told.snapshot is not None:
            out.snapshot.CopyFrom(snapshot_summary_to_proto(told.snapshot))
        return out

    @rpc
    async def ListJobs(self, request: rr.ListJobsRequest, context: Ctx) -> rr.ListJobsResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        status = JOB_STATUS.optional(request.status)
        job_type = JOB_TYPE.optional(request.job_type)
        created_from = _naive(request, "created_from")
        created_to = _naive(request, "created_to")
        check_created_range(created_from, created_to)
        if request.job_ids:
            others = (
                status,
                job_type,
                created_from,
                created_to,
                request.page_token,
                _opt(request, "parent_job_id"),
            )
            if (
                any(v is not None and v != "" for v in others)
                or request.page_size
                or (request.include_counts)
            ):
                raise AppError(
                    ErrorCode.INVALID_ARGUMENT,
                    "jobIds cannot be combined with other filters, paging or counts",
                    {"field": "jobIds"},
                )
            found = await self.domain.jobs_by_ids(request.user_id, list(request.job_ids))
            return rr.ListJobsResponse(jobs=[job_to_proto(j) for j in found])
        rows, token = await self.domain.list_jobs(
            user_id=user_id,
            status=status,
            job_type=job_type,
            page_size=request.page_size,
            page_token=request.page_token,
            created_from=created_from,
            created_to=created_to,
            parent_job_id=_opt(request, "parent_job_id"),
        )
        out = rr.ListJobsResponse(jobs=[job_to_proto(j) for j in rows], next_page_token=token)
        if request.include_counts:
            counts = await self.domain.job_counts(
                user_id=user_id,
                job_type=job_type,
                created_from=created_from,
                created_to=created_to,
            )
            out.counts.extend(
                msg.JobStateCount(status=_enum(JOB_STATUS.to_proto(state)), count=n)
                for state, n in counts.items()
            )
        return out

    @rpc
    async def CancelJob(self, request: rr.CancelJobRequest, context: Ctx) -> rr.CancelJobResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        job = await self.domain.cancel(
            job_id_of(request.job_id),
            user_id=user_id,
            actor=request.actor or (f"user:{user_id}" if user_id else "admin"),
        )
        return rr.CancelJobResponse(job=job_to_proto(job))

    @rpc
    async def RerunJob(self, request: rr.RerunJobRequest, context: Ctx) -> rr.RerunJobResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        job, replayed = await self.domain.retry(
            RetryInput(
                job_id_of(request.job_id),
                rebuild_snapshot=request.rebuild_snapshot,
                actor=request.actor or (f"user:{user_id}" if user_id else "admin"),
                user_id=user_id,
                idempotency_key=request.idempotency_key
                if request.HasField("idempotency_key")
                else None,
                plan=request.plan if request.HasField("plan") else None,
                trace_parent=tracing.job_trace_parent(context),
            )
        )
        return rr.RerunJobResponse(job=job_to_proto(job), replayed=replayed)

    @rpc
    async def GetAiAuthorization(
        self, request: rr.GetAiAuthorizationRequest, context: Ctx
    ) -> rr.GetAiAuthorizationResponse:
        if not request.user_id:
            raise AppError(ErrorCode.INVALID_ARGUMENT, "userId is required", {"field": "userId"})
        view = await self.domain.get_authorization(request.user_id)
        out = rr.GetAiAuthorizationResponse(granted=view.granted)
        ts = to_timestamp(view.changed_at)
        if ts is not None:
            out.changed_at.CopyFrom(ts)
        return out

    @rpc
    async def SetAiAuthorization(
        self, request: rr.SetAiAuthorizationRequest, context: Ctx
    ) -> rr.SetAiAuthorizationResponse:
        view = await self.domain.set_authorization(request.user_id, request.granted)
        out = rr.SetAiAuthorizationResponse(
            granted=view.granted, cancelled=view.cancelled, cancel_requested=view.cancel_requested
        )
        ts = to_timestamp(view.changed_at)
        if ts is not None:
            out.changed_at.CopyFrom(ts)
        return out
