"""The prompt registry's admin REST and learners' feedback (reference §10.4) over the
gateway, against a fake job_service: bodies, status codes, the error mapping and the
OpenAPI document."""

from __future__ import annotations

import httpx
import pytest

from airuntime_common.errors import AppError, ErrorCode
from airuntime_common.timeutil import to_timestamp
from zhixi.airuntime.common.v1 import message_pb2 as common_pb2
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

from .conftest import ADMIN, OWNER, T0, Backends, bearer, make_token

A = bearer(make_token(ADMIN, "admin", exp_in=86400))
U = bearer(make_token(OWNER, "user", exp_in=86400))
BASE = "/admin/ai/prompts/quiz_generation"
TEMPLATE = "{% block system %}json{% endblock %}{% block user %}{{ snapshot_json }}{% endblock %}"


def _version(created: bool = True) -> rr.PutPromptVersionResponse:
    return rr.PutPromptVersionResponse(
        version=msg.PromptVersion(
            version="v2", template=TEMPLATE, description="kinder", created_at=to_timestamp(T0)
        ),
        created=created,
    )


def _routing() -> msg.PromptRouting:
    return msg.PromptRouting(
        variants=[msg.PromptVariant(version="v1", weight=50), msg.PromptVariant(version="v2", weight=50)],
        guard=msg.PromptGuard(max_invalid_schema_increase=0.1, min_attempts=50),
        started_at=to_timestamp(T0),
    )  # fmt: skip


async def test_an_upload_is_201_then_200_for_the_same_template(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["PutPromptVersion"] = _version(True)
    body = {"version": "v2", "template": TEMPLATE, "description": "kinder"}
    first = await client.post(f"{BASE}/versions", json=body, headers=A)
    assert first.status_code == 201
    assert first.json() == {
        "version": "v2",
        "template": TEMPLATE,
        "description": "kinder",
        "createdAt": "2026-11-30T12:00:00.123Z",
        "builtin": False,
    }
    sent = backends.job.last("PutPromptVersion").request
    assert (sent.job_type, sent.version, sent.template, sent.description, sent.actor) == (
        common_pb2.JOB_TYPE_QUIZ_GENERATION, "v2", TEMPLATE, "kinder", "admin:admin1",
    )  # fmt: skip
    backends.job.responses["PutPromptVersion"] = _version(False)
    again = await client.post(f"{BASE}/versions", json=body, headers=A)
    assert again.status_code == 200 and again.json()["version"] == "v2"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.PROMPT_VERSION_EXISTS, 409),
        (ErrorCode.INVALID_PROMPT_TEMPLATE, 422),
        (ErrorCode.INVALID_ARGUMENT, 400),
    ],
)
async def test_registry_refusals_keep_their_code(
    client: httpx.AsyncClient, backends: Backends, code: str, status: int
) -> None:
    backends.job.errors["PutPromptVersion"] = AppError(
        code, "line 3: 'x' is undefined", {"line": 3}
    )
    resp = await client.post(f"{BASE}/versions", json={"version": "v2", "template": "t"}, headers=A)
    assert resp.status_code == status
    assert resp.json() == {
        "code": code,
        "message": "line 3: 'x' is undefined",
        "details": {"line": 3},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"version": "v 2", "template": "t"},
        {"version": "", "template": "t"},
        {"version": "v" * 65, "template": "t"},
        {"version": "v2\n", "template": "t"},
        {"version": "v2"},
        {"version": "v2", "template": ""},
        {"version": "v2", "template": "t", "description": "d" * 1001},
        {"version": "v2", "template": "t", "extra": 1},
        {"version": 2, "template": "t"},
    ],
)
async def test_a_bad_upload_is_400_and_reaches_no_backend(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, object]
) -> None:
    resp = await client.post(f"{BASE}/versions", json=body, headers=A)
    assert resp.status_code == 400 and resp.json()["code"] == "INVALID_ARGUMENT"
    assert not [c for c in backends.job.calls if c.method == "PutPromptVersion"]


