"""Public /v1 routes: shapes, conversions, validation and forwarding (reference §3, §3.1)."""

from __future__ import annotations

import httpx
import pytest

from airuntime_common.errors import AppError, ErrorCode
from tests.spec_fields import JOB_KEYS
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import OWNER, Backends, bearer, full_job, make_token, sparse_job

JOB_FIELDS = set(JOB_KEYS)
USER = bearer(make_token(OWNER, "user", plan="pro", exp_in=86400))  # made at import


async def test_job_json_has_every_field_and_nulls_for_absent_values(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.get("/v1/ai/jobs", headers=USER)
    assert resp.status_code == 200
    full, sparse = resp.json()["jobs"]
    assert set(full) == JOB_FIELDS
    assert set(sparse) == JOB_FIELDS
    assert full["jobType"] == "quiz_generation"
    assert full["targetType"] == "material"
    assert full["status"] == "running"
    assert full["apiKeyMode"] == "user_deepseek_key"
    assert full["params"] == {
        "count": 5,
        "difficulty": "medium",
        "questionTypes": ["single_choice"],
    }
    assert isinstance(full["params"]["count"], int)
    assert full["lockUntil"] == "2026-11-30T12:00:00.123Z"
    for key in (
        "snapshotId",
        "credentialId",
        "promptVersion",
        "outputSchemaVersion",
        "lockedBy",
        "lockUntil",
        "errorCode",
        "errorMessage",
        "retriedFromJobId",
        "startedAt",
        "finishedAt",
    ):
        assert sparse[key] is None, key
    assert sparse["params"] == {}
    assert sparse["status"] == "pending"
    assert sparse["cancelRequested"] is False
    assert resp.json()["nextPageToken"] is None


async def test_create_job_201_then_replay_200_with_header(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    body = {"jobType": "quiz_generation", "targetType": "material", "targetId": "m1"}
    resp = await client.post("/v1/ai/jobs", json=body, headers={**USER, "Idempotency-Key": "k-1"})
    assert resp.status_code == 201
    assert "Idempotent-Replayed" not in resp.headers
    assert set(resp.json()) == JOB_FIELDS
    req = backends.job.last("CreateJob").request
    assert req.user_id == OWNER
    assert req.idempotency_key == "k-1"
    assert req.plan == "pro"
    assert req.actor == "user:u1"
    assert req.job_type == common_pb2.JOB_TYPE_QUIZ_GENERATION
    assert req.api_key_mode == common_pb2.API_KEY_MODE_PLATFORM_KEY
    # defaults of reference §3.1 filled in
    assert req.params["count"] == 5
    assert req.params["difficulty"] == "medium"
    assert list(req.params["questionTypes"]) == ["single_choice"]
    assert not req.HasField("priority")

    backends.job.responses["CreateJob"] = rr.CreateJobResponse(job=sparse_job(), replayed=True)
    again = await client.post("/v1/ai/jobs", json=body, headers={**USER, "Idempotency-Key": "k-1"})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["jobId"] == resp.json()["jobId"]


async def test_a_repeat_with_params_now_invalid_goes_to_job_service_for_its_original(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    # reference §2.5: a repeat returns the original job whatever its params; only job_service
    # knows whether there is one, so the gateway forwards the key with the params as sent
    body = {
        "jobType": "quiz_generation",
        "targetType": "material",
        "targetId": "m1",
        "params": {"count": 99},
    }
    backends.job.responses["CreateJob"] = rr.CreateJobResponse(job=sparse_job(), replayed=True)
    resp = await client.post("/v1/ai/jobs", json=body, headers={**USER, "Idempotency-Key": "k-9"})
    assert resp.status_code == 200
    assert resp.headers["Idempotent-Replayed"] == "true"
    req = backends.job.last("CreateJob").request
    assert req.idempotency_key == "k-9"
    assert req.params["count"] == 99

    # no original: job_service refuses the params, and the caller sees its 400
    backends.job.errors["CreateJob"] = AppError(
        ErrorCode.INVALID_ARGUMENT, "count out of range", {"field": "params.count"}
    )
    resp = await client.post("/v1/ai/jobs", json=body, headers={**USER, "Idempotency-Key": "k-10"})
    assert resp.status_code == 400
    assert resp.json()["code"] == "INVALID_ARGUMENT"

    # without a key the gateway refuses them itself, and job_service is not called
    calls = len(backends.job.calls)
    resp = await client.post("/v1/ai/jobs", json=body, headers=USER)
    assert resp.status_code == 400
    assert len(backends.job.calls) == calls


async def test_create_without_key_sends_none(client: httpx.AsyncClient, backends: Backends) -> None:
    body = {"jobType": "learning_state_analysis", "targetType": "user"}
    resp = await client.post("/v1/ai/jobs", json=body, headers=USER)
    assert resp.status_code == 201
    req = backends.job.last("CreateJob").request
    assert not req.HasField("idempotency_key")
    assert req.target_id == OWNER  # targetType=user means the caller


async def test_user_target_with_another_id_is_404(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    body = {"jobType": "learning_state_analysis", "targetType": "user", "targetId": "u2"}
    resp = await client.post("/v1/ai/jobs", json=body, headers=USER)
    assert resp.status_code == 404
    assert resp.json()["code"] == "NOT_FOUND"
    assert not [c for c in backends.job.calls if c.method == "CreateJob"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jobType": "poetry", "targetType": "user"}, "jobType"),
        ({"jobType": "quiz_generation", "targetType": "galaxy", "targetId": "x"}, "targetType"),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "apiKeyMode": "free",
            },
            "apiKeyMode",
        ),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"count": 21},
            },
            "params.count",
        ),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"difficulty": "insane"},
            },
            "params.difficulty",
        ),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"questionTypes": ["essay"]},
            },
            "params.questionTypes.0",
        ),
        (
            {
                "jobType": "flashcard_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"count": 0},
            },
            "params.count",
        ),
        (
            {
                "jobType": "flashcard_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"count": True},  # not read as 1
            },
            "params.count",
        ),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"count": "7"},  # not read as 7
            },
            "params.count",
        ),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": {"count": 5, "colour": "blue"},  # not passed through
            },
            "params.colour",
        ),
        (
            {"jobType": "learning_state_analysis", "targetType": "user", "params": {"count": 5}},
            "params.count",  # the analysis types take no params
        ),
        ({"jobType": "flashcard_generation", "targetType": "material"}, "targetId"),
        ({"targetType": "user"}, "jobType"),
        (
            {
                "jobType": "quiz_generation",
                "targetType": "material",
                "targetId": "m1",
                "params": [1],
            },
            "params",
        ),
    ],
)
async def test_create_validation_is_400_with_the_field(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, object], field: str
) -> None:
    resp = await client.post("/v1/ai/jobs", json=body, headers=USER)
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert err["code"] == "INVALID_ARGUMENT"
    fields = [f["field"] for f in err["details"].get("fields", [])] or [err["details"].get("field")]
    assert field in fields, err
    assert not [c for c in backends.job.calls if c.method == "CreateJob"]


