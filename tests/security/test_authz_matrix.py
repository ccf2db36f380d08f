"""Authorization matrix on the REAL system: every gateway route × every kind of caller (reference §3, §3.1, §4).

Callers: no token, expired, wrong signature, ``alg=none``, another algorithm
(HS512, RS256), user A (owner of everything below), user B, admin, and the
service token (as a bearer and as ``x-internal-api-key``). Each answer's status
(and code) is exact; user B and the bad tokens change nothing of A's (A's
material, jobs, results, key view and AI setting are compared before/after).

Jobs of ``next_action_planning`` are never run by the system's worker (see
conftest), so their state only changes by what these tests do.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.security.conftest import (
    PARKED_TYPE,
    System,
    alg_none_token,
    expired_token,
    other_alg_token,
    random_canary,
    user_id,
    wrong_signature_token,
)

pytestmark = pytest.mark.e2e
package_loop = pytest.mark.asyncio(loop_scope="package")

CONTENT = "# Cells\n\nCells are the unit of life.\n\n## Membranes\n\nLipid bilayers bound cells.\n"


@dataclass
class World:
    """User A's objects, made once."""

    a: str
    b: str
    admin: str
    material: str
    blocks: list[str]
    kp: str
    event_id: str
    pending: str  # a parked job, never run
    done: str  # succeeded through the shim
    failed: str  # failed through the shim (rerun source)
    item: str = ""  # the done job's one recommendation (its itemId)


