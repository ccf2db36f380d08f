"""Hostile bodies for every POST/PUT route of the gateway, against the real backends.

For each route a valid body is mutated one way at a time: an oversized body
(by ``Content-Length`` and streamed without one), JSON nested past the depth
limit, invalid UTF-8, NUL characters, every field in turn given the wrong JSON
type / an empty string / a negative or huge number / an unknown enum value /
a 10,000-character id, and an extra unknown field. Each must get a clear 4xx
whose body is exactly ``{"code","message","details"}`` with a reference §4 code of
that HTTP status — and nothing in either database may change (every row of
both is digested before and after).

Routes with a job id in the path use an id that does not exist, so even a
body the gateway let through could not change a job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from airuntime_common.errors import ErrorCode, http_status
from tests.hostile.conftest import USER, Stack

MAX_BODY = 2 * 1024 * 1024
LONG_ID = "i" * 10_000
MISSING_JOB = "no-such-job-hostile"
SPEC_CODES = {c.value for c in ErrorCode} - {ErrorCode.INTERNAL, ErrorCode.UNAVAILABLE}
#: Values of closed enumerations per field name (an unknown one must be a 400).
ENUM_FIELDS = {
    "jobType",
    "targetType",
    "apiKeyMode",
    "type",
    "provider",
    "outcome",
    "capabilities",
}


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    area: str  # user | admin | runtime
    body: Callable[[Stack], dict[str, Any]]

    @property
    def name(self) -> str:
        return f"{self.method} {self.path}"


ROUTES = [
    Route("POST", "/v1/materials", "user", lambda s: {"title": "t", "content": "Some text."}),
    Route(
        "POST",
        "/v1/knowledge-points",
        "user",
        lambda s: {
            "materialId": s.seed.material_id,
            "name": "kp",
            "blockIds": [s.seed.block_ids[0]],
        },
    ),
    Route(
        "POST",
        "/v1/learning-events",
        "user",
        lambda s: {
            "events": [
                {
                    "eventId": "hostile-e1",
                    "type": "reading",
                    "materialId": s.seed.material_id,
                    "blockId": s.seed.block_ids[0],
                    "dwellSeconds": 12.5,
                    "occurredAt": "2026-11-30T10:00:00Z",
                }
            ]
        },
    ),
    Route(
        "POST",
        "/v1/ai/jobs",
        "user",
        lambda s: {
            "jobType": "quiz_generation",
            "targetType": "material",
            "targetId": s.seed.material_id,
            "params": {"count": 3, "difficulty": "easy", "questionTypes": ["true_false"]},
            "apiKeyMode": "platform_key",
        },
    ),
    Route(
        "PUT",
        "/v1/me/model-credential",
        "user",
        lambda s: {"provider": "deepseek", "apiKey": "sk-hostile-0123456789"},
    ),
    Route("PUT", "/v1/me/ai-authorization", "user", lambda s: {"granted": True}),
    Route(
        "POST",
        "/admin/ai/jobs",
        "admin",
        lambda s: {
            "jobType": "weak_point_analysis",
            "targetType": "user",
            "userId": USER,
            "priority": 5,
            "maxRetryCount": 2,
            "timeoutSeconds": 60,
        },
    ),
    Route(
        "POST", f"/admin/ai/jobs/{MISSING_JOB}/rerun", "admin", lambda s: {"rebuildSnapshot": True}
    ),
    Route(
        "POST",
        "/internal/runtime/jobs/poll",
        "runtime",
        lambda s: {"capabilities": ["quiz_generation"], "limit": 1, "waitMs": 0},
    ),
    Route(
        "POST",
        "/internal/runtime/jobs/claim",
        "runtime",
        lambda s: {"capabilities": ["flashcard_generation"], "limit": 1, "waitMs": 0},
    ),
    Route(
        "POST", f"/internal/runtime/jobs/{MISSING_JOB}/start", "runtime", lambda s: {"attemptNo": 1}
    ),
    Route(
        "POST",
        f"/internal/runtime/jobs/{MISSING_JOB}/heartbeat",
        "runtime",
        lambda s: {"attemptNo": 1},
    ),
    Route(
        "POST",
        "/internal/runtime/leases/heartbeat",
        "runtime",
        lambda s: {"leases": [{"jobId": MISSING_JOB, "attemptNo": 1}]},
    ),
    Route(
        "POST",
        "/internal/runtime/model-credentials/resolve",
        "runtime",
        lambda s: {"jobId": MISSING_JOB, "attemptNo": 1},
    ),
    Route(
        "POST",
        f"/internal/runtime/jobs/{MISSING_JOB}/result",
        "runtime",
        lambda s: {
            "attemptNo": 1,
            "promptVersion": "quiz_generation.v1",
            "outputSchemaVersion": "v1",
            "output": {"items": []},
        },
    ),
    Route(
        "POST",
        f"/internal/runtime/jobs/{MISSING_JOB}/fail",
        "runtime",
        lambda s: {
            "attemptNo": 1,
            "errorCode": "MODEL_TIMEOUT",
            "errorMessage": "slow",
            "retryAfterSeconds": 3,
        },
    ),
    Route(
        "POST",
        "/internal/runtime/invocation-logs",
        "runtime",
        lambda s: {
            "jobId": MISSING_JOB,
            "attemptNo": 1,
            "modelProvider": "deepseek",
            "modelName": "deepseek-chat",
            "apiKeyMode": "platform_key",
            "promptTokens": 1,
            "completionTokens": 1,
            "cacheHitTokens": 0,
            "latencyMs": 5,
            "outcome": "succeeded",
        },
    ),
]
ROUTE_IDS = [r.name for r in ROUTES]


def _headers(stack: Stack, route: Route) -> dict[str, str]:
    if route.area == "admin":
        return stack.admin_headers()
    if route.area == "runtime":
        return stack.runtime_headers()
    return stack.user_headers()


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, scalar) of a JSON value; a list is entered through its first item."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k in ("params", "output"):  # free-form JSON; checked by the routes' own rules
                continue
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list) and value:
        yield from _leaves(value[0], (*path, 0))
    else:
        yield path, value


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], tuple(rest), new)}
    copy = list(value)
    copy[head] = _replace(copy[head], tuple(rest), new)
    return copy


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "true"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return 12345
    return {"unexpected": "object"}


#: Text fields where an empty string is a legitimate value.
EMPTY_OK = {"errorMessage", "promptVersion"}


def _is_id(label: str) -> bool:
    return label.endswith(("Id", "Ids"))


def field_mutations(body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(name, body) with one field of ``body`` made hostile at a time (each one invalid)."""
    for path, value in _leaves(body):
        label = ".".join(str(p) for p in path)
        field = next(str(p) for p in reversed(path) if isinstance(p, str))
        yield f"wrong_type:{label}", _replace(body, path, _wrong_type(value))
        yield f"nested_wrong_type:{label}", _replace(body, path, [value, [value]])
        if isinstance(value, str):
            if field not in EMPTY_OK:
                yield f"empty_string:{label}", _replace(body, path, "")
            if _is_id(field):
                yield f"long_id:{label}", _replace(body, path, LONG_ID)
            if field in ENUM_FIELDS:
                yield f"unknown_enum:{label}", _replace(body, path, "not_a_known_value")
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield f"negative:{label}", _replace(body, path, -1)
            yield f"huge:{label}", _replace(body, path, 10**30)
            if isinstance(value, int):
                yield f"fraction:{label}", _replace(body, path, 1.5)
    yield "extra_field", {**body, "unexpectedField": 1}
    yield "top_level_array", [body]


