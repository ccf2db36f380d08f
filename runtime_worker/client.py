"""gRPC client of the worker to JobService and CredentialService (reference §3).

Every call carries ``x-internal-api-key`` and ``x-runtime-instance-id``
metadata and a deadline. Idempotent calls (HeartbeatLeases — retried
for at most one heartbeat interval —, GetSnapshot,
ResolveCredential, SubmitResult — idempotent by its key — and FailJob — a
repeated fail answers 200) are retried with exponential backoff while the
backend is UNAVAILABLE (or the deadline passed, or it reported INTERNAL, e.g.
a failed commit, case L4) for up to ``RPC_RETRY_SECONDS``, so a job_service
restart in the middle of a call is survived. ClaimJobs is never retried (a
lost answer would leak leases until they expire). Every failure is raised as
:class:`~airuntime_common.errors.AppError`.

The job_service runtime calls (claim, start, heartbeats, snapshot, result, fail,
invocation logs) travel over one ``RuntimeSession`` stream
(:mod:`runtime_worker.session`); the rules above hold for them as for unary calls,
and with tracing on each is its own span.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.struct_pb2 import Struct

from airuntime_common import metadata
from airuntime_common import tracing as _tracing
from airuntime_common.enums import JOB_TYPE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.settings import DAY
from airuntime_common.tracing import Tracing
from runtime_worker import metrics as worker_metrics
from runtime_worker.session import RuntimeSession
from zhixi.airuntime.credential.v1 import request_response_pb2 as cred_rr
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import message_pb2 as job_msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

#: gRPC status codes after which an idempotent call is tried again.
RETRY_STATUS = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: reference §4 codes (from ErrorInfo) after which an idempotent call is tried again.
RETRY_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.INTERNAL})
#: Most leases per HeartbeatLeases call (reference §3).
MAX_LEASES_PER_CALL = 500
#: Longest retryAfterSeconds a FailJob may carry (job_service refuses more: one day).
MAX_RETRY_AFTER_SECONDS = float(DAY)


def _retryable(exc: grpc.aio.AioRpcError, err: AppError) -> bool:
    return exc.code() in RETRY_STATUS or err.code in RETRY_CODES


class RuntimeClient:
    """The worker's view of job_service and credential_service.

    Args:
        job_target: JobService address (``JOB_SERVICE_ADDR``).
        credential_target: CredentialService address (``CREDENTIAL_SERVICE_ADDR``).
        token: ``RUNTIME_SERVICE_TOKEN``.
        instance_id: ``RUNTIME_INSTANCE_ID`` (sent as ``x-runtime-instance-id``).
        rpc_timeout: deadline of one call (s).
        retry_seconds: how long idempotent calls keep retrying (s).
        heartbeat_retry_seconds: how long one batched heartbeat keeps retrying (s); keep
            it at most the heartbeat interval so beats do not pile up.
        ca_file: CA bundle for TLS, or None for plaintext.
        tracing: the worker's tracing (None: the process's, if any): every call is then
            a client span of the current span and carries its ``traceparent``.
    """

    def __init__(
        self,
        *,
        job_target: str,
        credential_target: str,
        token: str,
        instance_id: str,
        rpc_timeout: float = 10.0,
        retry_seconds: float = 30.0,
        heartbeat_retry_seconds: float = 5.0,
        ca_file: str | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.instance_id = instance_id
        self._token = token
        self._rpc_timeout = rpc_timeout
        self._retry_seconds = retry_seconds
        self._heartbeat_retry_seconds = heartbeat_retry_seconds
        self._job_channel = insecure_or_tls_channel(job_target, ca_file, tracing=tracing)
        self._cred_channel = insecure_or_tls_channel(credential_target, ca_file, tracing=tracing)
        self._jobs = job_grpc.JobServiceStub(self._job_channel)
        self._creds = cred_grpc.CredentialServiceStub(self._cred_channel)
        #: the RuntimeSession stream every job_service runtime call travels on
        self.session = RuntimeSession(
            self._jobs, metadata.outgoing(token, instance_id), tracing or _tracing.current()
        )
        self._methods: dict[str, Callable[..., Awaitable[Any]]] = {}

    def _job_method(self, name: str, field: str) -> Callable[..., Awaitable[Any]]:
        """The JobService method ``name`` over the session (as its ``field``)."""
        found = self._methods.get(name)
        if found is None:
            found = self._methods[name] = self.session.method(field)
        return found

    async def close(self) -> None:
        """Close the session, then both channels."""
        await self.session.close()
        await self._job_channel.close()
        await self._cred_channel.close()

    async def _call(
        self,
        method: Callable[..., Awaitable[T]],
        request: Any,
        *,
        name: str,
        retry: bool,
        deadline_s: float | None = None,
        retry_seconds: float | None = None,
        again: Any = None,
    ) -> T:
        """``method(request)``; retried with ``again`` (default: the same request) while
        the error is retryable and the budget lasts, when ``retry``."""
        md = metadata.outgoing(self._token, self.instance_id, uuid.uuid4().hex)
        budget = self._retry_seconds if retry_seconds is None else retry_seconds
        give_up_at = time.monotonic() + budget
        delay = 0.1
        while True:
            started = time.perf_counter()
            try:
                answer = await method(request, metadata=md, timeout=deadline_s or self._rpc_timeout)
                worker_metrics.RPC_SECONDS.labels(name, "OK").observe(time.perf_counter() - started)
                return answer
            except asyncio.CancelledError:  # e.g. a long poll stopped by a drain
                worker_metrics.RPC_SECONDS.labels(name, "CANCELLED").observe(
                    time.perf_counter() - started
                )
                raise
            except grpc.aio.AioRpcError as exc:
                err = from_rpc_error(exc)
                worker_metrics.RPC_SECONDS.labels(name, err.code).observe(
                    time.perf_counter() - started
                )
                if not retry or not _retryable(exc, err) or time.monotonic() >= give_up_at:
                    raise err from None
                log.warning(
                    "retrying %s after %s",
                    name,
                    err.code,
                    extra={"fields": {"rpc": name, "code": err.code}},
                )
            await asyncio.sleep(min(delay, max(0.0, give_up_at - time.monotonic())))
            delay = min(delay * 2, 2.0) * random.uniform(0.8, 1.2)
            request = request if again is None else again

    async def claim_jobs(
        self, capabilities: Sequence[str], limit: int, wait_ms: int, status_address: str
    ) -> tuple[list[Any], dict[str, Any]]:
        """ClaimJobs with start: poll + lock + start up to ``limit`` jobs, with their
        snapshots (reference §2.3, §2.6, §3). Not retried.

        Returns:
            ``(jobs, snapshots)``: the claimed ``Job`` messages, each leased to this
            instance, and ``GetSnapshotResponse`` messages by job id. A job without
            one there (too big for the answer, no snapshot row, or a job_service
            that only locks) is read with :meth:`get_snapshot`.
        """
        request = rr.ClaimJobsRequest(
            capabilities=cast(Any, [JOB_TYPE.to_proto(c) for c in capabilities]),
            limit=limit,
            wait_ms=wait_ms,
            status_address=status_address,
            with_snapshots=True,
        )
        response = await self._call(
            self._job_method("ClaimJobs", "claim_jobs"),
            request,
            name="ClaimJobs",
            retry=False,
            deadline_s=self._rpc_timeout + wait_ms / 1000.0,
        )
        return list(response.jobs), dict(response.snapshots)

    async def heartbeat_leases(self, leases: Sequence[tuple[str, int]]) -> list[Any]:
        """HeartbeatLeases for ``[(jobId, attemptNo)…]``, chunked by 500.

        Returns:
            One ``LeaseState`` per lease, in order.
        """
        states: list[Any] = []
        for i in range(0, len(leases), MAX_LEASES_PER_CALL):
            chunk = leases[i : i + MAX_LEASES_PER_CALL]
            request = rr.HeartbeatLeasesRequest(
                leases=[job_msg.LeaseRef(job_id=j, attempt_no=a) for j, a in chunk]
            )
            response = await self._call(
                self._job_method("HeartbeatLeases", "heartbeat_leases"),
                request,
                name="HeartbeatLeases",
                retry=True,
                retry_seconds=self._heartbeat_retry_seconds,
            )
            states.extend(response.leases)
        return states

    async def get_snapshot(self, job_id: str, attempt_no: int) -> Any:
        """GetSnapshot for the lease holder. Returns ``GetSnapshotResponse``."""
        return await self._call(
            self._job_method("GetSnapshot", "get_snapshot"),
            rr.GetSnapshotRequest(job_id=job_id, attempt_no=attempt_no),
            name="GetSnapshot",
            retry=True,
        )

    async def resolve_credential(self, job_id: str, attempt_no: int) -> Any:
        """ResolveCredential: the key for this lease. The answer holds a plaintext key:
        never log it. Returns ``ResolveCredentialResponse``."""
        return await self._call(
            self._creds.ResolveCredential,
            cred_rr.ResolveCredentialRequest(job_id=job_id, attempt_no=attempt_no),
            name="ResolveCredential",
            retry=True,
        )

    async def submit_result(
        self,
        job_id: str,
        attempt_no: int,
        *,
        prompt_version: str,
        output_schema_version: str,
        output: dict[str, Any],
        invocations: Sequence[Any] = (),
        claim_next: tuple[Sequence[str], int, str] | None = None,
    ) -> Any:
        """SubmitResult (idempotent by ``jobId:attemptNo:outputHash``). Returns the response.

        ``invocations`` (``ModelCall`` messages) are logged with the result; a retry
        that turns out a replay does not log them twice. ``claim_next``
        (``(capabilities, limit, statusAddress)``): the jobs to claim for the slot the
        result frees, in its transaction (the answer's ``claimed_jobs`` and
        ``snapshots``); only the first try asks, a retry (after an answer that may
        have been lost) claims nothing, as its result replays.
        """
        struct = Struct()
        struct.update(output)
        request = rr.SubmitResultRequest(
            job_id=job_id,
            attempt_no=attempt_no,
            prompt_version=prompt_version,
            output_schema_version=output_schema_version,
            output=struct,
            invocations=list(invocations),
        )
        first = request
        if claim_next is not None:
            caps, limit, status_address = claim_next
            first = rr.SubmitResultRequest()
            first.CopyFrom(request)
            first.claim_next.capabilities.extend(cast(Any, [JOB_TYPE.to_proto(c) for c in caps]))
            first.claim_next.limit = limit
            first.claim_next.status_address = status_address
        return await self._call(
            self._job_method("SubmitResult", "submit_result"),
            first,
            name="SubmitResult",
            retry=True,
            again=request,
        )

    async def fail_job(
        self,
        job_id: str,
        attempt_no: int,
        code: str,
        message: str,
        retry_after_seconds: float | None = None,
        invocations: Sequence[Any] = (),
    ) -> Any:
        """FailJob with a reference §4 code (a repeat answers 200). Returns ``FailJobResponse``.

        ``invocations`` (``ModelCall`` messages) are logged with the fail, once.
        ``retry_after_seconds`` (a provider's Retry-After, reference §2.4) is sent as at
        most :data:`MAX_RETRY_AFTER_SECONDS`, the most job_service accepts: a fail it
        refused would leave the job to its lease's expiry, its code lost.
        """
        request = rr.FailJobRequest(
            job_id=job_id,
            attempt_no=attempt_no,
            error_code=code,
            error_message=message[:1000],
            invocations=list(invocations),
        )
        if retry_after_seconds is not None:
            request.retry_after_seconds = min(float(retry_after_seconds), MAX_RETRY_AFTER_SECONDS)
        return await self._call(
            self._job_method("FailJob", "fail_job"), request, name="FailJob", retry=True
        )

    async def record_invocation(self, request: Any) -> Any:
        """RecordInvocation (one row per model call). Not retried: a call that reached the
        server and lost its answer would be recorded twice and double-count cost."""
        return await self._call(
            self._job_method("RecordInvocation", "record_invocation"),
            request,
            name="RecordInvocation",
            retry=False,
        )

    async def get_prompt_version(self, job_type: str, version: str) -> str:
        """GetPromptVersion: the template source of ``job_type``'s ``version`` (reference
        §10.4), retried as a read. :class:`runtime_worker.prompt_cache.PromptCache`
        calls it once per version."""
        response = await self._call(
            self._jobs.GetPromptVersion,
            rr.GetPromptVersionRequest(
                job_type=cast(Any, JOB_TYPE.to_proto(job_type)), version=version
            ),
            name="GetPromptVersion",
            retry=True,
        )
        return str(response.version.template)
