"""``airt_grpc_server_handling_seconds``: every authenticated unary call is timed, by
method and by the status code it answered (job_service's and credential_service's
``/metrics``)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from airuntime_common.grpc_server import method_label
from tests.unit.job_service.conftest import Server
from zhixi.airuntime.common.v1 import message_pb2 as common
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

LSA = common.JOB_TYPE_LEARNING_STATE_ANALYSIS

NAME = "airt_grpc_server_handling_seconds_count"


def count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value(NAME, {"method": method, "code": code}) or 0.0


async def settled(method: str, code: str, want: float) -> float:
    """The count once the server has observed the call: a refusal's status reaches the
    caller as the handler aborts, a moment before the server's ``finally`` observes it."""
    for _ in range(100):
        if count(method, code) >= want:
            break
        await asyncio.sleep(0.02)
    return count(method, code)


def test_method_label_keeps_service_and_method() -> None:
    assert method_label("/zhixi.airuntime.job.v1.JobService/SubmitResult") == (
        "JobService/SubmitResult"
    )


async def test_each_call_is_timed_by_method_and_answered_code(server: Server) -> None:
    ok0 = count("JobService/GetRuntimeHealth", "OK")
    missing0 = count("JobService/GetJob", "NOT_FOUND")
    bad0 = count("JobService/ClaimJobs", "INVALID_ARGUMENT")
    await server.stub.GetRuntimeHealth(rr.GetRuntimeHealthRequest(), metadata=server.md())
    with pytest.raises(grpc.aio.AioRpcError):
        await server.stub.GetJob(rr.GetJobRequest(job_id="nope"), metadata=server.md())
    with pytest.raises(grpc.aio.AioRpcError):
        await server.stub.ClaimJobs(rr.ClaimJobsRequest(limit=1), metadata=server.md("w1"))
    assert await settled("JobService/GetRuntimeHealth", "OK", ok0 + 1) == ok0 + 1
    assert await settled("JobService/GetJob", "NOT_FOUND", missing0 + 1) == missing0 + 1
    assert await settled("JobService/ClaimJobs", "INVALID_ARGUMENT", bad0 + 1) == bad0 + 1


async def test_a_call_the_caller_gave_up_on_is_cancelled_not_ok(server: Server) -> None:
    """A long poll abandoned by its caller (deadline) is no success."""
    ok0 = count("JobService/ClaimJobs", "OK")
    gone0 = count("JobService/ClaimJobs", "CANCELLED")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await server.stub.ClaimJobs(
            rr.ClaimJobsRequest(capabilities=[LSA], limit=1, wait_ms=5000),
            metadata=server.md("w1"),
            timeout=0.3,
        )
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the server notices the deadline on its side
    assert await settled("JobService/ClaimJobs", "CANCELLED", gone0 + 1) == gone0 + 1
    assert count("JobService/ClaimJobs", "OK") == ok0


async def test_refusals_before_the_handler_are_timed_too(server: Server) -> None:
    """A wrong token and an undecodable body are answered by the server, and counted."""
    denied0 = count("JobService/GetJob", "UNAUTHENTICATED")
    bad0 = count("JobService/GetJob", "INVALID_ARGUMENT")
    with pytest.raises(grpc.aio.AioRpcError):
        await server.stub.GetJob(
            rr.GetJobRequest(job_id="x"), metadata=(("x-internal-api-key", "wrong"),)
        )
    raw = server.channel.unary_unary(
        "/zhixi.airuntime.job.v1.JobService/GetJob",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw(b"\xff\xff\xff", metadata=server.md())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await settled("JobService/GetJob", "UNAUTHENTICATED", denied0 + 1) == denied0 + 1
    assert await settled("JobService/GetJob", "INVALID_ARGUMENT", bad0 + 1) == bad0 + 1
