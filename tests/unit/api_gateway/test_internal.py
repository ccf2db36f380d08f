"""The /internal/runtime shim: bodies, headers and forwarding (reference §3 table)."""

from __future__ import annotations

import httpx
import pytest

from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import SERVICE_TOKEN, Backends, runtime_headers

H = runtime_headers("worker-a")


async def test_heartbeat_is_204_with_lease_headers(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.post(
        "/internal/runtime/jobs/job-1/heartbeat", json={"attemptNo": 3}, headers=H
    )
    assert resp.status_code == 204
    assert resp.content == b""
    assert resp.headers["X-Lock-Until"] == "2026-11-30T12:00:00.123Z"
    assert resp.headers["X-Cancel-Requested"] == "true"
    req = backends.job.last("Heartbeat").request
    assert (req.job_id, req.attempt_no) == ("job-1", 3)
    backends.job.responses["Heartbeat"] = rr.HeartbeatResponse(cancel_requested=False)
    resp = await client.post(
        "/internal/runtime/jobs/job-1/heartbeat", json={"attemptNo": 3}, headers=H
    )
    assert resp.headers["X-Cancel-Requested"] == "false"


async def test_resolve_is_no_store_and_carries_the_key(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    resp = await client.post(
        "/internal/runtime/model-credentials/resolve",
        json={"jobId": "job-1", "attemptNo": 2},
        headers=H,
    )
    assert resp.status_code == 200
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.json() == {
        "apiKeyMode": "user_deepseek_key",
        "credentialId": "cred-1",
        "apiKey": "sk-live-secret-1234",
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "baseUrl": "http://127.0.0.1:9/v1",
        "userBaseUrl": False,
    }
    call = backends.credential.last("ResolveCredential")
    assert (call.request.job_id, call.request.attempt_no) == ("job-1", 2)
    assert call.metadata["x-runtime-instance-id"] == "worker-a"


async def test_poll_and_claim(client: httpx.AsyncClient, backends: Backends) -> None:
    body = {
        "capabilities": ["quiz_generation", "flashcard_generation"],
        "limit": 3,
        "waitMs": 50,
        "statusAddress": "10.0.0.5:50053",
    }
    poll = await client.post("/internal/runtime/jobs/poll", json=body, headers=H)
    assert poll.status_code == 200
    assert poll.json()["jobs"][0]["status"] == "pending"
    req = backends.job.last("PollJobs").request
    assert list(req.capabilities) == [
        common_pb2.JOB_TYPE_QUIZ_GENERATION,
        common_pb2.JOB_TYPE_FLASHCARD_GENERATION,
    ]
    assert (req.limit, req.wait_ms, req.status_address) == (3, 50, "10.0.0.5:50053")
    claim = await client.post("/internal/runtime/jobs/claim", json=body, headers=H)
    job = claim.json()["jobs"][0]
    assert (job["status"], job["lockedBy"], job["attemptNo"]) == ("running", "worker-a", 1)
    assert job["lockUntil"] is not None


async def test_poll_defaults_limit_10(client: httpx.AsyncClient, backends: Backends) -> None:
    await client.post(
        "/internal/runtime/jobs/poll", json={"capabilities": ["quiz_generation"]}, headers=H
    )
    req = backends.job.last("PollJobs").request
    assert (req.limit, req.wait_ms) == (10, 0)


@pytest.mark.parametrize(
    "body",
    [
        {"capabilities": [], "limit": 1},
        {"capabilities": ["nope"], "limit": 1},
        {"capabilities": ["quiz_generation"], "limit": 0},
        {"capabilities": ["quiz_generation"], "waitMs": 20001},
        {"capabilities": ["quiz_generation"], "waitMs": -1},
        {"limit": 1},
    ],
)
async def test_poll_validation(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, object]
) -> None:
    for path in ("/internal/runtime/jobs/poll", "/internal/runtime/jobs/claim"):
        resp = await client.post(path, json=body, headers=H)
        assert resp.status_code == 400
        assert resp.json()["code"] == "INVALID_ARGUMENT"
    assert not backends.job.calls


async def test_lock_start_snapshot_result_fail(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    lock = await client.post("/internal/runtime/jobs/job-1/lock", headers=H)
    assert lock.json() == {
        "jobId": "job-1",
        "status": "locked",
        "lockedBy": "worker-a",
        "lockUntil": "2026-11-30T12:00:00.123Z",
        "attemptNo": 1,
    }
    start = await client.post(
        "/internal/runtime/jobs/job-1/start", json={"attemptNo": 1}, headers=H
    )
    assert start.json() == {"status": "running", "startedAt": "2026-11-30T12:00:00.123Z"}
    snap = await client.get("/internal/runtime/jobs/job-1/snapshot?attemptNo=1", headers=H)
    assert snap.json() == {
        "snapshotId": "snap-1",
        "schemaVersion": "v1",
        "targetType": "material",
        "targetId": "m1",
        "payload": {"jobType": "quiz_generation", "blocks": [{"ordinal": 0}]},
        "contentHash": "abc",
    }
    assert (await client.get("/internal/runtime/jobs/job-1/snapshot", headers=H)).status_code == 400
    output = {"items": [{"front": "a", "back": "b", "sourceBlockIds": ["b1"], "n": 2}]}
    result = await client.post(
        "/internal/runtime/jobs/job-1/result",
        json={
            "attemptNo": 1,
            "promptVersion": "flashcard_generation.v1",
            "outputSchemaVersion": "v1",
            "output": output,
        },
        headers=H,
    )
    assert result.json() == {
        "jobId": "job-1",
        "status": "succeeded",
        "resultId": "res-1",
        "outputHash": "h",
        "replayed": False,
    }
    sent = backends.job.last("SubmitResult").request
    assert sent.prompt_version == "flashcard_generation.v1"
    assert sent.output["items"][0]["sourceBlockIds"][0] == "b1"
    fail = await client.post(
        "/internal/runtime/jobs/job-1/fail",
        json={
            "attemptNo": 1,
            "errorCode": "MODEL_RATE_LIMIT",
            "errorMessage": "429",
            "retryAfterSeconds": 7,
        },
        headers=H,
    )
    assert fail.json() == {"jobId": "job-1", "status": "pending", "retryCount": 1}
    freq = backends.job.last("FailJob").request
    assert (freq.error_code, freq.retry_after_seconds) == ("MODEL_RATE_LIMIT", 7.0)
    await client.post(
        "/internal/runtime/jobs/job-1/fail",
        json={"attemptNo": 1, "errorCode": "CUSTOM_THING"},
        headers=H,
    )
    assert not backends.job.last("FailJob").request.HasField("retry_after_seconds")


async def test_leases_heartbeat_in_order(client: httpx.AsyncClient, backends: Backends) -> None:
    leases = [{"jobId": "a", "attemptNo": 1}, {"jobId": "b", "attemptNo": 2}]
    resp = await client.post(
        "/internal/runtime/leases/heartbeat", json={"leases": leases}, headers=H
    )
    assert resp.json() == {
        "leases": [
            {
                "jobId": "a",
                "attemptNo": 1,
                "held": True,
                "lockUntil": "2026-11-30T12:00:00.123Z",
                "cancelRequested": False,
            },
            {
                "jobId": "b",
                "attemptNo": 2,
                "held": False,
                "lockUntil": None,
                "cancelRequested": False,
            },
        ]
    }
    too_many = [{"jobId": f"j{i}", "attemptNo": 1} for i in range(501)]
    resp = await client.post(
        "/internal/runtime/leases/heartbeat", json={"leases": too_many}, headers=H
    )
    assert resp.status_code == 400


async def test_invocation_log_201(client: httpx.AsyncClient, backends: Backends) -> None:
    body = {
        "jobId": "job-1",
        "attemptNo": 1,
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "apiKeyMode": "user_deepseek_key",
        "credentialId": "cred-1",
        "promptTokens": 100,
        "completionTokens": 50,
        "cacheHitTokens": 20,
        "latencyMs": 1234,
        "outcome": "failed",
        "errorCode": "MODEL_TIMEOUT",
        "providerRequestId": "req-9",
    }
    resp = await client.post("/internal/runtime/invocation-logs", json=body, headers=H)
    assert resp.status_code == 201
    assert resp.json() == {"id": "inv-9"}
    req = backends.job.last("RecordInvocation").request
    assert (req.prompt_tokens, req.cache_hit_tokens, req.latency_ms) == (100, 20, 1234)
    assert req.api_key_mode == common_pb2.API_KEY_MODE_USER_DEEPSEEK_KEY
    assert (req.credential_id, req.error_code, req.provider_request_id) == (
        "cred-1",
        "MODEL_TIMEOUT",
        "req-9",
    )
    bad = await client.post(
        "/internal/runtime/invocation-logs", json={**body, "outcome": "meh"}, headers=H
    )
    assert bad.status_code == 400


async def test_health_token_only(client: httpx.AsyncClient) -> None:
    resp = await client.get(
        "/internal/runtime/health", headers={"x-internal-api-key": SERVICE_TOKEN}
    )
    assert resp.status_code == 200
    assert resp.json() == {
        "status": "SERVING",
        "workers": [
            {
                "instanceId": "worker-a",
                "capabilities": ["quiz_generation"],
                "inFlight": 1,
                "lastSeenAt": "2026-11-30T12:00:00.123Z",
                "status": "alive",
            }
        ],
    }


async def test_request_id_forwarded(client: httpx.AsyncClient, backends: Backends) -> None:
    resp = await client.post(
        "/internal/runtime/jobs/job-1/start",
        json={"attemptNo": 1},
        headers={**H, "X-Request-Id": "rid-42"},
    )
    assert resp.headers["X-Request-Id"] == "rid-42"
    assert backends.job.last("StartJob").metadata["x-request-id"] == "rid-42"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/internal/runtime/jobs/job-1/start", {"attemptNo": 0}),
        ("/internal/runtime/jobs/job-1/heartbeat", {"attemptNo": 0}),
        ("/internal/runtime/jobs/job-1/fail", {"attemptNo": 0, "errorCode": "X"}),
        ("/internal/runtime/model-credentials/resolve", {"jobId": "j", "attemptNo": 0}),
        ("/internal/runtime/jobs/job-1/result", {"output": {}}),
    ],
)
async def test_attempt_no_must_be_positive(
    client: httpx.AsyncClient, backends: Backends, path: str, body: dict[str, object]
) -> None:
    resp = await client.post(path, json=body, headers=H)
    assert resp.status_code == 400
    assert resp.json()["details"]["fields"][0]["field"] == "attemptNo"
    assert not backends.job.calls and not backends.credential.calls


@pytest.mark.parametrize(
    "instance", ["ínst-a".encode(), "ínst-a".encode("latin-1"), b"inst\x01a", b"x" * 129]
)
async def test_an_instance_id_grpc_cannot_carry_is_400(
    client: httpx.AsyncClient, backends: Backends, instance: bytes
) -> None:
    """The header travels on as gRPC metadata (printable ASCII only): anything else
    is refused here, not a 500 from the channel."""
    headers = [
        ("x-internal-api-key", SERVICE_TOKEN),
        ("x-runtime-instance-id", instance),
    ]
    resp = await client.post(
        "/internal/runtime/jobs/job-1/heartbeat",
        json={"attemptNo": 1},
        headers=httpx.Headers(headers),
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_ARGUMENT"
    fields = resp.json()["details"]["fields"]
    assert [(f["field"], f["in"]) for f in fields] == [("X-Runtime-Instance-Id", "header")]
    assert not backends.job.calls
