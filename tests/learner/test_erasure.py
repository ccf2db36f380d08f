"""``DELETE /v1/me`` over the real gateway on MariaDB, with jobs in flight (reference §9.2):
afterwards ``mariadb-dump`` of both databases holds neither the user id nor a sentence
of their material; cost totals and that day's quota use are unchanged."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.learner.conftest import (
    DOC,
    MARIADB_DAILY_QUOTA,
    PARKED_TYPE,
    Learner,
    System,
    logical_dump,
)
from tests.learner.test_deletes import claim_parked, material_with_point, send_result

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

BYSTANDER_DOC = (
    "# Rivers\n\nRivers carve valleys over time.\n\nDeltas form at river mouths.\n\n"
    "Floods spread silt across plains.\n"
)
SECRET = "Rubisco is the most abundant protein on Earth, zq8v."


def mariadb_dump(url: str) -> str:
    """``mariadb-dump`` of one database (every table, data and schema) as text."""
    binary = shutil.which("mariadb-dump") or shutil.which("mysqldump")
    if binary is None:
        pytest.skip("no mariadb-dump")
    u = make_url(url)
    args = [
        binary,
        f"--host={u.host or '127.0.0.1'}",
        f"--port={u.port or 3306}",
        f"--user={u.username or 'root'}",
        "--skip-extended-insert",
        "--hex-blob",
        str(u.database),
    ]
    if u.password:
        args.insert(4, f"--password={u.password}")
    done = subprocess.run(args, capture_output=True, check=True, timeout=60)
    return done.stdout.decode("utf-8", errors="replace")


async def admin_costs(learner: Learner, system: System) -> list[dict[str, Any]]:
    today = datetime.now(UTC).date().isoformat()
    resp = await learner.http.get(
        "/admin/ai/costs",
        params={"from": today, "to": today, "groupBy": "apiKeyMode"},
        headers=system.bearer("erasure-admin", role="admin"),
    )
    assert resp.status_code == 200, resp.text
    rows: list[dict[str, Any]] = resp.json()["rows"]
    return rows


@pytest.mark.mysql
async def test_erasure_on_mariadb_with_jobs_in_flight(mariadb_system: System) -> None:
    system = mariadb_system
    learner = Learner(system, prefix="erasure-victim")
    other = Learner(system, prefix="erasure-bystander")
    try:
        await erase_and_check(learner, other, system)
    finally:
        await learner.close()
        await other.close()


async def erase_and_check(learner: Learner, other: Learner, system: System) -> None:
    key = await learner.http.put(
        "/v1/me/model-credential",
        json={"provider": "deepseek", "apiKey": "sk-erasure-canary-0123456789"},
        headers=learner.headers,
    )
    assert key.status_code == 200, key.text
    m, kp_id = await material_with_point(learner)
    mine = await learner.material(DOC + f"\n{SECRET}\n", title="Rubisco notes")
    events = await learner.post(
        "/v1/learning-events",
        {
            "events": [
                {
                    "eventId": "e1",
                    "type": "reading",
                    "materialId": mine["materialId"],
                    "blockId": mine["blocks"][-1]["blockId"],
                    "dwellSeconds": 12,
                },
                {
                    "eventId": "e2",
                    "type": "quiz_attempt",
                    "knowledgePointId": kp_id,
                    "correct": True,
                },
            ]
        },
    )
    assert events.status_code == 202, events.text
    done = await learner.job("flashcard_generation", "material", mine["materialId"])
    assert (await learner.done(done["jobId"]))["status"] == "succeeded"
    theirs = await other.material(BYSTANDER_DOC, title="Bystander")
    other_job = await other.job("flashcard_generation", "material", theirs["materialId"])
    assert (await other.done(other_job["jobId"]))["status"] == "succeeded"
    await learner.job(PARKED_TYPE, "material", m["materialId"])
    leased = await claim_parked(learner, system, "erasure-w1")
    await learner.job(PARKED_TYPE, "user", learner.user_id)  # stays pending
    costs_before = await admin_costs(learner, system)
    assert costs_before, "the succeeded jobs' model calls were logged"

    first = await learner.delete("/v1/me")
    assert first.status_code == 204, first.text
    second = await learner.delete("/v1/me")
    assert second.status_code == 204, second.text

    # the attempt in flight still logs its model call: its tokens and cost are kept
    call = await learner.http.post(
        "/internal/runtime/invocation-logs",
        json={
            "jobId": leased["jobId"],
            "attemptNo": leased["attemptNo"],
            "modelProvider": "deepseek",
            "modelName": "deepseek-chat",
            "apiKeyMode": "platform_key",
            "promptTokens": 1200,
            "completionTokens": 300,
            "latencyMs": 850,
            "outcome": "succeeded",
        },
        headers=system.runtime_headers("erasure-w1"),
    )
    assert call.status_code == 201, call.text
    late = await send_result(learner, system, leased, "erasure-w1", m["materialId"])
    assert late.status_code == 409, late.text
    # case N7: once the last attempt of a job leased at the erasure ends, the job and its
    # events go too (its model calls stay, under the pseudonym)
    left = mariadb_dump(system.job_db)
    assert leased["jobId"] not in left
    assert (await learner.get("/v1/materials")).json()["materials"] == []
    assert (await learner.get("/v1/ai/jobs")).json()["jobs"] == []
    assert (await learner.get("/v1/knowledge-points")).json()["knowledgePoints"] == []
    assert (await learner.get("/v1/ai/results/flashcards")).json()["items"] == []
    assert (await learner.get("/v1/me/model-credential")).status_code == 404
    assert (await learner.get("/v1/me/ai-authorization")).json()["granted"] is True
    assert (await learner.get(f"/v1/ai/jobs/{done['jobId']}")).status_code == 404
    costs_after = await admin_costs(learner, system)
    calls = (
        {r["key"]: r["calls"] for r in costs_before},
        {r["key"]: r["calls"] for r in costs_after},
    )
    assert calls[1]["platform_key"] == calls[0].get("platform_key", 0) + 1, (
        costs_before,
        costs_after,
    )
    assert calls[1].get("user_key") == calls[0].get("user_key")

    dumps = mariadb_dump(system.job_db) + mariadb_dump(system.credential_db)
    assert learner.user_id not in dumps
    for sentence in (
        SECRET,
        "The light reactions split water and release oxygen",
        "Light reactions",
    ):
        assert sentence not in dumps, sentence
    assert "a late result" not in dumps
    assert other.user_id in dumps and "Bystander" in dumps  # the other user's stay
    assert "erased-" in dumps  # the kept cost rows, under the pseudonym

    # that day's quota use is kept: 3 jobs of the 6 the day allows
    for _ in range(MARIADB_DAILY_QUOTA - 3):
        await learner.job(PARKED_TYPE, "user", learner.user_id)
    refused = await learner.post(
        "/v1/ai/jobs",
        {"jobType": PARKED_TYPE, "targetType": "user", "apiKeyMode": "platform_key"},
    )
    assert refused.status_code == 429 and refused.json()["code"] == "QUOTA_EXCEEDED", refused.text


async def test_erasure_on_sqlite(learner: Learner, system: System) -> None:
    mine = await learner.material(DOC + f"\n{SECRET}\n", title="Rubisco notes")
    done = await learner.job("flashcard_generation", "material", mine["materialId"])
    assert (await learner.done(done["jobId"]))["status"] == "succeeded"
    await learner.job(PARKED_TYPE, "user", learner.user_id)
    assert (await learner.delete("/v1/me")).status_code == 204
    assert (await learner.delete("/v1/me")).status_code == 204
    text = logical_dump(system)
    assert learner.user_id not in text and SECRET not in text
    assert (await learner.get("/v1/ai/jobs")).json()["jobs"] == []
    assert (await learner.http.delete("/v1/me")).status_code == 401
