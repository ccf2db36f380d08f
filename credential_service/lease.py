"""Asking job_service whether a caller holds a job's lease (``JobService.VerifyLease``).

The fencing token is ``(jobId, x-runtime-instance-id, attemptNo)`` (SPEC §3); only
job_service knows the lease, so credential_service asks it on every resolve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import grpc

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE
from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import insecure_or_tls_channel
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


class GrpcLeaseVerifier:
    """:class:`LeaseVerifier` over one gRPC channel to job_service.

    Args:
        target: ``JOB_SERVICE_ADDR``.
        token: the internal service token sent as ``x-internal-api-key``.
        timeout_seconds: deadline of every call.
        ca_file: PEM CA for TLS, or None for plaintext.
    """

    def __init__(
        self, target: str, token: str, *, timeout_seconds: float = 5.0, ca_file: str | None = None
    ) -> None:
        self._channel = insecure_or_tls_channel(target, ca_file)
        self._stub = job_grpc.JobServiceStub(self._channel)
        self._token = token
        self._timeout = timeout_seconds

    async def verify(
        self, job_id: str, runtime_instance_id: str, attempt_no: int, request_id: str | None
    ) -> LeaseInfo:
        """See :meth:`LeaseVerifier.verify`."""
        request = job_rr.VerifyLeaseRequest(
            job_id=job_id, runtime_instance_id=runtime_instance_id, attempt_no=attempt_no
        )
        try:
            reply = await self._stub.VerifyLease(
                request,
                timeout=self._timeout,
                metadata=metadata.outgoing(self._token, runtime_instance_id, request_id),
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if err.code in PASS_THROUGH:
                raise err from None
            # e.g. our own token refused, or an internal error: not the caller's fault
            raise AppError(
                ErrorCode.UNAVAILABLE,
                "lease verification with job_service failed",
                {"upstreamCode": err.code},
            ) from None
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

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()
