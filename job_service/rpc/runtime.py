"""JobService RPCs of the runtime contract (reference §3): poll, claim, lock, start,
heartbeats, snapshot, result, fail, invocation logs, and the lease checks behind
credential resolution. Proto ↔ domain translation and request checks only."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from google.protobuf import struct_pb2

from airuntime_common.enums import API_KEY_MODE, JOB_STATUS, TARGET_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.logs import bind
from airuntime_common.lru import LruCache
from airuntime_common.timeutil import to_timestamp
from job_service.lifecycle import Lease
from job_service.rpc.common import (
    MAX_ERROR_CODE,
    MAX_ERROR_MESSAGE,
    MAX_OUTPUT_SCHEMA_VERSION,
    MAX_PROMPT_VERSION,
    MAX_RETRY_AFTER_SECONDS,
    MAX_STATUS_ADDRESS,
    Ctx,
    attempt_of,
    calls_of,
    capabilities_of,
    instance_of,
    job_id_of,
    model_call_of,
    rpc,
    text_field,
)
from job_service.rpc.convert import _enum, from_struct, job_to_proto, to_struct
from job_service.services.claiming import check_poll_args
from job_service.services.domain import JobDomain
from job_service.services.inputs import LeaseHolderView
from job_service.services.ports import SnapshotView
from job_service.store.records import JobRecord
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

log = logging.getLogger("job_service.rpc")

#: Snapshot bytes one ClaimJobs answer carries at most (``with_snapshots``); the
#: jobs past it come without theirs, so the answer stays far below the gRPC
#: message limit (``MAX_MESSAGE_BYTES``, 8 MiB) whatever the snapshots weigh.
CLAIM_SNAPSHOTS_MAX_BYTES = 2 * 1024 * 1024
#: Snapshot payloads kept as Structs for GetSnapshot (least recently used dropped).
MAX_CACHED_PAYLOADS = 256


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
    return Lease(
        job_id_of(request.job_id), request.runtime_instance_id, attempt_of(request.attempt_no)
    )


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


class RuntimeRpcs:
    """``PollJobs, ClaimJobs, LockJob, StartJob, Heartbeat, HeartbeatLeases, GetSnapshot,
    SubmitResult, FailJob, RecordInvocation, VerifyLease, VerifyLeases``."""

    domain: JobDomain

    def __init__(self) -> None:
        #: snapshotId → its payload as a Struct (snapshots are immutable; building
        #: a Struct from a large payload costs more than the rest of GetSnapshot)
        self._payloads: LruCache[str, struct_pb2.Struct] = LruCache(MAX_CACHED_PAYLOADS)

    def _payload(self, snapshot_id: str, payload: dict[str, Any]) -> struct_pb2.Struct:
        cached = self._payloads.get(snapshot_id)
        if cached is None:
            cached = to_struct(payload)
            self._payloads.put(snapshot_id, cached)
        return cached

    @rpc
    async def PollJobs(self, request: rr.PollJobsRequest, context: Ctx) -> rr.PollJobsResponse:
        instance = instance_of(context)
        caps = capabilities_of(request.capabilities)
        check_poll_args(caps, request.limit, request.wait_ms)
        text_field(request.status_address, "statusAddress", MAX_STATUS_ADDRESS)
        await self.domain.seen(instance, caps, request.status_address or None)
        found = await self.domain.poll(instance, caps, request.limit, request.wait_ms)
        return rr.PollJobsResponse(jobs=[job_to_proto(j) for j in found])

    @rpc
    async def ClaimJobs(self, request: rr.ClaimJobsRequest, context: Ctx) -> rr.ClaimJobsResponse:
        instance = instance_of(context)
        caps = capabilities_of(request.capabilities)
        check_poll_args(caps, request.limit, request.wait_ms)
        text_field(request.status_address, "statusAddress", MAX_STATUS_ADDRESS)
        await self.domain.seen(instance, caps, request.status_address or None)
        if not request.with_snapshots:
            found = await self.domain.claim(instance, caps, request.limit, request.wait_ms)
            return rr.ClaimJobsResponse(jobs=[self._leased(j) for j in found])
        found, views = await self.domain.claim_started(
            instance, caps, request.limit, request.wait_ms
        )
        out = rr.ClaimJobsResponse(jobs=[self._leased(j) for j in found])
        self._claimed_snapshots(found, views, out.snapshots)
        return out

    def _leased(self, job: JobRecord) -> msg.Job:
        """A job of a claim answer: with its attempt's provider model name and base URL
        (reference §9.4: the claim answer carries what a resolve would)."""
        return job_to_proto(job, self.domain.core.provider(job.model_provider))

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
        instance = instance_of(context)
        job = await self.domain.lock(job_id_of(request.job_id), instance)
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
        lease = Lease(job_id_of(job_id), instance_of(context), attempt_of(attempt_no))
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
        instance = instance_of(context)
        refs = [(job_id_of(x.job_id), attempt_of(x.attempt_no)) for x in request.leases]
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
        text_field(request.prompt_version, "promptVersion", MAX_PROMPT_VERSION)
        text_field(request.output_schema_version, "outputSchemaVersion", MAX_OUTPUT_SCHEMA_VERSION)
        calls = calls_of(request.invocations)
        claim_next = None
        if request.HasField("claim_next"):  # the next job of the slot this result frees
            nxt = request.claim_next
            caps = capabilities_of(nxt.capabilities)
            text_field(nxt.status_address, "statusAddress", MAX_STATUS_ADDRESS)
            claim_next = (caps, nxt.limit)
        outcome = await self.domain.submit_result(
            lease,
            prompt_version=request.prompt_version or None,
            output_schema_version=request.output_schema_version or "v1",
            output=from_struct(request.output, "output"),
            calls=calls,
            claim_next=claim_next,
        )
        out = rr.SubmitResultResponse(
            job_id=outcome.job_id,
            status=_enum(JOB_STATUS.to_proto(outcome.status)),
            result_id=outcome.result_id,
            output_hash=outcome.output_hash,
            replayed=outcome.replayed,
        )
        if outcome.claimed is not None and outcome.claimed.jobs:
            found = outcome.claimed.jobs
            out.claimed_jobs.extend(self._leased(j) for j in found)
            self._claimed_snapshots(found, outcome.claimed.snapshots, out.snapshots)
        return out

    @rpc
    async def FailJob(self, request: rr.FailJobRequest, context: Ctx) -> rr.FailJobResponse:
        lease = self._lease(context, request.job_id, request.attempt_no)
        text_field(request.error_code, "errorCode", MAX_ERROR_CODE, required=True)
        text_field(request.error_message, "errorMessage", MAX_ERROR_MESSAGE)
        if request.HasField("retry_after_seconds") and not (
            0 <= request.retry_after_seconds <= MAX_RETRY_AFTER_SECONDS
        ):
            raise AppError(
                ErrorCode.INVALID_ARGUMENT,
                "retryAfterSeconds must be 0..86400",
                {"field": "retryAfterSeconds"},
            )
        calls = calls_of(request.invocations)
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
        call = model_call_of(request)
        log_id = await self.domain.record_invocation(
            job_id=job_id_of(request.job_id),
            attempt_no=attempt_of(request.attempt_no),
            **dataclasses.asdict(call),
        )
        return rr.RecordInvocationResponse(id=log_id)

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