async def test_list_filters_and_paging(client: httpx.AsyncClient, backends: Backends) -> None:
    backends.job.responses["ListJobs"] = rr.ListJobsResponse(
        jobs=[full_job()], next_page_token="next"
    )
    resp = await client.get(
        "/v1/ai/jobs?status=failed&jobType=weak_point_analysis&pageSize=7&pageToken=abc",
        headers=USER,
    )
    assert resp.status_code == 200
    assert resp.json()["nextPageToken"] == "next"
    req = backends.job.last("ListJobs").request
    assert (req.user_id, req.page_size, req.page_token) == (OWNER, 7, "abc")
    assert req.status == common_pb2.JOB_STATUS_FAILED
    assert req.job_type == common_pb2.JOB_TYPE_WEAK_POINT_ANALYSIS
    for bad in ("pageSize=0", "pageSize=101", "status=sleeping", "jobType=x", "pageSize=abc"):
        r = await client.get(f"/v1/ai/jobs?{bad}", headers=USER)
        assert r.status_code == 400, bad
        assert r.json()["code"] == "INVALID_ARGUMENT"
        assert r.json()["details"]["fields"][0]["in"] == "query"


async def test_default_page_size_is_20(client: httpx.AsyncClient, backends: Backends) -> None:
    await client.get("/v1/ai/jobs", headers=USER)
    assert backends.job.last("ListJobs").request.page_size == 20


async def test_job_routes_pass_the_caller(client: httpx.AsyncClient, backends: Backends) -> None:
    assert (await client.get("/v1/ai/jobs/job-1", headers=USER)).status_code == 200
    assert backends.job.last("GetJob").request.user_id == OWNER
    assert not backends.job.last("GetJob").request.include_history
    resp = await client.post("/v1/ai/jobs/job-1/cancel", headers=USER)
    assert resp.json()["cancelRequested"] is True
    assert backends.job.last("CancelJob").request.actor == "user:u1"
    result = await client.get("/v1/ai/jobs/job-1/result", headers=USER)
    assert result.json() == {
        "jobId": "job-1",
        "jobType": "flashcard_generation",
        "outputSchemaVersion": "v1",
        "items": [{"front": "f", "back": "b", "sourceBlockIds": ["b1"]}],
    }


