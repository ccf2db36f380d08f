"""``zhixi.airuntime.job.v1.JobService``: proto ↔ domain only (SPEC §3).

Every :class:`AppError` becomes a rich gRPC status via
:func:`airuntime_common.grpc_errors.abort`; an unexpected exception becomes
``INTERNAL`` (logged), never a bare traceback. Runtime calls read the caller's
instance id from ``x-runtime-instance-id`` (missing → INVALID_ARGUMENT).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf import struct_pb2
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, BREAKER_STATE, JOB_STATUS, JOB_TYPE, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import abort
from airuntime_common.logs import bind, log_context
from airuntime_common.settings import DAY
from airuntime_common.timeutil import to_timestamp
from job_service.convert import (
    _enum,
    event_to_proto,
    from_struct,
    invocation_to_proto,
    job_to_proto,
    to_struct,
    worker_to_proto,
)
from job_service.domain.breaker import BreakerView
from job_service.domain.jobs import (
    ClaimNext,
    CreateJobInput,
    JobDomain,
    JobRecord,
    LeaseHolderView,
    ModelCallInput,
)
from job_service.domain.ports import SnapshotView
from job_service.domain.statemachine import Lease
from job_service.settings import JobServiceSettings
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc

try:
    from job_service.servicer_learning import LearningRpcsMixin
except ImportError:  # pragma: no cover - the learning RPCs module is optional at import time

    class LearningRpcsMixin:  # type: ignore[no-redef]
        """Placeholder until the learning-data RPCs are available."""


log = logging.getLogger(__name__)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type hints)


def rpc(
    fn: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    """Map :class:`AppError` to a rich status, a database that cannot be reached to
    ``UNAVAILABLE`` (retryable: nothing was committed, or the call is idempotent),
    and anything else unexpected to INTERNAL."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await fn(self, request, context)
        except AppError as err:
            await abort(context, err)
        except grpc.aio.AbortError:
            raise
        except DBAPIError as exc:
            if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                log.exception("unexpected database error in %s", fn.__name__)
                await abort(context, AppError(ErrorCode.INTERNAL, "internal error", None))
            log.warning(
                "database unavailable in %s: %s",
                fn.__name__,
                type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__,
            )
            await abort(
                context, AppError(ErrorCode.UNAVAILABLE, "the job database is unavailable", None)
            )
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            await abort(context, AppError(ErrorCode.INTERNAL, "internal error", None))
        raise AssertionError("unreachable")  # pragma: no cover

    return wrapper


def _instance(context: Ctx) -> str:
    value = metadata.get(context, metadata.RUNTIME_INSTANCE_ID)
    if not value:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "x-runtime-instance-id metadata is required",
            {"field": "x-runtime-instance-id"},
        )
    if len(value) > 128:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "x-runtime-instance-id is too long",
            {"field": "x-runtime-instance-id"},
        )
    return value


def _job_id(value: str) -> str:
    if not value:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "jobId is required", {"field": "jobId"})
    return value


def _verify_lease(request: rr.VerifyLeaseRequest) -> Lease:
    """The lease a VerifyLease (or one item of VerifyLeases) asks about.

    Raises:
        AppError: INVALID_ARGUMENT (no job id, no runtime instance id, attemptNo < 1).
    """
    if not request.runtime_instance_id:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            "runtimeInstanceId is required",
            {"field": "runtimeInstanceId"},
        )
    return Lease(_job_id(request.job_id), request.runtime_instance_id, _attempt(request.attempt_no))


def _lease_holder(job: LeaseHolderView) -> rr.VerifyLeaseResponse:
    out = rr.VerifyLeaseResponse(
        user_id=job.user_id,
        api_key_mode=_enum(API_KEY_MODE.to_proto(job.api_key_mode)),
        model_provider=job.model_provider,
        model_name=job.model_name,
    )
    if job.credential_id is not None:
        out.credential_id = job.credential_id
    return out