async def _ok(resp: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert resp.status_code == status, (resp.request.method, resp.request.url, resp.text)
    body: dict[str, Any] = resp.json() if resp.content else {}
    return body


async def new_parked_job(sys_: System, c: httpx.AsyncClient, owner: str) -> str:
    """A fresh pending job of A's that no worker takes."""
    body = await _ok(
        await c.post(
            "/v1/ai/jobs",
            json={"jobType": PARKED_TYPE, "targetType": "user", "targetId": owner},
            headers=sys_.bearer(owner),
        ),
        201,
    )
    return str(body["jobId"])


async def _lock(sys_: System, c: httpx.AsyncClient, job_id: str, instance: str) -> int:
    body = await _ok(
        await c.post(
            f"/internal/runtime/jobs/{job_id}/lock", json={}, headers=sys_.runtime_headers(instance)
        )
    )
    assert body["status"] == "locked" and body["lockedBy"] == instance
    return int(body["attemptNo"])


def _output(w: World) -> dict[str, Any]:
    return {
        "items": [
            {
                "actionType": "read",
                "targetType": "material",
                "targetId": w.material,
                "reason": "start with the membranes section",
                "priority": 0,
            }
        ]
    }


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def world(system: System) -> World:
    a, b, admin = user_id("alice"), user_id("bob"), user_id("admin")
    async with system.client() as c:
        ha = system.bearer(a)
        mat = await _ok(
            await c.post("/v1/materials", json={"title": "Cells", "content": CONTENT}, headers=ha),
            201,
        )
        blocks = [blk["blockId"] for blk in mat["blocks"]]
        kp = await _ok(
            await c.post(
                "/v1/knowledge-points",
                json={"materialId": mat["materialId"], "name": "membranes", "blockIds": blocks[:1]},
                headers=ha,
            ),
            201,
        )
        event_id = f"ev-{uuid.uuid4().hex[:8]}"
        await _ok(
            await c.post(
                "/v1/learning-events",
                json={
                    "events": [
                        {
                            "eventId": event_id,
                            "type": "reading",
                            "blockId": blocks[0],
                            "dwellSeconds": 9,
                        }
                    ]
                },
                headers=ha,
            ),
            202,
        )
        key = system.add_canary(random_canary("sk-matrix-"))
        await _ok(await c.put("/v1/me/model-credential", json={"apiKey": key}, headers=ha))
        pending = await new_parked_job(system, c, a)
        w = World(
            a,
            b,
            admin,
            mat["materialId"],
            blocks,
            kp["knowledgePointId"],
            event_id,
            pending,
            "",
            "",
        )
        w.done = await new_parked_job(system, c, a)
        attempt = await _lock(system, c, w.done, "matrix-setup")
        await _ok(
            await c.post(
                f"/internal/runtime/jobs/{w.done}/result",
                json={
                    "attemptNo": attempt,
                    "promptVersion": f"{PARKED_TYPE}.v1",
                    "outputSchemaVersion": "v1",
                    "output": _output(w),
                },
                headers=system.runtime_headers("matrix-setup"),
            )
        )
        result = await _ok(await c.get(f"/v1/ai/jobs/{w.done}/result", headers=ha))
        w.item = str(result["items"][0]["itemId"])
        w.failed = await new_parked_job(system, c, a)
        attempt = await _lock(system, c, w.failed, "matrix-setup")
        failed = await _ok(
            await c.post(
                f"/internal/runtime/jobs/{w.failed}/fail",
                json={
                    "attemptNo": attempt,
                    "errorCode": "MODEL_BAD_REQUEST",
                    "errorMessage": "bad",
                },
                headers=system.runtime_headers("matrix-setup"),
            )
        )
        assert failed["status"] == "failed"
    return w


# ------------------------------------------------------------------ callers

#: kind → headers factory (``None`` user: the kind carries no valid identity)
KINDS = [
    "no-token",
    "expired",
    "wrong-signature",
    "alg-none",
    "hs512",
    "rs256",
    "service-bearer",
    "service-key",
    "user-b",
    "admin",
    "user-a",
]
ANON = frozenset(KINDS) - {"user-a", "user-b", "admin"}


def headers_for(sys_: System, w: World, kind: str) -> dict[str, str]:
    """The request headers of one kind of caller."""
    tokens: dict[str, Callable[[], str]] = {
        "expired": lambda: expired_token(sys_, w.a, "admin"),
        "wrong-signature": lambda: wrong_signature_token(w.a, "admin"),
        "alg-none": lambda: alg_none_token(w.a, "admin"),
        "hs512": lambda: other_alg_token(sys_, "HS512", w.a, "admin"),
        "rs256": lambda: other_alg_token(sys_, "RS256", w.a, "admin"),
        "service-bearer": lambda: sys_.service_token,
        "user-a": lambda: sys_.token(w.a),
        "user-b": lambda: sys_.token(w.b),
        "admin": lambda: sys_.token(w.admin, "admin"),
    }
    if kind == "no-token":
        return {}
    if kind == "service-key":
        return sys_.runtime_headers("matrix-intruder")
    return {"Authorization": f"Bearer {tokens[kind]()}"}


# ------------------------------------------------------------------ routes

FRESH = "{fresh}"  # replaced by a fresh pending job of A's, per request


@dataclass
class Route:
    """One request and its expected (status, code) per caller class."""

    method: str
    path: str
    body: Any
    owner: tuple[int, str | None]  # user A
    other: tuple[int, str | None]  # user B, and admin on /v1 (acting as itself)
    admin: tuple[int, str | None] | None = None  # /admin routes only


NF = (404, "NOT_FOUND")
JNF = (404, "JOB_NOT_FOUND")


def v1_routes(w: World) -> list[Route]:
    ev = {
        "eventId": f"ev-{uuid.uuid4().hex[:8]}",
        "type": "reading",
        "materialId": w.material,
        "blockId": w.blocks[0],
        "dwellSeconds": 4,
    }
    return [
        Route(
            "POST", "/v1/materials", {"title": "t", "content": "hello"}, (201, None), (201, None)
        ),
        Route("GET", f"/v1/materials/{w.material}", None, (200, None), NF),
        Route(
            "POST",
            "/v1/knowledge-points",
            {"materialId": w.material, "name": "k2", "blockIds": w.blocks[:1]},
            (201, None),
            NF,
        ),
        # a foreign id inside an event batch is refused like an unknown one: 404 naming
        # the event's field (reference §3, any unknown id → 404)
        Route("POST", "/v1/learning-events", {"events": [ev]}, (202, None), NF),
        Route(
            "POST",
            "/v1/ai/jobs",
            {"jobType": PARKED_TYPE, "targetType": "material", "targetId": w.material},
            (201, None),
            NF,
        ),
        Route("GET", "/v1/ai/jobs", None, (200, None), (200, None)),
        Route("GET", f"/v1/ai/jobs/{w.pending}", None, (200, None), JNF),
        Route("POST", f"/v1/ai/jobs/{FRESH}/cancel", None, (200, None), JNF),
        Route("GET", f"/v1/ai/jobs/{w.done}/result", None, (200, None), JNF),
        Route("GET", f"/v1/ai/jobs/{w.failed}/result", None, (409, "INVALID_JOB_STATE"), JNF),
        Route("GET", "/v1/ai/results/recommendations", None, (200, None), (200, None)),
        Route(
            "POST",
            f"/v1/ai/results/recommendations/{w.item}/feedback",
            {"rating": 1},
            (204, None),
            NF,
        ),
        Route("PUT", "/v1/me/model-credential", {"apiKey": "<canary>"}, (200, None), (200, None)),
        Route("GET", "/v1/me/model-credential", None, (200, None), (200, None)),
        Route("DELETE", "/v1/me/model-credential", None, (204, None), (204, None)),
        Route("GET", "/v1/me/model-credential", None, NF, NF),
        Route("GET", "/v1/me/ai-authorization", None, (200, None), (200, None)),
        Route("PUT", "/v1/me/ai-authorization", {"granted": True}, (200, None), (200, None)),
        Route("POST", "/v1/me/ai-authorization/revoke", None, (200, None), (200, None)),
        Route("PUT", "/v1/me/ai-authorization", {"granted": True}, (200, None), (200, None)),
    ]


def admin_routes(w: World) -> list[Route]:
    deny = (403, "PERMISSION_DENIED")
    return [
        Route(
            "POST",
            "/admin/ai/jobs",
            {
                "userId": w.a,
                "jobType": PARKED_TYPE,
                "targetType": "user",
                "targetId": w.a,
                "priority": 1,
                "maxRetryCount": 2,
                "timeoutSeconds": 60,
            },
            deny,
            deny,
            (201, None),
        ),
        Route("GET", f"/admin/ai/jobs?userId={w.a}", None, deny, deny, (200, None)),
        Route("GET", f"/admin/ai/jobs/{w.done}", None, deny, deny, (200, None)),
        Route("GET", "/admin/ai/jobs/no-such-job", None, deny, deny, JNF),
        Route(
            "POST",
            f"/admin/ai/jobs/{w.failed}/rerun",
            {"rebuildSnapshot": False},
            deny,
            deny,
            (201, None),
        ),
        Route("POST", f"/admin/ai/jobs/{w.done}/rerun", {}, deny, deny, (409, "INVALID_JOB_STATE")),
        Route("POST", f"/admin/ai/jobs/{FRESH}/cancel", None, deny, deny, (200, None)),
        Route(
            "GET",
            "/admin/ai/costs?from=2026-01-01&to=2026-12-31&groupBy=apiKeyMode",
            None,
            deny,
            deny,
            (200, None),
        ),
        Route("GET", "/admin/ai/circuit-breaker", None, deny, deny, (200, None)),
        Route("POST", "/admin/ai/circuit-breaker/reset", None, deny, deny, (200, None)),
        Route("GET", "/admin/ai/runtime", None, deny, deny, (200, None)),
        Route("GET", f"/admin/ai/prompts/{PARKED_TYPE}", None, deny, deny, (200, None)),
        Route("GET", f"/admin/ai/prompts/{PARKED_TYPE}/versions/v1", None, deny, deny, (200, None)),
        Route(
            "POST",
            f"/admin/ai/prompts/{PARKED_TYPE}/versions",
            {"version": "v1", "template": "x"},
            deny,
            deny,
            (409, "PROMPT_VERSION_EXISTS"),
        ),
        Route(
            "PUT",
            f"/admin/ai/prompts/{PARKED_TYPE}/routing",
            {"variants": [{"version": "v1", "weight": 1}]},
            deny,
            deny,
            (200, None),
        ),
    ]


def internal_routes(w: World) -> list[tuple[str, str, Any]]:
    j = f"/internal/runtime/jobs/{w.pending}"
    return [
        ("POST", "/internal/runtime/jobs/poll", {"capabilities": [PARKED_TYPE], "limit": 1}),
        ("POST", "/internal/runtime/jobs/claim", {"capabilities": [PARKED_TYPE], "limit": 1}),
        ("POST", f"{j}/lock", {}),
        ("POST", f"{j}/start", {"attemptNo": 1}),
        ("POST", f"{j}/heartbeat", {"attemptNo": 1}),
        (
            "POST",
            "/internal/runtime/leases/heartbeat",
            {"leases": [{"jobId": w.pending, "attemptNo": 1}]},
        ),
        ("GET", f"{j}/snapshot?attemptNo=1", None),
        (
            "POST",
            "/internal/runtime/model-credentials/resolve",
            {"jobId": w.pending, "attemptNo": 1},
        ),
        (
            "POST",
            f"{j}/result",
            {
                "attemptNo": 1,
                "promptVersion": "p",
                "outputSchemaVersion": "v1",
                "output": _output(w),
            },
        ),
        ("POST", f"{j}/fail", {"attemptNo": 1, "errorCode": "CANCELLED", "errorMessage": "x"}),
        ("POST", "/internal/runtime/invocation-logs", {"jobId": w.pending, "attemptNo": 1}),
        ("GET", "/internal/runtime/health", None),
    ]


OPEN = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/admin/console"),
    ("GET", "/openapi.json"),
]


