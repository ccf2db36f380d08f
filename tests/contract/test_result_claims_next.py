"""SubmitResult's ``claim_next``: a result that also claims the job for the slot it frees,
in the result's transaction (gRPC), on SQLite and on MariaDB."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from airuntime_common import metadata
from airuntime_common.enums import JOB_STATUS, JOB_TYPE
from airuntime_common.grpc_errors import from_rpc_error
from tests.contract.conftest import TOKEN, RuntimeStack
from tests.contract.transports import job_json
from tests.unit.job_service.conftest import ANALYSIS_OUTPUT
from zhixi.airuntime.job.v1 import request_response_pb2 as rr

LSA = "learning_state_analysis"
QUIZ = "quiz_generation"
OUTPUT = ANALYSIS_OUTPUT
pytestmark = pytest.mark.parametrize("contract_db", ["sqlite", "mysql"], indirect=True)


def md(instance: str) -> Any:
    return metadata.outgoing(TOKEN, instance)


def submit_request(
    job_id: str, output: dict[str, Any] | None = None, *, attempt_no: int = 1, **claim: Any
) -> rr.SubmitResultRequest:
    struct = struct_pb2.Struct()
    struct.update(OUTPUT if output is None else output)
    req = rr.SubmitResultRequest(
        job_id=job_id, attempt_no=attempt_no, output_schema_version="v1", output=struct
    )
    if claim:
        caps = claim.get("capabilities", [LSA])
        req.claim_next.CopyFrom(
            rr.ClaimNext(
                capabilities=[JOB_TYPE.to_proto(c) for c in caps],  # type: ignore[misc]
                limit=claim.get("limit", 1),
            )
        )
    return req


async def claim_one(stack: RuntimeStack, instance: str) -> str:
    answer = await stack.stub.ClaimJobs(
        rr.ClaimJobsRequest(
            capabilities=[JOB_TYPE.to_proto(LSA)],  # type: ignore[list-item]
            limit=1,
            with_snapshots=True,
        ),
        metadata=md(instance),
    )
    assert len(answer.jobs) == 1
    return str(answer.jobs[0].job_id)


async def refused(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return from_rpc_error(info.value).code


async def test_a_result_claims_and_starts_the_next_job_in_its_transaction(
    stack: RuntimeStack,
) -> None:
    ids = [(await stack.create())["jobId"] for _ in range(3)]
    assert await claim_one(stack, "w1") == ids[0]

    answer = await stack.stub.SubmitResult(submit_request(ids[0], limit=1), metadata=md("w1"))
    assert (answer.job_id, answer.replayed) == (ids[0], False)
    assert (await stack.get(ids[0]))["status"] == "succeeded"
    assert [j.job_id for j in answer.claimed_jobs] == [ids[1]]
    nxt = job_json(answer.claimed_jobs[0])
    assert (nxt["status"], nxt["lockedBy"], nxt["attemptNo"]) == ("running", "w1", 1)
    assert nxt["startedAt"] is not None and nxt["lockUntil"] is not None
    assert nxt == await stack.get(ids[1])
    assert [h[:2] for h in await stack.history(ids[1])] == [
        (None, "pending"),
        ("pending", "locked"),
        ("locked", "running"),
    ]
    # the snapshot is the one the holder would read, and that read starts nothing more
    snap = await stack.stub.GetSnapshot(
        rr.GetSnapshotRequest(job_id=ids[1], attempt_no=1), metadata=md("w1")
    )
    assert answer.snapshots[ids[1]] == snap

    # a replay of the same result claims nothing: the third job stays pending
    again = await stack.stub.SubmitResult(submit_request(ids[0], limit=1), metadata=md("w1"))
    assert again.replayed and not again.claimed_jobs and not again.snapshots
    assert (await stack.get(ids[2]))["status"] == "pending"

    # a limit above what waits takes what waits; with nothing left, nothing
    answer = await stack.stub.SubmitResult(submit_request(ids[1], limit=5), metadata=md("w1"))
    assert [j.job_id for j in answer.claimed_jobs] == [ids[2]]
    answer = await stack.stub.SubmitResult(submit_request(ids[2], limit=5), metadata=md("w1"))
    assert not answer.claimed_jobs
    assert [(await stack.get(i))["status"] for i in ids] == ["succeeded"] * 3


async def test_claim_next_takes_only_the_callers_capabilities(stack: RuntimeStack) -> None:
    first = (await stack.create())["jobId"]
    quiz = (await stack.create(job_type=QUIZ))["jobId"]
    await claim_one(stack, "w1")
    answer = await stack.stub.SubmitResult(submit_request(first, limit=1), metadata=md("w1"))
    assert not answer.claimed_jobs
    assert (await stack.get(quiz))["status"] == "pending"


async def test_a_refused_result_claims_nothing(stack: RuntimeStack) -> None:
    ids = [(await stack.create())["jobId"] for _ in range(2)]
    await claim_one(stack, "w1")
    # a bad claim_next: refused before anything, the result not taken either
    for claim in ({"limit": 0}, {"capabilities": []}, {"limit": -3}):
        code = await refused(
            stack.stub.SubmitResult(submit_request(ids[0], **claim), metadata=md("w1"))
        )
        assert code == "INVALID_ARGUMENT", claim
    # not the lease holder: LOCK_NOT_HELD, nothing claimed
    code = await refused(
        stack.stub.SubmitResult(submit_request(ids[0], attempt_no=2, limit=1), metadata=md("w1"))
    )
    assert code == "LOCK_NOT_HELD"
    code = await refused(
        stack.stub.SubmitResult(submit_request(ids[0], limit=1), metadata=md("w2"))
    )
    assert code == "LOCK_NOT_HELD"
    assert [(await stack.get(i))["status"] for i in ids] == ["running", "pending"]
    # an invalid output fails the job (INVALID_SCHEMA) and claims nothing
    code = await refused(
        stack.stub.SubmitResult(
            submit_request(ids[0], {"summary": "no mastery"}, limit=1), metadata=md("w1")
        )
    )
    assert code == "INVALID_SCHEMA"
    assert [(await stack.get(i))["status"] for i in ids] == ["failed", "pending"]


async def test_concurrent_results_never_claim_one_job_twice(stack: RuntimeStack) -> None:
    """Four workers, each finishing jobs with claim_next until none is left: every job
    runs exactly once, the claims are disjoint (``SKIP LOCKED`` on MariaDB)."""
    ids = [(await stack.create())["jobId"] for _ in range(24)]
    workers = [f"w{i}" for i in range(4)]
    firsts = [await claim_one(stack, w) for w in workers]
    ran: dict[str, list[str]] = {w: [] for w in workers}

    async def work(worker: str, job_id: str | None) -> None:
        while job_id is not None:
            ran[worker].append(job_id)
            answer = await stack.stub.SubmitResult(
                submit_request(job_id, limit=1), metadata=md(worker)
            )
            assert not answer.replayed
            job_id = answer.claimed_jobs[0].job_id if answer.claimed_jobs else None
            if job_id is not None:
                status = JOB_STATUS.to_str_or_none(answer.claimed_jobs[0].status)
                assert (status, answer.claimed_jobs[0].locked_by) == ("running", worker)

    await asyncio.gather(*(work(w, j) for w, j in zip(workers, firsts, strict=True)))
    every = [j for done in ran.values() for j in done]
    assert sorted(every) == sorted(ids)  # each once: none twice, none left
    assert {(await stack.get(i))["status"] for i in ids} == {"succeeded"}


async def test_a_lost_answer_strands_its_claim_only_until_the_lease_expires(
    stack: RuntimeStack,
) -> None:
    """The answer of a result that claimed is lost: the worker sends the result again
    without its claim (a replay, nothing claimed), and the job the lost answer claimed
    goes back to pending when its lease expires (LEASE_EXPIRED, retried), then runs."""
    ids = [(await stack.create())["jobId"] for _ in range(2)]
    await claim_one(stack, "w1")
    lost = await stack.stub.SubmitResult(submit_request(ids[0], limit=1), metadata=md("w1"))
    assert [j.job_id for j in lost.claimed_jobs] == [ids[1]]  # never reaches the worker
    again = await stack.stub.SubmitResult(submit_request(ids[0]), metadata=md("w1"))
    assert again.replayed and not again.claimed_jobs
    assert (await stack.get(ids[1]))["status"] == "running"
    await stack.lapse_lease(ids[1])
    assert await stack.sweep() == 1
    stranded = await stack.get(ids[1])
    assert (stranded["status"], stranded["errorCode"], stranded["retryCount"]) == (
        "pending",
        "LEASE_EXPIRED",
        1,
    )
    assert await claim_one(stack, "w2") == ids[1]
    done = await stack.stub.SubmitResult(
        submit_request(ids[1], attempt_no=2, limit=1), metadata=md("w2")
    )
    assert not done.replayed and not done.claimed_jobs
    assert (await stack.get(ids[1]))["status"] == "succeeded"