def assert_clean_refusal(
    resp: httpx.Response, what: str, *, allowed: set[int] | None = None
) -> None:
    """A 4xx with exactly ``{"code","message","details"}`` and a reference §4 code of that status."""
    allowed = allowed or {400, 404, 409, 413, 422}
    assert resp.status_code in allowed, f"{what}: {resp.status_code} {resp.text[:300]}"
    body = resp.json()
    assert set(body) == {"code", "message", "details"}, f"{what}: {body}"
    assert body["code"] in SPEC_CODES, f"{what}: {body}"
    assert http_status(body["code"]) == resp.status_code, f"{what}: {body}"
    assert isinstance(body["message"], str) and body["message"], f"{what}: {body}"
    assert isinstance(body["details"], dict), f"{what}: {body}"


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, timeout=30) as client:
        yield client


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_every_field_made_hostile_is_refused_and_changes_nothing(
    stack: Stack, http: httpx.Client, route: Route
) -> None:
    headers = _headers(stack, route)
    body = route.body(stack)
    failures = []
    before = stack.fingerprint()
    for name, mutated in field_mutations(body):
        resp = http.request(route.method, route.path, json=mutated, headers=headers)
        if (
            route.path.endswith("/leases/heartbeat")
            and name.startswith("long_id")
            and resp.status_code == 200
        ):
            # an unknown lease is answered in place, not refused (reference §3)
            assert [lease["held"] for lease in resp.json()["leases"]] == [False]
            continue
        try:
            assert_clean_refusal(resp, name)
            if name.startswith(("wrong_type", "negative", "huge", "unknown_enum", "extra")):
                # refused by the gateway's validation, not by a later lookup
                assert resp.status_code in (400, 413), (
                    f"{name}: {resp.status_code} {resp.text[:200]}"
                )
        except AssertionError as exc:
            failures.append(str(exc))
    after = stack.fingerprint()
    assert not failures, f"{route.name}:\n  " + "\n  ".join(failures)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, f"{route.name}: hostile bodies changed {sorted(changed)}"