async def snapshot_of_a(sys_: System, c: httpx.AsyncClient, w: World) -> dict[str, Any]:
    """Everything of A's a caller could have changed, as A sees it."""
    ha = sys_.bearer(w.a)
    out: dict[str, Any] = {}
    for path in (
        f"/v1/materials/{w.material}",
        "/v1/ai/jobs?pageSize=100",
        "/v1/ai/results/recommendations?pageSize=100",
        "/v1/me/model-credential",
        "/v1/me/ai-authorization",
        f"/v1/ai/jobs/{w.done}/result",
    ):
        resp = await c.get(path, headers=ha)
        out[path] = (resp.status_code, resp.json())
    return out


def _check(
    problems: list[str],
    kind: str,
    method: str,
    path: str,
    resp: httpx.Response,
    want: tuple[int, str | None],
) -> None:
    status, code = want
    got_code = None
    if resp.status_code >= 400:
        body = resp.json()
        got_code = body.get("code")
        if set(body) != {"code", "message", "details"}:
            problems.append(f"{kind} {method} {path}: error body {body}")
    if resp.status_code != status or (code is not None and got_code != code):
        problems.append(
            f"{kind} {method} {path}: want {want}, got {resp.status_code} {resp.text[:200]}"
        )


@package_loop
@pytest.mark.parametrize("kind", KINDS)
async def test_every_route_for_every_caller(system: System, world: World, kind: str) -> None:
    w = world
    problems: list[str] = []
    async with system.client() as c:
        before = await snapshot_of_a(system, c, w)
        headers = headers_for(system, w, kind)

        async def send(
            method: str, path: str, body: Any, hdrs: dict[str, str], fresh: bool = False
        ) -> httpx.Response:
            if FRESH in path:  # a new job only where the caller may act on it
                job = await new_parked_job(system, c, w.a) if fresh else w.pending
                path = path.replace(FRESH, job)
            if isinstance(body, dict) and body.get("apiKey") == "<canary>":
                body = {"apiKey": system.add_canary(random_canary("sk-matrix-"))}
            return await c.request(method, path, json=body, headers=hdrs)

        for r in v1_routes(w):
            want = (
                (401, "UNAUTHENTICATED")
                if kind in ANON
                else r.owner
                if kind == "user-a"
                else r.other
            )
            resp = await send(r.method, r.path, r.body, headers, fresh=kind == "user-a")
            _check(problems, kind, r.method, r.path, resp, want)
        for r in admin_routes(w):
            if kind in ANON:
                want = (401, "UNAUTHENTICATED")
            elif kind == "admin":
                assert r.admin is not None
                want = r.admin
            else:
                want = r.owner
            resp = await send(r.method, r.path, r.body, headers, fresh=kind == "admin")
            _check(problems, kind, r.method, r.path, resp, want)
        if kind != "service-key":  # the service token's own matrix is the lifecycle test below
            for method, path, body in internal_routes(w):
                hdrs = {**headers, "X-Runtime-Instance-Id": "matrix-intruder"}
                _check(
                    problems,
                    kind,
                    method,
                    path,
                    await send(method, path, body, hdrs),
                    (401, "UNAUTHENTICATED"),
                )
        for method, path in OPEN:
            resp = await c.request(method, path, headers=headers)
            if resp.status_code != 200:
                problems.append(f"{kind} {method} {path}: open route answered {resp.status_code}")

        if kind == "user-b" or kind in ANON:
            after = await snapshot_of_a(system, c, w)
            for key in before:
                if before[key] != after[key]:
                    problems.append(f"{kind} changed A's {key}: {before[key]} -> {after[key]}")
        if kind == "user-b":
            mine = (await c.get("/v1/ai/jobs?pageSize=100", headers=headers)).json()["jobs"]
            assert all(j["userId"] == w.b for j in mine)
            assert not {w.pending, w.done, w.failed} & {j["jobId"] for j in mine}
            recs = (await c.get("/v1/ai/results/recommendations", headers=headers)).json()
            assert recs["items"] == []
    assert not problems, "\n".join(problems)


