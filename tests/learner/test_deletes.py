"""Deleting the learner's data over the real gateway (reference §9.2): knowledge points,
result items, materials."""

from __future__ import annotations

from typing import Any

import pytest

from tests.learner.conftest import DOC, PARKED_TYPE, Learner, System, logical_dump

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]


async def material_with_point(learner: Learner) -> tuple[dict[str, Any], str]:
    m = await learner.material()
    blocks = [b["blockId"] for b in m["blocks"]]
    resp = await learner.post(
        "/v1/knowledge-points",
        {"materialId": m["materialId"], "name": "Light reactions", "blockIds": blocks},
    )
    assert resp.status_code == 201, resp.text
    return m, resp.json()["knowledgePointId"]


async def test_knowledge_points_listed_and_deleted(learner: Learner, system: System) -> None:
    m, kp_id = await material_with_point(learner)
    job = await learner.job(
        "flashcard_generation", "material", m["materialId"], params={"count": 3}
    )
    assert (await learner.done(job["jobId"]))["status"] == "succeeded"
    items = (await learner.get(f"/v1/ai/jobs/{job['jobId']}/result")).json()["items"]
    assert items and all(i["itemId"] for i in items)
    assert any(i["knowledgePointId"] == kp_id for i in items)
    listed = await learner.get("/v1/knowledge-points", params={"materialId": m["materialId"]})
    assert listed.status_code == 200, listed.text
    assert [k["knowledgePointId"] for k in listed.json()["knowledgePoints"]] == [kp_id]
    assert listed.json()["nextPageToken"] is None
    other = Learner(system)
    assert (await other.delete(f"/v1/knowledge-points/{kp_id}")).status_code == 404
    assert (
        await other.get("/v1/knowledge-points", params={"materialId": m["materialId"]})
    ).status_code == 404
    assert (await learner.get("/v1/knowledge-points", params={"pageSize": 0})).status_code == 400
    resp = await learner.delete(f"/v1/knowledge-points/{kp_id}")
    assert resp.status_code == 204, resp.text
    after = (await learner.get(f"/v1/ai/jobs/{job['jobId']}/result")).json()["items"]
    assert [i["front"] for i in after] == [i["front"] for i in items]
    assert all(i["knowledgePointId"] is None for i in after)
    assert (await learner.get("/v1/knowledge-points")).json()["knowledgePoints"] == []
    assert (await learner.delete(f"/v1/knowledge-points/{kp_id}")).status_code == 404
    await other.close()


async def test_result_items_deleted_by_item_id(learner: Learner, system: System) -> None:
    m = await learner.material()
    job = await learner.job(
        "flashcard_generation", "material", m["materialId"], params={"count": 3}
    )
    assert (await learner.done(job["jobId"]))["status"] == "succeeded"
    listed = (await learner.get("/v1/ai/results/flashcards")).json()["items"]
    assert len(listed) >= 2 and all(i["itemId"] for i in listed)
    gone, kept = listed[0]["itemId"], [i["itemId"] for i in listed[1:]]
    other = Learner(system)
    assert (await other.delete(f"/v1/ai/results/flashcards/{gone}")).status_code == 404
    assert (await learner.delete(f"/v1/ai/results/questions/{gone}")).status_code == 404
    assert (await learner.delete(f"/v1/ai/results/nonsense/{gone}")).status_code == 400
    resp = await learner.delete(f"/v1/ai/results/flashcards/{gone}")
    assert resp.status_code == 204, resp.text
    after = (await learner.get("/v1/ai/results/flashcards")).json()["items"]
    assert [i["itemId"] for i in after] == kept
    in_result = (await learner.get(f"/v1/ai/jobs/{job['jobId']}/result")).json()["items"]
    assert gone not in {i["itemId"] for i in in_result}
    assert (await learner.delete(f"/v1/ai/results/flashcards/{gone}")).status_code == 404
    await other.close()


async def claim_parked(learner: Learner, system: System, instance: str) -> dict[str, Any]:
    """Claim the one pending parked job through the REST shim (it is then leased)."""
    resp = await learner.http.post(
        "/internal/runtime/jobs/claim",
        json={"capabilities": [PARKED_TYPE], "limit": 1},
        headers=system.runtime_headers(instance),
    )
    assert resp.status_code == 200, resp.text
    (job,) = resp.json()["jobs"]
    return dict(job)


async def send_result(
    learner: Learner, system: System, job: dict[str, Any], instance: str, target_id: str
) -> Any:
    item = {
        "actionType": "read",
        "targetType": "material",
        "targetId": target_id,
        "reason": "a late result",
        "priority": 0,
    }
    return await learner.http.post(
        f"/internal/runtime/jobs/{job['jobId']}/result",
        json={
            "attemptNo": job["attemptNo"],
            "promptVersion": "next_action_planning.v1",
            "outputSchemaVersion": "v1",
            "output": {"items": [item]},
        },
        headers=system.runtime_headers(instance),
    )


async def test_deleting_a_material(learner: Learner, system: System) -> None:
    secret = "Chlorophyll absorbs mostly blue and red light, xq7."
    m, kp_id = await material_with_point(learner)
    m2 = await learner.material(DOC.replace("Photosynthesis", "Plants") + f"\n{secret}\n")
    done = await learner.job("flashcard_generation", "material", m2["materialId"])
    assert (await learner.done(done["jobId"]))["status"] == "succeeded"
    leased_job = await learner.job(PARKED_TYPE, "material", m2["materialId"])
    leased = await claim_parked(learner, system, "learner-w1")
    assert leased["jobId"] == leased_job["jobId"]
    pending = await learner.job(PARKED_TYPE, "material", m2["materialId"])
    other = Learner(system)
    assert (await other.delete(f"/v1/materials/{m2['materialId']}")).status_code == 404

    resp = await learner.delete(f"/v1/materials/{m2['materialId']}")
    assert resp.status_code == 204, resp.text

    assert (await learner.get(f"/v1/materials/{m2['materialId']}")).status_code == 404
    jobs = (
        await learner.get(
            "/v1/ai/jobs",
            params={"ids": f"{done['jobId']},{leased_job['jobId']},{pending['jobId']}"},
        )
    ).json()["jobs"]
    assert [j["status"] for j in jobs] == ["succeeded", "locked", "cancelled"]
    assert jobs[1]["cancelRequested"] is True
    late = await send_result(learner, system, leased, "learner-w1", m2["materialId"])
    assert late.status_code == 409, late.text
    assert late.json()["code"] == "INVALID_JOB_STATE"
    assert (await learner.done(leased_job["jobId"]))["status"] == "cancelled"
    result = await learner.get(f"/v1/ai/jobs/{done['jobId']}/result")
    assert result.status_code == 200 and result.json()["items"] == []
    recs = (await learner.get("/v1/ai/results/recommendations")).json()["items"]
    assert all(r["reason"] != "a late result" for r in recs)
    text = logical_dump(system)
    assert secret not in text and "a late result" not in text
    assert "The Calvin cycle fixes carbon dioxide" in text  # the other material stays
    listed = (await learner.get("/v1/materials")).json()["materials"]
    assert [x["materialId"] for x in listed] == [m["materialId"]]
    assert (await learner.delete(f"/v1/materials/{m2['materialId']}")).status_code == 404
    assert kp_id
    await other.close()
