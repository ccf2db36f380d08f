"""``POST /v1/ai/job-batches`` and ``?parentJobId=`` at the gateway (reference §10.3):
what it forwards to job_service, what it refuses itself, the ``Job`` JSON of a
parent and of a child."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.spec_fields import JOB_KEYS
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import OWNER, Backends, bearer, make_token, parent_job, sparse_job

USER = bearer(make_token(OWNER, "user", plan="pro", exp_in=86400))


async def test_a_batch_is_forwarded_whole_and_answers_its_parent(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    body = {
        "jobType": "quiz_generation",
        "targets": [
            {"targetType": "material", "targetId": "m1"},
            {"targetType": "knowledge_point", "targetId": "k1"},
        ],
        "minSuccessRatio": 0.5,
    }
    resp = await client.post(
        "/v1/ai/job-batches", json=body, headers={**USER, "Idempotency-Key": "b-1"}
    )
    assert resp.status_code == 201, resp.text
    out = resp.json()
    assert set(out) == set(JOB_KEYS)
    assert out["batch"] == {
        "total": 3,
        "pending": 2,
        "running": 1,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 0,
        "minSuccessRatio": 0.5,
    }
    assert out["parentJobId"] is None
    req = backends.job.last("CreateJobBatch").request
    assert (req.user_id, req.actor, req.plan, req.idempotency_key) == (
        OWNER,
        "user:u1",
        "pro",
        "b-1",
    )
    assert [(t.target_type, t.target_id) for t in req.targets] == [
        (common_pb2.TARGET_TYPE_MATERIAL, "m1"),
        (common_pb2.TARGET_TYPE_KNOWLEDGE_POINT, "k1"),
    ]
    assert not req.HasField("targets_of")
    assert req.min_success_ratio == 0.5
    assert req.params["count"] == 5  # the type's defaults filled in

    backends.job.responses["CreateJobBatch"] = rr.CreateJobBatchResponse(
        job=parent_job(), replayed=True
    )
    again = await client.post(
        "/v1/ai/job-batches", json=body, headers={**USER, "Idempotency-Key": "b-1"}
    )
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"


async def test_targets_of_is_forwarded(client: httpx.AsyncClient, backends: Backends) -> None:
    body = {
        "jobType": "weak_point_analysis",
        "targetsOf": {"targetType": "knowledge_point", "materialId": "m9"},
    }
    resp = await client.post("/v1/ai/job-batches", json=body, headers=USER)
    assert resp.status_code == 201, resp.text
    req = backends.job.last("CreateJobBatch").request
    assert list(req.targets) == []
    assert req.targets_of.target_type == common_pb2.TARGET_TYPE_KNOWLEDGE_POINT
    assert req.targets_of.material_id == "m9"
    assert not req.HasField("min_success_ratio")


@pytest.mark.parametrize(
    "body",
    [
        {"jobType": "quiz_generation", "targets": [{"targetType": "material"}]},
        {"jobType": "quiz_generation", "targets": [{"targetType": "lesson", "targetId": "a"}]},
        {"jobType": "quiz_generation", "targetsOf": {"targetType": "user"}},
        {"jobType": "quiz_generation", "targetsOf": {"targetType": "material"}, "x": 1},
        {"jobType": "nope", "targetsOf": {"targetType": "material"}},
        {
            "jobType": "quiz_generation",
            "targetsOf": {"targetType": "material"},
            "minSuccessRatio": 0,
        },
        {
            "jobType": "quiz_generation",
            "targetsOf": {"targetType": "material"},
            "minSuccessRatio": 2,
        },
        {
            "jobType": "quiz_generation",
            "targetsOf": {"targetType": "material"},
            "params": {"count": 99},
        },
    ],
)
async def test_bad_bodies_never_reach_job_service(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, Any]
) -> None:
    resp = await client.post("/v1/ai/job-batches", json=body, headers=USER)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_ARGUMENT"
    assert not [c for c in backends.job.calls if c.method == "CreateJobBatch"]


async def test_a_batchs_children_are_listed_by_parent(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    child = sparse_job()
    child.parent_job_id = "parent-1"
    backends.job.responses["ListJobs"] = rr.ListJobsResponse(jobs=[child], next_page_token="")
    resp = await client.get("/v1/ai/jobs?parentJobId=parent-1", headers=USER)
    assert resp.status_code == 200
    assert resp.json()["jobs"][0]["parentJobId"] == "parent-1"
    assert resp.json()["jobs"][0]["batch"] is None
    req = backends.job.last("ListJobs").request
    assert (req.user_id, req.parent_job_id) == (OWNER, "parent-1")
    mixed = await client.get("/v1/ai/jobs?parentJobId=parent-1&ids=a,b", headers=USER)
    assert mixed.status_code == 400


async def test_the_document_describes_batches(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    post = doc["paths"]["/v1/ai/job-batches"]["post"]
    assert post["operationId"] == "createAiJobBatch"
    assert set(post["responses"]) >= {"201", "200", "400", "404", "429"}
    job = doc["components"]["schemas"]["JobOut"]["properties"]
    assert "parentJobId" in job and "batch" in job
    params = {p["name"] for p in doc["paths"]["/v1/ai/jobs"]["get"]["parameters"]}
    assert "parentJobId" in params