@package_loop
async def test_service_token_drives_the_runtime_contract_and_nothing_else(
    system: System, world: World
) -> None:
    """The service token: every shim route with exact statuses along a real lease (reference §3)."""
    w = world
    inst = "matrix-runtime"
    h = system.runtime_headers(inst)
    async with system.client() as c:
        polled = await _ok(
            await c.post(
                "/internal/runtime/jobs/poll",
                json={"capabilities": [PARKED_TYPE], "limit": 50},
                headers=h,
            )
        )
        assert all(j["status"] == "pending" for j in polled["jobs"])
        claimed = await _ok(
            await c.post(
                "/internal/runtime/jobs/claim",
                json={"capabilities": [PARKED_TYPE], "limit": 1},
                headers=h,
            )
        )
        for job in claimed["jobs"]:  # give it straight back (retried at once)
            assert job["lockedBy"] == inst
            await _ok(
                await c.post(
                    f"/internal/runtime/jobs/{job['jobId']}/fail",
                    json={
                        "attemptNo": job["attemptNo"],
                        "errorCode": "WORKER_SHUTDOWN",
                        "errorMessage": "matrix",
                    },
                    headers=h,
                )
            )
        job_id = await new_parked_job(system, c, w.a)
        j = f"/internal/runtime/jobs/{job_id}"
        attempt = await _lock(system, c, job_id, inst)
        relock = await c.post(f"{j}/lock", json={}, headers=system.runtime_headers("other"))
        assert relock.status_code == 409 and relock.json()["code"] == "JOB_ALREADY_LOCKED"
        await _ok(await c.post(f"{j}/start", json={"attemptNo": attempt}, headers=h))
        hb = await c.post(f"{j}/heartbeat", json={"attemptNo": attempt}, headers=h)
        assert hb.status_code == 204 and hb.headers["X-Cancel-Requested"] == "false"
        leases = await _ok(
            await c.post(
                "/internal/runtime/leases/heartbeat",
                json={"leases": [{"jobId": job_id, "attemptNo": attempt}]},
                headers=h,
            )
        )
        assert leases["leases"][0]["held"] is True
        snap = await _ok(await c.get(f"{j}/snapshot?attemptNo={attempt}", headers=h))
        assert snap["payload"]["userId"] == w.a
        # another instance, same attempt: not the lease holder
        for method, path, body in (
            ("GET", f"{j}/snapshot?attemptNo={attempt}", None),
            (
                "POST",
                "/internal/runtime/model-credentials/resolve",
                {"jobId": job_id, "attemptNo": attempt},
            ),
            ("POST", f"{j}/heartbeat", {"attemptNo": attempt}),
        ):
            resp = await c.request(method, path, json=body, headers=system.runtime_headers("thief"))
            assert resp.status_code == 409 and resp.json()["code"] == "LOCK_NOT_HELD", (
                path,
                resp.text,
            )
        resolved = await c.post(
            "/internal/runtime/model-credentials/resolve",
            json={"jobId": job_id, "attemptNo": attempt},
            headers=h,
        )
        assert resolved.status_code == 200, resolved.text
        assert resolved.json()["apiKeyMode"] == "platform_key"
        assert resolved.headers["Cache-Control"] == "no-store"
        inv = await _ok(
            await c.post(
                "/internal/runtime/invocation-logs",
                json={
                    "jobId": job_id,
                    "attemptNo": attempt,
                    "modelProvider": "deepseek",
                    "modelName": "deepseek-chat",
                    "apiKeyMode": "platform_key",
                    "credentialId": None,
                    "promptTokens": 10,
                    "completionTokens": 5,
                    "cacheHitTokens": 0,
                    "latencyMs": 12,
                    "outcome": "succeeded",
                    "errorCode": None,
                    "providerRequestId": "req-1",
                },
                headers=h,
            ),
            201,
        )
        assert inv["id"]
        done = await _ok(
            await c.post(
                f"{j}/result",
                json={
                    "attemptNo": attempt,
                    "promptVersion": f"{PARKED_TYPE}.v1",
                    "outputSchemaVersion": "v1",
                    "output": _output(w),
                },
                headers=h,
            )
        )
        assert done["status"] == "succeeded"
        late = await c.post(
            f"{j}/fail",
            json={"attemptNo": attempt, "errorCode": "MODEL_TIMEOUT", "errorMessage": "late"},
            headers=h,
        )
        assert late.status_code == 409, late.text
        unknown = await c.post("/internal/runtime/jobs/no-such-job/lock", json={}, headers=h)
        assert unknown.status_code == 404 and unknown.json()["code"] == "JOB_NOT_FOUND"
        await _ok(
            await c.get(
                "/internal/runtime/health", headers={"x-internal-api-key": system.service_token}
            )
        )
        no_instance = await c.post(
            "/internal/runtime/jobs/poll",
            json={"capabilities": [PARKED_TYPE]},
            headers={"x-internal-api-key": system.service_token},
        )
        assert no_instance.status_code == 400 and no_instance.json()["code"] == "INVALID_ARGUMENT"