RAW_BODIES: dict[str, tuple[bytes, int, str]] = {
    "oversized": (b'{"title": "' + b"x" * (MAX_BODY + 16) + b'"}', 413, "PAYLOAD_TOO_LARGE"),
    "deep_json": (b"[" * 5000 + b"]" * 5000, 400, "INVALID_ARGUMENT"),
    "deep_object": (b'{"a":' * 200 + b"1" + b"}" * 200, 400, "INVALID_ARGUMENT"),
    "invalid_utf8": (b'{"title": "\xff\xfe\xfd", "content": "x"}', 400, "INVALID_ARGUMENT"),
    "nul_escape": (
        b'{"title": "a\\u0000b", "content": "x", "name": "a\\u0000"}',
        400,
        "INVALID_ARGUMENT",
    ),
    "lone_surrogate": (b'{"title": "\\ud800", "content": "\\udfff"}', 400, "INVALID_ARGUMENT"),
    "not_json": (b"title=x&content=y", 400, "INVALID_ARGUMENT"),
    "truncated": (b'{"title": "x", "content": ', 400, "INVALID_ARGUMENT"),
    "empty": (b"", 400, "INVALID_ARGUMENT"),
    "huge_number": (b'{"granted": 1' + b"0" * 5000 + b"}", 400, "INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("route", ROUTES, ids=ROUTE_IDS)
def test_raw_hostile_bodies_are_refused_and_change_nothing(
    stack: Stack, http: httpx.Client, route: Route
) -> None:
    headers = {**_headers(stack, route), "Content-Type": "application/json"}
    before = stack.fingerprint()
    failures = []
    for name, (raw, status, code) in RAW_BODIES.items():
        if name == "empty" and "rerun" in route.path:
            continue  # the rerun body is optional: an empty one means the defaults
        resp = http.request(route.method, route.path, content=raw, headers=headers)
        try:
            assert_clean_refusal(resp, name)
            assert (resp.status_code, resp.json()["code"]) == (status, code), (
                f"{name}: {resp.status_code} {resp.text[:200]}"
            )
        except AssertionError as exc:
            failures.append(str(exc))
    after = stack.fingerprint()
    assert not failures, f"{route.name}:\n  " + "\n  ".join(failures)
    assert after == before


def test_oversized_body_streamed_without_content_length_is_413(
    stack: Stack, http: httpx.Client
) -> None:
    before = stack.fingerprint()

    def chunks() -> Iterator[bytes]:
        yield b'{"title": "big", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}'

    resp = http.post(
        "/v1/materials",
        content=chunks(),
        headers={**stack.user_headers(), "Content-Type": "application/json"},
    )
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    assert_clean_refusal(resp, "streamed", allowed={413})
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert stack.fingerprint() == before


def test_material_content_over_one_mib_is_413(stack: Stack, http: httpx.Client) -> None:
    before = stack.fingerprint()
    resp = http.post(
        "/v1/materials",
        json={"title": "big", "content": "z" * (1024 * 1024 + 1)},
        headers=stack.user_headers(),
    )
    assert_clean_refusal(resp, "content > 1 MiB", allowed={413})
    assert stack.fingerprint() == before


@pytest.mark.parametrize(
    ("method", "path", "area"),
    [
        ("GET", "/v1/ai/jobs/{id}", "user"),
        ("POST", "/v1/ai/jobs/{id}/cancel", "user"),
        ("GET", "/v1/ai/jobs/{id}/result", "user"),
        ("GET", "/v1/materials/{id}", "user"),
        ("GET", "/admin/ai/jobs/{id}", "admin"),
        ("POST", "/admin/ai/jobs/{id}/cancel", "admin"),
        ("POST", "/internal/runtime/jobs/{id}/lock", "runtime"),
        ("GET", "/internal/runtime/jobs/{id}/snapshot?attemptNo=1", "runtime"),
    ],
)
@pytest.mark.parametrize("job_id", ["x" * 10_000, "%00nul", "..%2F..%2Fetc", "é𝄞"])
def test_hostile_path_ids_are_a_clean_4xx(
    stack: Stack, http: httpx.Client, method: str, path: str, area: str, job_id: str
) -> None:
    hdrs = _headers(stack, Route(method, path, area, lambda s: {}))
    before = stack.fingerprint()
    resp = http.request(method, path.replace("{id}", job_id), headers=hdrs)
    # reference §3: an unknown id is 404, never 400, whatever its length or bytes.
    assert_clean_refusal(resp, f"{method} {path} id={job_id[:20]}", allowed={404, 414})
    assert stack.fingerprint() == before
