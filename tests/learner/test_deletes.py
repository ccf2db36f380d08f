"""Deleting the learner's data over the real gateway (SPEC §9.2): knowledge points,
result items, materials."""

from __future__ import annotations

from typing import Any

import pytest

from tests.learner.conftest import Learner, System

pytestmark = pytest.mark.asyncio(loop_scope="package")


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
