"""Asking job_service whether a caller holds a job's lease (``JobService.VerifyLeases``).

The fencing token is ``(jobId, x-runtime-instance-id, attemptNo)`` (reference §3); only
job_service knows the lease, so credential_service asks it on every resolve (the
resolves that arrive together in one call).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Protocol

import grpc

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.tracing import Tracing
from airuntime_common.tracing import current as current_tracing
from credential_service import metrics
from zhixi.airuntime.job.v1 import request_response_pb2 as job_rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

#: job_service answers about the lease itself, handed to the caller unchanged.
PASS_THROUGH = frozenset(
    {
        ErrorCode.LOCK_NOT_HELD,
        ErrorCode.JOB_NOT_FOUND,
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.INVALID_JOB_STATE,
        ErrorCode.UNAVAILABLE,
    }
)


@dataclass(frozen=True)
class LeaseInfo:
    """What job_service says about a held lease.

    Attributes:
        user_id: the job's owner.
        api_key_mode: ``platform_key`` | ``user_deepseek_key``.
        credential_id: the credential the job recorded at create, or None.
        model_provider, model_name: the job's model settings.
    """

    user_id: str
    api_key_mode: str
    credential_id: str | None
    model_provider: str
    model_name: str


class LeaseVerifier(Protocol):
    """Anything that can verify a lease (the gRPC client below, or a test double)."""

    async def verify(
        self, job_id: str, runtime_instance_id: str, attempt_no: int, request_id: str | None
    ) -> LeaseInfo:
        """Return the job's key settings if the caller holds the lease.

        Raises:
            AppError: ``LOCK_NOT_HELD``, ``JOB_NOT_FOUND`` (passed through from
                job_service) or ``UNAVAILABLE`` when job_service cannot be reached.
        """
        ...


#: Seconds a job_service that answered VerifyLeases with UNIMPLEMENTED is asked one
#: VerifyLease per lease before VerifyLeases is tried again.
UNBATCHED_RECHECK_SECONDS = 60.0
#: Leases one VerifyLeases call carries at most (job_service's limit).
MAX_LEASES_PER_CALL = 500
#: VerifyLeases calls in flight at once. The resolves that arrive meanwhile wait for
#: it to end, then go together in the next call: one call in flight batches 2.5
#: leases per call at 16 worker slots (4 in flight: 1.2). A stalled call holds the
#: others back for up to ``VERIFY_LEASE_TIMEOUT_SECONDS``, so a resolve may take up
#: to twice that (the wait, then its own call).
MAX_CALLS_IN_FLIGHT = 1


@dataclass
class _Waiting:
    request: job_rr.VerifyLeaseRequest
    future: asyncio.Future[LeaseInfo]
    #: the asker's context (traced only): its batch's call is a span of its trace
    context: contextvars.Context | None = None


class GrpcLeaseVerifier:
    """:class:`LeaseVerifier` over one gRPC channel to job_service.

    The verifications asked for at about the same time go to job_service together,
    as one ``VerifyLeases`` call (one read there, one round trip here): a request
    waits for the current event-loop turn, and for the call in flight
    (:data:`MAX_CALLS_IN_FLIGHT`) to end, so a lone resolve is sent at once. Each lease gets its own verdict. A job_service without ``VerifyLeases``
    (UNIMPLEMENTED) is asked one ``VerifyLease`` per lease from then on.

    Args:
        target: ``JOB_SERVICE_ADDR``.
        token: the internal service token sent as ``x-internal-api-key``.
        timeout_seconds: deadline of every call.
        ca_file: PEM CA for TLS, or None for plaintext.
        tracing: credential_service's tracing (None: the process's, if any): each
            ``VerifyLeases`` call is a client span in the trace of the first
            resolve of its batch.
    """

    def __init__(
        self,
        target: str,
        token: str,
        *,
        timeout_seconds: float = 5.0,
        ca_file: str | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._channel = insecure_or_tls_channel(target, ca_file, tracing=tracing)
        self._traced = (tracing or current_tracing()) is not None
        self._stub = job_grpc.JobServiceStub(self._channel)
        self._token = token
        self._timeout = timeout_seconds
        self._waiting: list[_Waiting] = []
        self._in_flight = 0
        self._flush_scheduled = False
        self._unbatched_until = 0.0
        self._tasks: set[asyncio.Future[None]] = set()
        #: VerifyLeases calls made, and the leases they carried (for tests and metrics)
        self.calls = 0
        self.leases_sent = 0

    async def verify(
        self, job_id: str, runtime_instance_id: str, attempt_no: int, request_id: str | None
    ) -> LeaseInfo:
        """See :meth:`LeaseVerifier.verify`."""
        request = job_rr.VerifyLeaseRequest(
            job_id=job_id, runtime_instance_id=runtime_instance_id, attempt_no=attempt_no
        )
        if time.monotonic() < self._unbatched_until:
            return await self._verify_one(request, request_id)
        loop = asyncio.get_running_loop()
        waiting = _Waiting(
            request,
            loop.create_future(),
            contextvars.copy_context() if self._traced else None,
        )
        self._waiting.append(waiting)
        self._schedule(loop)
        return await waiting.future

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._flush_scheduled and self._in_flight < MAX_CALLS_IN_FLIGHT:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._waiting and self._in_flight < MAX_CALLS_IN_FLIGHT:
            batch = [w for w in self._waiting[:MAX_LEASES_PER_CALL] if not w.future.done()]
            del self._waiting[:MAX_LEASES_PER_CALL]
            if batch:
                self._in_flight += 1
                task = asyncio.get_running_loop().create_task(
                    self._send(batch), context=batch[0].context
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            await self._answer(batch)
        except BaseException as exc:  # never leave a caller waiting
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._in_flight -= 1
            if self._waiting:
                self._schedule(asyncio.get_running_loop())

    async def _answer(self, batch: list[_Waiting]) -> None:
        self.calls += 1
        self.leases_sent += len(batch)
        metrics.LEASE_CHECKS_PER_CALL.observe(len(batch))
        try:
            reply = await self._stub.VerifyLeases(
                job_rr.VerifyLeasesRequest(leases=[w.request for w in batch]),
                timeout=self._timeout,
                metadata=metadata.outgoing(self._token),
            )
        except grpc.RpcError as exc:
            if (
                isinstance(exc, grpc.aio.AioRpcError)
                and exc.code() == grpc.StatusCode.UNIMPLEMENTED
            ):
                # an older job_service: one call per lease, asked again after a while
                # (it may be upgraded under us)
                self._unbatched_until = time.monotonic() + UNBATCHED_RECHECK_SECONDS
                batch = [w for w in batch if not w.future.done()]
                results = await asyncio.gather(
                    *(self._verify_one(w.request, None) for w in batch), return_exceptions=True
                )
                for w, result in zip(batch, results, strict=True):
                    _settle(w.future, result)
                return
            err = _refusal(exc)
            for w in batch:
                _settle(w.future, err)
            return
        if len(reply.verdicts) != len(batch):
            err = AppError(ErrorCode.INTERNAL, "job_service answered the wrong number of leases")
            for w in batch:
                _settle(w.future, err)
            return
        for w, verdict in zip(batch, reply.verdicts, strict=True):
            if not verdict.HasField("held"):
                _settle(w.future, _verdict_error(verdict))
                continue
            try:
                _settle(w.future, _lease_info(verdict.held))
            except AppError as err:  # this lease alone
                _settle(w.future, err)

    async def _verify_one(
        self, request: job_rr.VerifyLeaseRequest, request_id: str | None
    ) -> LeaseInfo:
        try:
            reply = await self._stub.VerifyLease(
                request,
                timeout=self._timeout,
                metadata=metadata.outgoing(self._token, request.runtime_instance_id, request_id),
            )
        except grpc.RpcError as exc:
            raise _refusal(exc) from None
        return _lease_info(reply)

    async def close(self) -> None:
        """Close the channel; verifications still waiting fail with ``UNAVAILABLE``."""
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            _settle(w.future, AppError(ErrorCode.UNAVAILABLE, "lease verifier closed"))
        await self._channel.close()


def _settle(future: asyncio.Future[LeaseInfo], result: LeaseInfo | BaseException) -> None:
    if future.done():  # its caller gave up (cancelled)
        return
    if isinstance(result, AppError):  # each caller its own exception (and traceback)
        future.set_exception(dataclasses.replace(result))
    elif isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _refusal(exc: grpc.RpcError) -> AppError:
    """A failed call as the caller sees it: job_service's word about the lease passed
    through, anything else (our own token refused, an internal error) UNAVAILABLE."""
    return _as_caller_sees(from_rpc_error(exc))


def _verdict_error(verdict: job_rr.LeaseVerdict) -> AppError:
    """A refused lease of a VerifyLeases answer, as :func:`_refusal` gives a refused call."""
    try:
        details = json.loads(verdict.error_details_json) if verdict.error_details_json else None
    except ValueError:
        details = None
    return _as_caller_sees(AppError(verdict.error_code, verdict.error_message, details or None))


def _as_caller_sees(err: AppError) -> AppError:
    if err.code in PASS_THROUGH:
        return err
    return AppError(
        ErrorCode.UNAVAILABLE,
        "lease verification with job_service failed",
        {"upstreamCode": err.code},
    )


def _lease_info(reply: job_rr.VerifyLeaseResponse) -> LeaseInfo:
    try:
        mode = API_KEY_MODE.to_str(reply.api_key_mode)
    except AppError:
        raise AppError(
            ErrorCode.INTERNAL, "job_service returned a lease without an api key mode"
        ) from None
    return LeaseInfo(
        user_id=reply.user_id,
        api_key_mode=mode,
        credential_id=reply.credential_id if reply.HasField("credential_id") else None,
        model_provider=reply.model_provider,
        model_name=reply.model_name,
    )
