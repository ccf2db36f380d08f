"""The admin endpoints of the console (reference §9.5): list filters and counts, the job's
attempts and snapshot, jobs per minute; admin token only, bad filters 400."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from airuntime_common.timeutil import to_timestamp
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import ADMIN, JOB_ID, T0, Backends, bearer, full_job, make_token

A = bearer(make_token(ADMIN, "admin", exp_in=86400))
U = bearer(make_token("u1", "user", exp_in=86400))


async def test_list_passes_the_time_range_and_answers_counts(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["ListJobs"] = rr.ListJobsResponse(
        jobs=[full_job()],
        counts=[
            msg.JobStateCount(status=common_pb2.JOB_STATUS_FAILED, count=3),
            msg.JobStateCount(status=common_pb2.JOB_STATUS_PENDING, count=0),
        ],
    )
    resp = await client.get(
        "/admin/ai/jobs",
        params={
            "userId": "u1",
            "jobType": "quiz_generation",
            "status": "failed",
            "createdFrom": "2026-11-30T08:00:00+08:00",
            "createdTo": "2026-11-30T12:00:00Z",
            "includeCounts": "true",
        },
        headers=A,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["counts"] == {"failed": 3, "pending": 0}
    assert [j["jobId"] for j in body["jobs"]] == [JOB_ID]
    req = backends.job.last("ListJobs").request
    assert req.include_counts and req.user_id == "u1"
    assert req.created_from.ToDatetime().isoformat() == "2026-11-30T00:00:00"
    assert req.created_to.ToDatetime().isoformat() == "2026-11-30T12:00:00"


async def test_list_without_counts_says_null(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.get("/admin/ai/jobs", headers=A)
    assert resp.status_code == 200
    assert resp.json()["counts"] is None
    req = backends.job.last("ListJobs").request
    assert not req.include_counts and not req.HasField("created_from")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"createdFrom": "2026-11-30T08:00:00"}, "createdFrom"),  # no offset
        ({"createdTo": "yesterday"}, "createdTo"),
        (
            {"createdFrom": "2026-11-30T08:00:00Z", "createdTo": "2026-11-30T08:00:00Z"},
            "createdFrom",
        ),
        ({"status": "expired-ish"}, "status"),
        ({"jobType": "poetry"}, "jobType"),
        ({"includeCounts": "maybe"}, "includeCounts"),
        ({"pageSize": "0"}, "pageSize"),
    ],
)
async def test_bad_filters_are_invalid_argument(
    client: httpx.AsyncClient, backends: Backends, params: dict[str, str], field: str
) -> None:
    resp = await client.get("/admin/ai/jobs", params=params, headers=A)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "INVALID_ARGUMENT"
    assert field in resp.text
    assert not backends.job.calls


async def test_job_detail_has_attempts_and_snapshot(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    event = msg.JobEvent(
        job_id=JOB_ID,
        from_status=common_pb2.JOB_STATUS_RUNNING,
        to_status=common_pb2.JOB_STATUS_FAILED,
        error_code="MODEL_BAD_REQUEST",
        actor="runtime:w1",
        attempt_no=1,
        at=to_timestamp(T0),
    )
    call = msg.Invocation(
        id="inv-1",
        job_id=JOB_ID,
        attempt_no=1,
        model_provider="backup",
        model_name="m",
        latency_ms=40,
        outcome="failed",
        error_code="MODEL_BAD_REQUEST",
        cost_usd=0.5,
    )
    resp_pb = rr.GetJobResponse(
        job=full_job(),
        events=[event],
        invocations=[call],
        attempts=[
            msg.JobAttempt(
                attempt_no=1,
                runtime_instance_id="w1",
                started_at=to_timestamp(T0),
                ended_at=to_timestamp(T0 + timedelta(seconds=2)),
                outcome=common_pb2.JOB_STATUS_FAILED,
                error_code="MODEL_BAD_REQUEST",
                events=[event],
                invocations=[call],
                latency_ms=40,
                cost_usd=0.5,
            )
        ],
        snapshot=msg.SnapshotSummary(
            snapshot_id="snap-1",
            schema_version="v1",
            target_type="user",
            target_id="u1",
            content_hash="h",
            payload_bytes=120,
            block_count=2,
        ),
    )
    backends.job.responses["GetJob"] = resp_pb
    resp = await client.get(f"/admin/ai/jobs/{JOB_ID}", headers=A)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    (attempt,) = body["attempts"]
    assert attempt["outcome"] == "failed" and attempt["runtimeInstanceId"] == "w1"
    assert attempt["endedAt"] == "2026-11-30T12:00:02.123Z"
    assert attempt["invocations"][0]["modelProvider"] == "backup"
    assert attempt["invocations"][0]["errorCode"] == "MODEL_BAD_REQUEST"
    assert attempt["events"][0]["toStatus"] == "failed"
    assert body["snapshot"]["blockCount"] == 2 and body["snapshot"]["stats"] == {}
    assert backends.job.last("GetJob").request.include_history


async def test_job_detail_without_snapshot_is_null(client: httpx.AsyncClient) -> None:
    resp = await client.get(f"/admin/ai/jobs/{JOB_ID}", headers=A)
    assert resp.status_code == 200
    assert resp.json()["snapshot"] is None and resp.json()["attempts"] == []


async def test_throughput(client: httpx.AsyncClient, backends: Backends) -> None:
    backends.job.responses["GetJobThroughput"] = rr.GetJobThroughputResponse(
        from_time=to_timestamp(T0 - timedelta(hours=2)),
        to_time=to_timestamp(T0),
        minutes=[
            msg.ThroughputMinute(
                minute=to_timestamp(T0.replace(second=0, microsecond=0)), succeeded=3, failed=1
            )
        ],
        succeeded=3,
        failed=1,
        failure_rate=0.25,
    )
    resp = await client.get("/admin/ai/throughput", params={"hours": 2}, headers=A)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["from"] == "2026-11-30T10:00:00.123Z" and body["to"] == "2026-11-30T12:00:00.123Z"
    assert body["minutes"] == [
        {"minute": "2026-11-30T12:00:00.000Z", "succeeded": 3, "failed": 1, "cancelled": 0}
    ]
    assert (body["failureRate"], body["hours"]) == (0.25, 2)
    assert backends.job.last("GetJobThroughput").request.hours == 2
    default = await client.get("/admin/ai/throughput", headers=A)
    assert default.json()["hours"] == 6
    assert backends.job.last("GetJobThroughput").request.hours == 6


@pytest.mark.parametrize("hours", ["0", "169", "x"])
async def test_throughput_hours_bounds(
    client: httpx.AsyncClient, backends: Backends, hours: str
) -> None:
    resp = await client.get("/admin/ai/throughput", params={"hours": hours}, headers=A)
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_ARGUMENT"
    assert not backends.job.calls


@pytest.mark.parametrize(
    "path",
    ["/admin/ai/throughput", "/admin/ai/jobs?includeCounts=true", f"/admin/ai/jobs/{JOB_ID}"],
)
async def test_console_endpoints_need_an_admin(
    client: httpx.AsyncClient, backends: Backends, path: str
) -> None:
    assert (await client.get(path, headers=U)).status_code == 403
    assert (await client.get(path)).status_code == 401
    assert not backends.job.calls


async def test_openapi_declares_the_console_endpoints(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert "/admin/ai/throughput" in doc["paths"]
    names = {p["name"] for p in doc["paths"]["/admin/ai/jobs"]["get"]["parameters"]}
    assert {"createdFrom", "createdTo", "includeCounts", "status", "jobType", "userId"} <= names
    schemas = doc["components"]["schemas"]
    assert "attempts" in schemas["AdminJobDetailOut"]["properties"]
    assert "counts" in schemas["AdminJobList"]["properties"]
