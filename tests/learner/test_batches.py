"""Batches over the real processes on MariaDB (reference §10.3): the launcher's
services, one worker, the model stand-in, two fresh MariaDB databases.

* a batch of 50 ends ``succeeded`` with 50 children, and its result lists one
  analysis per child, each with its child's ``jobId``;
* with one child failing, ``minSuccessRatio`` 1.0 ends the parent ``failed``
  ``CHILD_JOBS_FAILED`` and 0.9 ``succeeded``; the failed parent's retry runs only the
  failed target;
* cancelling a parent while children run leaves no child running, and none succeeds
  after the cancel;
* a batch the day's quota cannot take whole creates nothing.

Skipped without ``TEST_MYSQL_URL``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.learner.conftest import PARKED_TYPE, Learner, System, wait_terminal
from tests.security.conftest import mysql_database, start_system

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

#: The daily quota of :func:`batch_system` (the quota test fills it).
QUOTA = 80
ANALYSIS = "learning_state_analysis"


@pytest_asyncio.fixture(scope="module", loop_scope="package")
async def batch_system(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[System]:
    """A running system on two fresh MariaDB databases, daily quota :data:`QUOTA`."""
    base = os.environ.get("TEST_MYSQL_URL")
    if not base:
        pytest.skip("TEST_MYSQL_URL not set")
    job_db, drop_job = mysql_database(base)
    cred_db, drop_cred = mysql_database(base)
    try:
        sys_ = await start_system(
            tmp_path_factory.mktemp("batches-mariadb"),
            {
                "DATABASE_URL": job_db,
                "CREDENTIAL_DATABASE_URL": cred_db,
                "USER_DAILY_JOB_QUOTA": str(QUOTA),
            },
        )
        try:
            yield sys_
        finally:
            await sys_.launcher.stop()
    finally:
        drop_job()
        drop_cred()


@pytest_asyncio.fixture(loop_scope="package")
async def learner(batch_system: System) -> AsyncIterator[Learner]:
    one = Learner(batch_system, "batcher")
    try:
        yield one
    finally:
        await one.close()


async def _standin(sys_: System, path: str, body: Any) -> None:
    url = sys_.launcher.standin_url
    assert url
    async with httpx.AsyncClient(trust_env=False) as http:
        reply = await http.post(f"{url}/_standin/{path}", json=body)
        assert reply.status_code == 200, reply.text


async def _materials(learner: Learner, n: int) -> list[str]:
    """``n`` new materials of the learner, made one after the other (their creation order
    is the order ``targetsOf`` would give)."""
    made = []
    for i in range(n):
        made.append(await learner.material(f"# Topic {i}\n\nFact {i} about cells.", f"T{i}"))
    return [m["materialId"] for m in made]


async def _batch(learner: Learner, targets: list[str], **kw: Any) -> dict[str, Any]:
    body = {
        "jobType": kw.pop("jobType", ANALYSIS),
        "targets": [{"targetType": "material", "targetId": t} for t in targets],
        **kw,
    }
    resp = await learner.post("/v1/ai/job-batches", body)
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


async def _children(learner: Learner, parent_id: str) -> list[dict[str, Any]]:
    kids: list[dict[str, Any]] = []
    token = None
    while True:
        query = f"/v1/ai/jobs?parentJobId={parent_id}&pageSize=100"
        resp = await learner.get(query + (f"&pageToken={token}" if token else ""))
        assert resp.status_code == 200, resp.text
        kids += resp.json()["jobs"]
        token = resp.json()["nextPageToken"]
        if not token:
            return kids[::-1]  # oldest first: the order of the targets


async def _ended(learner: Learner, job_id: str) -> dict[str, Any]:
    return await wait_terminal(learner.http, job_id, learner.headers, within=120.0)


def _counts_match(parent: dict[str, Any], kids: list[dict[str, Any]]) -> None:
    b = parent["batch"]
    states = [k["status"] for k in kids]
    assert b["total"] == len(kids)
    assert b["pending"] == states.count("pending")
    assert b["running"] == states.count("locked") + states.count("running")
    for state in ("succeeded", "failed", "cancelled"):
        assert b[state] == states.count(state), (b, states)


async def test_a_batch_of_fifty_succeeds_with_fifty_children(learner: Learner) -> None:
    targets = await _materials(learner, 50)
    parent = await _batch(learner, targets)
    assert parent["status"] == "pending" and parent["batch"]["total"] == 50
    done = await _ended(learner, parent["jobId"])
    assert done["status"] == "succeeded", done
    kids = await _children(learner, parent["jobId"])
    assert [k["targetId"] for k in kids] == targets
    assert all(k["status"] == "succeeded" and k["parentJobId"] == parent["jobId"] for k in kids)
    _counts_match(done, kids)
    result = await learner.get(f"/v1/ai/jobs/{parent['jobId']}/result")
    assert result.status_code == 200, result.text
    items = result.json()["items"]
    assert [i["jobId"] for i in items] == [k["jobId"] for k in kids]  # one analysis each
    assert result.json()["jobType"] == ANALYSIS


@pytest.mark.parametrize(("ratio", "ending"), [(1.0, "failed"), (0.9, "succeeded")])
async def test_one_failing_child_and_the_ratio(
    learner: Learner, batch_system: System, ratio: float, ending: str
) -> None:
    targets = await _materials(learner, 10)
    await _standin(batch_system, "faults", [{"kind": "status", "status": 400, "count": 1}])
    parent = await _batch(learner, targets, minSuccessRatio=ratio)
    done = await _ended(learner, parent["jobId"])
    kids = await _children(learner, parent["jobId"])
    _counts_match(done, kids)
    assert (done["batch"]["succeeded"], done["batch"]["failed"]) == (9, 1), done
    assert done["status"] == ending, done
    if ending == "succeeded":
        return
    assert done["errorCode"] == "CHILD_JOBS_FAILED"
    # the retry runs only the failed target, as a new parent naming the old one
    failed = next(k for k in kids if k["status"] == "failed")
    resp = await learner.post(f"/v1/ai/jobs/{parent['jobId']}/retry")
    assert resp.status_code == 201, resp.text
    again = resp.json()
    assert again["retriedFromJobId"] == parent["jobId"]
    assert again["batch"]["total"] == 1 and again["batch"]["minSuccessRatio"] == 1.0
    (only,) = await _children(learner, again["jobId"])
    assert only["targetId"] == failed["targetId"]
    assert only["retriedFromJobId"] == failed["jobId"]
    assert (await _ended(learner, again["jobId"]))["status"] == "succeeded"


async def test_cancelling_a_parent_leaves_no_child_running_or_succeeding(
    learner: Learner, batch_system: System
) -> None:
    targets = await _materials(learner, 8)
    await _standin(batch_system, "faults", {"faults": [], "delayMs": 1500})
    try:
        parent = await _batch(learner, targets)
        deadline = time.monotonic() + 30
        while True:  # some children leased, some not yet
            seen = (await learner.get(f"/v1/ai/jobs/{parent['jobId']}")).json()
            if seen["batch"]["running"]:
                break
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        resp = await learner.post(f"/v1/ai/jobs/{parent['jobId']}/cancel")
        assert resp.status_code == 200, resp.text
        cancelled = resp.json()
        assert cancelled["status"] == "cancelled"
        kids = [
            await _ended(learner, k["jobId"]) for k in await _children(learner, parent["jobId"])
        ]
    finally:
        await _standin(batch_system, "faults", {"faults": [], "delayMs": 0})
    assert all(k["status"] in ("cancelled", "succeeded") for k in kids), kids
    late = [
        k for k in kids if k["status"] == "succeeded" and k["finishedAt"] > cancelled["finishedAt"]
    ]
    assert late == [], late
    assert any(k["status"] == "cancelled" for k in kids)
    final = (await learner.get(f"/v1/ai/jobs/{parent['jobId']}")).json()
    assert final["status"] == "cancelled"
    _counts_match(final, kids)


async def test_a_batch_over_quota_creates_nothing(learner: Learner) -> None:
    targets = await _materials(learner, 3)
    single = await learner.job(PARKED_TYPE, "material", targets[0])
    over = {
        "jobType": PARKED_TYPE,
        "targets": [{"targetType": "user", "targetId": learner.user_id}]
        + [{"targetType": "material", "targetId": f"m-{i}"} for i in range(QUOTA - 1)],
    }
    resp = await learner.post("/v1/ai/job-batches", over)
    assert resp.status_code == 429, resp.text
    assert resp.json()["code"] == "QUOTA_EXCEEDED"
    listed = (await learner.get("/v1/ai/jobs?pageSize=100")).json()["jobs"]
    assert [j["jobId"] for j in listed] == [single["jobId"]]
    # a target that is not the caller's: 404, nothing either
    foreign = {"jobType": PARKED_TYPE, "targets": [{"targetType": "material", "targetId": "nope"}]}
    resp = await learner.post("/v1/ai/job-batches", {**foreign})
    assert resp.status_code == 404, resp.text
    fits = await _batch(learner, targets, jobType=PARKED_TYPE)
    assert fits["batch"]["total"] == 3
    listed = (await learner.get("/v1/ai/jobs?pageSize=100")).json()["jobs"]
    assert len(listed) == 5  # the single job, three children, their parent


async def test_deleting_materials_and_the_user_treat_children_as_jobs(learner: Learner) -> None:
    targets = await _materials(learner, 2)
    parent = await _batch(learner, targets, jobType=PARKED_TYPE)  # no worker: stay pending
    assert (await learner.delete(f"/v1/materials/{targets[0]}")).status_code == 204
    kids = {k["targetId"]: k for k in await _children(learner, parent["jobId"])}
    assert (kids[targets[0]]["status"], kids[targets[1]]["status"]) == ("cancelled", "pending")
    after = (await learner.get(f"/v1/ai/jobs/{parent['jobId']}")).json()
    assert after["status"] == "pending" and after["batch"]["cancelled"] == 1
    _counts_match(after, list(kids.values()))
    assert (await learner.delete(f"/v1/materials/{targets[1]}")).status_code == 204
    ended = (await learner.get(f"/v1/ai/jobs/{parent['jobId']}")).json()
    assert (ended["status"], ended["errorCode"]) == ("failed", "CHILD_JOBS_FAILED"), ended
    assert ended["batch"]["cancelled"] == 2
    # the user erased: the batch goes with every job of theirs
    assert (await learner.delete("/v1/me")).status_code == 204
    assert (await learner.get(f"/v1/ai/jobs/{parent['jobId']}")).status_code == 404
    listed = (await learner.get(f"/v1/ai/jobs?parentJobId={parent['jobId']}")).json()
    assert listed["jobs"] == []
