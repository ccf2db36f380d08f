"""Prompt experiments over the real processes (reference §10.4): every service started by
the launcher, the model stand-in behind the worker.

* A variant whose outputs fail validation (its template leaves the learner's material
  out of the prompt, so the model has nothing to make flashcards from) is rolled back
  by the guard within its ``minAttempts`` attempts plus one guard interval, and jobs
  created after it get the control; the worker fetched the variant's template once.
* Feedback on a generated item counts under its job's version.
* A 50/50 split over 5,000 users lands within ± 2 points, each user always in the same arm.
* With two job_service replicas on one MariaDB, a routing set through one reaches the
  other's next create with no restart.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from airuntime_common import metadata
from airuntime_common.enums import API_KEY_MODE, JOB_TYPE, TARGET_TYPE
from airuntime_common.prompts import builtin_source
from tests.e2e.conftest import RunningSystem
from zhixi.airuntime.job.v1 import message_pb2 as msg
from zhixi.airuntime.job.v1 import request_response_pb2 as rr
from zhixi.airuntime.job.v1 import service_pb2_grpc as job_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CARDS = "flashcard_generation"
ANALYSIS = "learning_state_analysis"
GUARD_INTERVAL = 1.0
MIN_ATTEMPTS = 5
MATERIAL = (
    "Photosynthesis turns light energy into chemical energy inside the chloroplasts.\n\n"
    "Chlorophyll absorbs red and blue light and reflects most of the green light.\n\n"
    "The light reactions split water and release oxygen as a by-product."
)


def _iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A system whose worker takes only flashcard jobs (analysis jobs stay pending) and
    whose guard passes every second."""
    running = RunningSystem.start(
        tmp_path_factory.mktemp("e2e-prompts"),
        {"WORKER_CAPABILITIES": CARDS, "PROMPT_GUARD_INTERVAL_SECONDS": str(GUARD_INTERVAL)},
        metrics=True,
    )
    try:
        yield running
    except BaseException:
        print(running.diagnostics())
        raise
    finally:
        running.close()


def _admin(system: RunningSystem) -> httpx.Client:
    return system.client(system.token("e2e-prompt-admin", "admin"))


def _learner_job(system: RunningSystem, user: str) -> dict[str, Any]:
    """A learner with one material and a flashcard job on it, run to its end."""
    token = system.token(user)
    with system.client(token) as http:
        made = http.post("/v1/materials", json={"title": "Light", "content": MATERIAL})
        assert made.status_code == 201, made.text
        reply = http.post(
            "/v1/ai/jobs",
            json={"jobType": CARDS, "targetType": "material",
                  "targetId": made.json()["materialId"], "params": {"count": 2}},
        )  # fmt: skip
        assert reply.status_code == 201, reply.text
    return system.wait_terminal(token, reply.json()["jobId"])


