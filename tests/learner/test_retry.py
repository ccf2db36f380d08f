"""``POST /v1/ai/jobs/{jobId}/retry`` over the real gateway (reference §9.2)."""

from __future__ import annotations

import pytest

from tests.learner.conftest import PARKED_TYPE, Learner, System
from tests.learner.test_deletes import claim_parked

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]


async def test_retry_of_a_failed_job(learner: Learner, system: System) -> None:
    job = await learner.job(PARKED_TYPE, "user", learner.user_id)
    leased = await claim_parked(learner, system, "retry-w1")
    assert leased["jobId"] == job["jobId"]
    failed = await learner.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/fail",
        json={
            "attemptNo": leased["attemptNo"],
            "errorCode": "MODEL_BAD_REQUEST",
            "errorMessage": "x",
        },
        headers=system.runtime_headers("retry-w1"),
    )
    assert failed.status_code == 200 and failed.json()["status"] == "failed", failed.text
    other = Learner(system)
    assert (await other.post(f"/v1/ai/jobs/{job['jobId']}/retry")).status_code == 404
    key = {"Idempotency-Key": f"retry-{job['jobId']}"}
    first = await learner.post(
        f"/v1/ai/jobs/{job['jobId']}/retry", {"rebuildSnapshot": False}, headers=key
    )
    assert first.status_code == 201, first.text
    new = first.json()
    assert new["retriedFromJobId"] == job["jobId"] and new["status"] == "pending"
    assert new["jobId"] != job["jobId"] and new["snapshotId"] == job["snapshotId"]
    again = await learner.post(f"/v1/ai/jobs/{job['jobId']}/retry", headers=key)
    assert again.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["jobId"] == new["jobId"]
    not_failed = await learner.post(f"/v1/ai/jobs/{new['jobId']}/retry")
    assert not_failed.status_code == 409 and not_failed.json()["code"] == "INVALID_JOB_STATE"
    bad = await learner.post(f"/v1/ai/jobs/{job['jobId']}/retry", {"rebuildSnapshot": "yes"})
    assert bad.status_code == 400
    off = await learner.http.put(
        "/v1/me/ai-authorization", json={"granted": False}, headers=learner.headers
    )
    assert off.status_code == 200, off.text
    refused = await learner.post(f"/v1/ai/jobs/{job['jobId']}/retry", {"rebuildSnapshot": True})
    assert refused.status_code == 403 and refused.json()["code"] == "AI_NOT_AUTHORIZED"
    await other.close()