async def test_result_before_success_is_409(client: httpx.AsyncClient, backends: Backends) -> None:
    backends.job.errors["GetJobResult"] = AppError(
        ErrorCode.INVALID_JOB_STATE, "not succeeded", {"status": "running"}
    )
    resp = await client.get("/v1/ai/jobs/job-1/result", headers=USER)
    assert resp.status_code == 409
    assert resp.json() == {
        "code": "INVALID_JOB_STATE",
        "message": "not succeeded",
        "details": {"status": "running"},
    }


@pytest.mark.parametrize(
    ("kind", "number"),
    [
        ("analyses", 1),
        ("weak-points", 2),
        ("recommendations", 3),
        ("questions", 4),
        ("flashcards", 5),
    ],
)
async def test_accumulated_results(
    client: httpx.AsyncClient, backends: Backends, kind: str, number: int
) -> None:
    resp = await client.get(f"/v1/ai/results/{kind}?pageSize=3&pageToken=p", headers=USER)
    assert resp.status_code == 200
    assert resp.json() == {"items": [{"stem": "q", "count": 3}], "nextPageToken": "tok-2"}
    req = backends.job.last("ListResultItems").request
    assert (req.user_id, req.kind, req.page_size, req.page_token) == (OWNER, number, 3, "p")


async def test_unknown_result_kind_is_400(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/ai/results/poems", headers=USER)
    assert resp.status_code == 400


async def test_materials_and_knowledge_points(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.post(
        "/v1/materials", json={"title": "t", "content": "# h\n\ntext"}, headers=USER
    )
    assert resp.status_code == 201
    assert resp.json()["materialId"] == "m1"
    assert resp.json()["blocks"] == [{"blockId": "b1", "ordinal": 0, "text": "hello"}]
    assert backends.job.last("CreateMaterial").request.user_id == OWNER
    got = await client.get("/v1/materials/m1", headers=USER)
    assert got.json()["blocks"][0]["blockId"] == "b1"
    kp = await client.post(
        "/v1/knowledge-points",
        json={"materialId": "m1", "name": "k", "blockIds": ["b1"]},
        headers=USER,
    )
    assert kp.status_code == 201
    assert kp.json()["knowledgePointId"] == "kp1"
    assert list(backends.job.last("CreateKnowledgePoint").request.block_ids) == ["b1"]


async def test_material_content_over_1_mib_is_413(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.post(
        "/v1/materials", json={"title": "t", "content": "x" * (1024 * 1024 + 1)}, headers=USER
    )
    assert resp.status_code == 413
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert not backends.job.calls


async def test_learning_events(client: httpx.AsyncClient, backends: Backends) -> None:
    events = [
        {
            "eventId": "e1",
            "type": "reading",
            "materialId": "m1",
            "blockId": "b1",
            "dwellSeconds": 12.5,
            "occurredAt": "2026-11-30T10:00:00Z",
        },
        {"eventId": "e2", "type": "quiz_attempt", "knowledgePointId": "kp1", "correct": False},
    ]
    resp = await client.post("/v1/learning-events", json={"events": events}, headers=USER)
    assert resp.status_code == 202
    assert resp.json() == {"accepted": 2, "duplicates": 0}
    req = backends.job.last("RecordLearningEvents").request
    first, second = req.events
    assert first.type == 1 and first.dwell_seconds == 12.5 and first.block_id == "b1"
    assert first.occurred_at.seconds > 0
    assert second.type == 2 and second.HasField("correct") and second.correct is False
    assert not second.HasField("dwell_seconds")
    bad = await client.post(
        "/v1/learning-events",
        json={"events": [{"eventId": "e3", "type": "dreaming"}]},
        headers=USER,
    )
    assert bad.status_code == 400
    assert bad.json()["details"]["fields"][0]["field"].startswith("events.0.type")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"occurredAt": "9999-12-31T23:59:59.999999-01:00"}, "occurredAt"),  # past year 9999 in UTC
        ({"occurredAt": "0001-01-01T00:00:00+01:00"}, "occurredAt"),  # before year 1 in UTC
        ({"occurredAt": "2026-11-30T10:00:00"}, "occurredAt"),  # no offset
        ({"occurredAt": 1764496800}, "occurredAt"),  # a number is not RFC 3339
        ({"dwellSeconds": 86400.5}, "dwellSeconds"),  # over job_service's one day
    ],
)
async def test_bad_learning_event_is_400_and_sends_nothing(
    client: httpx.AsyncClient, backends: Backends, change: dict[str, object], field: str
) -> None:
    event = {"eventId": "e1", "type": "reading", "blockId": "b1", **change}
    resp = await client.post("/v1/learning-events", json={"events": [event]}, headers=USER)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_ARGUMENT"
    assert resp.json()["details"]["fields"][0]["field"] == f"events.0.{field}"
    assert not backends.job.calls