def _attempt(value: int) -> int:
    if value < 1:
        raise AppError(ErrorCode.INVALID_ARGUMENT, "attemptNo must be ≥ 1", {"field": "attemptNo"})
    return value


#: Bounds of runtime request fields, shared with the REST shim's body models so
#: both transports refuse the same requests (and no value overflows its column).
MAX_CAPABILITIES = 10
MAX_STATUS_ADDRESS = 255
MAX_PROMPT_VERSION = 64
MAX_OUTPUT_SCHEMA_VERSION = 16
MAX_ERROR_CODE = 64
MAX_ERROR_MESSAGE = 4000
#: Snapshot bytes one ClaimJobs answer carries at most (``with_snapshots``); the
#: jobs past it come without theirs, so the answer stays far below the gRPC
#: message limit (``MAX_MESSAGE_BYTES``, 8 MiB) whatever the snapshots weigh.
CLAIM_SNAPSHOTS_MAX_BYTES = 2 * 1024 * 1024
MAX_RETRY_AFTER_SECONDS = float(DAY)
MAX_MODEL_PROVIDER = 32
MAX_MODEL_NAME = 64
MAX_CREDENTIAL_ID = 64
MAX_PROVIDER_REQUEST_ID = 128
#: Token counts and latencies stay within the integers JSON handles exactly.
MAX_COUNTER = 2**53


def _caps(values: Any) -> list[str]:
    if len(values) > MAX_CAPABILITIES:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"at most {MAX_CAPABILITIES} capabilities",
            {"field": "capabilities"},
        )
    # a repeated capability is the same capability: kept once, in first-seen order
    return list(dict.fromkeys(JOB_TYPE.to_str(v) for v in values))


def _text(value: str, field: str, max_len: int, *, required: bool = False) -> str:
    """A string request field within its bounds (``INVALID_ARGUMENT`` naming it otherwise)."""
    if required and not value.strip():
        raise AppError(ErrorCode.INVALID_ARGUMENT, f"{field} is required", {"field": field})
    if len(value) > max_len:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field} is longer than {max_len} characters",
            {"field": field},
        )
    return value


def _counter(value: int, field: str) -> int:
    if not 0 <= value <= MAX_COUNTER:
        raise AppError(ErrorCode.INVALID_ARGUMENT, f"{field} must be 0..2^53", {"field": field})
    return value


#: Snapshot payloads kept as Structs for GetSnapshot (least recently used dropped).
MAX_CACHED_PAYLOADS = 256
#: Model calls one SubmitResult/FailJob may carry (a worker makes at most two per attempt).
MAX_CALLS_PER_REPORT = 20


def _model_call(c: Any, at: str = "") -> ModelCallInput:
    """One reported model call (a ``ModelCall`` or a ``RecordInvocationRequest``: the same
    field names), its fields checked; ``at`` prefixes the field named in an error.

    Raises:
        AppError: INVALID_ARGUMENT naming ``<at><field>``.
    """
    for field, value, max_len in (
        ("credentialId", c.credential_id, MAX_CREDENTIAL_ID),
        ("errorCode", c.error_code, MAX_ERROR_CODE),
        ("providerRequestId", c.provider_request_id, MAX_PROVIDER_REQUEST_ID),
    ):
        _text(value, at + field, max_len)
    call = ModelCallInput(
        model_provider=_text(
            c.model_provider, at + "modelProvider", MAX_MODEL_PROVIDER, required=True
        ),
        model_name=_text(c.model_name, at + "modelName", MAX_MODEL_NAME, required=True),
        api_key_mode=API_KEY_MODE.optional(c.api_key_mode),
        credential_id=c.credential_id if c.HasField("credential_id") else None,
        prompt_tokens=_counter(c.prompt_tokens, at + "promptTokens"),
        completion_tokens=_counter(c.completion_tokens, at + "completionTokens"),
        cache_hit_tokens=_counter(c.cache_hit_tokens, at + "cacheHitTokens"),
        latency_ms=_counter(c.latency_ms, at + "latencyMs"),
        outcome=c.outcome,
        error_code=c.error_code if c.HasField("error_code") else None,
        provider_request_id=c.provider_request_id if c.HasField("provider_request_id") else None,
    )
    try:
        call.check()
    except AppError as err:
        field = (err.details or {}).get("field", "")
        raise AppError(err.code, err.message, {"field": at + str(field)}) from None
    return call


