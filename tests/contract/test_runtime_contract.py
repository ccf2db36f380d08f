"""The runtime contract (reference §2.3–§2.6, §3, §4), run once over gRPC and once over the REST shim.

Every test takes ``rt``: ``rt("w1")`` is a runtime instance ``w1`` talking to
the real job_service / credential_service, either through the gRPC stubs or
through the api_gateway's ``/internal/runtime`` routes. Answers are compared
in the REST camelCase shape; refusals by reference §4 code and by the status reference §4
gives that code on the transport in use. A test that passes on one transport
and fails on the other is a disagreement between them, i.e. a bug.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from airuntime_common import metadata
from launcher.token import mint_token
from tests.contract.conftest import JWT_SECRET, PLATFORM_KEY, TOKEN, USER, RuntimeStack
from tests.contract.transports import JOB_KEYS, ContractError, RestTransport, RuntimeTransport
from zhixi.airuntime.job.v1 import request_response_pb2 as job_rr

RT = Callable[[str], RuntimeTransport]
LSA = "learning_state_analysis"
QUIZ = "quiz_generation"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
OUTPUT: dict[str, Any] = {
    "summary": "steady progress",
    "masteryLevel": 0.5,
    "strengths": ["reading"],
    "risks": [],
    "evidence": [],
}
OTHER_OUTPUT: dict[str, Any] = {**OUTPUT, "summary": "a different answer"}
BAD_OUTPUT: dict[str, Any] = {"summary": "no mastery level"}
UNKNOWN_IDS = ["no-such-job", "0" * 32, "x" * 200, "job with spaces", "über-job", "a:b;c"]
# the lease ops MariaDB must agree on too
MYSQL = pytest.mark.parametrize("contract_db", ["sqlite", "mysql"], indirect=True)


async def refused(t: RuntimeTransport, code: str, call: Awaitable[Any]) -> ContractError:
    """Await ``call``; it must be refused with ``code`` and reference §4's status for it."""
    with pytest.raises(ContractError) as info:
        await call
    err = info.value
    assert err.code == code, f"{t.name}: expected {code}, got {err}"
    assert err.status == t.expected_status(code), f"{t.name}: {code} as {err.status}"
    return err