async def test_an_unknown_job_type_is_400_and_a_user_token_403(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    assert (await client.get("/admin/ai/prompts/no_such_type", headers=A)).status_code == 400
    for method, path in (("GET", BASE), ("GET", f"{BASE}/versions/v1"),
                         ("POST", f"{BASE}/versions"), ("PUT", f"{BASE}/routing")):  # fmt: skip
        resp = await client.request(method, path, json={}, headers=U)
        assert resp.status_code == 403 and resp.json()["code"] == "PERMISSION_DENIED"


async def test_a_version_reads_whole_and_an_unknown_one_is_404(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["GetPromptVersion"] = rr.GetPromptVersionResponse(
        version=msg.PromptVersion(version="v1", template=TEMPLATE, description="The shipped template.", builtin=True)
    )  # fmt: skip
    resp = await client.get(f"{BASE}/versions/v1", headers=A)
    assert resp.status_code == 200
    assert resp.json() == {
        "version": "v1",
        "template": TEMPLATE,
        "description": "The shipped template.",
        "createdAt": None,
        "builtin": True,
    }
    backends.job.errors["GetPromptVersion"] = AppError(ErrorCode.NOT_FOUND, "no such version")
    assert (await client.get(f"{BASE}/versions/v9", headers=A)).status_code == 404
    assert (await client.get(f"{BASE}/versions/v%209", headers=A)).status_code == 400


async def test_a_routing_is_forwarded_with_its_guard(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["PutPromptRouting"] = rr.PutPromptRoutingResponse(routing=_routing())
    body = {
        "variants": [{"version": "v1", "weight": 50}, {"version": "v2", "weight": 50.0}],
        "guard": {"minAttempts": 20},
    }
    resp = await client.put(f"{BASE}/routing", json=body, headers=A)
    assert resp.status_code == 200
    assert resp.json() == {
        "variants": [{"version": "v1", "weight": 50.0}, {"version": "v2", "weight": 50.0}],
        "guard": {"maxInvalidSchemaIncrease": 0.1, "minAttempts": 50},
        "rolledBackAt": None,
        "rollbackReason": None,
        "startedAt": "2026-11-30T12:00:00.123Z",
    }
    sent = backends.job.last("PutPromptRouting").request
    assert [(v.version, v.weight) for v in sent.variants] == [("v1", 50.0), ("v2", 50.0)]
    assert sent.min_attempts == 20 and not sent.HasField("max_invalid_schema_increase")


@pytest.mark.parametrize(
    "body",
    [
        {"variants": []},
        {"variants": [{"version": "v1", "weight": -1}]},
        {"variants": [{"version": "v1"}]},
        {"variants": [{"version": "v1", "weight": "1"}]},
        {"variants": [{"version": "v1", "weight": 1}], "guard": {"maxInvalidSchemaIncrease": 2}},
        {"variants": [{"version": "v1", "weight": 1}], "guard": {"minAttempts": 0}},
        {"variants": [{"version": "v1", "weight": 1}]} | {"extra": True},
    ],
)
async def test_a_bad_routing_is_400(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, object]
) -> None:
    resp = await client.put(f"{BASE}/routing", json=body, headers=A)
    assert resp.status_code == 400, resp.text
    assert not [c for c in backends.job.calls if c.method == "PutPromptRouting"]


async def test_the_overview_has_every_field(client: httpx.AsyncClient, backends: Backends) -> None:
    rolled = _routing()
    rolled.rolled_back_at.CopyFrom(to_timestamp(T0))
    rolled.rollback_reason = "v2: invalidSchemaRate 80.0% …"
    stats = [
        msg.PromptVersionStats(version="v1", attempts=10, succeeded=9, invalid_schema_rate=0.1,
                               mean_prompt_tokens=900.5, mean_completion_tokens=120,
                               p50_latency_ms=800, p95_latency_ms=1500,
                               cost_per_succeeded_usd=0.0004, feedback_positive=3,
                               feedback_negative=1),
        msg.PromptVersionStats(version="v2"),
    ]  # fmt: skip
    backends.job.responses["GetPrompts"] = rr.GetPromptsResponse(
        versions=[msg.PromptVersion(version="v1", builtin=True, description="The shipped template."),
                  msg.PromptVersion(version="v2", description="kinder", created_at=to_timestamp(T0))],
        routing=rolled, stats=stats,
    )  # fmt: skip
    resp = await client.get(BASE, params={"hours": 6}, headers=A)
    assert resp.status_code == 200
    got = resp.json()
    assert backends.job.last("GetPrompts").request.hours == 6
    assert got["jobType"] == "quiz_generation" and got["hours"] == 6
    assert got["versions"][1] == {"version": "v2", "description": "kinder",
                                  "createdAt": "2026-11-30T12:00:00.123Z", "builtin": False}  # fmt: skip
    assert got["routing"]["rolledBackAt"] == "2026-11-30T12:00:00.123Z"
    assert got["routing"]["rollbackReason"].startswith("v2:")
    assert got["stats"][0] == {
        "version": "v1", "attempts": 10, "succeeded": 9, "invalidSchemaRate": 0.1,
        "meanPromptTokens": 900.5, "meanCompletionTokens": 120.0, "p50LatencyMs": 800,
        "p95LatencyMs": 1500, "costPerSucceededUsd": 0.0004,
        "feedback": {"positive": 3, "negative": 1},
    }  # fmt: skip
    assert got["stats"][1]["invalidSchemaRate"] is None and got["stats"][1]["p50LatencyMs"] is None
    for hours in (0, 721, "x"):
        assert (await client.get(BASE, params={"hours": hours}, headers=A)).status_code == 400


async def test_a_type_with_no_routing_shows_v1_alone(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["GetPrompts"] = rr.GetPromptsResponse(
        versions=[msg.PromptVersion(version="v1", builtin=True)], stats=[msg.PromptVersionStats(version="v1")]
    )  # fmt: skip
    got = (await client.get(BASE, headers=A)).json()
    assert backends.job.last("GetPrompts").request.hours == 24
    assert got["routing"]["variants"] == [{"version": "v1", "weight": 1.0}]
    assert got["routing"]["guard"] == {"maxInvalidSchemaIncrease": 0.1, "minAttempts": 50}


async def test_feedback_is_204_for_the_callers_item(
    client: httpx.AsyncClient, backends: Backends
) -> None:
    backends.job.responses["SetResultFeedback"] = rr.SetResultFeedbackResponse()
    resp = await client.post(
        "/v1/ai/results/weak-points/item-1/feedback", json={"rating": -1}, headers=U
    )
    assert resp.status_code == 204 and resp.content == b""
    sent = backends.job.last("SetResultFeedback").request
    assert (sent.user_id, sent.kind, sent.item_id, sent.rating) == (
        OWNER, rr.RESULT_KIND_WEAK_POINTS, "item-1", -1,
    )  # fmt: skip
    backends.job.errors["SetResultFeedback"] = AppError(ErrorCode.NOT_FOUND, "item not found")
    other = await client.post("/v1/ai/results/questions/x/feedback", json={"rating": 1}, headers=U)
    assert other.status_code == 404 and other.json()["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    "body", [{"rating": 0}, {"rating": 2}, {"rating": "1"}, {"rating": True}, {"rating": 1.0}, {}]
)
async def test_a_bad_rating_is_400(
    client: httpx.AsyncClient, backends: Backends, body: dict[str, object]
) -> None:
    resp = await client.post("/v1/ai/results/questions/x/feedback", json=body, headers=U)
    assert resp.status_code == 400
    assert not [c for c in backends.job.calls if c.method == "SetResultFeedback"]


async def test_the_openapi_document_has_the_prompt_routes(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths["/admin/ai/prompts/{jobType}/versions"]) == {"post"}
    assert set(paths["/admin/ai/prompts/{jobType}/versions/{version}"]) == {"get"}
    assert set(paths["/admin/ai/prompts/{jobType}/routing"]) == {"put"}
    assert set(paths["/admin/ai/prompts/{jobType}"]) == {"get"}
    assert set(paths["/v1/ai/results/{kind}/{itemId}/feedback"]) == {"post"}
    post = paths["/admin/ai/prompts/{jobType}/versions"]["post"]
    assert {"200", "201", "409", "422"} <= set(post["responses"])