def _calls(reported: Any) -> list[ModelCallInput]:
    """The ``invocations`` of a SubmitResult/FailJob, checked like RecordInvocation's fields.

    Raises:
        AppError: INVALID_ARGUMENT naming ``invocations[i].<field>``.
    """
    if len(reported) > MAX_CALLS_PER_REPORT:
        raise AppError(
            ErrorCode.INVALID_ARGUMENT,
            f"at most {MAX_CALLS_PER_REPORT} invocations",
            {"field": "invocations"},
        )
    return [_model_call(c, f"invocations[{i}].") for i, c in enumerate(reported)]


def _breaker(view: BreakerView) -> msg.CircuitBreaker:
    out = msg.CircuitBreaker(
        state=_enum(BREAKER_STATE.to_proto(view.state)),
        consecutive_failures=view.consecutive_failures,
    )
    for name in ("opened_at", "half_open_at"):
        ts = to_timestamp(getattr(view, name))
        if ts is not None:
            getattr(out, name).CopyFrom(ts)
    return out


class JobServiceServicer(LearningRpcsMixin, service_pb2_grpc.JobServiceServicer):  # type: ignore[misc]
    """Every JobService RPC. Learning-data RPCs come from :class:`LearningRpcsMixin`.

    Args:
        domain: the job domain.
        sessions: session factory (the mixin uses it).
        settings: job_service settings (the mixin uses it).
    """

    def __init__(
        self,
        domain: JobDomain,
        sessions: async_sessionmaker[AsyncSession],
        settings: JobServiceSettings,
    ) -> None:
        self.domain = domain
        self.sessions = sessions
        self.settings = settings
        #: snapshotId → its payload as a Struct (snapshots are immutable; building
        #: a Struct from a large payload costs more than the rest of GetSnapshot)
        self._payloads: OrderedDict[str, struct_pb2.Struct] = OrderedDict()

    def _payload(self, snapshot_id: str, payload: dict[str, Any]) -> struct_pb2.Struct:
        cached = self._payloads.get(snapshot_id)
        if cached is None:
            cached = self._payloads[snapshot_id] = to_struct(payload)
            while len(self._payloads) > MAX_CACHED_PAYLOADS:
                self._payloads.popitem(last=False)
        else:
            self._payloads.move_to_end(snapshot_id)
        return cached

    # ---- user / admin side

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
        )
        job, replayed = await self.domain.create(req)
        return rr.CreateJobResponse(job=job_to_proto(job), replayed=replayed)

    @rpc
    async def GetJob(self, request: rr.GetJobRequest, context: Ctx) -> rr.GetJobResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        job = await self.domain.get(_job_id(request.job_id), user_id)
        out = rr.GetJobResponse(job=job_to_proto(job))
        if request.include_history:
            evs, invs = await self.domain.history(job.job_id)
            out.events.extend(event_to_proto(e) for e in evs)
            out.invocations.extend(invocation_to_proto(i) for i in invs)
        return out

    @rpc
    async def ListJobs(self, request: rr.ListJobsRequest, context: Ctx) -> rr.ListJobsResponse:
        rows, token = await self.domain.list_jobs(
            user_id=request.user_id if request.HasField("user_id") else None,
            status=JOB_STATUS.optional(request.status),
            job_type=JOB_TYPE.optional(request.job_type),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return rr.ListJobsResponse(jobs=[job_to_proto(j) for j in rows], next_page_token=token)

    @rpc
    async def CancelJob(self, request: rr.CancelJobRequest, context: Ctx) -> rr.CancelJobResponse:
        user_id = request.user_id if request.HasField("user_id") else None
        job = await self.domain.cancel(
            _job_id(request.job_id),
            user_id=user_id,
            actor=request.actor or (f"user:{user_id}" if user_id else "admin"),
        )
        return rr.CancelJobResponse(job=job_to_proto(job))

    @rpc
    async def RerunJob(self, request: rr.RerunJobRequest, context: Ctx) -> rr.RerunJobResponse:
        job = await self.domain.rerun(
            _job_id(request.job_id),
            rebuild_snapshot=request.rebuild_snapshot,
            actor=request.actor or "admin",
        )
        return rr.RerunJobResponse(job=job_to_proto(job))

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
        return rr.GetCircuitBreakerResponse(breaker=_breaker(await self.domain.breaker_view()))

    @rpc
    async def ResetCircuitBreaker(
        self, request: rr.ResetCircuitBreakerRequest, context: Ctx
    ) -> rr.ResetCircuitBreakerResponse:
        return rr.ResetCircuitBreakerResponse(breaker=_breaker(await self.domain.breaker_reset()))

    # ---- runtime contract

    @rpc
    async def PollJobs(self, request: rr.PollJobsRequest, context: Ctx) -> rr.PollJobsResponse:
        instance = _instance(context)
        caps = _caps(request.capabilities)
        JobDomain.check_poll_args(caps, request.limit, request.wait_ms)
        _text(request.status_address, "statusAddress", MAX_STATUS_ADDRESS)
        await self.domain.seen(instance, caps, request.status_address or None)
        found = await self.domain.poll(instance, caps, request.limit, request.wait_ms)
        return rr.PollJobsResponse(jobs=[job_to_proto(j) for j in found])

    @rpc
    async def ClaimJobs(self, request: rr.ClaimJobsRequest, context: Ctx) -> rr.ClaimJobsResponse:
        instance = _instance(context)
        caps = _caps(request.capabilities)
        JobDomain.check_poll_args(caps, request.limit, request.wait_ms)
        _text(request.status_address, "statusAddress", MAX_STATUS_ADDRESS)
        await self.domain.seen(instance, caps, request.status_address or None)
        if not request.with_snapshots:
            found = await self.domain.claim(instance, caps, request.limit, request.wait_ms)
            return rr.ClaimJobsResponse(jobs=[job_to_proto(j) for j in found])
        found, views = await self.domain.claim_started(
            instance, caps, request.limit, request.wait_ms
        )
        out = rr.ClaimJobsResponse(jobs=[job_to_proto(j) for j in found])
        self._claimed_snapshots(found, views, out.snapshots)
        return out

    def _claimed_snapshots(
        self, found: list[JobRecord], views: dict[str, SnapshotView], into: Any
    ) -> None:
        """Fill a claim answer's snapshot map (job id → GetSnapshotResponse) from
        ``views``, within :data:`CLAIM_SNAPSHOTS_MAX_BYTES`; a job left out reads
        its snapshot with GetSnapshot."""
        room = CLAIM_SNAPSHOTS_MAX_BYTES
        for job in found:
            view = views.get(job.job_id)
            if view is None:
                continue
            try:
                snapshot = self._snapshot_proto(view)
            except Exception:  # this job alone reads it with GetSnapshot (and fails there)
                log.exception(
                    "snapshot left out of a claim answer", extra={"fields": {"jobId": job.job_id}}
                )
                continue
            size = snapshot.ByteSize()
            if size > room:  # this job's snapshot is read with GetSnapshot
                continue
            room -= size
            into[job.job_id].CopyFrom(snapshot)

    @rpc
    async def LockJob(self, request: rr.LockJobRequest, context: Ctx) -> rr.LockJobResponse:
        instance = _instance(context)
        job = await self.domain.lock(_job_id(request.job_id), instance)
        out = rr.LockJobResponse(
            job_id=job.job_id,
            status=_enum(JOB_STATUS.to_proto(job.status)),
            locked_by=job.locked_by or "",
            attempt_no=job.attempt_no,
        )
        ts = to_timestamp(job.lock_until)
        if ts is not None:
            out.lock_until.CopyFrom(ts)
        return out

    def _lease(self, context: Ctx, job_id: str, attempt_no: int) -> Lease:
        lease = Lease(_job_id(job_id), _instance(context), _attempt(attempt_no))
        bind(jobId=lease.job_id, attemptNo=lease.attempt_no)
        return lease

    @rpc
    async def StartJob(self, request: rr.StartJobRequest, context: Ctx) -> rr.StartJobResponse:
        job = await self.domain.start(self._lease(context, request.job_id, request.attempt_no))
        out = rr.StartJobResponse(status=_enum(JOB_STATUS.to_proto(job.status)))
        ts = to_timestamp(job.started_at)
        if ts is not None:
            out.started_at.CopyFrom(ts)
        return out

    @rpc
    async def Heartbeat(self, request: rr.HeartbeatRequest, context: Ctx) -> rr.HeartbeatResponse:
        lease = self._lease(context, request.job_id, request.attempt_no)
        job = await self.domain.heartbeat(lease)
        # the registry records holders of live leases, not refused callers
        await self.domain.seen(lease.instance_id)
        out = rr.HeartbeatResponse(cancel_requested=bool(job.cancel_requested))
        ts = to_timestamp(job.lock_until)
        if ts is not None:
            out.lock_until.CopyFrom(ts)
        return out

    @rpc
    async def HeartbeatLeases(
        self, request: rr.HeartbeatLeasesRequest, context: Ctx
    ) -> rr.HeartbeatLeasesResponse:
        instance = _instance(context)
        refs = [(_job_id(x.job_id), _attempt(x.attempt_no)) for x in request.leases]
        answers = await self.domain.heartbeat_leases(instance, refs)
        if any(a.held for a in answers):  # refused callers are not recorded as seen
            await self.domain.seen(instance)
        out = rr.HeartbeatLeasesResponse()
        for a in answers:
            state = msg.LeaseState(
                job_id=a.job_id,
                attempt_no=a.attempt_no,
                held=a.held,
                cancel_requested=a.cancel_requested,
            )
            ts = to_timestamp(a.lock_until)
            if ts is not None:
                state.lock_until.CopyFrom(ts)
            out.leases.append(state)
        return out

    @rpc
    async def GetSnapshot(
        self, request: rr.GetSnapshotRequest, context: Ctx
    ) -> rr.GetSnapshotResponse:
        snap = await self.domain.snapshot(self._lease(context, request.job_id, request.attempt_no))
        return self._snapshot_proto(snap)

    def _snapshot_proto(self, snap: SnapshotView) -> rr.GetSnapshotResponse:
        return rr.GetSnapshotResponse(
            snapshot_id=snap.snapshot_id,
            schema_version=snap.schema_version,
            target_type=_enum(TARGET_TYPE.to_proto(snap.target_type)),
            target_id=snap.target_id,
            payload=self._payload(snap.snapshot_id, snap.payload),
            content_hash=snap.content_hash,
        )

    @rpc
    async def SubmitResult(
        self, request: rr.SubmitResultRequest, context: Ctx
    ) -> rr.SubmitResultResponse:
        lease = self._lease(context, request.job_id, request.attempt_no)
        _text(request.prompt_version, "promptVersion", MAX_PROMPT_VERSION)
        _text(request.output_schema_version, "outputSchemaVersion", MAX_OUTPUT_SCHEMA_VERSION)
        calls = _calls(request.invocations)
        claim_next = None
        if request.HasField("claim_next"):
            nxt = request.claim_next
            caps = _caps(nxt.capabilities)
            _text(nxt.status_address, "claimNext.statusAddress", MAX_STATUS_ADDRESS)
            claim_next = ClaimNext(caps, nxt.limit)
        outcome = await self.domain.submit_result(
            lease,
            prompt_version=request.prompt_version or None,
            output_schema_version=request.output_schema_version or "v1",
            output=from_struct(request.output, "output"),
            calls=calls,
            claim_next=claim_next,
        )
        if claim_next is not None:
            await self.domain.seen(
                lease.instance_id,
                claim_next.capabilities,
                request.claim_next.status_address or None,
            )
        out = rr.SubmitResultResponse(
            job_id=outcome.job_id,
            status=_enum(JOB_STATUS.to_proto(outcome.status)),
            result_id=outcome.result_id,
            output_hash=outcome.output_hash,
            replayed=outcome.replayed,
            claimed_jobs=[job_to_proto(j) for j in outcome.claimed],
        )
        self._claimed_snapshots(outcome.claimed, outcome.snapshots, out.snapshots)
        return out

    @rpc
    async def FailJob(self, request: rr.FailJobRequest, context: Ctx) -> rr.FailJobResponse:
        lease = self._lease(context, request.job_id, request.attempt_no)
        _text(request.error_code, "errorCode", MAX_ERROR_CODE, required=True)
        _text(request.error_message, "errorMessage", MAX_ERROR_MESSAGE)
        if request.HasField("retry_after_seconds") and not (
            0 <= request.retry_after_seconds <= MAX_RETRY_AFTER_SECONDS
        ):
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "retryAfterSeconds must be 0..86400",
                {"field": "retryAfterSeconds"},
            )
        calls = _calls(request.invocations)
        job = await self.domain.fail(
            lease,
            error_code=request.error_code,
            error_message=request.error_message,
            retry_after_seconds=request.retry_after_seconds
            if request.HasField("retry_after_seconds")
            else None,
            calls=calls,
        )
        return rr.FailJobResponse(
            job_id=job.job_id,
            status=_enum(JOB_STATUS.to_proto(job.status)),
            retry_count=job.retry_count,
        )

    @rpc
    async def RecordInvocation(
        self, request: rr.RecordInvocationRequest, context: Ctx
    ) -> rr.RecordInvocationResponse:
        call = _model_call(request)
        log_id = await self.domain.record_invocation(
            job_id=_job_id(request.job_id),
            attempt_no=_attempt(request.attempt_no),
            **dataclasses.asdict(call),
        )
        return rr.RecordInvocationResponse(id=log_id)

    @rpc
    async def GetRuntimeHealth(
        self, request: rr.GetRuntimeHealthRequest, context: Ctx
    ) -> rr.GetRuntimeHealthResponse:
        serving, found = await self.domain.health()
        return rr.GetRuntimeHealthResponse(
            status="SERVING" if serving else "NOT_SERVING",
            workers=[worker_to_proto(w) for w in found],
        )

    @rpc
    async def VerifyLease(
        self, request: rr.VerifyLeaseRequest, context: Ctx
    ) -> rr.VerifyLeaseResponse:
        job = await self.domain.verify_lease(_verify_lease(request))
        return _lease_holder(job)

    @rpc
    async def VerifyLeases(
        self, request: rr.VerifyLeasesRequest, context: Ctx
    ) -> rr.VerifyLeasesResponse:
        verdicts: list[LeaseHolderView | AppError | Lease] = []
        for item in request.leases:
            try:
                verdicts.append(_verify_lease(item))
            except AppError as err:  # judged alone: the other leases are still checked
                verdicts.append(err)
        leases = [v for v in verdicts if isinstance(v, Lease)]
        judged = iter(await self.domain.verify_leases(leases))
        out = rr.VerifyLeasesResponse()
        for verdict in verdicts:
            answer = next(judged) if isinstance(verdict, Lease) else verdict
            if not isinstance(answer, AppError):
                try:
                    out.verdicts.add(held=_lease_holder(answer))
                    continue
                except AppError as err:  # this lease alone, as VerifyLease would fail it
                    answer = err
            out.verdicts.add(
                error_code=answer.code,
                error_message=answer.message,
                error_details_json=json.dumps(answer.details or {}, default=str),
            )
        return out


__all__ = ["JobServiceServicer", "log_context"]