async def test_learning_event_times_are_sent_in_utc(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    edge = {"eventId": "e1", "type": "reading", "occurredAt": "9999-12-31T22:59:59.5-01:00"}
    resp = await client.post("/v1/learning-events", json={"events": [edge]}, headers=USER)
    assert resp.status_code == 202, resp.text
    sent = backends.job.last("RecordLearningEvents").request.events[0].occurred_at
    assert sent.ToJsonString() == "9999-12-31T23:59:59.500Z"


async def test_more_events_than_job_service_takes_is_400(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    events = [{"eventId": f"e{i}", "type": "reading", "blockId": "b1"} for i in range(501)]
    resp = await client.post("/v1/learning-events", json={"events": events}, headers=USER)
    assert resp.status_code == 400
    assert not backends.job.calls


async def test_model_credential_routes_never_return_the_key(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    put = await client.put(
        "/v1/me/model-credential",
        json={"provider": "deepseek", "apiKey": "sk-secret-abcd1234"},
        headers=USER,
    )
    assert put.status_code == 200
    assert put.json() == {
        "credentialId": "cred-1",
        "provider": "deepseek",
        "maskedKey": "sk-****1234",
        "status": "valid",
        "createdAt": "2026-11-30T12:00:00.123Z",
        "baseUrl": None,
    }
    assert "sk-secret" not in put.text
    req = backends.credential.last("PutCredential").request
    assert (req.user_id, req.api_key) == (OWNER, "sk-secret-abcd1234")
    assert (await client.get("/v1/me/model-credential", headers=USER)).json()[
        "maskedKey"
    ] == "sk-****1234"
    deleted = await client.delete("/v1/me/model-credential", headers=USER)
    assert deleted.status_code == 204 and deleted.content == b""
    backends.credential.errors["GetCredential"] = AppError(ErrorCode.NOT_FOUND, "no key")
    missing = await client.get("/v1/me/model-credential", headers=USER)
    assert missing.status_code == 404 and missing.json()["code"] == "NOT_FOUND"
    # any provider name goes to credential_service, which knows the configured ones …
    backup = await client.put(
        "/v1/me/model-credential", json={"provider": "backup", "apiKey": "sk-b-1234"}, headers=USER
    )
    assert backup.status_code == 200
    assert put_call(backends) == ("backup", "sk-b-1234")
    omitted = await client.put(
        "/v1/me/model-credential", json={"apiKey": "sk-k-1234"}, headers=USER
    )
    assert omitted.status_code == 200 and put_call(backends) == ("", "sk-k-1234")  # the first
    # … and refuses one it does not configure; the gateway passes its answer on
    backends.credential.errors["PutCredential"] = AppError(
        ErrorCode.INVALID_ARGUMENT, "provider must be one of deepseek", {"field": "provider"}
    )
    other_provider = await client.put(
        "/v1/me/model-credential", json={"provider": "openai", "apiKey": "sk-k-1234"}, headers=USER
    )
    assert other_provider.status_code == 400
    assert other_provider.json()["details"]["field"] == "provider"
    too_long = await client.put(
        "/v1/me/model-credential", json={"provider": "x" * 33, "apiKey": "sk-k-1234"}, headers=USER
    )
    assert too_long.status_code == 400 and too_long.json()["code"] == "INVALID_ARGUMENT"


def put_call(backends: Backends) -> tuple[str, str]:
    req = backends.credential.last("PutCredential").request
    return req.provider, req.api_key


async def test_ai_authorization(client: httpx.AsyncClient, backends: Backends) -> None:
    got = await client.get("/v1/me/ai-authorization", headers=USER)
    assert got.json() == {"granted": True, "changedAt": None}
    off = await client.put("/v1/me/ai-authorization", json={"granted": False}, headers=USER)
    assert off.json() == {"granted": False, "changedAt": "2026-11-30T12:00:00.123Z"}
    assert backends.job.last("SetAiAuthorization").request.granted is False
    revoke = await client.post("/v1/me/ai-authorization/revoke", headers=USER)
    assert revoke.status_code == 200
    assert revoke.json()["cancelled"] == 2 and revoke.json()["cancelRequested"] == 1
    bad = await client.put("/v1/me/ai-authorization", json={"granted": "maybe"}, headers=USER)
    assert bad.status_code == 400