def test_a_variant_failing_validation_is_rolled_back_by_the_guard(lab: RunningSystem) -> None:
    system = lab
    variant = f"v2-{uuid.uuid4().hex[:6]}"
    bad = builtin_source(CARDS).replace(
        "{{ snapshot_json }}", "{{ snapshot_json|replace('\"blocks\":[', '\"gone\":[') }}"
    )
    base = f"/admin/ai/prompts/{CARDS}"
    with _admin(system) as admin:
        up = admin.post(f"{base}/versions", json={"version": variant, "template": bad})
        assert up.status_code == 201, up.text
        routing = {"variants": [{"version": "v1", "weight": 50}, {"version": variant, "weight": 50}],
                   "guard": {"minAttempts": MIN_ATTEMPTS, "maxInvalidSchemaIncrease": 0.1}}  # fmt: skip
        assert admin.put(f"{base}/routing", json=routing).status_code == 200

    # one learner after another, each job run to its end, until the variant has
    # its minAttempts attempts: all of its outputs fail validation, the control's pass
    ran: dict[str, list[dict[str, Any]]] = {"v1": [], variant: []}
    users: dict[str, str] = {}
    run = uuid.uuid4().hex[:6]
    for i in range(200):
        user = f"e2e-prompt-{run}-{i}"
        job = _learner_job(system, user)
        version = job["promptVersion"].split(".", 1)[1]
        users[user] = version
        ran[version].append(job)
        if version == variant:
            assert (job["status"], job["errorCode"]) == ("failed", "INVALID_SCHEMA"), job
            if len(ran[variant]) == MIN_ATTEMPTS:
                break
        else:
            assert job["status"] == "succeeded", job
    assert len(ran[variant]) == MIN_ATTEMPTS and ran["v1"], ran
    last_failure = _iso(ran[variant][-1]["finishedAt"])

    with _admin(system) as admin:
        deadline = time.monotonic() + 10 * GUARD_INTERVAL + 10
        while True:
            overview = admin.get(base).json()
            if overview["routing"]["rolledBackAt"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    rolled_at = overview["routing"]["rolledBackAt"]
    assert rolled_at is not None, overview
    took = (_iso(rolled_at) - last_failure).total_seconds()
    assert took <= GUARD_INTERVAL + 1.0, took  # one guard interval (+ the pass itself)
    print(f"rolled back {took:.2f} s after the variant's attempt {MIN_ATTEMPTS} ended")
    assert overview["routing"]["variants"] == [{"version": "v1", "weight": 50.0}]
    assert variant in overview["routing"]["rollbackReason"]
    stats = {s["version"]: s for s in overview["stats"]}
    assert (stats[variant]["attempts"], stats[variant]["invalidSchemaRate"]) == (MIN_ATTEMPTS, 1.0)
    assert stats["v1"]["invalidSchemaRate"] == 0.0 and stats["v1"]["succeeded"] == len(ran["v1"])
    assert stats["v1"]["p95LatencyMs"] is not None and stats["v1"]["costPerSucceededUsd"] > 0

    # the learners who had the variant now get the control, and succeed
    for user in [u for u, v in users.items() if v == variant][:3]:
        after = _learner_job(system, user)
        assert after["promptVersion"] == f"{CARDS}.v1" and after["status"] == "succeeded"

    # the calls were logged under the version their attempt ran
    with _admin(system) as admin:
        detail = admin.get(f"/admin/ai/jobs/{ran[variant][0]['jobId']}").json()
    assert {i["promptVersion"] for i in detail["invocations"]} == {f"{CARDS}.{variant}"}
    # one rollback counted, every type exported; the worker fetched the variant once
    text = httpx.get(system.metrics_url("JOB_SERVICE_METRICS_PORT"), timeout=10).text
    assert _metric(text, "ai_runtime_prompt_rollbacks_total", job_type=CARDS) == 1.0
    assert _metric(text, "ai_runtime_prompt_rollbacks_total", job_type=ANALYSIS) == 0.0
    worker = httpx.get(system.metrics_url("WORKER_METRICS_PORT"), timeout=10).text
    assert _metric(worker, "airt_worker_rpc_seconds_count", rpc="GetPromptVersion") == 1.0


def test_feedback_counts_under_the_items_version(lab: RunningSystem) -> None:
    system = lab
    user = f"e2e-rater-{uuid.uuid4().hex[:6]}"
    job = _learner_job(system, user)
    assert job["status"] == "succeeded", job
    token = system.token(user)
    with system.client(token) as http:
        items = http.get(f"/v1/ai/jobs/{job['jobId']}/result").json()["items"]
        item = items[0]["itemId"]
        path = f"/v1/ai/results/flashcards/{item}/feedback"
        assert http.post(path, json={"rating": 1}).status_code == 204
        assert http.post(path, json={"rating": -1}).status_code == 204  # replaces
    with system.client(system.token("e2e-someone-else")) as other:
        assert other.post(path, json={"rating": 1}).status_code == 404
    with _admin(system) as admin:
        stats = {s["version"]: s for s in admin.get(f"/admin/ai/prompts/{CARDS}").json()["stats"]}
    version = job["promptVersion"].split(".", 1)[1]
    assert stats[version]["feedback"]["negative"] >= 1


async def _create_many(system: RunningSystem, users: list[str], width: int = 12) -> list[str]:
    """One analysis job per user (their own target), ``width`` at a time; their versions."""
    gate = asyncio.Semaphore(width)
    async with httpx.AsyncClient(base_url=system.gateway_url, timeout=60, trust_env=False) as http:

        async def one(user: str) -> str:
            async with gate:
                reply = await http.post(
                    "/v1/ai/jobs",
                    json={"jobType": ANALYSIS, "targetType": "user", "targetId": user},
                    headers={"Authorization": f"Bearer {system.token(user)}"},
                )
            assert reply.status_code == 201, reply.text
            return str(reply.json()["promptVersion"])

        return list(await asyncio.gather(*(one(u) for u in users)))


def test_a_fifty_fifty_split_over_5000_users_is_within_two_points(lab: RunningSystem) -> None:
    system = lab
    other = builtin_source(ANALYSIS).replace("You are a learning coach", "You are a kind coach")
    base = f"/admin/ai/prompts/{ANALYSIS}"
    with _admin(system) as admin:
        assert admin.post(
            f"{base}/versions", json={"version": "v2", "template": other}
        ).status_code in (200, 201)
        routing = {"variants": [{"version": "v1", "weight": 50}, {"version": "v2", "weight": 50}]}
        assert admin.put(f"{base}/routing", json=routing).status_code == 200  # fmt: skip
    run = uuid.uuid4().hex[:6]
    users = [f"e2e-split-{run}-{i}" for i in range(5000)]
    started = time.monotonic()
    first = asyncio.run(_create_many(system, users))
    took = time.monotonic() - started
    arms = Counter(first)
    share = arms[f"{ANALYSIS}.v2"] / len(users)
    assert set(arms) == {f"{ANALYSIS}.v1", f"{ANALYSIS}.v2"}
    assert abs(share - 0.5) <= 0.02, (arms, took)
    # each user always in the same arm: a second job of 1,000 of them
    again = asyncio.run(_create_many(system, users[::5]))
    assert again == first[::5]
    print(f"5,000 creates in {took:.1f} s; v2 share {share:.4f}")


@pytest.mark.mysql
def test_a_routing_change_reaches_the_other_replicas_next_create(
    mysql_url: str, tmp_path: Path
) -> None:
    running = RunningSystem.start(
        tmp_path,
        {"DATABASE_URL": mysql_url, "CREDENTIAL_DATABASE_URL": mysql_url,
         "WORKER_CAPABILITIES": CARDS},
        job_services=2,
    )  # fmt: skip
    try:
        asyncio.run(_replicas(running))
    except BaseException:
        print(running.diagnostics())
        raise
    finally:
        running.close()


async def _replicas(running: RunningSystem) -> None:
    replicas = [s.env["JOB_SERVICE_LISTEN"] for s in running.launcher.plan.services
                if s.kind == "job_service"]  # fmt: skip
    assert len(replicas) == 2 and replicas[0] != replicas[1]
    md = metadata.outgoing(running.internal_token)
    jt = JOB_TYPE.to_proto(ANALYSIS)
    channels = [grpc.aio.insecure_channel(a) for a in replicas]
    try:
        a, b = (job_grpc.JobServiceStub(c) for c in channels)
        other = builtin_source(ANALYSIS).replace("You are a learning coach", "You are a kind coach")
        await a.PutPromptVersion(
            rr.PutPromptVersionRequest(job_type=jt, version="v2", template=other, actor="e2e"),
            metadata=md,
        )  # type: ignore[arg-type]

        async def route(stub: Any, version: str) -> None:
            await stub.PutPromptRouting(
                rr.PutPromptRoutingRequest(
                    job_type=jt, variants=[msg.PromptVariant(version=version, weight=1)]
                ),
                metadata=md,
            )  # type: ignore[arg-type]

        async def create(stub: Any, user: str) -> str:
            reply = await stub.CreateJob(
                rr.CreateJobRequest(
                    user_id=user, job_type=jt, target_type=TARGET_TYPE.to_proto("user"),
                    target_id=user, api_key_mode=API_KEY_MODE.to_proto("platform_key"),
                ),
                metadata=md,
            )  # type: ignore[arg-type]  # fmt: skip
            return str(reply.job.prompt_version)

        for round_no, (setter, creator, version) in enumerate(
            [(a, b, "v2"), (b, a, "v1"), (a, b, "v1"), (b, a, "v2"), (a, b, "v2"), (b, b, "v1")]
        ):
            await route(setter, version)
            # the very next create, on either replica, follows it: no wait, no restart
            got = await create(creator, f"e2e-replica-{round_no}")
            assert got == f"{ANALYSIS}.{version}", (round_no, got)
    finally:
        for channel in channels:
            await channel.close()
