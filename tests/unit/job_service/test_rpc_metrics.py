"""``airt_grpc_server_handling_seconds``: every authenticated unary call is timed, by
method and by the status code it answered (job_service's and credential_service's
``/metrics``)."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import REGISTRY

from airuntime_common.grpc_server import method_label
from tests.unit.job_service.conftest import Server
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

NAME = "airt_grpc_server_handling_seconds_count"


def count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value(NAME, {"method": method, "code": code}) or 0.0


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
    assert count("JobService/GetRuntimeHealth", "OK") == ok0 + 1
    assert count("JobService/GetJob", "NOT_FOUND") == missing0 + 1
    assert count("JobService/ClaimJobs", "INVALID_ARGUMENT") == bad0 + 1