@package_loop
async def test_user_b_cannot_tell_a_foreign_id_from_a_missing_one(
    system: System, world: World
) -> None:
    """Every probe with A's id answers exactly as with an id that does not exist (no oracle)."""
    w = world
    hb = system.bearer(w.b)
    async with system.client() as c:
        before = await snapshot_of_a(system, c, w)
        mb = await _ok(
            await c.post("/v1/materials", json={"title": "B", "content": CONTENT}, headers=hb), 201
        )

        def probes(material: str, block: str, job: str) -> list[tuple[str, str, Any]]:
            return [
                ("GET", f"/v1/materials/{material}", None),
                (
                    "POST",
                    "/v1/knowledge-points",
                    {"materialId": material, "name": "x", "blockIds": [block]},
                ),
                (
                    "POST",
                    "/v1/knowledge-points",
                    {"materialId": mb["materialId"], "name": "x", "blockIds": [block]},
                ),
                (
                    "POST",
                    "/v1/learning-events",
                    {
                        "events": [
                            {
                                "eventId": "p1",
                                "type": "reading",
                                "blockId": block,
                                "dwellSeconds": 1,
                            }
                        ]
                    },
                ),
                (
                    "POST",
                    "/v1/ai/jobs",
                    {"jobType": "quiz_generation", "targetType": "material", "targetId": material},
                ),
                (
                    "POST",
                    "/v1/ai/jobs",
                    {"jobType": "weak_point_analysis", "targetType": "user", "targetId": w.a},
                ),
                ("GET", f"/v1/ai/jobs/{job}", None),
                ("POST", f"/v1/ai/jobs/{job}/cancel", None),
                ("GET", f"/v1/ai/jobs/{job}/result", None),
            ]

        foreign = probes(w.material, w.blocks[0], w.done)
        missing = probes("mat-does-not-exist", "blk-does-not-exist", "job-does-not-exist")
        for (method, path, body), (m2, p2, b2) in zip(foreign, missing, strict=True):
            r1 = await c.request(method, path, json=body, headers=hb)
            r2 = await c.request(m2, p2, json=b2, headers=hb)
            assert r1.status_code >= 400, (path, r1.text)
            assert (r1.status_code, r1.json()["code"]) == (r2.status_code, r2.json()["code"]), (
                path,
                r1.text,
                r2.text,
            )
        # A's page token in B's hands pages through B's jobs only (or is refused)
        page = await _ok(await c.get("/v1/ai/jobs?pageSize=1", headers=system.bearer(w.a)))
        assert page["nextPageToken"]
        for path in ("/v1/ai/jobs", "/v1/ai/results/recommendations"):
            stolen = await c.get(f"{path}?pageToken={page['nextPageToken']}", headers=hb)
            if stolen.status_code == 200:
                items = stolen.json().get("jobs", stolen.json().get("items"))
                assert all(i.get("userId", w.b) == w.b for i in items), stolen.text
                assert w.material not in stolen.text, stolen.text
            else:
                assert stolen.status_code == 400, stolen.text
        # event ids are per user: B reusing A's event id is a new event, not a duplicate
        ev = await _ok(
            await c.post(
                "/v1/learning-events",
                json={
                    "events": [
                        {
                            "eventId": w.event_id,
                            "type": "reading",
                            "blockId": mb["blocks"][0]["blockId"],
                            "dwellSeconds": 2,
                        }
                    ]
                },
                headers=hb,
            ),
            202,
        )
        assert ev == {"accepted": 1, "duplicates": 0}
        after = await snapshot_of_a(system, c, w)
    assert before == after
