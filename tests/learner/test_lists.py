"""Lists and pages over the real gateway (reference §9.2): materials, blocks, jobs by ids."""

from __future__ import annotations

import pytest

from tests.learner.conftest import DOC, PARKED_TYPE, Learner, System

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]


async def test_materials_listed_newest_first_and_paged(learner: Learner, system: System) -> None:
    made = [(await learner.material(title=f"T{i}"))["materialId"] for i in range(3)]
    other = Learner(system)
    await other.material(title="not yours")
    first = await learner.get("/v1/materials", params={"pageSize": 2})
    assert first.status_code == 200, first.text
    body = first.json()
    assert [m["materialId"] for m in body["materials"]] == [made[2], made[1]]
    assert set(body["materials"][0]) == {"materialId", "title", "blockCount", "createdAt"}
    assert body["materials"][0]["blockCount"] == 4
    assert body["nextPageToken"]
    second = await learner.get(
        "/v1/materials", params={"pageSize": 2, "pageToken": body["nextPageToken"]}
    )
    assert [m["materialId"] for m in second.json()["materials"]] == [made[0]]
    assert second.json()["nextPageToken"] is None
    for bad in ({"pageSize": 0}, {"pageSize": 101}, {"pageSize": "x"}, {"pageToken": "@@"}):
        resp = await learner.get("/v1/materials", params=bad)
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["code"] == "INVALID_ARGUMENT"
    assert (await other.get("/v1/materials")).json()["materials"][0]["title"] == "not yours"
    await other.close()


async def test_material_blocks_paged(learner: Learner) -> None:
    m = await learner.material(DOC + "".join(f"\nParagraph {i}.\n" for i in range(5)))
    whole = (await learner.get(f"/v1/materials/{m['materialId']}")).json()
    assert len(whole["blocks"]) == 9 and whole["nextBlocksPageToken"] is None
    got, token, pages = [], None, 0
    while True:
        params: dict[str, str | int] = {"blocksPageSize": 4}
        if token:
            params["blocksPageToken"] = token
        page = (await learner.get(f"/v1/materials/{m['materialId']}", params=params)).json()
        pages += 1
        got += page["blocks"]
        token = page["nextBlocksPageToken"]
        if token is None:
            break
    assert pages == 3 and got == whole["blocks"]
    for bad in ({"blocksPageSize": 0}, {"blocksPageSize": 1001}, {"blocksPageToken": "x"}):
        resp = await learner.get(f"/v1/materials/{m['materialId']}", params=bad)
        assert resp.status_code == 400, (bad, resp.text)


async def test_jobs_by_ids(learner: Learner, system: System) -> None:
    a = await learner.job(PARKED_TYPE, "user", learner.user_id)
    b = await learner.job(PARKED_TYPE, "user", learner.user_id)
    other = Learner(system)
    theirs = await other.job(PARKED_TYPE, "user", other.user_id)
    ids = ",".join([b["jobId"], "unknown-id", theirs["jobId"], a["jobId"]])
    resp = await learner.get("/v1/ai/jobs", params={"ids": ids})
    assert resp.status_code == 200, resp.text
    assert [j["jobId"] for j in resp.json()["jobs"]] == [b["jobId"], a["jobId"]]
    assert resp.json()["nextPageToken"] is None
    listed = await learner.get("/v1/ai/jobs")  # the plain list is unchanged
    assert {j["jobId"] for j in listed.json()["jobs"]} == {a["jobId"], b["jobId"]}
    many = ",".join(f"id{i}" for i in range(101))
    assert (await learner.get("/v1/ai/jobs", params={"ids": many})).status_code == 400
    mixed = await learner.get("/v1/ai/jobs", params={"ids": a["jobId"], "status": "pending"})
    assert mixed.status_code == 400
    for job in (a, b):
        await learner.post(f"/v1/ai/jobs/{job['jobId']}/cancel")
    await other.post(f"/v1/ai/jobs/{theirs['jobId']}/cancel")
    await other.close()
