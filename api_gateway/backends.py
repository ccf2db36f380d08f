"""gRPC clients of the gateway: one channel per backend, deadlines, metadata, error mapping.

The gateway never touches a database: every route calls job_service or
credential_service through :class:`Caller`, which adds the internal token,
the request id and (on the shim) the runtime instance id as metadata, puts a
deadline on the call and turns any gRPC failure back into the
:class:`AppError` the backend raised (reference §4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.grpc_errors import from_rpc_error
from airuntime_common.grpc_server import insecure_or_tls_channel
from airuntime_common.metadata import outgoing
from airuntime_common.tracing import Tracing
from api_gateway.settings import GatewaySettings
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cred_grpc
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc
from zhixi.airuntime.worker.v1 import service_pb2_grpc as worker_grpc

log = logging.getLogger(__name__)

#: Most worker status channels kept open at once (``/admin/ai/runtime``).
MAX_WORKER_CHANNELS = 64


class Backends:
    """The gateway's channels and stubs, created once per app.

    Args:
        settings: gateway settings (token, deadlines, TLS CA).
        job_channel: channel to job_service.
        credential_channel: channel to credential_service.
        owns_channels: close the two channels in :meth:`aclose` (False when injected).
        tracing: the gateway's tracing, for the worker status channels it opens
            (None: the process's, if any; reference §9.5).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        job_channel: grpc.aio.Channel,
        credential_channel: grpc.aio.Channel,
        *,
        owns_channels: bool,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.tracing = tracing
        self.job_channel = job_channel
        self.credential_channel = credential_channel
        self.owns_channels = owns_channels
        self.job = job_grpc.JobServiceStub(job_channel)
        self.credential = cred_grpc.CredentialServiceStub(credential_channel)
        self.job_health = health_pb2_grpc.HealthStub(job_channel)
        self.credential_health = health_pb2_grpc.HealthStub(credential_channel)
        self._worker_channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Future[None]] = set()

    @classmethod
    def connect(cls, settings: GatewaySettings, *, tracing: Tracing | None = None) -> Backends:
        """Open one channel per backend from ``JOB_SERVICE_ADDR`` / ``CREDENTIAL_SERVICE_ADDR``.

        Must run inside the serving event loop (the app's lifespan). With ``tracing``
        every call carries the request's trace context (reference §9.5).
        """
        ca = settings.GRPC_TLS_CA_FILE
        return cls(
            settings,
            insecure_or_tls_channel(settings.JOB_SERVICE_ADDR, ca, tracing=tracing),
            insecure_or_tls_channel(settings.CREDENTIAL_SERVICE_ADDR, ca, tracing=tracing),
            owns_channels=True,
            tracing=tracing,
        )

    def worker(self, address: str) -> Any:
        """A ``WorkerStatusService`` stub for ``address`` (channel cached per address)."""
        channel = self._worker_channels.get(address)
        if channel is None:
            if len(self._worker_channels) >= MAX_WORKER_CHANNELS:
                # workers come and go: drop the oldest cached channel
                oldest = next(iter(self._worker_channels))
                stale = self._worker_channels.pop(oldest)
                self._closing.add(asyncio.ensure_future(stale.close()))
            channel = insecure_or_tls_channel(
                address, self.settings.GRPC_TLS_CA_FILE, tracing=self.tracing
            )
            self._worker_channels[address] = channel
        return worker_grpc.WorkerStatusServiceStub(channel)

    async def serving(self) -> dict[str, str]:
        """gRPC health of both backends: ``{"jobService": "SERVING", ...}`` (never raises)."""

        async def check(stub: Any) -> str:
            try:
                resp = await stub.Check(
                    health_pb2.HealthCheckRequest(service=""),
                    timeout=min(self.settings.GRPC_TIMEOUT_SECONDS, 2.0),
                )
            except grpc.aio.AioRpcError as exc:
                return f"UNREACHABLE ({exc.code().name})"
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

        job, cred = await asyncio.gather(check(self.job_health), check(self.credential_health))
        return {"jobService": job, "credentialService": cred}

    async def aclose(self) -> None:
        """Close the channels this object opened."""
        channels = list(self._worker_channels.values())
        self._worker_channels.clear()
        if self.owns_channels:
            channels += [self.job_channel, self.credential_channel]
        for channel in channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
            self._closing.clear()


def _rpc_name(method: Any) -> str:
    """``JobService/GetJob`` for a stub method (for logs), or ``?``."""
    name = getattr(method, "_method", b"")
    text = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
    return text.rsplit(".", 1)[-1] or "?"


def map_rpc_error(exc: grpc.aio.AioRpcError, rpc: str = "?") -> AppError:
    """A backend failure as the :class:`AppError` to answer with.

    The reference §4 code in ``ErrorInfo.reason`` is kept as is; a backend that is
    down, unreachable or too slow (gRPC UNAVAILABLE / DEADLINE_EXCEEDED) is 503
    ``UNAVAILABLE`` (reference §9.3; the answer's ``Retry-After`` says a few seconds);
    a backend refusing the gateway's own token is a misconfiguration, answered
    as 500 ``INTERNAL`` (the caller's credentials were fine).

    Args:
        exc: the failed call.
        rpc: ``Service/Method`` of the call, for the log line.
    """
    err = from_rpc_error(exc)
    if err.code == ErrorCode.UNAUTHENTICATED:
        log.error("a backend refused the gateway's service token (%s)", rpc)
        return AppError(ErrorCode.INTERNAL, "internal authentication between services failed")
    if err.code == ErrorCode.UNAVAILABLE:
        timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        log.warning(
            "backend %s on %s: %s", "timeout" if timed_out else "unavailable", rpc, err.message
        )
        message = (
            "a backend service did not answer in time; try again shortly"
            if timed_out
            else "a backend service is unavailable; try again shortly"
        )
        return AppError(ErrorCode.UNAVAILABLE, message, err.details)
    if err.code == ErrorCode.INTERNAL:
        log.warning("backend internal error on %s: %s", rpc, err.message)
        return AppError(ErrorCode.INTERNAL, "internal error")
    return err


class Caller:
    """Calls backends on behalf of one HTTP request.

    Args:
        backends: the app's :class:`Backends`.
        request_id: forwarded as ``x-request-id``.
        instance_id: forwarded as ``x-runtime-instance-id`` (shim calls only).
    """

    def __init__(self, backends: Backends, request_id: str | None, instance_id: str | None = None):
        self.backends = backends
        self.request_id = request_id
        self.instance_id = instance_id

    @property
    def job(self) -> Any:
        """The JobService stub."""
        return self.backends.job

    @property
    def credential(self) -> Any:
        """The CredentialService stub."""
        return self.backends.credential

    async def __call__(
        self,
        method: Callable[..., Awaitable[Any]],
        request: Any,
        *,
        deadline: float | None = None,
    ) -> Any:
        """Call ``method(request)`` with metadata and a deadline.

        Args:
            method: a stub method, e.g. ``caller.job.GetJob``.
            request: the request message.
            deadline: seconds the call may take; default ``GRPC_TIMEOUT_SECONDS``.

        Returns:
            The response message.

        Raises:
            AppError: the backend's refusal (reference §4), 503 ``UNAVAILABLE`` when it
                is down, unreachable or does not answer within the deadline.
        """
        md = outgoing(
            self.backends.settings.RUNTIME_SERVICE_TOKEN, self.instance_id, self.request_id
        )
        try:
            return await method(
                request,
                metadata=md,
                timeout=deadline
                if deadline is not None
                else self.backends.settings.GRPC_TIMEOUT_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, _rpc_name(method)) from None
