"""Probes of the three gRPC listeners: one protected call each, health, reflection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from airuntime_common.grpc_errors import from_rpc_error
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.credential.v1 import request_response_pb2 as crr
from zhixi.airuntime.credential.v1 import service_pb2_grpc as cgrpc
from zhixi.airuntime.job.v1 import request_response_pb2 as jrr
from zhixi.airuntime.job.v1 import service_pb2_grpc as jgrpc
from zhixi.airuntime.worker.v1 import request_response_pb2 as wrr
from zhixi.airuntime.worker.v1 import service_pb2_grpc as wgrpc

Metadata = tuple[tuple[str, str], ...]
Call = Callable[[grpc.aio.Channel, Metadata], Awaitable[Any]]


async def _job(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await jgrpc.JobServiceStub(channel).GetRuntimeHealth(
        jrr.GetRuntimeHealthRequest(), metadata=md, timeout=10
    )


async def _job_poll(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await jgrpc.JobServiceStub(channel).PollJobs(
        jrr.PollJobsRequest(capabilities=[common_pb2.JOB_TYPE_QUIZ_GENERATION], limit=1),
        metadata=md,
        timeout=10,
    )


async def _credential(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await cgrpc.CredentialServiceStub(channel).GetCredential(
        crr.GetCredentialRequest(user_id="grpc-probe-nobody"), metadata=md, timeout=10
    )


async def _credential_put(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await cgrpc.CredentialServiceStub(channel).PutCredential(
        crr.PutCredentialRequest(
            user_id="grpc-probe-nobody", provider="deepseek", api_key="sk-probe-0123456789"
        ),
        metadata=md,
        timeout=10,
    )


async def _worker(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await wgrpc.WorkerStatusServiceStub(channel).GetStatus(
        wrr.GetStatusRequest(), metadata=md, timeout=10
    )


async def _worker_drain(channel: grpc.aio.Channel, md: Metadata) -> Any:
    return await wgrpc.WorkerStatusServiceStub(channel).Drain(
        wrr.DrainRequest(grace_seconds=0.1), metadata=md, timeout=10
    )


#: name → (address variable, full service name, harmless protected calls, a call that would change state)
SERVICES: dict[str, tuple[str, str, list[Call], Call]] = {
    "job_service": (
        "JOB_SERVICE_ADDR",
        "zhixi.airuntime.job.v1.JobService",
        [_job, _job_poll],
        _job_poll,
    ),
    "credential_service": (
        "CREDENTIAL_SERVICE_ADDR",
        "zhixi.airuntime.credential.v1.CredentialService",
        [_credential],
        _credential_put,
    ),
    "runtime_worker": (
        "RUNTIME_WORKER_ADDR",
        "zhixi.airuntime.worker.v1.WorkerStatusService",
        [_worker],
        _worker_drain,
    ),
}


async def expect_code(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """Await a call that must fail; returns its gRPC status code and the reference §4 code."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), from_rpc_error(exc).code
    raise AssertionError("the call succeeded")


async def health(channel: grpc.aio.Channel, service: str = "") -> int:
    """``grpc.health.v1.Health/Check`` without any metadata."""
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=10
    )
    return int(reply.status)


SERVING = health_pb2.HealthCheckResponse.SERVING


async def reflected_services(channel: grpc.aio.Channel) -> set[str]:
    """Service names listed by server reflection, asked without any metadata."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(timeout=10)
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    await call.done_writing()
    names: set[str] = set()
    async for reply in call:
        names |= {s.name for s in reply.list_services_response.service}
    return names