def when(value: str | None) -> datetime:
    """An RFC 3339 answer as an aware datetime (asserting the ms/Z format)."""
    assert value is not None and TIME.match(value), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def output_hash(output: dict[str, Any]) -> str:
    """sha256 hex of the canonical JSON (for these ASCII/integer outputs, sorted compact JSON)."""
    canonical = json.dumps(output, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


async def db_now(stack: RuntimeStack) -> datetime:
    async with stack.jobs.domain.sessions() as session:
        now = await stack.jobs.domain.clock.read(session)
    return now if now.tzinfo else now.replace(tzinfo=UTC)


async def _end_pauses(stack: RuntimeStack) -> None:
    """Every provider's pause after a 429 runs out now."""
    from sqlalchemy import update

    from job_service.store.tables import breaker

    async with stack.jobs.domain.sessions() as session, session.begin():
        await session.execute(update(breaker).values(paused_until=None))


async def held(stack: RuntimeStack, t: RuntimeTransport, **create: Any) -> str:
    """A new job locked by ``t`` as attempt 1."""
    job_id = str((await stack.create(**create))["jobId"])
    assert (await t.lock(job_id))["attemptNo"] == 1
    return job_id


async def job_in(stack: RuntimeStack, t: RuntimeTransport, state: str) -> str:
    """A job in ``state`` (leased, if ever, by ``t`` as attempt 1)."""
    job_id = str((await stack.create())["jobId"])
    if state == "cancelled":
        await stack.cancel(job_id)
    elif state != "pending":
        await t.lock(job_id)
        if state == "running":
            await t.start(job_id, 1)
        elif state == "succeeded":
            await t.result(job_id, 1, OUTPUT)
        elif state == "failed":
            await t.fail(job_id, 1, "MODEL_BAD_REQUEST", "bad request")
    assert (await stack.get(job_id))["status"] == state
    return job_id


# ---------------------------------------------------------------- poll / claim (§2.6)


async def test_poll_answers_full_job_json_and_does_not_lock(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    created = await stack.create(job_type=QUIZ, params={"count": 3}, priority=2)
    [job] = (await w1.poll([QUIZ]))["jobs"]
    assert tuple(job) == JOB_KEYS
    assert job == created
    assert job["status"] == "pending" and job["lockedBy"] is None and job["lockUntil"] is None
    assert job["params"]["count"] == 3 and job["priority"] == 2
    assert job["finishedAt"] is None and job["errorCode"] is None
    for key in ("createdAt", "updatedAt", "availableAt"):
        when(job[key])
    assert job["availableAt"] == job["createdAt"]  # new jobs: availableAt = createdAt
    again = (await rt("w2").poll([QUIZ]))["jobs"]
    assert [j["jobId"] for j in again] == [job["jobId"]]  # poll locks nothing


@MYSQL
async def test_claim_locks_each_job_to_the_caller(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    ids = [(await stack.create())["jobId"] for _ in range(3)]
    claimed = (await w1.claim([LSA], limit=2))["jobs"]
    assert [j["jobId"] for j in claimed] == ids[:2]
    for job in claimed:
        assert tuple(job) == JOB_KEYS
        assert (job["status"], job["lockedBy"], job["attemptNo"]) == ("locked", "w1", 1)
        assert when(job["lockUntil"]) > when(job["createdAt"])
        assert job == await stack.get(job["jobId"])
    rest = (await w2.claim([LSA], limit=5))["jobs"]
    assert [j["jobId"] for j in rest] == ids[2:]
    assert (await w2.claim([LSA]))["jobs"] == []
    assert (await w1.poll([LSA]))["jobs"] == []


@MYSQL
async def test_claim_with_snapshots_starts_each_job_and_answers_its_snapshot(
    stack: RuntimeStack, rt: RT
) -> None:
    w1 = rt("w1")
    ids = [(await stack.create())["jobId"] for _ in range(2)]
    answer = await w1.claim([LSA], limit=5, with_snapshots=True)
    assert set(answer) == {"jobs", "snapshots"}
    assert [j["jobId"] for j in answer["jobs"]] == ids
    assert set(answer["snapshots"]) == set(ids)
    for job in answer["jobs"]:
        assert tuple(job) == JOB_KEYS
        assert (job["status"], job["lockedBy"], job["attemptNo"]) == ("running", "w1", 1)
        assert when(job["startedAt"]) >= when(job["createdAt"])
        assert job == await stack.get(job["jobId"])
        # what the holder's snapshot read answers, and that read starts nothing more
        assert answer["snapshots"][job["jobId"]] == await w1.snapshot(job["jobId"], 1)
        assert (await stack.get(job["jobId"]))["startedAt"] == job["startedAt"]
    late = (await stack.create())["jobId"]
    plain = await w1.claim([LSA])
    assert set(plain) == {"jobs"}  # without the flag: locked, no snapshots
    assert [(j["jobId"], j["status"]) for j in plain["jobs"]] == [(late, "locked")]


@pytest.mark.parametrize("op", ["poll", "claim"])
async def test_poll_and_claim_argument_validation(stack: RuntimeStack, rt: RT, op: str) -> None:
    w1 = rt("w1")
    await stack.create()
    call = getattr(w1, op)
    cases: list[dict[str, Any]] = [
        {"capabilities": [LSA], "limit": -1},
        {"capabilities": []},
        {"capabilities": ["bogus_type"]},
        {"capabilities": [LSA, "bogus_type"]},
        {"capabilities": [LSA], "wait_ms": 20001},
        {"capabilities": [LSA], "wait_ms": -1},
    ]
    for kwargs in cases:
        err = await refused(w1, "INVALID_ARGUMENT", call(**kwargs))
        assert err.details, kwargs  # names the offending field
    # nothing was locked by the refused calls
    assert len((await w1.poll([LSA]))["jobs"]) == 1


async def test_limit_defaults_to_10_and_is_capped_at_50(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    for _ in range(51):
        await stack.create()
    assert len((await w1.poll([LSA]))["jobs"]) == 10
    assert len((await w1.poll([LSA], limit=1000))["jobs"]) == 50
    assert len((await w1.claim([LSA], limit=1000))["jobs"]) == 50
    assert len((await w1.claim([LSA], limit=1000))["jobs"]) == 1


async def test_order_is_priority_then_creation(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    specs = [5, 0, 5, 1, 0, 0]
    ids = [(await stack.create(priority=p))["jobId"] for p in specs]
    expected = [i for _, _, i in sorted(zip(specs, range(len(ids)), ids, strict=True))]
    assert [j["jobId"] for j in (await w1.poll([LSA], limit=50))["jobs"]] == expected
    assert [j["jobId"] for j in (await w1.claim([LSA], limit=3))["jobs"]] == expected[:3]
    assert [j["jobId"] for j in (await w1.claim([LSA], limit=3))["jobs"]] == expected[3:]


@pytest.mark.stack_settings(RETRY_BACKOFF_BASE_SECONDS=600, RETRY_BACKOFF_MAX_SECONDS=600)
async def test_only_available_pending_covered_jobs_are_polled(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    states = ["pending", "locked", "running", "succeeded", "failed", "cancelled"]
    by_state = {s: await job_in(stack, w2, s) for s in states}
    quiz = (await stack.create(job_type=QUIZ))["jobId"]
    requested = await job_in(stack, w2, "running")
    await stack.cancel(requested)  # cancelRequested on a leased job: still leased
    backing_off = await held(stack, w2)
    assert (await w2.fail(backing_off, 1, "MODEL_TIMEOUT"))["status"] == "pending"
    polled = (await w1.poll([LSA], limit=50))["jobs"]
    assert [j["jobId"] for j in polled] == [by_state["pending"]]
    assert [j["jobId"] for j in (await w1.poll([QUIZ, LSA], limit=50))["jobs"]] == [
        by_state["pending"],
        quiz,
    ]
    claimed = (await w1.claim([LSA, QUIZ], limit=50))["jobs"]
    assert [j["jobId"] for j in claimed] == [by_state["pending"], quiz]
    assert (await w1.claim([LSA, QUIZ], limit=50))["jobs"] == []
    # availableAt filters poll and claim, but is not a lock guard
    assert (await w1.lock(backing_off))["attemptNo"] == 2


@pytest.mark.parametrize("op", ["poll", "claim"])
async def test_long_poll_answers_as_soon_as_a_job_is_created(
    stack: RuntimeStack, rt: RT, op: str
) -> None:
    w1 = rt("w1")
    loop = asyncio.get_running_loop()
    began = loop.time()
    empty = await getattr(w1, op)([LSA], wait_ms=300)
    assert empty == {"jobs": []}
    assert loop.time() - began >= 0.25  # waited for a job before answering empty
    began = loop.time()
    waiting = asyncio.ensure_future(getattr(w1, op)([LSA], wait_ms=15000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    job = await stack.create()
    answer = await asyncio.wait_for(waiting, 5)
    assert [j["jobId"] for j in answer["jobs"]] == [job["jobId"]]
    assert loop.time() - began < 5
    if op == "claim":
        assert answer["jobs"][0]["lockedBy"] == "w1"


# ---------------------------------------------------------------- lock (§2.3)


@MYSQL
async def test_lock(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = (await stack.create())["jobId"]
    lease = await w1.lock(job_id)
    assert set(lease) == {"jobId", "status", "lockedBy", "lockUntil", "attemptNo"}
    assert (lease["jobId"], lease["status"], lease["lockedBy"], lease["attemptNo"]) == (
        job_id,
        "locked",
        "w1",
        1,
    )
    now = await db_now(stack)
    assert abs((when(lease["lockUntil"]) - now).total_seconds() - 30) < 5  # now + lease
    before = await stack.get(job_id)
    await refused(w2, "JOB_ALREADY_LOCKED", w2.lock(job_id))
    await refused(w1, "JOB_ALREADY_LOCKED", w1.lock(job_id))
    await w1.start(job_id, 1)
    await refused(w2, "JOB_ALREADY_LOCKED", w2.lock(job_id))
    assert (await stack.get(job_id))["lockedBy"] == before["lockedBy"] == "w1"
    for state in ("succeeded", "failed", "cancelled"):
        done = await job_in(stack, w1, state)
        await refused(w2, "INVALID_JOB_STATE", w2.lock(done))


async def test_unknown_job_ids_are_404_never_400(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    for job_id in UNKNOWN_IDS:
        await refused(w1, "JOB_NOT_FOUND", w1.lock(job_id))
        await refused(w1, "JOB_NOT_FOUND", w1.start(job_id, 1))
        await refused(w1, "JOB_NOT_FOUND", w1.heartbeat(job_id, 1))
        await refused(w1, "JOB_NOT_FOUND", w1.snapshot(job_id, 1))
        await refused(w1, "JOB_NOT_FOUND", w1.resolve(job_id, 1))
        await refused(w1, "JOB_NOT_FOUND", w1.result(job_id, 1, OUTPUT))
        await refused(w1, "JOB_NOT_FOUND", w1.fail(job_id, 1, "MODEL_TIMEOUT"))


# ---------------------------------------------------------------- start / heartbeat


async def test_start(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    pending = (await stack.create())["jobId"]
    await refused(w1, "LOCK_NOT_HELD", w1.start(pending, 1))
    job_id = await held(stack, w1)
    await refused(w2, "LOCK_NOT_HELD", w2.start(job_id, 1))
    await refused(w1, "LOCK_NOT_HELD", w1.start(job_id, 2))
    assert (await stack.get(job_id))["status"] == "locked"
    first = await w1.start(job_id, 1)
    assert set(first) == {"status", "startedAt"}
    assert first["status"] == "running"
    when(first["startedAt"])
    await asyncio.sleep(0.01)
    assert await w1.start(job_id, 1) == first  # a repeat answers the same startedAt
    assert (await stack.get(job_id))["startedAt"] == first["startedAt"]
    await refused(w2, "LOCK_NOT_HELD", w2.start(job_id, 1))


@MYSQL
async def test_heartbeat(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    lock_until = (await stack.get(job_id))["lockUntil"]
    await asyncio.sleep(0.02)
    beat = await w1.heartbeat(job_id, 1)
    assert beat["cancelRequested"] is False
    assert when(beat["lockUntil"]) > when(lock_until)  # now + lease, on the DB clock
    job = await stack.get(job_id)
    assert job["status"] == "running" and job["startedAt"] is not None  # implied start
    assert job["lockUntil"] == beat["lockUntil"]
    # back-to-back heartbeats (same millisecond on MySQL) are not a lost lease
    for _ in range(3):
        await w1.heartbeat(job_id, 1)
    await refused(w2, "LOCK_NOT_HELD", w2.heartbeat(job_id, 1))
    await refused(w1, "LOCK_NOT_HELD", w1.heartbeat(job_id, 2))
    await stack.cancel(job_id)
    assert (await w1.heartbeat(job_id, 1))["cancelRequested"] is True
    for state in ("pending", "succeeded", "failed", "cancelled"):
        other = await job_in(stack, w1, state)
        await refused(w1, "LOCK_NOT_HELD", w1.heartbeat(other, 1))


async def test_lease_past_lock_until_is_dead_before_the_reaper_runs(
    stack: RuntimeStack, rt: RT
) -> None:
    w1 = rt("w1")
    job_id = await held(stack, w1)
    await w1.start(job_id, 1)
    await stack.lapse_lease(job_id)
    await refused(w1, "LOCK_NOT_HELD", w1.heartbeat(job_id, 1))
    [state] = (await w1.heartbeat_leases([(job_id, 1)]))["leases"]
    assert state["held"] is False
    assert (await stack.get(job_id))["status"] == "running"  # the reaper has not run
    assert await stack.sweep() == 1
    job = await stack.get(job_id)
    assert (job["status"], job["retryCount"], job["lockedBy"]) == ("pending", 1, None)
    assert ("running", "expired", "LEASE_EXPIRED") in await stack.history(job_id)


async def test_batched_heartbeat_answers_each_lease_in_order(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    mine = await held(stack, w1)
    theirs = await held(stack, w2)
    asked = await held(stack, w1)
    await stack.cancel(asked)
    pending = (await stack.create())["jobId"]
    refs = [
        (asked, 1),
        (theirs, 1),
        ("no-such-job", 1),
        (mine, 2),
        (pending, 1),
        (mine, 1),
    ]
    answer = (await w1.heartbeat_leases(refs))["leases"]
    assert [(a["jobId"], a["attemptNo"]) for a in answer] == refs
    for a in answer:
        assert set(a) == {"jobId", "attemptNo", "held", "lockUntil", "cancelRequested"}
    assert [a["held"] for a in answer] == [True, False, False, False, False, True]
    assert [a["cancelRequested"] for a in answer] == [True, False, False, False, False, False]
    for a in (answer[0], answer[5]):
        assert a["lockUntil"] == (await stack.get(a["jobId"]))["lockUntil"]
    assert (await stack.get(mine))["status"] == "running"
    assert (await stack.get(theirs))["status"] == "locked"  # untouched
    assert (await w1.heartbeat_leases([]))["leases"] == []
    await refused(w1, "INVALID_ARGUMENT", w1.heartbeat_leases([(mine, 1)] * 501))


# ---------------------------------------------------------------- snapshot / resolve


async def test_snapshot_is_for_the_lease_holder(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    await refused(w2, "LOCK_NOT_HELD", w2.snapshot(job_id, 1))
    await refused(w1, "LOCK_NOT_HELD", w1.snapshot(job_id, 2))
    snap = await w1.snapshot(job_id, 1)
    assert set(snap) == {
        "snapshotId",
        "schemaVersion",
        "targetType",
        "targetId",
        "payload",
        "contentHash",
    }
    job = await stack.get(job_id)
    assert snap["snapshotId"] == job["snapshotId"]
    assert (snap["schemaVersion"], snap["targetType"], snap["targetId"]) == ("v1", "user", USER)
    assert snap["payload"]["userId"] == USER and snap["payload"]["jobType"] == LSA
    assert re.fullmatch(r"[0-9a-f]{64}", snap["contentHash"])
    assert job["status"] == "running"  # the first snapshot read implies start
    assert await w1.snapshot(job_id, 1) == snap  # immutable
    pending = (await stack.create())["jobId"]
    await refused(w1, "LOCK_NOT_HELD", w1.snapshot(pending, 1))


async def test_resolve_gives_the_key_to_the_lease_holder_only(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    await refused(w2, "LOCK_NOT_HELD", w2.resolve(job_id, 1))
    await refused(w1, "LOCK_NOT_HELD", w1.resolve(job_id, 2))
    key = await w1.resolve(job_id, 1)
    assert key == {
        "apiKeyMode": "platform_key",
        "credentialId": None,
        "apiKey": PLATFORM_KEY,
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "baseUrl": "http://127.0.0.1:9/v1",
        "userBaseUrl": False,  # a configured provider's endpoint, not a user's own
    }
    # a user-key job resolves to the user's own key while it is stored
    credential_id = await stack.put_key("sk-user-own-key-9876")
    user_job = await held(stack, w1, api_key_mode="user_deepseek_key")
    assert (await stack.get(user_job))["credentialId"] == credential_id
    key = await w1.resolve(user_job, 1)
    assert (key["apiKeyMode"], key["credentialId"], key["apiKey"]) == (
        "user_deepseek_key",
        credential_id,
        "sk-user-own-key-9876",
    )
    await refused(w2, "LOCK_NOT_HELD", w2.resolve(user_job, 1))
    await stack.delete_key()
    await refused(w1, "INVALID_CREDENTIAL", w1.resolve(user_job, 1))
    pending = (await stack.create())["jobId"]
    await refused(w1, "LOCK_NOT_HELD", w1.resolve(pending, 1))


# ---------------------------------------------------------------- result (§2.5)


@MYSQL
async def test_result_idempotency_in_the_spec_order(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    await w1.start(job_id, 1)
    # lease before validation: a non-holder's invalid output is LOCK_NOT_HELD
    await refused(w2, "LOCK_NOT_HELD", w2.result(job_id, 1, BAD_OUTPUT))
    await refused(w2, "LOCK_NOT_HELD", w2.result(job_id, 1, OUTPUT))
    await refused(w1, "LOCK_NOT_HELD", w1.result(job_id, 2, OUTPUT))
    first = await w1.result(job_id, 1, OUTPUT)
    assert set(first) == {"jobId", "status", "resultId", "outputHash", "replayed"}
    assert (first["jobId"], first["status"], first["replayed"]) == (job_id, "succeeded", False)
    assert first["outputHash"] == output_hash(OUTPUT)
    job = await stack.get(job_id)
    assert job["status"] == "succeeded" and job["finishedAt"] is not None
    # 1. exact replay: 200 replayed, even though the job is terminal
    again = await w1.result(job_id, 1, OUTPUT)
    assert again == {**first, "replayed": True}
    # 2. another hash after success: RESULT_ALREADY_EXISTS (before the lease and validation)
    await refused(w1, "RESULT_ALREADY_EXISTS", w1.result(job_id, 1, OTHER_OUTPUT))
    await refused(w2, "RESULT_ALREADY_EXISTS", w2.result(job_id, 1, OTHER_OUTPUT))
    await refused(w1, "RESULT_ALREADY_EXISTS", w1.result(job_id, 1, BAD_OUTPUT))
    # 3. the SAME hash under another attempt is neither a replay (other key) nor another
    #    result (same hash): the lease answers it
    await refused(w1, "LOCK_NOT_HELD", w1.result(job_id, 2, OUTPUT))
    assert await stack.get(job_id) == job  # nothing written twice


async def test_invalid_output_fails_the_job(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    job_id = await held(stack, w1)
    err = await refused(w1, "INVALID_SCHEMA", w1.result(job_id, 1, BAD_OUTPUT))
    assert err.message
    job = await stack.get(job_id)
    assert (job["status"], job["errorCode"], job["lockUntil"]) == ("failed", "INVALID_SCHEMA", None)
    assert job["retryCount"] == 0  # not retryable
    # the attempt is over: a later (valid) submission no longer holds the lease
    await refused(w1, "LOCK_NOT_HELD", w1.result(job_id, 1, OUTPUT))
    await refused(w1, "LOCK_NOT_HELD", w1.heartbeat(job_id, 1))


BLOCK = "{block}"  # replaced by the id of a block of the user's material


def quiz_item(**fields: Any) -> dict[str, Any]:
    """A quiz output whose one question is valid but for ``fields``."""
    item: dict[str, Any] = {
        "questionType": "single_choice",
        "stem": "What stops recursion?",
        "options": ["A base case", "A loop"],
        "answer": "A base case",
        "explanation": "The material says so.",
        "difficulty": "medium",
        "sourceBlockIds": [BLOCK],
    }
    return {"items": [{**item, **fields}]}


def action(priority: Any) -> dict[str, Any]:
    """A next_action_planning output recommending the user itself."""
    item = {"actionType": "review", "targetType": "user", "targetId": USER, "reason": "r"}
    return {"items": [{**item, "priority": priority}]}


async def held_with_block(
    stack: RuntimeStack, t: RuntimeTransport, job_type: str, output: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """A job of ``job_type`` on a user with one material, leased by ``t``, and
    ``output`` citing that material's first block."""
    reply = await stack.stub.CreateMaterial(
        job_rr.CreateMaterialRequest(
            user_id=USER, title="Recursion", content="A base case stops the recursion."
        ),
        metadata=metadata.outgoing(TOKEN),
    )
    block_id = reply.material.blocks[0].block_id
    job_id = await held(stack, t, job_type=job_type)
    return job_id, json.loads(json.dumps(output).replace(BLOCK, block_id))


@pytest.mark.parametrize(
    ("job_type", "output"),
    [
        (LSA, {**OUTPUT, "masteryLevel": "0.5"}),  # a number sent as a string
        (LSA, {**OUTPUT, "masteryLevel": True}),  # a boolean is no number
        ("next_action_planning", action("3")),  # an integer sent as a string
        ("next_action_planning", action(1.5)),  # a fraction is no integer
        (QUIZ, quiz_item(answer="A while loop")),  # not one of its options
        (QUIZ, quiz_item(questionType="multiple_choice", answer=[])),
        (QUIZ, quiz_item(questionType="true_false", options=["True", "False"], answer="true")),
        (QUIZ, quiz_item(questionType="true_false", options=["true", "false"], answer=True)),
    ],
    ids=[
        "string-number",
        "bool-number",
        "string-int",
        "fraction-int",
        "answer-not-an-option",
        "empty-multiple-choice",
        "true-false-options",
        "true-false-bool",
    ],
)
async def test_p4_outputs_are_validated_strictly(
    stack: RuntimeStack, rt: RT, job_type: str, output: dict[str, Any]
) -> None:
    """Case P4 on the result path (reference §9.4): no coercion, an answer fits its options;
    refused INVALID_SCHEMA and the job failed, over gRPC and the REST shim alike.
    Each output cites only the user's own block, so only its shape is at fault."""
    w1 = rt("w1")
    job_id, output = await held_with_block(stack, w1, job_type, output)
    await refused(w1, "INVALID_SCHEMA", w1.result(job_id, 1, output))
    job = await stack.get(job_id)
    assert (job["status"], job["errorCode"]) == ("failed", "INVALID_SCHEMA")


@pytest.mark.parametrize(
    ("job_type", "output"),
    [
        # ``priority: 2`` crosses a Struct as 2.0 (its numbers are doubles): still an integer
        ("next_action_planning", action(2)),
        (LSA, {**OUTPUT, "masteryLevel": 1}),  # an integer is a number
        (QUIZ, quiz_item()),
        (QUIZ, quiz_item(questionType="multiple_choice", answer=["A loop", "A base case"])),
        (QUIZ, quiz_item(questionType="true_false", options=["true", "false"], answer="false")),
        (QUIZ, quiz_item(questionType="short_answer", options=[], answer="A base case")),
    ],
    ids=["integer", "int-number", "single", "multiple", "true-false", "short"],
)
async def test_strictly_valid_outputs_are_accepted(
    stack: RuntimeStack, rt: RT, job_type: str, output: dict[str, Any]
) -> None:
    w1 = rt("w1")
    job_id, output = await held_with_block(stack, w1, job_type, output)
    assert (await w1.result(job_id, 1, output))["status"] == "succeeded"


async def test_result_beats_an_unacknowledged_cancel(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    job_id = await held(stack, w1)
    await w1.start(job_id, 1)
    assert (await stack.cancel(job_id))["cancelRequested"] is True
    assert (await w1.result(job_id, 1, OUTPUT))["status"] == "succeeded"
    assert (await stack.get(job_id))["status"] == "succeeded"


# ---------------------------------------------------------------- fail (§2.3, §2.4)


@pytest.mark.stack_settings(RETRY_BACKOFF_BASE_SECONDS=100, RETRY_BACKOFF_MAX_SECONDS=1000)
async def test_retryable_fail_goes_back_to_pending_with_backoff(
    stack: RuntimeStack, rt: RT
) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    await w1.start(job_id, 1)
    await refused(w2, "LOCK_NOT_HELD", w2.fail(job_id, 1, "MODEL_TIMEOUT"))
    answer = await w1.fail(job_id, 1, "MODEL_TIMEOUT", "model timed out")
    assert answer == {"jobId": job_id, "status": "pending", "retryCount": 1}
    now = await db_now(stack)
    job = await stack.get(job_id)
    assert (job["lockedBy"], job["lockUntil"]) == (None, None)  # lease cleared
    delay = (when(job["availableAt"]) - now).total_seconds()
    assert 85 <= delay <= 111, delay  # base × 2^0 ± 10 %
    assert (await w1.poll([LSA]))["jobs"] == []
    # the second retry doubles the backoff
    assert (await w2.lock(job_id))["attemptNo"] == 2
    await w2.fail(job_id, 2, "NETWORK_ERROR")
    delay = (when((await stack.get(job_id))["availableAt"]) - await db_now(stack)).total_seconds()
    assert 175 <= delay <= 221, delay
    # a longer Retry-After wins
    assert (await w1.lock(job_id))["attemptNo"] == 3
    answer = await w1.fail(job_id, 3, "MODEL_RATE_LIMIT", "429", retry_after_seconds=900)
    assert answer["retryCount"] == 3
    delay = (when((await stack.get(job_id))["availableAt"]) - await db_now(stack)).total_seconds()
    assert 895 <= delay <= 905, delay
    # the 429 also paused the provider for every lease (reference §10.2, at most 300 s):
    # a lock is refused with how long to wait
    await refused(w1, "NO_PROVIDER_CAPACITY", w1.lock(job_id))
    await _end_pauses(stack)
    # retries used up: failed with the last code, retryCount stays at maxRetryCount
    assert (await w1.lock(job_id))["attemptNo"] == 4
    answer = await w1.fail(job_id, 4, "TEMPORARY_PROVIDER_ERROR", "503")
    assert answer == {"jobId": job_id, "status": "failed", "retryCount": 3}
    assert (await stack.get(job_id))["errorCode"] == "TEMPORARY_PROVIDER_ERROR"


@pytest.mark.stack_settings(RETRY_BACKOFF_BASE_SECONDS=100, RETRY_BACKOFF_MAX_SECONDS=1000)
async def test_worker_shutdown_retries_at_once(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    answer = await w1.fail(job_id, 1, "WORKER_SHUTDOWN", "draining")
    assert answer == {"jobId": job_id, "status": "pending", "retryCount": 1}
    [again] = (await w2.claim([LSA]))["jobs"]
    assert (again["jobId"], again["attemptNo"], again["lockedBy"]) == (job_id, 2, "w2")


@MYSQL
async def test_non_retryable_fail_and_its_repeat(stack: RuntimeStack, rt: RT) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    answer = await w1.fail(job_id, 1, "MODEL_BAD_REQUEST", "our request was wrong")
    assert answer == {"jobId": job_id, "status": "failed", "retryCount": 0}
    job = await stack.get(job_id)
    assert (job["errorCode"], job["errorMessage"]) == ("MODEL_BAD_REQUEST", "our request was wrong")
    assert job["finishedAt"] is not None and job["lockUntil"] is None
    # a repeat of the fail that ended the attempt: 200 with the current state
    assert await w1.fail(job_id, 1, "MODEL_BAD_REQUEST", "our request was wrong") == answer
    await refused(w2, "LOCK_NOT_HELD", w2.fail(job_id, 1, "MODEL_BAD_REQUEST"))
    assert await stack.get(job_id) == job
    # an unknown code is recorded as given and is final
    other = await held(stack, w1)
    answer = await w1.fail(other, 1, "SOMETHING_NEW", "?")
    assert answer == {"jobId": other, "status": "failed", "retryCount": 0}
    assert (await stack.get(other))["errorCode"] == "SOMETHING_NEW"


async def test_fail_acknowledging_a_cancel(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    # CANCELLED → cancelled, never retried
    job_id = await held(stack, w1)
    answer = await w1.fail(job_id, 1, "CANCELLED", "stopped")
    assert answer == {"jobId": job_id, "status": "cancelled", "retryCount": 0}
    # any code (even a retryable one) after a cancel request → cancelled
    other = await held(stack, w1)
    await w1.start(other, 1)
    await stack.cancel(other)
    answer = await w1.fail(other, 1, "MODEL_TIMEOUT", "aborted")
    assert answer == {"jobId": other, "status": "cancelled", "retryCount": 0}
    job = await stack.get(other)
    assert job["lockUntil"] is None  # lease cleared (lockedBy keeps who ran the attempt)
    assert (await w1.poll([LSA]))["jobs"] == []
    await refused(w1, "INVALID_JOB_STATE", w1.lock(other))


# ---------------------------------------------------------------- invocation logs, health


async def test_invocation_log(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    job_id = await held(stack, w1)
    fields: dict[str, Any] = {
        "jobId": job_id,
        "attemptNo": 1,
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "apiKeyMode": "platform_key",
        "credentialId": None,
        "promptTokens": 1200,
        "completionTokens": 300,
        "cacheHitTokens": 200,
        "latencyMs": 850,
        "outcome": "succeeded",
        "errorCode": None,
        "providerRequestId": "req-123",
    }
    created = await w1.invocation_log(**fields)
    assert set(created) == {"id"} and created["id"]
    [logged] = await stack.invocations(job_id)
    assert logged["id"] == created["id"]
    assert (logged["promptTokens"], logged["completionTokens"], logged["cacheHitTokens"]) == (
        1200,
        300,
        200,
    )
    assert logged["providerRequestId"] == "req-123" and logged["costUsd"] > 0
    failed = await w1.invocation_log(
        **{**fields, "outcome": "failed", "errorCode": "MODEL_TIMEOUT", "providerRequestId": None}
    )
    assert failed["id"] != created["id"]
    await refused(w1, "INVALID_ARGUMENT", w1.invocation_log(**{**fields, "outcome": "maybe"}))
    await refused(w1, "INVALID_ARGUMENT", w1.invocation_log(**{**fields, "promptTokens": -1}))
    await refused(w1, "JOB_NOT_FOUND", w1.invocation_log(**{**fields, "jobId": "no-such-job"}))
    assert len(await stack.invocations(job_id)) == 2


async def test_health_follows_the_runtime_instances_seen(stack: RuntimeStack, rt: RT) -> None:
    w1 = rt("w1")
    assert await w1.health() == {"status": "NOT_SERVING", "workers": []}
    job_id = (await stack.create())["jobId"]
    await w1.claim([LSA, QUIZ])
    health = await w1.health()
    assert health["status"] == "SERVING"
    [worker] = health["workers"]
    assert set(worker) == {"instanceId", "capabilities", "inFlight", "lastSeenAt", "status"}
    assert worker["instanceId"] == "w1"
    assert sorted(worker["capabilities"]) == sorted([LSA, QUIZ])
    assert worker["inFlight"] == 1
    assert abs((when(worker["lastSeenAt"]) - await db_now(stack)).total_seconds()) < 5
    await w1.result(job_id, 1, OUTPUT)
    assert (await w1.health())["workers"][0]["inFlight"] == 0
    # not seen for longer than the liveness window: NOT_SERVING again
    await stack.age_workers(3600)
    health = await w1.health()
    assert health["status"] == "NOT_SERVING"
    assert [w["instanceId"] for w in health["workers"]] in ([], ["w1"])


# ---------------------------------------------------------------- fencing (§3)


@MYSQL
async def test_a_worker_whose_lease_was_taken_over_is_fenced_off(
    stack: RuntimeStack, rt: RT
) -> None:
    w1, w2 = rt("w1"), rt("w2")
    job_id = await held(stack, w1)
    await w1.snapshot(job_id, 1)
    await w1.resolve(job_id, 1)
    await stack.lapse_lease(job_id)
    await stack.sweep()
    assert (await stack.get(job_id))["status"] == "pending"
    taken = await w2.lock(job_id)
    assert (taken["attemptNo"], taken["lockedBy"]) == (2, "w2")
    for attempt in (1, 2):  # neither its own attempt nor a guessed one
        await refused(w1, "LOCK_NOT_HELD", w1.heartbeat(job_id, attempt))
        await refused(w1, "LOCK_NOT_HELD", w1.start(job_id, attempt))
        await refused(w1, "LOCK_NOT_HELD", w1.snapshot(job_id, attempt))
        await refused(w1, "LOCK_NOT_HELD", w1.resolve(job_id, attempt))
        await refused(w1, "LOCK_NOT_HELD", w1.result(job_id, attempt, OUTPUT))
        await refused(w1, "LOCK_NOT_HELD", w1.fail(job_id, attempt, "CANCELLED"))
        [state] = (await w1.heartbeat_leases([(job_id, attempt)]))["leases"]
        assert state["held"] is False
    # w2 holds attempt 2 and finishes the job; w1's late result cannot overwrite it
    assert (await w2.heartbeat(job_id, 2))["cancelRequested"] is False
    done = await w2.result(job_id, 2, OUTPUT)
    assert done["status"] == "succeeded"
    await refused(w1, "RESULT_ALREADY_EXISTS", w1.result(job_id, 1, OTHER_OUTPUT))
    job = await stack.get(job_id)
    assert (job["status"], job["attemptNo"], job["retryCount"]) == ("succeeded", 2, 1)


# ---------------------------------------------------------------- transport envelope


async def test_missing_instance_id_is_refused(stack: RuntimeStack, transport_kind: str) -> None:
    """gRPC without ``x-runtime-instance-id`` / REST without ``X-Runtime-Instance-Id`` → 400."""
    job_id = (await stack.create())["jobId"]
    t = stack.transport(transport_kind, "")
    if transport_kind == "rest":
        del t.headers["X-Runtime-Instance-Id"]  # type: ignore[attr-defined]
    calls: list[Awaitable[Any]] = [
        t.poll([LSA]),
        t.claim([LSA]),
        t.lock(job_id),
        t.start(job_id, 1),
        t.heartbeat(job_id, 1),
        t.heartbeat_leases([(job_id, 1)]),
        t.snapshot(job_id, 1),
        t.resolve(job_id, 1),
        t.result(job_id, 1, OUTPUT),
        t.fail(job_id, 1, "MODEL_TIMEOUT"),
    ]
    for call in calls:
        await refused(t, "INVALID_ARGUMENT", call)
    assert (await stack.get(job_id))["status"] == "pending"
    # health needs the token only
    assert (await t.health())["status"] == "NOT_SERVING"


async def test_token_is_required(stack: RuntimeStack, transport_kind: str) -> None:
    job_id = (await stack.create())["jobId"]
    user_jwt = mint_token(JWT_SECRET, sub=USER, role="user")
    admin_jwt = mint_token(JWT_SECRET, sub="admin1", role="admin")
    for token in ("", "wrong-token", user_jwt, admin_jwt):
        t = stack.transport(transport_kind, "w1")
        if transport_kind == "rest":
            t.headers["x-internal-api-key"] = token  # type: ignore[attr-defined]
            if not token:
                del t.headers["x-internal-api-key"]  # type: ignore[attr-defined]
        else:
            t.md = (("x-internal-api-key", token), ("x-runtime-instance-id", "w1"))  # type: ignore[attr-defined]
        for call in (t.poll([LSA]), t.lock(job_id), t.heartbeat(job_id, 1), t.health()):
            await refused(t, "UNAUTHENTICATED", call)
    assert (await stack.get(job_id))["status"] == "pending"


async def test_rest_user_jwt_as_bearer_is_not_a_runtime_credential(stack: RuntimeStack) -> None:
    for role in ("user", "admin"):
        jwt_token = mint_token(JWT_SECRET, sub=USER, role=role)
        resp = await stack.http.post(
            "/internal/runtime/jobs/poll",
            json={"capabilities": [LSA]},
            headers={"Authorization": f"Bearer {jwt_token}", "X-Runtime-Instance-Id": "w1"},
        )
        assert resp.status_code == 401, resp.text
        assert resp.json()["code"] == "UNAUTHENTICATED"


async def test_rest_envelope(stack: RuntimeStack) -> None:
    """REST-only shapes: limit 0 is < 1; heartbeat 204 headers; resolve no-store; log 201."""
    t = stack.transport("rest", "w1")
    assert isinstance(t, RestTransport)
    await refused(t, "INVALID_ARGUMENT", t.poll([LSA], limit=0))
    await refused(t, "INVALID_ARGUMENT", t.claim([LSA], limit=0))
    job_id = await held(stack, t)
    await t.heartbeat(job_id, 1)
    assert t.last is not None and t.last.status_code == 204
    assert TIME.match(t.last.headers["X-Lock-Until"])
    assert t.last.headers["X-Cancel-Requested"] == "false"
    await t.resolve(job_id, 1)
    assert t.last.headers["Cache-Control"] == "no-store"
    await refused(t, "LOCK_NOT_HELD", t.resolve(job_id, 2))
    assert t.last.headers.get("Cache-Control") == "no-store"  # refusals are not cached either
    body = {
        "jobId": job_id,
        "attemptNo": 1,
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "apiKeyMode": "platform_key",
        "outcome": "succeeded",
    }
    await t.invocation_log(**body)
    assert t.last.status_code == 201
    await refused(t, "INVALID_ARGUMENT", t.invocation_log(**{**body, "apiKeyMode": "nope"}))
    del body["jobId"]
    await refused(t, "INVALID_ARGUMENT", t.invocation_log(**body))


async def test_grpc_limit_zero_means_the_default(stack: RuntimeStack) -> None:
    """proto3 cannot tell 0 from unset: gRPC ``limit=0`` is the default 10 (REST: 400)."""
    t = stack.transport("grpc", "w1")
    for _ in range(12):
        await stack.create()
    assert len((await t.poll([LSA], limit=0))["jobs"]) == 10


# ---------------------------------------------------------------- argument bounds


@MYSQL
async def test_both_transports_bound_the_same_fields(stack: RuntimeStack, rt: RT) -> None:
    """Out-of-bounds values are 400 ``INVALID_ARGUMENT`` on both; values at the bound fit the DB."""
    w1 = rt("w1")
    job_id = await held(stack, w1)
    log: dict[str, Any] = {
        "jobId": job_id,
        "attemptNo": 1,
        "modelProvider": "deepseek",
        "modelName": "deepseek-chat",
        "apiKeyMode": "platform_key",
        "outcome": "failed",
    }
    refusals: list[Awaitable[Any]] = [
        w1.poll([LSA] * 11),
        w1.start(job_id, 0),
        w1.heartbeat(job_id, 0),
        w1.heartbeat_leases([(job_id, 0)]),
        w1.heartbeat_leases([("", 1)]),
        w1.snapshot(job_id, 0),
        w1.resolve(job_id, 0),
        w1.result(job_id, 0, OUTPUT),
        w1.result(job_id, 1, OUTPUT, prompt_version="p" * 129),
        w1.fail(job_id, 0, "MODEL_TIMEOUT"),
        w1.fail(job_id, 1, ""),
        w1.fail(job_id, 1, "E" * 65),
        w1.fail(job_id, 1, "MODEL_TIMEOUT", "m" * 4001),
        w1.fail(job_id, 1, "MODEL_RATE_LIMIT", "", retry_after_seconds=-1),
        w1.fail(job_id, 1, "MODEL_RATE_LIMIT", "", retry_after_seconds=86401),
        w1.invocation_log(**{**log, "attemptNo": 0}),
        w1.invocation_log(**{**log, "modelProvider": ""}),
        w1.invocation_log(**{**log, "modelProvider": "p" * 33}),
        w1.invocation_log(**{**log, "modelName": "m" * 65}),
        w1.invocation_log(**{**log, "credentialId": "c" * 65}),
        w1.invocation_log(**{**log, "errorCode": "E" * 65}),
        w1.invocation_log(**{**log, "providerRequestId": "r" * 129}),
        w1.invocation_log(**{**log, "promptTokens": 2**53 + 1}),
        w1.invocation_log(**{**log, "completionTokens": 10_000_001}),  # job_service's cap
        w1.invocation_log(**{**log, "latencyMs": -1}),
    ]
    for call in refusals:
        await refused(w1, "INVALID_ARGUMENT", call)
    assert (await stack.get(job_id))["status"] == "locked"  # no refusal touched the job
    assert await stack.invocations(job_id) == []
    # at the bound: accepted and stored whole (no column overflow on MariaDB)
    await w1.invocation_log(
        **{
            **log,
            "modelProvider": "p" * 32,
            "modelName": "m" * 64,
            "credentialId": "c" * 64,
            "errorCode": "E" * 64,
            "providerRequestId": "r" * 128,
            "promptTokens": 10_000_000,
        }
    )
    [stored] = await stack.invocations(job_id)
    assert (stored["modelName"], stored["providerRequestId"]) == ("m" * 64, "r" * 128)
    done = await w1.result(job_id, 1, OUTPUT, prompt_version="p" * 128)
    assert done["status"] == "succeeded"
    assert (await stack.get(job_id))["promptVersion"] == "p" * 128
    other = await held(stack, w1)
    answer = await w1.fail(other, 1, "E" * 64, "m" * 4000)
    assert answer["status"] == "failed"
    job = await stack.get(other)
    assert (job["errorCode"], job["errorMessage"]) == ("E" * 64, "m" * 4000)
    # unknown output versions and empty outputs are the output's fault: INVALID_SCHEMA
    for output, version in (({}, "v1"), (OUTPUT, "v9")):
        bad = await held(stack, w1)
        await refused(
            w1, "INVALID_SCHEMA", w1.result(bad, 1, output, output_schema_version=version)
        )
        assert (await stack.get(bad))["status"] == "failed"
